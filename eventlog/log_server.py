"""The local log server: a node's worker processes share the parent's log over a Unix socket.

The embedded log is one RocksDB directory, which one process opens. A node of several processes
keeps its :class:`eventlog.embedded.EmbeddedLog` in the parent, and ``LogServer`` serves the log
port (:mod:`eventlog.port`) to the workers as a local broker: each worker is a full node on a
:class:`eventlog.remote.RemoteLog` and a member of the server's :class:`eventlog.group.Group`,
which shares the partitions among the workers as a Kafka consumer group shares them among
nodes. One code path: a worker does not know it is not on Kafka.

::

    parent                                         worker k (a node)
    EmbeddedLog ─ LogServer ─ <data>/log.sock ◄──── RemoteLog(path, member_id="worker-k")
                   Group: partitions round robin     membership: its share of the partitions
                   over the workers by member id     writers, readers, mailbox: the same port

**The socket** is created with mode 0600 (bound in a private directory, then moved to ``path``,
so it is never reachable with looser permissions), and a peer of another user is refused (its
credentials are checked as it connects). A socket file left by an earlier server that died is
replaced; one a live server answers on is not.

**Framing** (:mod:`eventlog.log_wire`): a 4-byte big-endian length and a msgpack message
(msgspec structs, array-like and tagged; no pickle), records travelling a batch to a frame.
Errors cross as the ``core.errors`` class they are and are raised again in the worker.

**One connection per concurrent caller.** A worker's threads (its partition runners, the read
model's followers, its mailbox reader, its membership poller) each borrow a connection from the
client's pool for one call, and the server gives every connection a thread that answers its
requests in order. A call is then one send and one receive by the calling thread itself: no
thread on either side hands requests or answers on (a pipelined connection needs a reader
thread on each side, and in CPython every hand-off to it is a wake-up and an interpreter-lock
switch, paid twice a call), and no call waits behind another's long poll. Appends from many
connections still share one WAL sync: the embedded log's committer batches whatever is queued,
whichever thread queued it. The cost is a socket and a server thread per concurrent caller: a
worker opens a few dozen (a read model follower per partition, the runners, a few more).
The id every request carries checks that an answer belongs to its question; a connection whose
call failed half way (a timeout) is closed, never reused.

Two kinds of connection also carry state. A member's **session** connection carries its join and
nothing else, so the server sees it close the moment the worker exits or dies (its partitions
move at once and its writers are fenced); a worker that stops without exiting (SIGSTOP) keeps
its connections open and expires after ``session_timeout_s`` without a poll. A **mailbox** is a
connection too: the replies to its node id are delivered there until it closes.

**Measured** by hand (a throwaway script; the 2-core VM the benchmarks run on, load 1-1.5,
three rounds): a worker process calling the parent's EmbeddedLog through the socket, against
the same calls made in the parent itself. Events and commands of 200 bytes::

    call                                        in the parent           from a worker
    append, 1 event (a WAL sync each)           3,260-3,940 /s          2,410-2,650 /s
    append, 1 event, 16 threads at once         14,900-18,200 /s        10,700-12,200 /s
    submit                                      2,610-3,900 /s          2,180-2,690 /s
    read, batches of 1,000 records              807,000-832,000 rec/s   495,000-524,000 rec/s
    a call without I/O (end_offset)             0.5 us                  14-65 us

A round trip is mostly waking the other process: two Python processes bouncing a byte over a
socket pair take 6-50 us a round on this VM, depending on whether they share a core. A read
costs 0.35 us a record more (msgspec writing and building each ``Record``) on top of the log's
own 1.2 us. With 16 appenders the parent's interpreter lock is the limit: its threads answer
one at a time, so a group commit gathers 6 appends instead of 8.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import assert_never

import msgspec

from core.errors import CronlogError
from eventlog import log_wire as wire
from eventlog.group import DEFAULT_SESSION_TIMEOUT_S, Group, InProcessLog
from eventlog.port import Mailbox

log = logging.getLogger(__name__)

_MAX_PATH = 107  # sockaddr_un's sun_path, less its terminating NUL
_ACCEPTOR_STOP_S = 2.0


@dataclass(eq=False)
class _Connection:
    """What a connection has become: a member's session, a mailbox, or neither."""

    sock: socket.socket
    session: int | None = None
    mailbox: Mailbox | None = None


class LogServer:
    """``LogServer(log, path, session_timeout_s=10.0)``: serve ``log`` on the Unix socket
    ``path`` until :meth:`close`. The caller opened ``log`` and closes it after the server."""

    def __init__(
        self,
        log: InProcessLog,
        path: str | Path,
        *,
        session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._path = Path(path)
        self._group = Group(log, session_timeout_s=session_timeout_s, clock=clock)
        self._lock = threading.Lock()
        self._connections: dict[threading.Thread, _Connection] = {}
        self._closed = False
        self._listener, self._inode = _listen(self._path)
        self._acceptor = threading.Thread(
            target=self._accept, name=f"cronlog-log-server:{self._path.name}", daemon=True
        )
        self._acceptor.start()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def group(self) -> Group:
        return self._group

    def close(self) -> None:
        """Stop: refuse new connections, end every member's poll, shut every connection down.

        A connection's thread inside a call to the log (a read waiting for records) ends when
        the call returns, at the latest when the log's owner closes the log, which wakes every
        waiting reader; close does not wait for it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._group.close()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        with contextlib.suppress(OSError):
            if os.stat(self._path).st_ino == self._inode:  # still ours, not a successor's
                os.unlink(self._path)
        self._acceptor.join(_ACCEPTOR_STOP_S)
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> LogServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- connections ------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                with self._lock:
                    if self._closed:
                        return
                log.exception("log server %s: accept failed", self._path)
                time.sleep(0.1)  # a persistent failure (no file descriptors left) must not spin
                continue
            try:
                same_user = _same_user(sock)
            except Exception:  # the one accepting thread must not end on one peer's account
                log.exception("log server %s: could not tell a peer's user", self._path)
                same_user = False
            if not same_user:
                log.warning("log server %s: refused a peer of another user", self._path)
                sock.close()
                continue
            connection = _Connection(sock)
            thread = threading.Thread(
                target=self._serve, args=(connection,), name="cronlog-log-conn", daemon=True
            )
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._connections[thread] = connection
            thread.start()

    def _serve(self, connection: _Connection) -> None:
        sock = connection.sock
        stream = sock.makefile("rb")
        try:
            while (payload := wire.read_frame(stream)) is not None:
                try:
                    request: wire.Request = wire.requests.decode(payload)
                except msgspec.DecodeError as exc:  # a client of another version, or a bug
                    log.warning("log server %s: dropped a connection: %s", self._path, exc)
                    return
                sock.sendall(wire.frame(self._answer(request, connection)))
        except OSError:
            pass  # the worker went away (or the server is closing): what it held is released
        finally:
            if connection.session is not None:
                self._group.leave(connection.session)
            if connection.mailbox is not None:
                connection.mailbox.close()
            stream.close()
            sock.close()
            with self._lock:
                self._connections.pop(threading.current_thread(), None)

    def _answer(self, request: wire.Request, connection: _Connection) -> wire.Answer:
        try:
            return self._handle(request, connection)
        except (CronlogError, ValueError) as exc:
            return wire.failure(request.id, exc)
        except Exception as exc:
            log.exception("log server %s: %s failed", self._path, type(request).__name__)
            return wire.failure(request.id, exc)

    def _handle(self, request: wire.Request, connection: _Connection) -> wire.Answer:
        group, log_ = self._group, self._log
        match request:
            case wire.Append(id, partition, token, events, through):
                return wire.Offsets(id, group.append(partition, token, events, through))
            case wire.Read(id, stream, partition, from_offset, max_records, timeout_s):
                if stream not in ("events", "commands"):
                    raise ValueError(f"unknown stream {stream!r}")
                read = log_.read_events if stream == "events" else log_.read_commands
                return wire.Records(id, read(partition, from_offset, max_records, timeout_s))
            case wire.Poll(id, handle, timeout_s, max_records):
                polled = group.poll(handle, timeout_s, max_records)
                return wire.Polled(
                    id,
                    polled.revoked,
                    list(polled.assigned.items()),
                    polled.records,
                    polled.gone,
                )
            case wire.Submit(id, partition, value, key):
                return wire.Number(id, log_.submit(partition, value, key))
            case wire.EndOffset(id, stream, partition):
                return wire.Number(id, log_.end_offset(stream, partition))
            case wire.StartOffset(id, stream, partition):
                return wire.Number(id, log_.start_offset(stream, partition))
            case wire.WaitReadable(id, partition, token):
                group.wait_until_readable(partition, token)
                return wire.Done(id)
            case wire.CommandPosition(id, partition):
                return wire.Number(id, group.command_position(partition))
            case wire.CloseWriter(id, partition, token):
                group.close_writer(partition, token)
                return wire.Done(id)
            case wire.Renew(id, handle, partition):
                return wire.Number(id, group.renew(handle, partition))
            case wire.SendReply(id, node_id, value):
                log_.send_reply(node_id, value)
                return wire.Done(id)
            case wire.PollMailbox(id, timeout_s):
                if connection.mailbox is None:
                    raise CronlogError("no mailbox was opened on this connection")
                return wire.Mail(id, connection.mailbox.poll(timeout_s))
            case wire.OpenMailbox(id, node_id):
                if connection.mailbox is not None:
                    connection.mailbox.close()
                connection.mailbox = log_.mailbox(node_id)
                return wire.Done(id)
            case wire.Join(id, member_id):
                if connection.session is not None:
                    raise CronlogError("a member already joined on this connection")
                connection.session = group.join(member_id)
                return wire.Joined(id, connection.session)
            case wire.Leave(id):
                if connection.session is not None:
                    group.leave(connection.session)
                    connection.session = None
                return wire.Done(id)
            case wire.Members(id):
                return wire.Assignment(id, group.assignment())
            case wire.Hello(id, version):
                if version != wire.VERSION:
                    raise CronlogError(
                        f"log server {self._path} speaks version {wire.VERSION}, "
                        f"the worker {version}"
                    )
                # Served logs are in-process: an append is readable when it returns.
                return wire.Welcome(id, wire.VERSION, log_.num_partitions, True)
            case _:
                assert_never(request)


def _listen(path: Path) -> tuple[socket.socket, int]:
    """A listening socket at ``path``, mode 0600 from the moment it can be reached; its inode."""
    if len(os.fsencode(path)) > _MAX_PATH:
        raise ValueError(f"socket path {path} is longer than {_MAX_PATH} bytes")
    _clear_stale(path)
    private = Path(tempfile.mkdtemp(prefix=".log-", dir=path.parent))  # mode 0700
    bound = private / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(os.fsencode(bound)) > _MAX_PATH:
            raise ValueError(f"socket path {bound} (bound first, then moved) is too long")
        sock.bind(os.fspath(bound))
        os.chmod(bound, 0o600)
        sock.listen(128)
        os.rename(bound, path)
        return sock, os.stat(path).st_ino
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(bound)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(private)


def _clear_stale(path: Path) -> None:
    """Remove a socket file a dead server left; refuse a live server's, or any other file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise CronlogError(f"{path} exists and is not a socket; not serving the log there")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(os.fspath(path))
    except OSError:
        os.unlink(path)  # nobody answers: left by a server that died
        return
    finally:
        probe.close()
    raise CronlogError(f"a log server is already serving at {path}")


_PEER_CREDENTIALS = struct.Struct("3i")  # pid, uid, gid


def _same_user(sock: socket.socket) -> bool:
    """Whether the peer runs as this process's user (the socket's mode says so already; this
    is the second lock on the door, where the platform reports peers)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size)
    _, uid, _ = _PEER_CREDENTIALS.unpack(raw)
    return bool(uid == os.getuid())
