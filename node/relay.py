"""Dependencies across partitions: tell each dependent job that an upstream job succeeded.

A job with ``depends_on`` may live in another partition than its upstream jobs, so the owner of
the upstream's partition, right after a ``RunCompleted`` is durable, sends an
``UpstreamSucceeded`` request to each dependant (found in every partition's dependants index,
one question a batch: ``node.history_reader``),
through the node like any other request: to a local runner, or forwarded to the owner.

Delivery is at least once, and a success is never dropped without a word. Each relay (one
success to one dependant) is tried until it is delivered or the dependant is gone
(``NotFound``), with a backoff of 0.5 s doubling to 30 s between attempts; whatever fails is
retried, an unexpected exception as much as a ``CronlogError`` (its traceback logged the first
time), except a damaged log (``LogCorrupted``), which stops the relay as it stops the node.
Short of those, a relay is given up in two cases only, each logged and counted
(``cronlog_relay_abandoned_total{reason}``):

- ``moved``: the upstream's partition is no longer owned by this node. Its new owner, once it
  has recovered the partition, relays again the successes among that partition's most recent
  events (``RECENT_EVENTS``), as it does after a node died between the append and the send;
- ``stopped``: the node stops. The partition's next owner relays again, the same way.

That reread is retried the same way while the partition is owned and the node runs, resuming
where it had got to. Repeats are harmless: the dependant's partition ignores a success at or
before the slot it last triggered for, and records the same success twice as once. Rereading
recent events decodes only the successes (of the others only the tag is read: after a restart
with a million jobs, the recent events are mostly registrations) and passes over records that
are not events, reporting each once (``projections.decoding``).

Worked example: the dependant's partition is unreachable for five minutes. The relay's attempts
at 0, 0.5, 1.5, 3.5, 7.5, 15.5 and 31.5 s fail, then one every 30 s from 61.5 s on (each
failure is an info line; the 8th, there, a warning); the 16th attempt, at 301.5 s, delivers
it. Meanwhile ``cronlog_relay_retrying`` is 1, and ``cronlog_relay_failures_total`` counts 15.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from core import events as ev
from core.commands import AnyCommand, UpstreamSucceeded
from core.errors import CronlogError, LogCorrupted, NotFound, Pruned
from eventlog.port import EventLog, Record
from node.handoff import Handoff
from node.history_reader import HistoryReader
from node.worker import ThreadWorker, backoff_s
from projections.decoding import EventDecoder

log = logging.getLogger(__name__)

RECENT_EVENTS = 10_000  # how far back a new owner looks for successes to relay again
# A busy relay looks dependants up at most this often, for every success meanwhile (_Lookups).
LOOKUP_LINGER_S = 0.5
# The successes the partitions append within this long of the first are handed to the relay's
# loop together (``DependencyRelay.appended``): at a steady rate each batch held a success or
# two, and a hand-off a batch (a wake of the loop, a task, a lookup) was 7 % of the node's main
# process at 500 runs a second. A dependant is told this much later at most.
GATHER_S = 0.05
_COMPLETED = frozenset({"RunCompleted"})
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
# Failures in a row after which a relay still failing says so at warning level (once); before
# and after, each failed attempt is an info line, at most one every MAX_BACKOFF_S per relay.
ATTEMPTS = 8

T = TypeVar("T")


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.retrying = Gauge(
            "cronlog_relay_retrying",
            "Dependency relays (an upstream's success to a dependant, a lookup of a batch's"
            " dependants, a reread of a recovered partition's recent successes) that failed and"
            " wait to try again: alert when it stays above 0.",
            registry=r,
        )
        self.failures = Counter(
            "cronlog_relay_failures",
            "Failed attempts of dependency relays (each is retried; the first unexpected"
            " failure of a relay is logged with its traceback).",
            registry=r,
        )
        self.abandoned = Counter(
            "cronlog_relay_abandoned",
            "Dependency relays given up, by reason: moved (the upstream's partition is owned"
            " elsewhere now) or stopped (the node stopped); the partition's next owner relays"
            " its recent successes again.",
            ["reason"],
            registry=r,
        )
        for reason in ("moved", "stopped"):  # shown at 0 before the first one
            self.abandoned.labels(reason)


class _Moved(Exception):
    """The partition of a relay waiting to retry is no longer owned by this node."""


class DependencyRelay(ThreadWorker):
    """The relay's asyncio loop on a thread of its own: a service of the node
    (:mod:`node.supervisor`); the loop outlives a thread that died, and a new one runs it."""

    _thread_name = "relay"

    def __init__(
        self,
        log_: EventLog,
        history: Callable[[], HistoryReader],
        execute: Callable[[AnyCommand], Awaitable[list[ev.AnyEvent]]],
        decoder: EventDecoder | None = None,
        *,
        owns: Callable[[int], bool],
        metrics: RelayMetrics | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        linger_s: float = LOOKUP_LINGER_S,
        gather_s: float = GATHER_S,
    ) -> None:
        """``history()``: where the dependants are looked up (every partition's history,
        wherever it is kept). ``owns(partition)``: whether this node owns that partition now
        (asked before each retry). ``sleep``: the backoff's wait, on the relay's loop (tests
        drive it). ``linger_s``: lookups of dependants go at most this often, each for every
        success that came meanwhile (see ``_Lookups``). ``gather_s``: how long the successes
        appended after a first are gathered before the loop takes them all (``GATHER_S``)."""
        self._log = log_
        self._history = history
        self._execute = execute
        self._decoder = decoder or EventDecoder("relay")
        self._owns = owns
        self.metrics = metrics or RelayMetrics()
        self._sleep = sleep
        self._loop = asyncio.new_event_loop()
        self._handoff = Handoff(self._loop)
        self._lookups = _Lookups(lambda asked: self._history().dependants_many(asked), linger_s)
        # The loop holds its tasks only weakly: a relay waiting on a future nothing else holds
        # would be collected mid-retry, never to finish or be counted. Held here until done.
        self._tasks: set[asyncio.Task[None]] = set()
        self._gather_s = gather_s
        self._gathered_lock = threading.Lock()
        # Appended, not yet handed over; while it holds any, their hand-off is on its way.
        self._gathered: dict[int, list[ev.RunCompleted]] = {}

    def _work(self) -> None:
        self._loop.run_forever()

    def _wake(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)

    def stop(self, timeout_s: float | None = None) -> None:
        if self.alive:
            # Relays unfinished are given up (each counted): a new owner relays recent
            # successes again.
            unfinished = asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result(10)
            unfinished += self._drop_gathered()
            if unfinished:
                log.warning(
                    "dependency relay stopped with %d relays unfinished; the partitions' next"
                    " owners relay their recent successes again",
                    unfinished,
                )
        super().stop(timeout_s)
        self._loop.close()

    async def _cancel_all(self) -> int:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    def appended(
        self, partition: int, offsets: Sequence[int], events: Sequence[ev.AnyEvent]
    ) -> None:
        """Called by a runner after an append is durable. Its successes are gathered with
        those the partitions append in the next ``gather_s``, and the loop takes them together:
        one relay of each partition's successes, one lookup of their dependants."""
        completed = [e for e in events if isinstance(e, ev.RunCompleted)]
        if not completed:
            return
        with self._gathered_lock:
            first = not self._gathered
            self._gathered.setdefault(partition, []).extend(completed)
        if not first:
            return
        try:
            self._handoff.post(self._take_gathered_later)
        except RuntimeError:  # the loop is closed: said to the runner, as before
            self._drop_gathered()
            raise

    def _take_gathered_later(self) -> None:
        self._loop.call_later(self._gather_s, self._take_gathered)

    def _take_gathered(self) -> None:
        with self._gathered_lock:
            gathered, self._gathered = self._gathered, {}
        for partition, completed in gathered.items():
            self._spawn(partition, completed)

    def _drop_gathered(self) -> int:
        """(The node stops.) The successes gathered and not handed over, as relays given up:
        the partitions' next owners relay their recent successes again."""
        with self._gathered_lock:
            gathered, self._gathered = self._gathered, {}
        for _ in gathered:
            self.metrics.abandoned.labels("stopped").inc()
        return len(gathered)

    def recovered(self, partition: int) -> None:
        """Called by a runner once it has caught up: relay recent successes again."""
        self._handoff.post(self._spawn_recent, partition)

    def _spawn(self, partition: int, completed: list[ev.RunCompleted]) -> None:
        what = f"relay of {len(completed)} successes of partition {partition}"
        self._task(partition, what, partial(self._relay_all, partition, completed))

    def _spawn_recent(self, partition: int) -> None:
        what = f"reread of partition {partition}'s recent successes"
        self._task(partition, what, partial(self._relay_recent, partition, what))

    def _task(self, partition: int, what: str, work: Callable[[], Awaitable[None]]) -> None:
        """(On the relay's loop.) Run ``work()``, counting it given up if its partition moves
        away or the node stops; should it fail otherwise, say so at once rather than when the
        task is collected."""
        task = self._loop.create_task(self._unless_moved(partition, what, work), name=what)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    async def _unless_moved(
        self, partition: int, what: str, work: Callable[[], Awaitable[None]]
    ) -> None:
        try:
            await work()
        except _Moved:
            self.metrics.abandoned.labels("moved").inc()
            log.warning(
                "%s given up: partition %d is no longer owned here; its new owner relays its"
                " recent successes again",
                what,
                partition,
            )

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():  # the node stops (counted here: a task may end before it began)
            self.metrics.abandoned.labels("stopped").inc()
            return
        failure = task.exception()
        if failure is None:
            return
        if isinstance(failure, LogCorrupted):  # the log has failed: the node stops and says why
            log.error("dependency relay stopped: %s: %s", task.get_name(), failure)
            return
        log.error("%s failed", task.get_name(), exc_info=failure)

    async def _retried(self, partition: int, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` until it returns, with a backoff after each failure. Raises ``_Moved``
        when, after a failure, ``partition`` is no longer owned here, and ``LogCorrupted`` at
        once."""
        failures = 0
        unexpected = 0
        try:
            while True:
                try:
                    return await attempt()
                except LogCorrupted:
                    raise  # the log has failed: the node stops
                except CronlogError as err:
                    failures += 1
                    level = logging.WARNING if failures == ATTEMPTS else logging.INFO
                    log.log(level, "%s failed (%d in a row), retrying: %s", what, failures, err)
                except Exception as err:
                    failures += 1
                    unexpected += 1
                    if unexpected == 1:  # a bug, most likely: its traceback, once
                        log.exception("%s failed (%d in a row), retrying", what, failures)
                    else:
                        log.warning("%s failed (%d in a row), retrying: %r", what, failures, err)
                if failures == 1:
                    self.metrics.retrying.inc()
                self.metrics.failures.inc()
                await self._sleep(backoff_s(failures, FIRST_BACKOFF_S, MAX_BACKOFF_S))
                if not self._owns(partition):
                    raise _Moved(what)
        finally:
            if failures:
                self.metrics.retrying.dec()

    async def _relay_recent(self, partition: int, what: str) -> None:
        end = await self._retried(
            partition, what, partial(asyncio.to_thread, self._log.end_offset, "events", partition)
        )
        start = await self._retried(
            partition,
            what,
            partial(asyncio.to_thread, self._log.start_offset, "events", partition),
        )
        offset = max(start, end - RECENT_EVENTS)
        while offset < end:
            offset, records = await self._retried(
                partition, what, partial(self._read, partition, offset)
            )
            if not records:
                break
            # Most recent events are not successes: only their tags are read.
            decoded = (self._decoder.decode_kind(record, _COMPLETED) for record in records)
            await self._relay_all(partition, [e for e in decoded if isinstance(e, ev.RunCompleted)])
            offset = records[-1].offset + 1

    async def _read(self, partition: int, offset: int) -> tuple[int, list[Record]]:
        """Up to 1000 events from ``offset``, or from the partition's start if retention has
        removed ``offset`` meanwhile; that start and the events."""
        try:
            return offset, await asyncio.to_thread(self._log.read_events, partition, offset, 1000)
        except Pruned as gone:
            if gone.start <= offset:
                raise
            log.warning(
                "partition %d: events %d to %d were pruned before the relay reread them",
                partition,
                offset,
                gone.start - 1,
            )
            start = gone.start
        return start, await asyncio.to_thread(self._log.read_events, partition, start, 1000)

    async def _relay_all(self, partition: int, completed: list[ev.RunCompleted]) -> None:
        """Look the dependants of a batch's successes up in one go (most jobs have none), then
        relay to each on its own, retrying."""
        if not completed:
            return
        found = await self._retried(
            partition,
            f"lookup of the dependants of {len(completed)} successes of partition {partition}",
            partial(self._dependants_of, completed),
        )
        for event, dependants in found:
            for job_id in dependants:
                command = UpstreamSucceeded(
                    job_id=job_id,
                    upstream_job_id=event.job_id,
                    scheduled_for=event.scheduled_for,
                )
                what = f"relay of {event.run_id}'s success to {job_id}"
                self._task(partition, what, partial(self._relay, partition, what, command))

    async def _dependants_of(
        self, completed: list[ev.RunCompleted]
    ) -> list[tuple[ev.RunCompleted, list[str]]]:
        upstreams = [(event.tenant, event.job_id) for event in completed]
        dependants = await self._lookups.ask(upstreams)
        return [(e, dependants[e.job_id]) for e in completed if e.job_id in dependants]

    async def _relay(self, partition: int, what: str, command: UpstreamSucceeded) -> None:
        await self._retried(partition, what, partial(self._send, command))

    async def _send(self, command: UpstreamSucceeded) -> None:
        with contextlib.suppress(NotFound):  # the dependant is gone
            await self._execute(command)


class _Lookups:
    """Lookups of dependants, coalesced (on the relay's loop). Where history is kept with its
    partition each lookup is a question to every partition owned elsewhere, so one per batch of
    successes would be one per run at a steady rate: the successes that arrive while a lookup
    is under way, or within ``linger_s`` of the last, go together in the next one. An idle
    relay asks at once; a busy one at most every ``linger_s``."""

    def __init__(
        self,
        ask: Callable[[list[tuple[str, str]]], Awaitable[dict[str, list[str]]]],
        linger_s: float,
    ) -> None:
        self._ask = ask
        self._linger_s = linger_s
        self._pending: dict[tuple[str, str], None] = {}
        self._round: asyncio.Future[dict[str, list[str]]] | None = None
        self._running: asyncio.Task[None] | None = None
        self._last = float("-inf")

    async def ask(self, upstreams: list[tuple[str, str]]) -> dict[str, list[str]]:
        self._pending.update(dict.fromkeys(upstreams))
        if self._round is None:
            loop = asyncio.get_running_loop()
            self._round = loop.create_future()
            # held here: the loop holds its tasks only weakly
            self._running = loop.create_task(self._run(self._round))
        return await asyncio.shield(self._round)

    async def _run(self, done: asyncio.Future[dict[str, list[str]]]) -> None:
        loop = asyncio.get_running_loop()
        wait = self._last + self._linger_s - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        asked, self._pending, self._round = list(self._pending), {}, None
        try:
            done.set_result(await self._ask(asked))
        except BaseException as err:  # every waiter's own retry tries again
            done.set_exception(err)
            done.exception()  # retrieved here: a round nobody awaits any more is not an error
        finally:
            self._last = loop.time()
