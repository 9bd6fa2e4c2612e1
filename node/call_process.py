"""Executor processes: calls to push targets made on other cores.

A midnight herd is tens of thousands of HTTP calls in a second. Made in the node's own process,
their requests and answers share one interpreter lock with the partitions' deciding, the read
model and the API, and a second core idles. With ``cronlog serve --executor-processes N`` the
executors hand each call to one of N processes, which only make calls: room, heartbeats and
outcomes stay with the node (:mod:`node.executors`), so everything the log records is decided
where it was before.

The wire, one socket pair per process, frames of a 4-byte length and a msgpack message::

    node -> process    the CallerConfig (once, pickled: the process is the node's own child)
                       Call(id, lease, spec)      make this attempt's call
                       Cancel(id)                 abandon it (the lease was lost, the run cancelled)
    process -> node    Ready()                    set up: calls are taken from now (once, first)
                       Done(id, result)           what came back, classified

The node's executors start only once every process has said it is ready (at most
``READY_TIMEOUT_S``): a process's start (an interpreter, its imports, the HTTP client) is about
0.35 s of a core at rest and seconds on a loaded machine, and a node that took partitions before
then would hold their first calls for that long (the node joins its group after its executors
start: ``Node.services``).

**A process kept for the teams with few calls.** Besides the N processes, a node starts one
more, kept for the calls of teams that hold few of the node's calls (at most a team's share of
the room kept for the others, ``node.admission``): a team's herd fills the N, and another team's
call, handed over in the middle of it, is made by a process with nothing else to do. Fair queues
inside one process are not enough: a process making a herd's calls as fast as its core lets it
runs each turn of its loop for up to a second, and a call needs five or six turns (read, start,
connect, send), so another team's call went out 1-5 s after its start however fair its turn
(measured, ``bench.flood_three``: 40,000 calls of one team due at once on three nodes). A call
of a team with few calls goes to the kept process unless that has more calls in flight than the
least busy of the N by more than ``KEPT_LEAD`` (with no herd, calls spread over all of them), and
never before it has said it is ready (the node's start does not wait for it). A team with many
calls never uses it. The lead is there because calls are armed ahead: a team's every-second jobs
keep their next seconds' calls in the kept process, waiting for their starts, and the rule of
earlier builds, "no more than the least busy", sent the next of them to a shared process that
held none yet, where another team's herd armed for the same slot could fill it before the call
was made (in ``tests/node/test_fair_defaults.py``, 5 of the few team's first calls went there;
a run of that test with the few team's call 2.6 s late may have been this). Calls
waiting for their start cost a process a timer each, so the kept process may hold a few dozen
more than the others.

A call goes to the process with the fewest calls in flight. The calls handed to a process wait
in the node, each team's in the order they came and the teams in turn (:class:`core.turns.Turns`),
and go down the socket only as the process reads them, at most ``SEND_BYTES`` buffered on the way
(the socket's kernel buffer is made that small too). The socket is a queue like any other: written
at once, a herd of one team's 13,000 calls armed ahead was megabytes in the socket, read at the
pace of a process busy making those calls, and another team's call handed over behind them
reached the process 15 s later (measured, ``bench.flood_three``); now it waits behind at most
``SEND_BYTES`` of them. A cancel of a call still waiting in the node takes it out there; of one
sent, it follows it down the socket.

A process that ends unasked (killed, crashed) is noticed at once, as its socket closes: its calls
in flight end as ambiguous failures (they may have reached their targets, so a critical run's
attempt is dead-lettered as ``outcome_unknown``, as any call whose end nobody saw), while those
still waiting in the node fail as not called (the target saw nothing); it is logged and counted,
and another process takes its place. A process whose node has gone sees its socket close and
exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from core import events as ev
from core.commands import Outcome
from core.jobs import JobSpec
from core.turns import Turns
from node.calls import COLLECTOR_THRESHOLDS, NOT_CALLED, CallerConfig, Result, call_at_start

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_HIGH_WATER = 1 << 20  # bytes buffered for a process before a writer waits for it to read
# Bytes of calls on their way to a process (the node's write buffer, and the socket's): what a
# call handed over waits behind at most, whatever the herd ahead of it. A call is about 1 KB.
SEND_BYTES = 64 * 1024
# How many calls more than the least busy of the others the kept process may hold and still take
# a call of a team with few calls (see the module).
KEPT_LEAD = 64
DONE_PER_TURN = 64  # frames read from a process in one turn of the executors' loop
RESPAWN_DELAY_S = 0.5  # before another process replaces one that ended; doubles, up to 10 s
READY_TIMEOUT_S = 30.0  # the start waits this long for the processes' Ready, then goes on


class Call(msgspec.Struct, tag="call", array_like=True):
    id: int
    lease: ev.LeaseGranted
    spec: JobSpec


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    id: int


class Done(msgspec.Struct, tag="done", array_like=True):
    id: int
    result: Result


class Ready(msgspec.Struct, tag="ready", array_like=True):
    pass


_encoder = msgspec.msgpack.Encoder()
_to_process = msgspec.msgpack.Decoder(Call | Cancel)
_to_node = msgspec.msgpack.Decoder(Done | Ready)


def _frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame, or None once the other end has closed."""
    try:
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        return await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


# -- the node's side ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Process:
    index: int
    popen: subprocess.Popen[bytes]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pending: dict[int, asyncio.Future[Result]] = field(default_factory=dict)
    reading: asyncio.Task[None] | None = None
    ready: bool = False  # it said Ready: set up, taking calls
    # Calls not sent yet, by team: (call id, frame); a call cancelled meanwhile is left out of
    # ``unsent`` and skipped when its turn comes.
    outbox: Turns[tuple[int, bytes]] = field(default_factory=Turns)
    unsent: set[int] = field(default_factory=set)
    more: asyncio.Event = field(default_factory=asyncio.Event)  # the outbox has calls
    sending: asyncio.Task[None] | None = None

    def unsent_calls(self) -> list[int]:
        """Empty the outbox: the ids of the calls never sent."""
        ids = list(self.unsent)
        self.outbox = Turns()
        self.unsent.clear()
        return ids


class CallerProcesses:
    """N executor processes, and one kept for teams with few calls (``kept``), used from the
    executors' loop."""

    def __init__(
        self,
        config: CallerConfig,
        count: int,
        on_failed: Callable[[], None] | None = None,
        *,
        kept: bool = True,
    ) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        if config.resolver is not None:
            raise ValueError("a custom resolver cannot be sent to an executor process")
        self._config = config
        self._count = count  # the processes any call may go to; the kept one is after them
        self._kept = kept
        self._on_failed = on_failed
        self._processes: list[_Process] = []
        self._ids = itertools.count(1)
        self._stopping = False
        self._failures = 0
        self._changed = asyncio.Event()  # a process said Ready, or was replaced

    @property
    def pids(self) -> list[int]:
        """The processes' pids, the kept one (if any) last."""
        return [p.popen.pid for p in self._processes]

    async def start(self) -> None:
        """Start the processes, and return once each has said it is ready (or after
        ``READY_TIMEOUT_S``, said in a warning: its calls then wait for it, as before)."""
        started = time.monotonic()
        self._processes = [
            await self._spawn(i) for i in range(self._count + (1 if self._kept else 0))
        ]
        try:
            await asyncio.wait_for(self._all_ready(), READY_TIMEOUT_S)
        except TimeoutError:
            log.warning(
                "executor processes not ready after %.0f s; going on without waiting for them",
                READY_TIMEOUT_S,
            )
            return
        log.info("%d executor process(es) ready in %.1f s", self._count, time.monotonic() - started)

    async def _all_ready(self) -> None:
        # The kept process is not waited for: until it is ready its calls go to the others.
        while not all(p.ready for p in self._processes[: self._count]):
            self._changed.clear()
            await self._changed.wait()

    async def _spawn(self, index: int) -> _Process:
        ours, theirs = socket.socketpair()
        try:
            popen = subprocess.Popen(
                [*_command(), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        reader, writer = await open_socket(ours)
        writer.write(_frame(pickle.dumps((self._config, logging.getLogger().level))))
        process = _Process(index, popen, reader, writer)
        process.reading = asyncio.create_task(self._read(process))
        process.sending = asyncio.create_task(self._send(process))
        log.debug("executor process %d started (pid %d)", index, popen.pid)
        return process

    def submit(
        self, lease: ev.LeaseGranted, spec: JobSpec, few: bool = False
    ) -> asyncio.Future[Result]:
        """Have a process make the call; the future is its result. ``few``: the call's team
        holds few calls, so it may go to the kept process (see the module). Cancelling the
        future abandons the call (the process is told)."""
        process = self._choose(few)
        call_id = next(self._ids)
        answer: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        process.pending[call_id] = answer
        process.outbox.append(
            lease.tenant, (call_id, _frame(_encoder.encode(Call(call_id, lease, spec))))
        )
        process.unsent.add(call_id)
        process.more.set()

        def abandoned(future: asyncio.Future[Result]) -> None:
            if not future.cancelled() or process.pending.pop(call_id, None) is None:
                return
            if call_id in process.unsent:
                process.unsent.discard(call_id)  # never sent: nothing to tell the process
            elif not process.writer.is_closing():
                process.writer.write(_frame(_encoder.encode(Cancel(call_id))))

        answer.add_done_callback(abandoned)
        return answer

    def _choose(self, few: bool) -> _Process:
        least = min(self._processes[: self._count], key=lambda p: len(p.pending))
        if few and len(self._processes) > self._count:  # started with the kept one
            kept = self._processes[self._count]
            if kept.ready and len(kept.pending) <= len(least.pending) + KEPT_LEAD:
                return kept
        return least

    async def call(self, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        return await self.submit(lease, spec)

    async def _send(self, process: _Process) -> None:
        """Send the process its calls as it reads them, one team after another, at most
        ``SEND_BYTES`` on the way (see the module)."""
        writer = process.writer
        try:
            while True:
                await process.more.wait()
                ids: list[int] = []
                chunk: list[bytes] = []
                size = 0
                while process.outbox and size < SEND_BYTES:
                    call_id, frame = process.outbox.popleft()
                    if call_id in process.unsent:  # else cancelled while it waited
                        ids.append(call_id)
                        chunk.append(frame)
                        size += len(frame)
                if not process.outbox:
                    process.more.clear()
                if chunk:
                    writer.write(b"".join(chunk))
                    process.unsent.difference_update(ids)
                    await writer.drain()
        except ConnectionError:
            pass  # the process ended: its reader replaces it
        except Exception:
            # Never a sender owned and dead, its calls waiting for ever: the process is ended,
            # and replaced as any that dies (its calls not sent fail as not called).
            log.exception("sending calls to executor process %d failed; ending it", process.index)
            process.popen.kill()

    async def _read(self, process: _Process) -> None:
        try:
            await self._take_answers(process)
        except Exception:
            # Never a reader owned and dead, its calls' answers never read: the process is
            # ended, and replaced as any that dies.
            log.exception("reading from executor process %d failed; ending it", process.index)
            process.popen.kill()
        if self._stopping:
            return
        await self._replace(process)

    async def _take_answers(self, process: _Process) -> None:
        taken = 0
        while (data := await _read_frame(process.reader)) is not None:
            taken += 1
            if taken == DONE_PER_TURN:
                # Outcomes read from a buffer full of them would all resume their calls' tasks
                # in one turn of the loop; a few at a time, other work comes in between (another
                # team's call handed over, which waited up to a second behind a herd's outcomes).
                taken = 0
                await asyncio.sleep(0)
            match _to_node.decode(data):
                case Done() as done:
                    answer = process.pending.pop(done.id, None)
                    if answer is not None and not answer.done():
                        answer.set_result(done.result)
                case Ready():
                    process.ready = True
                    self._changed.set()

    async def _replace(self, process: _Process) -> None:
        """A process ended unasked: end its calls, say so, and start another."""
        code = await asyncio.to_thread(_exit_code, process.popen)
        if process.sending is not None:
            process.sending.cancel()
        for call_id in process.unsent_calls():  # the process never had them: no call was made
            answer = process.pending.pop(call_id, None)
            if answer is not None and not answer.done():
                answer.set_result(Result(Outcome.FAILED, NOT_CALLED))
        lost = list(process.pending.values())
        process.pending.clear()
        for answer in lost:
            if not answer.done():
                answer.set_result(
                    Result(
                        Outcome.FAILED,
                        "the executor process ended during the call",
                        ambiguous=True,
                    )
                )
        self._failures += 1
        log.error(
            "executor process %d (pid %d) ended with %s; %d calls in flight end as ambiguous;"
            " starting another",
            process.index,
            process.popen.pid,
            code,
            len(lost),
        )
        if self._on_failed is not None:
            self._on_failed()
        process.writer.close()
        while True:
            delay = min(10.0, RESPAWN_DELAY_S * 2.0 ** min(self._failures - 1, 5))
            await asyncio.sleep(delay)  # a crash loop must not spin: a backoff, not a wait
            if self._stopping:
                return
            try:
                replacement = await self._spawn(process.index)
                break
            except Exception:  # no process, no descriptors: said, and tried again
                self._failures += 1
                log.exception("executor process %d could not be started again", process.index)
        self._processes[self._processes.index(process)] = replacement
        self._changed.set()

    async def stop(self) -> None:
        self._stopping = True
        for process in self._processes:
            process.writer.close()  # the process sees its socket close and exits
        for process in self._processes:
            for task in (process.reading, process.sending):
                if task is not None:
                    task.cancel()
            await asyncio.to_thread(_exit_code, process.popen)


async def open_socket(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The node's end of a process's socket, holding at most about ``SEND_BYTES`` on the way
    (its write buffer, and the kernel's: what a call handed over waits behind)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BYTES)
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.transport.set_write_buffer_limits(high=SEND_BYTES)
    return reader, writer


def _command() -> list[str]:
    """How a process is started (its socket's descriptor follows)."""
    return [sys.executable, "-m", "node.call_process"]


def _exit_code(popen: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int | str:
    try:
        return popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
        return "kill after it would not stop"


# -- the process's side ---------------------------------------------------------------------------


async def _serve(fd: int) -> None:
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=fd))
    setup = await _read_frame(reader)
    if setup is None:
        return
    config, level = pickle.loads(setup)  # from the node that started this process
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s[executor]: %(message)s"
    )
    from node.caller import Caller  # the HTTP client: this process's, not the node's

    caller = Caller(config)
    await caller.open()
    # What the start loaded lives as long as the process: kept out of the collector's walks,
    # and a herd's allocations run between collections (node.calls.COLLECTOR_THRESHOLDS).
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    writer.write(_frame(_encoder.encode(Ready())))
    calls: dict[int, asyncio.Task[None]] = {}

    async def run(message: Call) -> None:
        try:
            if time.time() * 1000 >= message.lease.lease_expires_at:
                # The node checked the lease when it handed the call over; taken up after it
                # ran out (a backlog here, a pause), the run may be another node's by now: no
                # call, and the target saw nothing.
                run_id = message.lease.run_id
                log.warning("run %s: its lease ran out before the call started", run_id)
                result = Result(Outcome.FAILED, NOT_CALLED)
            else:
                # A call armed ahead waits for its start here, in this process, on its own
                # timer: at the instant the node has nothing left to do for it.
                result = await call_at_start(caller, message.lease, message.spec)
        except asyncio.CancelledError:
            return  # the node abandoned it and expects nothing
        finally:
            calls.pop(message.id, None)
        writer.write(_frame(_encoder.encode(Done(message.id, result))))
        if writer.transport.get_write_buffer_size() > _HIGH_WATER:
            await writer.drain()

    while (data := await _read_frame(reader)) is not None:
        match _to_process.decode(data):
            case Call() as message:
                calls[message.id] = asyncio.create_task(run(message))
            case Cancel(id=call_id):
                task = calls.get(call_id)
                if task is not None:
                    task.cancel()
    for task in list(calls.values()):  # the node is gone: nobody can record an outcome
        task.cancel()
    with contextlib.suppress(Exception):
        await caller.close()


def main(argv: list[str]) -> None:
    fd = int(argv[1])
    try:
        import uvloop

        uvloop.run(_serve(fd))
    except ImportError:
        asyncio.run(_serve(fd))
    os._exit(0)  # no interpreter teardown for a process that only made calls


if __name__ == "__main__":
    main(sys.argv)
