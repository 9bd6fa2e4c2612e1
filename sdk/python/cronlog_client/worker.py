"""A pull worker: claim runs of a pool, run a handler on each, heartbeat, complete.

::

    from cronlog_client import AsyncClient, RunContext, Worker

    async def export(run: RunContext) -> None:
        await copy_table(run.payload["table"], idempotency_key=run.idempotency_key)

    async def main() -> None:
        async with AsyncClient() as cronlog:
            await Worker(cronlog, "exports", export, concurrency=4).run()

A plain function works too (it runs in a thread): ``def export(run): ...``; and
``Worker(...).run_blocking()`` runs the worker without an event loop of your own.

What the worker does for the handler:

- **Claims long-poll** (``wait_sec``, 20 s by default): an idle worker holds one request open
  and is answered the moment a run of its pool is ready, so it neither spins nor sees a run a
  poll interval late.
- **Claims reach ahead** (``ahead_sec``, 5 s by default, 15 s for a worker whose ``concurrency``
  is 1,000 or more, time for the node to lease a herd before its slot): a run due within that
  long is leased ahead, and the worker holds it and starts the handler at the run's start
  instant, never before: it waits ``start_in_ms`` (the node's word for how far off the start is)
  from the moment the answer arrived, so no clock of the worker's is read and a worker whose
  clock runs ahead cannot start early; it starts late by at most the answer's way from the node.
  Before the start it asks whether the lease still holds (a heartbeat that only checks, decided
  without writing anything): ``check_ahead_ms`` (3 s) before it when the claim's answer says
  so, the node answering 1.5 s before the start; else ``check_sec`` (1 s) before it. A cancel
  decided before the check is answered, or a pause or a schedule change decided 1.5 s or more
  before the start, withdraws the run and it is not started; a cancel decided after it reaches
  the run as a running run's cancel does, at its first heartbeat. The start is reported
  with the first heartbeat after it, or with the outcome, so the node's scheduling delay
  measures the start, not the lease. The runs held to one instant are checked together (a
  thousand a request) and their tasks made before it, so at the instant only the handlers begin,
  with the interpreter's cycle collector off until they all have (:meth:`_starts_without_gc`):
  50,000 runs held by two worker processes on a 2-core machine started with p50 0.11-0.15 s
  and p99 0.21-0.26 s, their checks held by the node (``bench/results/perfherd.md``). A node
  that does not take ``ahead_sec`` (older than it) is claimed from without it, for the
  worker's life.
- **Heartbeats** every third of the lease with the run's fencing token. The beats of the runs
  the worker holds that come due together go in one ``POST /v1/runs:heartbeat`` (a beat
  waits 5 ms for others, and behind a request in flight until it is answered,
  ``heartbeat_linger_sec`` at most, 50 ms by default; 1,000 a request at most), each
  answered for its run alone (``beats.py``): a worker holding thousands of runs makes a few
  requests a second, not one a run. The first beats of runs started together are spread at
  ``heartbeat_spread_per_sec`` (2,000 a second, within half a period): a herd's runs would
  otherwise all beat in the same instant, every period. A node without that endpoint is sent
  one heartbeat a request, as before. A heartbeat answered 409 (``lease_lost``) means stop:
  the lease was reclaimed (the run is someone else's now) or the run was cancelled
  (``run.cancelled``). The handler learns it at once: an async handler is cancelled
  (``asyncio.CancelledError`` inside it), and ``run.lost`` is set for a plain one, which
  should look at it (or call ``run.check()``) between steps. Nothing is completed for a lost
  run. A heartbeat that could not be delivered (after a few tries while the lease lasts) is
  logged, and the next one goes a period later.
- **Completes** with the token: returning is success; raising is failure, retried by the
  job's policy. Raise :class:`PermanentFailure` for what retrying cannot fix (it
  dead-letters), :class:`RetryLater` to say when the next attempt may start. The outcomes of
  runs that finish together go in one ``POST /v1/runs:complete`` (``complete_batch``
  outcomes at most; one waits ``complete_linger_sec``, 5 ms by default, for others, and none
  when every run the worker holds has finished or it is stopping); each is answered for its
  run alone, as a single completion would be (``completions.py``).
- **The run's timeout** (``timeout_sec`` of the job) cancels an async handler and fails the
  attempt as ``ambiguous`` (it may have taken effect); a plain handler is told through
  ``run.lost`` and its result is not waited for.
- **Stops gracefully**: :meth:`Worker.stop` (SIGTERM and SIGINT under :meth:`run` when
  ``handle_signals``) stops claiming and lets the handlers in flight finish, for at most
  ``drain_sec``; one still running then is cancelled and failed as ``ambiguous``, so its run
  is retried without waiting for the lease to run out.
- **Concurrency**: up to ``concurrency`` runs at once; it claims only as many as it has room
  for, up to ``MAX_CLAIM`` (the node's limit) a claim, claiming again at once while room is
  left. A run's slot is free again once its outcome is answered.

A claim answered 429 waits its ``Retry-After``; an unreachable node or a 503 is tried again
after a backoff (doubling up to ``MAX_BACKOFF_S``). A 401 ends :meth:`run` with the error: no
retry fixes a token the node does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import inspect
import logging
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from cronlog_client import errors
from cronlog_client.beats import Beater
from cronlog_client.client import AsyncClient
from cronlog_client.completions import MAX_BACKOFF_S, Completer, Settled, Sleep
from cronlog_client.models import ClaimedRun, Completion

log = logging.getLogger("cronlog_client.worker")

MAX_CLAIM = 1000  # the most runs the node leases in one claim (100 before leases ahead)
OLD_MAX_CLAIM = 100
MAX_COMPLETE_BATCH = 1000  # the most outcomes the node takes in one POST /v1/runs:complete
# How far ahead a claim reaches by default: far enough that a herd is leased before its slot
# (a node materialises runs 30 s ahead), near enough that a run held ahead seldom keeps a small
# worker's room from a run ready now (a pause is withdrawn all the same, up to the check).
DEFAULT_AHEAD_SEC = 5.0
# ... and for a worker with room for a herd (HERD_CONCURRENCY runs or more), far enough for the
# node to lease it: a 2-core node leases about 5,000 runs a second (bench/results/perfherd.md,
# "A herd's checks and starts"), so 50,000 runs due at once take it some ten seconds.
HERD_CONCURRENCY = 1000
HERD_AHEAD_SEC = 15.0
MAX_AHEAD_SEC = 300.0  # the node's bound (the longest lead time)
MAX_CHECK_SEC = 1.0  # the node withdraws a run leased ahead up to 1.5 s before its start
SPREAD_BEATS_PER_SEC = 2000.0  # the rate a herd's first heartbeats are spread at
DEFAULT_CHECK_SEC = 1.0  # a run leased ahead: its lease is checked this long before its start

Handler = Callable[["RunContext"], Awaitable[Any]] | Callable[["RunContext"], Any]


class PermanentFailure(Exception):
    """Retrying cannot help: the run is dead-lettered now."""


class RetryLater(Exception):
    """Fail this attempt; the next may start no sooner than ``after_sec`` from now."""

    def __init__(self, after_sec: float, message: str = "") -> None:
        super().__init__(message or f"retry in {after_sec:g} s")
        self.after_sec = after_sec


class RunLost(Exception):
    """Raised by :meth:`RunContext.check` once the lease is lost: stop working on the run."""


@dataclass
class RunContext:
    """What a handler gets: the claimed run, and what it learns while it works."""

    run: ClaimedRun
    worker_id: str
    lost: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False  # set with ``lost`` when the run was cancelled (not reclaimed)
    reason: str = ""
    # leased ahead: how late it started, until a heartbeat or the outcome has said so
    _started_late_ms: int | None = None
    _settled: bool = False  # held ahead: started, or its room given back

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def job_id(self) -> str:
        return self.run.job_id

    @property
    def payload(self) -> Any:
        return self.run.payload

    @property
    def attempt(self) -> int:
        return self.run.attempt

    @property
    def scheduled_for(self) -> dt.datetime:
        return self.run.scheduled_for

    @property
    def fencing_token(self) -> int:
        return self.run.fencing_token

    @property
    def idempotency_key(self) -> str:
        return self.run.idempotency_key

    def headers(self) -> dict[str, str]:
        """Headers for what the work calls, so a target using ``cronlog_client.target``
        ignores a repeat of this slot and refuses an attempt older than the newest it saw."""
        return {
            "Idempotency-Key": self.run.idempotency_key,
            "X-Cronlog-Run-Id": self.run.run_id,
            "X-Cronlog-Attempt": str(self.run.attempt),
            "X-Cronlog-Fencing-Token": str(self.run.fencing_token),
        }

    def check(self) -> None:
        """Raise :class:`RunLost` if the lease was lost (reclaimed, cancelled, timed out)."""
        if self.lost.is_set():
            raise RunLost(self.reason or f"run {self.run_id}: the lease was lost")

    def _lose(self, reason: str, cancelled: bool = False) -> None:
        self.reason, self.cancelled = reason, cancelled
        self.lost.set()


class Worker:
    """Runs ``handler`` on the runs of ``pool``; see the module's docstring."""

    def __init__(
        self,
        client: AsyncClient,
        pool: str,
        handler: Handler,
        *,
        worker_id: str | None = None,
        concurrency: int = 1,
        wait_sec: float = 20.0,
        drain_sec: float = 30.0,
        complete_batch: int = MAX_COMPLETE_BATCH,
        complete_linger_sec: float = 0.005,
        heartbeat_linger_sec: float = 0.05,
        heartbeat_spread_per_sec: float = SPREAD_BEATS_PER_SEC,
        ahead_sec: float | None = None,
        check_sec: float = DEFAULT_CHECK_SEC,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if ahead_sec is None:
            ahead_sec = DEFAULT_AHEAD_SEC if concurrency < HERD_CONCURRENCY else HERD_AHEAD_SEC
        if not 0 <= ahead_sec <= MAX_AHEAD_SEC:
            raise ValueError(f"ahead_sec must be between 0 and {MAX_AHEAD_SEC}")
        if not 0 <= check_sec <= MAX_CHECK_SEC:
            # A pause or change withdraws a run leased ahead only while its start is 1.5 s
            # away or more: a check sent closer to the start always sees it.
            raise ValueError(f"check_sec must be between 0 and {MAX_CHECK_SEC}")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 1 <= complete_batch <= MAX_COMPLETE_BATCH:
            raise ValueError(f"complete_batch must be between 1 and {MAX_COMPLETE_BATCH}")
        if complete_linger_sec < 0:
            raise ValueError("complete_linger_sec must not be negative")
        if heartbeat_linger_sec < 0:
            raise ValueError("heartbeat_linger_sec must not be negative")
        if heartbeat_spread_per_sec <= 0:
            raise ValueError("heartbeat_spread_per_sec must be positive")
        self.client = client
        self.pool = pool
        self.handler = handler
        self._async_handler = inspect.iscoroutinefunction(handler)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.concurrency = concurrency
        self.ahead_sec = ahead_sec
        self.check_sec = check_sec
        self.withdrawn = 0  # runs leased ahead, withdrawn before their start (not started)
        self.wait_sec = wait_sec
        self.drain_sec = drain_sec
        self._stopping = asyncio.Event()
        self._free = concurrency  # room for runs not claimed yet
        self._freed = asyncio.Event()
        self._running: set[asyncio.Task[Any]] = set()  # handlers, and tasks holding runs ahead
        self._cut = False  # the drain's time is up: the handlers still running are cancelled
        self._answering = 0  # outcomes handed to the completer, not answered yet
        self._instants: dict[float, asyncio.Future[None]] = {}  # instants waited for
        self._holds: dict[float, list[RunContext]] = {}  # runs held to a start not checked yet
        self._max_claim = MAX_CLAIM
        self.completed = 0  # runs this worker completed (succeeded or failed)
        self.lost = 0  # runs it gave up because the lease was lost
        self.refused = 0  # outcomes the node refused or that could not be delivered (logged)
        self._completer = Completer(
            client,
            max_batch=complete_batch,
            linger_sec=complete_linger_sec,
            held=lambda: len(self._running) + self._answering,
            sleep=sleep,
        )
        self._beater = Beater(client, linger_sec=heartbeat_linger_sec, sleep=sleep)
        self._spread_per_sec = heartbeat_spread_per_sec
        self._first_beats_until = 0.0  # the loop's time the first beats spread so far end
        self._gc_paused = 0  # start instants whose handlers are still beginning
        self._gc_was_on = False  # the collector was on before the first of them

    @property
    def complete_requests(self) -> int:
        """How many ``POST /v1/runs:complete`` requests the worker has made."""
        return self._completer.requests

    @property
    def heartbeat_requests(self) -> int:
        """How many ``POST /v1/runs:heartbeat`` requests the worker has made."""
        return self._beater.requests

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once the handlers in flight have finished (or
        ``drain_sec`` has passed) and their outcomes are sent. Safe to call from a signal
        handler of the loop."""
        self._stopping.set()
        # The heartbeats are not hurried: the handlers still draining need their leases.
        self._completer.hurry()
        for instant in self._instants.values():  # runs held ahead: not to be started now
            if not instant.done():
                instant.set_result(None)
        self._instants.clear()

    async def run(self, *, handle_signals: bool = False) -> None:
        """Claim and handle runs until :meth:`stop`."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        sending = asyncio.ensure_future(self._completer.run())
        beating = asyncio.ensure_future(self._beater.run())
        try:
            await self._claim_until_stopped()
        finally:
            try:
                await self._drain()
            finally:
                try:
                    await self._completer.close(sending)
                finally:
                    await self._beater.close(beating)
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    def run_blocking(self) -> None:
        """:meth:`run` in an event loop of its own, stopping on SIGTERM or SIGINT."""
        asyncio.run(self.run(handle_signals=True))

    async def _claim_until_stopped(self) -> None:
        failures = 0
        while not self._stopping.is_set():  # each turn waits: for room, a claim or a backoff
            if self._free == 0:
                self._freed.clear()
                await self._until(self._freed)
                continue
            room = min(self._free, self._max_claim)
            self._free -= room
            runs: list[ClaimedRun] = []
            received = 0.0
            try:
                runs = await self._claim(room)
                received = asyncio.get_running_loop().time()
                failures = 0
            except errors.InvalidRequest as e:
                if e.field == "limit" and self._max_claim > OLD_MAX_CLAIM:
                    self._max_claim = OLD_MAX_CLAIM  # a node before leases ahead
                elif e.field == "ahead_sec" and self.ahead_sec:
                    log.info("the node does not lease runs ahead (%s): claiming without", e)
                    self.ahead_sec = 0.0
                else:
                    raise
            except (errors.Unreachable, errors.Unavailable) as e:
                failures += 1
                log.warning("claim failed (%d in a row): %s", failures, e)
                await self._pause(min(MAX_BACKOFF_S, 0.5 * 2 ** (failures - 1)))
            except errors.RateLimited as e:
                await self._pause(e.retry_after or 1.0)
            finally:
                self._free += room - len(runs)
            now: list[RunContext] = []
            for run in runs:
                if run.start_in_ms > 0:
                    self._hold(run, received)
                else:
                    now.append(RunContext(run, self.worker_id))
            self._start(now)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _until(self, event: asyncio.Event) -> None:
        """Until ``event`` is set or the worker is stopping."""
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stopping.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _claim(self, room: int) -> list[ClaimedRun]:
        claim = asyncio.ensure_future(
            self.client.claim(
                self.pool,
                self.worker_id,
                limit=room,
                wait_sec=self.wait_sec,
                ahead_sec=self.ahead_sec,
            )
        )
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({claim, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if claim.done():
            return claim.result()
        # Stopping while the claim waits: drop it. The node stops waiting for a claim whose
        # connection closed before it leases anything more; a lease granted in the instant
        # between runs out and the run is retried.
        claim.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await claim
        return []

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _drain(self) -> None:
        if not self._running:
            return
        _, late = await asyncio.wait(set(self._running), timeout=self.drain_sec)
        self._cut = True  # a handler cancelled from here on: the worker stopped before it finished
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)

    # -- one run ----------------------------------------------------------------------------

    def _hold(self, run: ClaimedRun, received: float) -> None:
        """Hold a run leased ahead until its start, ``start_in_ms`` from ``received`` (the
        loop's time its answer came), with the others held to the same instant: one task
        holds them all, checks their leases together and starts them together, where a task
        a run cost a herd's fifty thousand runs a wake-up each at the check, at its answer and
        at the start."""
        start = round(received + run.start_in_ms / 1000, 3)
        held = self._holds.get(start)
        if held is None:
            held = self._holds[start] = []
            self._spawn(self._held(start, held))
        held.append(RunContext(run, self.worker_id))

    async def _held(self, start: float, held: list[RunContext]) -> None:
        """The runs held to ``start``: their leases checked ``check_sec`` before it (those
        withdrawn meanwhile are not started), then each one's task made, to begin its
        handler at the instant (:meth:`_gated`). Runs leased to the same instant
        after the check has gone are held by another task, which checks them at once. A bug
        on the way is logged, and the runs not yet started give their room back (their leases
        run out and they are retried): a task holding runs never ends without a word."""
        try:
            await self._check_and_start(start, held)
        except Exception:
            if self._holds.get(start) is held:
                del self._holds[start]  # no run may join a group nobody will start
            unsettled = [c for c in held if not c._settled]
            log.exception(
                "%d runs held to their start could not be started (their leases run out)",
                len(unsettled),
            )
            self._release(len(unsettled))

    async def _check_and_start(self, start: float, held: list[RunContext]) -> None:
        # A node that holds early checks says how long before the start to send them; it
        # answers each once the start is 1.5 s away, so a herd's checks are read before that
        # and answered together. Another is checked ``check_sec`` before the start.
        ahead_ms = held[0].run.check_ahead_ms
        await self._instant(start - max(self.check_sec, ahead_ms / 1000))
        if self._holds.get(start) is held:
            del self._holds[start]  # from here on the group takes no more runs
        if self._stopping.is_set():
            self._not_started(held, "the worker is stopping")
            return
        answers = await self._beater.check_many(
            [(c.run_id, c.fencing_token, start + c.run.lease_sec) for c in held],
            held=ahead_ms > 0,
        )
        kept: list[RunContext] = []
        for context, answer in zip(held, answers, strict=True):
            if answer.how == "lost":
                self.withdrawn += 1
                log.info("run %s: withdrawn before its start: %s", context.run_id, answer.reason)
                context._settled = True
                self._release(1)
                continue
            if answer.how == "undelivered":  # the lease is ours: start, and hear of it by beating
                log.warning(
                    "run %s: its lease could not be checked: %s", context.run_id, answer.reason
                )
            kept.append(context)
        if self._stopping.is_set():
            self._not_started(kept, "the worker is stopping")
            return
        # Each run's task is made now, waiting for the instant: at the instant only the
        # handlers begin, all the bookkeeping done before it.
        self._start(kept, (self._instant(start), start))

    def _not_started(self, held: list[RunContext], why: str) -> None:
        for context in held:
            log.info("run %s: %s; not started (its lease runs out)", context.run_id, why)
            context._settled = True
        self._release(len(held))

    def _release(self, runs: int) -> None:
        """Room for ``runs`` more."""
        if runs:
            self._free += runs
            self._freed.set()

    def _instant(self, at: float) -> asyncio.Future[None]:
        """A future done at ``at`` (the loop's time, to the millisecond) or when the worker
        stops: one timer for every run held to the same instant, where a herd's ten thousand
        runs each timing out a wait of their own cost the loop a third of a second at it."""
        key = round(at, 3)
        instant = self._instants.get(key)
        if instant is None:
            loop = asyncio.get_running_loop()
            instant = self._instants[key] = loop.create_future()

            def come() -> None:
                if self._instants.pop(key, None) is not None and not instant.done():
                    instant.set_result(None)

            loop.call_at(key, come)
        return instant

    def _start(
        self, contexts: list[RunContext], gate: tuple[asyncio.Future[None], float] | None = None
    ) -> None:
        """Start the handler on each run: now, or with ``gate`` (a future done at the start
        instant, and that instant) once it is done. A task a run, and for the runs that share
        a lease and a timeout one timer for their first heartbeats and one for their timeout,
        where a timer of each a run cost a herd's start two heap entries a run. (Most runs end
        long before a third of their lease: the heartbeats begin only for those still
        running then.)"""
        if not contexts:
            return
        loop = asyncio.get_running_loop()
        started = loop.time() if gate is None else gate[1]
        if gate is not None:
            # before the tasks wait on it: this callback runs first at the instant
            gate[0].add_done_callback(self._starts_without_gc)
        together: dict[tuple[float, float], _Started] = {}
        for context in contexts:
            run = context.run
            key = (heartbeat_every(run.lease_sec), run.timeout_sec)
            group = together.get(key)
            if group is None:
                group = together[key] = _Started(started)
                group.first_beat = loop.call_at(started + key[0], self._first_beats, group)
                group.deadline = loop.call_at(started + key[1], self._time_out, group)
            if gate is not None:
                work = loop.create_task(self._gated(context, *gate))
            elif self._async_handler:
                work = loop.create_task(self.handler(context))  # type: ignore[arg-type]
            else:
                work = loop.create_task(self._call(context))
            context._settled = True  # its room is the task's to give back now
            running = _Running(context, work, group)
            group.running.add(running)
            self._running.add(work)
            work.add_done_callback(partial(self._finished, running))

    def _starts_without_gc(self, gate: asyncio.Future[None]) -> None:
        """(At a start instant, before the handlers held to it begin.) The interpreter's cycle
        collector waits until they all have: tens of thousands of handlers beginning allocate
        enough to set off a full collection, which walks every object the worker holds (each
        run's task among them) and stood every start behind it for about a tenth of a second
        (50,000 runs, two workers: p99 528-827 ms, 252 ms without). The runs' tasks are all
        woken already; a callback queued now runs after each has begun, and puts the collector
        back. Nothing is collected meanwhile that reference counting does not free; a collector
        the application turned off stays off."""
        if self._gc_paused == 0:
            self._gc_was_on = gc.isenabled()
            gc.disable()
        self._gc_paused += 1
        asyncio.get_running_loop().call_soon(self._gc_back)

    def _gc_back(self) -> None:
        self._gc_paused -= 1
        if self._gc_paused == 0 and self._gc_was_on:
            gc.enable()

    async def _gated(self, context: RunContext, gate: asyncio.Future[None], at: float) -> Any:
        """The handler on a run leased ahead, begun once ``gate`` is done (at ``at``, the
        loop's time of its start), noting how late; :data:`_NOT_STARTED` when the worker
        stopped first."""
        await gate
        if self._stopping.is_set():
            return _NOT_STARTED
        late = asyncio.get_running_loop().time() - at
        context._started_late_ms = max(0, round(late * 1000))
        if self._async_handler:
            return await self.handler(context)
        return await self._call(context)

    def _first_beats(self, group: _Started) -> None:
        """A third of the lease after the group's start: heartbeats for those still running,
        their first ones spread (:func:`first_beat_delays`) after those of the groups spread
        before, so that a herd's runs, started together in groups of a claim each, do not all
        beat in the same instant ever after."""
        beating = [r for r in group.running if not r.work.done() and r.beats is None]
        if not beating:
            return
        every = heartbeat_every(beating[0].context.run.lease_sec)
        now = asyncio.get_running_loop().time()
        queued_for = max(0.0, self._first_beats_until - now)
        delays = first_beat_delays(len(beating), every, self._spread_per_sec, queued_for)
        # never past the latest a first beat may wait: starts sustained above the rate would
        # otherwise push it ever further, and every later group's beats to that latest
        self._first_beats_until = now + min(
            every / 2, queued_for + len(beating) / self._spread_per_sec
        )
        for running, after in zip(beating, delays, strict=True):
            running.beats = asyncio.ensure_future(
                self._heartbeat(running.context, running.work, group.started, after=after)
            )

    def _time_out(self, group: _Started) -> None:
        """The job's timeout after the group's start: cancel the handlers still running."""
        for running in list(group.running):
            if not running.work.done():
                running.timed_out = True
                running.context._lose(f"timed out after {running.context.run.timeout_sec:g} s")
                running.work.cancel()

    def _finished(self, running: _Running, work: asyncio.Task[Any]) -> None:
        """The handler ended: its outcome goes to the node (none for a lost lease), and the
        run's room is free once the node has answered it."""
        self._running.discard(work)
        group = running.group
        group.running.discard(running)
        if not group.running:  # the group's timers have nobody left to look at
            group.first_beat.cancel()
            group.deadline.cancel()
        if running.beats is not None:
            running.beats.cancel()
        context = running.context
        if not work.cancelled() and work.exception() is None and work.result() is _NOT_STARTED:
            self._not_started([context], "the worker is stopping")
            return
        outcome = _outcome(running, self._cut)
        if outcome is None:
            self.lost += 1
            log.info("run %s: lease lost (%s); not completed", context.run_id, context.reason)
            self._release(1)
            return
        status, error, permanent, ambiguous, retry_after_sec = outcome
        completion = Completion(
            run_id=context.run_id,
            fencing_token=context.fencing_token,
            status="succeeded" if status == "succeeded" else "failed",
            error=error,
            permanent=permanent,
            ambiguous=ambiguous,
            retry_after_sec=retry_after_sec,
            started_late_ms=context._started_late_ms,
        )
        self._answering += 1
        self._completer.add(completion).add_done_callback(self._answered)

    def _answered(self, settled: asyncio.Future[Settled]) -> None:
        self._answering -= 1
        match settled.result():  # logged there, for its run
            case "completed":
                self.completed += 1
            case "lost":
                self.lost += 1
            case "refused" | "undelivered":
                self.refused += 1
        self._release(1)

    async def _call(self, context: RunContext) -> Any:
        if self._async_handler:
            return await self.handler(context)
        result = await asyncio.to_thread(self.handler, context)
        if inspect.isawaitable(result):
            return await result
        return result

    async def _heartbeat(
        self, context: RunContext, work: asyncio.Future[Any], started: float, after: float = 0.0
    ) -> None:
        """Beat every third of the lease, the first one ``after`` seconds from now (a third
        after ``started``, the loop's time the run began), until the work ends."""
        lease_sec = context.run.lease_sec
        every = heartbeat_every(lease_sec)
        loop = asyncio.get_running_loop()
        # When the lease runs out, as far as this worker can tell: the claim's answer came a
        # moment after the lease was granted (which counts from the start for a run leased
        # ahead), and a heartbeat's extension starts no sooner than it was asked. A beat not
        # delivered by then is given up.
        lease_ends = started + lease_sec
        first = True
        while not work.done():  # one beat a third of a lease; ends with the work
            if not first:
                await asyncio.sleep(every)
            elif after > 0:
                await asyncio.sleep(after)
            first = False
            if work.done():
                return
            asked = loop.time()
            late, context._started_late_ms = context._started_late_ms, None  # said once
            answer = await self._beater.beat(
                context.run_id, context.fencing_token, until=lease_ends, started_late_ms=late
            )
            if answer.how == "extended":
                lease_ends = asked + lease_sec
            elif answer.how == "lost":
                context._lose(answer.reason, cancelled=answer.cancelled)
                work.cancel()
                return
            else:
                log.warning("run %s: heartbeat not delivered: %s", context.run_id, answer.reason)


def heartbeat_every(lease_sec: float) -> float:
    """How often a run's lease is extended: a third of it (at least 0.2 s apart)."""
    return max(0.2, lease_sec / 3)


def first_beat_delays(
    runs: int, every: float, per_sec: float = SPREAD_BEATS_PER_SEC, queued_for: float = 0.0
) -> list[float]:
    """How long from now each of ``runs`` started together waits for its first heartbeat: one
    after another at ``per_sec`` a second, after ``queued_for`` seconds of first beats already
    spread, and never later than half a period (so a run's first beat is asked within half its
    lease, as before within a third). A herd of 10,000 runs of a 30 s lease beats over 5 s at
    2,000 a second, not all in one instant every 10 s; 60 runs over 30 ms, one batch still."""
    latest = every / 2
    return [min(latest, queued_for + i / per_sec) for i in range(runs)]


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@dataclass(eq=False, slots=True)
class _Started:
    """Runs started together that share a lease and a timeout: their two timers."""

    started: float  # the loop's time they started
    running: set[_Running] = field(default_factory=set)  # those whose handler has not ended
    first_beat: asyncio.TimerHandle = field(init=False)
    deadline: asyncio.TimerHandle = field(init=False)


@dataclass(eq=False, slots=True)
class _Running:
    """One run whose handler runs: its task, its heartbeats once they begin."""

    context: RunContext
    work: asyncio.Task[Any]
    group: _Started
    beats: asyncio.Task[None] | None = None
    timed_out: bool = False


_NOT_STARTED = object()  # what a run held to its start answers when the worker stopped first
Outcome = tuple[str, str, bool, bool, float | None]  # status, error, permanent, ambiguous, retry


def _outcome(running: _Running, cut: bool) -> Outcome | None:
    """What to report of a run whose handler ended (None: the lease is gone, nothing to report).
    ``cut``: the worker was stopping and cancelled the handlers still running."""
    work, context = running.work, running.context
    timed_out: Outcome = ("failed", context.reason, False, True, None)
    outcome: Outcome | None
    if work.cancelled():
        if running.timed_out:
            outcome = timed_out
        elif context.lost.is_set():
            outcome = None  # the lease is gone: nothing to complete
        elif cut:  # the worker is stopping and the handler did not finish in time
            outcome = ("failed", "the worker stopped before it finished", False, True, None)
        else:  # the handler's own work was cancelled: an attempt that did not finish
            outcome = ("failed", "the handler was cancelled", False, True, None)
    else:
        error = work.exception()
        if error is None:
            # a handler that swallowed its timeout's cancellation still timed out
            outcome = timed_out if running.timed_out else ("succeeded", "", False, False, None)
        elif isinstance(error, PermanentFailure):
            outcome = ("failed", _describe(error), True, False, None)
        elif isinstance(error, RetryLater):
            outcome = ("failed", _describe(error), False, False, error.after_sec)
        elif isinstance(error, RunLost):
            outcome = None
        else:  # the handler's failure is the run's, retried by its policy
            log.warning("run %s failed: %s", context.run_id, _describe(error))
            outcome = ("failed", _describe(error), False, False, None)
    if context.lost.is_set() and outcome is not None and outcome[0] == "succeeded":
        return None  # it finished, but the lease had gone: not ours to report
    return outcome
