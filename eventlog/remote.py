"""The log port over the local log server's socket: the log of a node's worker process.

``RemoteLog(path, member_id)`` is an :class:`eventlog.port.EventLog` whose every call is a
request to the :class:`eventlog.log_server.LogServer` listening at ``path`` (the parent's log);
a worker builds its node on it exactly as on the embedded or the Kafka log. ``member_id`` names
the worker in the server's group (the partitions are spread over the members in id order, see
:mod:`eventlog.group`); a membership joined under an id already in the group replaces the
member that had it, as a restarted worker replaces its predecessor.

**Threads.** Every call borrows a connection from a pool, opened on demand and kept while idle,
so threads never wait for each other's calls (a read model follower's long poll holds up no
append); see the server's module for why a connection carries one call at a time. A
membership's session and a mailbox have connections of their own.

**A server that is gone** is :class:`core.errors.Unavailable`, never a hang: connecting is
bounded by ``connect_timeout_s``, every call by ``request_timeout_s`` beyond its own wait (a
read's or a poll's ``timeout_s``). A connection whose call failed is closed, not reused: its
answer may still be on the way. An append that fails so may have been written (the runner
recovers from the log, as after any failed append). A membership whose poll failed has lost its
session: it closes it (the server, if it is there, lets the member go and fences its writers),
reports every partition ``revoked`` and raises; its next poll joins again, under the same id.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from core.errors import CronlogError, Fenced, Unavailable
from eventlog import log_wire as wire
from eventlog.port import NO_OUTBOUND, Outbound, OwnershipListener, Record

DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_REQUEST_TIMEOUT_S = 30.0  # beyond a call's own wait: a group commit on a busy disk
_IDLE_KEPT = 64  # connections kept for reuse; more concurrent callers open (and close) their own
_MAX_OFFSET = 2**64 - 1

A = TypeVar("A", bound=wire.Answer)


class _Connection:
    """One socket to the server, used by one thread at a time."""

    def __init__(self, path: str, connect_timeout_s: float) -> None:
        self._path = path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(connect_timeout_s)
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise Unavailable(f"log server {path}: cannot connect: {exc}") from exc
        self._sock = sock
        self._timeout_s = connect_timeout_s
        self._stream = sock.makefile("rb")
        self._ids = itertools.count(1)

    def ask(self, request: wire.Request, timeout_s: float) -> wire.Answer:
        """Send ``request`` and wait up to ``timeout_s`` for its answer; Unavailable (and this
        connection closed) when there is none."""
        request.id = next(self._ids)
        try:
            if timeout_s != self._timeout_s:
                self._sock.settimeout(timeout_s)
                self._timeout_s = timeout_s
            self._sock.sendall(wire.frame(request))
            payload = wire.read_frame(self._stream)
            if payload is None:
                raise ConnectionError("the server closed the connection")
            answer: wire.Answer = wire.answers.decode(payload)
        except (OSError, msgspec.DecodeError) as exc:
            self.close()
            what = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise Unavailable(f"log server {self._path}: {type(request).__name__}: {what}") from exc
        if answer.id != request.id:
            self.close()
            raise Unavailable(
                f"log server {self._path}: answer {answer.id} to request {request.id}"
            )
        return answer

    def shutdown(self) -> None:
        """Wake a thread waiting in :meth:`ask` on this connection (it raises Unavailable)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stream.close()
        self._sock.close()


def _expect(answer: wire.Answer, expected: type[A], request: wire.Request) -> A:
    if isinstance(answer, wire.Failed):
        raise wire.raised(answer)
    if not isinstance(answer, expected):
        raise CronlogError(
            f"the log server answered {type(request).__name__} with {type(answer).__name__}"
        )
    return answer


class RemoteLog:
    """``RemoteLog(path, member_id)``: the log port through the log server at ``path``.

    Thread-safe. Raises Unavailable at once when nothing answers at ``path``."""

    def __init__(
        self,
        path: str | Path,
        member_id: str,
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        if not member_id:
            raise ValueError("a member id must not be empty")
        self._path = os.fspath(path)
        self._member_id = member_id
        self._connect_timeout_s = connect_timeout_s
        self._request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._members: list[RemoteMembership] = []
        self._boxes: list[RemoteMailbox] = []
        self._closed = False
        welcome = self._ask(wire.Hello(0, wire.VERSION), wire.Welcome)
        self._num_partitions = welcome.num_partitions
        self._readable_on_return = welcome.readable_on_return

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    @property
    def member_id(self) -> str:
        return self._member_id

    def assignment(self) -> dict[str, list[int]]:
        """The group's live members and the partitions each is to own (for readiness and
        tests)."""
        return self._ask(wire.Members(0), wire.Assignment).members

    def submit(self, partition: int, value: bytes, key: bytes | None = None) -> int:
        return self._ask(wire.Submit(0, partition, value, key), wire.Number).value

    def read_events(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        return self._read("events", partition, from_offset, max_records, timeout_s)

    def read_commands(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        return self._read("commands", partition, from_offset, max_records, timeout_s)

    def end_offset(self, stream: str, partition: int) -> int:
        return self._ask(wire.EndOffset(0, stream, partition), wire.Number).value

    def start_offset(self, stream: str, partition: int) -> int:
        return self._ask(wire.StartOffset(0, stream, partition), wire.Number).value

    def join(self, listener: OwnershipListener) -> RemoteMembership:
        self._check_open()
        member = RemoteMembership(self, listener)
        with self._lock:
            self._members.append(member)
        return member

    def send_reply(self, node_id: str, value: bytes) -> None:
        self._ask(wire.SendReply(0, node_id, value), wire.Done)

    def mailbox(self, node_id: str) -> RemoteMailbox:
        self._check_open()
        box = RemoteMailbox(self, node_id)
        with self._lock:
            self._boxes.append(box)
        return box

    def close(self) -> None:
        """Leave with every membership, close every mailbox and connection."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            members, boxes = list(self._members), list(self._boxes)
        for member in members:
            member.close()
        for box in boxes:
            box.close()
        for connection in idle:
            connection.close()

    def __enter__(self) -> RemoteLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- calls ------------------------------------------------------------------------------

    def _read(
        self, stream: str, partition: int, from_offset: int, max_records: int, timeout_s: float
    ) -> list[Record]:
        request = wire.Read(0, stream, partition, from_offset, max_records, timeout_s)
        return self._ask(request, wire.Records, wait_s=timeout_s).records

    def _ask(self, request: wire.Request, expected: type[A], *, wait_s: float = 0.0) -> A:
        """One call on a borrowed connection; the server's error raised as its own class."""
        with self._lock:
            if self._closed:
                raise CronlogError(f"the remote log at {self._path} is closed")
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            connection = self._connect()
        answer = connection.ask(request, self._request_timeout_s + max(wait_s, 0.0))
        with self._lock:
            keep = not self._closed and len(self._idle) < _IDLE_KEPT
            if keep:
                self._idle.append(connection)
        if not keep:
            connection.close()
        return _expect(answer, expected, request)

    def _ask_on(
        self, connection: _Connection, request: wire.Request, expected: type[A], wait_s: float
    ) -> A:
        """One call on a connection of its own (a session's, a mailbox's)."""
        answer = connection.ask(request, self._request_timeout_s + max(wait_s, 0.0))
        return _expect(answer, expected, request)

    def _connect(self) -> _Connection:
        return _Connection(self._path, self._connect_timeout_s)

    def _forget(self, thing: RemoteMembership | RemoteMailbox) -> None:
        with self._lock:
            if isinstance(thing, RemoteMembership):
                if thing in self._members:
                    self._members.remove(thing)
            elif thing in self._boxes:
                self._boxes.remove(thing)

    def _check_open(self) -> None:
        with self._lock:
            if self._closed:
                raise CronlogError(f"the remote log at {self._path} is closed")


class RemoteWriter:
    """The writer of one partition, named on the server by its token."""

    def __init__(self, log: RemoteLog, partition: int, token: int) -> None:
        self._log = log
        self._partition = partition
        self._token = token
        self._closed = False

    @property
    def partition(self) -> int:
        return self._partition

    def append(
        self,
        events: Sequence[bytes],
        *,
        commands_through: int | None = None,
        outbound: Sequence[Outbound] = (),
    ) -> list[int]:
        if outbound:
            raise ValueError(NO_OUTBOUND)
        if self._closed:
            raise Fenced(f"writer of partition {self._partition} is closed")
        if commands_through is not None and not 0 <= commands_through <= _MAX_OFFSET:
            raise ValueError(f"commands_through {commands_through} is not an offset")
        batch = events if isinstance(events, list) else list(events)
        request = wire.Append(0, self._partition, self._token, batch, commands_through)
        return self._log._ask(request, wire.Offsets).offsets

    def wait_until_readable(self) -> None:
        if self._log._readable_on_return or self._closed:
            return
        with contextlib.suppress(CronlogError):  # only speed depends on it: it never raises
            self._log._ask(wire.WaitReadable(0, self._partition, self._token), wire.Done)

    def command_position(self) -> int:
        return self._log._ask(wire.CommandPosition(0, self._partition), wire.Number).value

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(CronlogError):  # a server that is gone closed it already
            self._log._ask(wire.CloseWriter(0, self._partition, self._token), wire.Done)

    def _closed_by_membership(self) -> None:
        """Lost with the partition: the server has closed (or fenced) it already."""
        self._closed = True


class RemoteMembership:
    """This worker's membership in the server's group; joined on construction."""

    def __init__(self, log: RemoteLog, listener: OwnershipListener) -> None:
        self._log = log
        self._listener = listener
        self._lock = threading.Lock()  # the writers and the state
        self._polling = threading.Lock()  # one poll at a time
        self._session_lock = threading.Lock()
        self._session: _Connection | None = None
        self._handle: int | None = None
        self._writers: dict[int, RemoteWriter] = {}
        self._state: Literal["member", "gone", "closed"] = "member"
        self._stopped = threading.Event()
        self._join()

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Record]:
        with self._polling:
            with self._lock:
                state = self._state
            if state == "closed":
                raise CronlogError("poll on a closed membership")
            if state == "gone":  # replaced by a newer member under this id: it owns nothing
                self._stopped.wait(timeout_s)
                return []
            handle = self._join()
            request = wire.Poll(0, handle, timeout_s, max_records)
            try:
                polled = self._log._ask(request, wire.Polled, wait_s=timeout_s)
            except Unavailable:
                self._lose_session()
                raise
            return self._apply(polled)

    def writer(self, partition: int) -> RemoteWriter:
        with self._lock:
            writer = self._writers.get(partition)
        if writer is None:
            raise Fenced(f"partition {partition} is not owned by this member")
        return writer

    def owned(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._writers)

    def others(self, timeout_s: float) -> int | None:
        return None  # the worker processes of one node stop together: nobody to hand over to

    def renew(self, partition: int) -> RemoteWriter:
        with self._lock:
            old = self._writers.get(partition)
        handle = self._handle
        if old is None or handle is None:
            raise Fenced(f"partition {partition} is not owned by this member")
        token = self._log._ask(wire.Renew(0, handle, partition), wire.Number).value
        new = RemoteWriter(self._log, partition, token)
        with self._lock:
            if self._writers.get(partition) is not old:  # revoked meanwhile
                raise Fenced(f"partition {partition} is not owned by this member")
            self._writers[partition] = new
        old._closed_by_membership()
        return new

    def close(self) -> None:
        """Revoke every partition, then leave the group (the server moves them at once)."""
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
            lost = self._drop_writers()
        self._stopped.set()
        if lost:
            self._listener.revoked(lost)
        with self._session_lock:
            session, self._session, self._handle = self._session, None, None
        if session is not None:
            with contextlib.suppress(CronlogError):
                self._log._ask_on(session, wire.Leave(0), wire.Done, 0.0)
            session.close()
        self._log._forget(self)

    # -- the session --------------------------------------------------------------------------

    def _join(self) -> int:
        """The member's handle, joining on a session connection of its own if it has none."""
        with self._session_lock:
            if self._handle is not None:
                return self._handle
            with self._lock:
                if self._state == "closed":  # closed since the poll began: never join again
                    raise CronlogError("poll on a closed membership")
            session = self._log._connect()
            try:
                joined = self._log._ask_on(
                    session, wire.Join(0, self._log.member_id), wire.Joined, 0.0
                )
            except BaseException:
                session.close()
                raise
            self._session, self._handle = session, joined.handle
            return joined.handle

    def _lose_session(self) -> None:
        """After a failed poll nothing is known of the member's standing: end its session (the
        server lets it go and fences its writers) and stop deciding for what it owned."""
        with self._session_lock:
            session, self._session, self._handle = self._session, None, None
        if session is not None:
            session.close()
        with self._lock:
            lost = self._drop_writers()
        if lost:
            self._listener.revoked(lost)

    def _apply(self, polled: wire.Polled) -> list[Record]:
        """Follow the server's moves (revocations first), then hand out the commands."""
        with self._lock:
            if self._state == "closed":  # closed while the poll was out: nothing of it holds
                return []
            if polled.gone:
                self._state = "gone"
                lost = self._drop_writers()
            else:
                lost = sorted(p for p in polled.revoked if p in self._writers)
                for partition in lost:
                    self._writers.pop(partition)._closed_by_membership()
            for partition, token in polled.assigned:
                previous = self._writers.get(partition)
                if previous is not None:
                    previous._closed_by_membership()
                self._writers[partition] = RemoteWriter(self._log, partition, token)
        if lost:
            self._listener.revoked(lost)
        if polled.assigned:
            self._listener.assigned(sorted(p for p, _ in polled.assigned))
        return polled.records

    def _drop_writers(self) -> list[int]:
        lost = sorted(self._writers)
        for writer in self._writers.values():
            writer._closed_by_membership()
        self._writers.clear()
        return lost


class RemoteMailbox:
    """The replies to one node id, on a connection of their own (reopened after a failure)."""

    def __init__(self, log: RemoteLog, node_id: str) -> None:
        self._log = log
        self._node_id = node_id
        self._lock = threading.Lock()
        self._closed = False
        self._connection: _Connection | None = self._open()

    def poll(self, timeout_s: float) -> list[bytes]:
        with self._lock:
            if self._closed:
                return []
            connection = self._connection or self._open()
            self._connection = connection
            try:
                mail = self._log._ask_on(
                    connection, wire.PollMailbox(0, timeout_s), wire.Mail, timeout_s
                )
            except Unavailable:
                self._connection = None
                if self._closed:
                    return []
                raise
            return mail.replies

    def close(self) -> None:
        self._closed = True
        connection = self._connection
        if connection is not None:
            connection.shutdown()  # a poll in flight returns; the server closes the box
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
        self._log._forget(self)

    def _open(self) -> _Connection:
        connection = self._log._connect()
        try:
            self._log._ask_on(connection, wire.OpenMailbox(0, self._node_id), wire.Done, 0.0)
        except BaseException:
            connection.close()
            raise
        return connection
