"""Dependencies across partitions: tell each dependent job that an upstream job succeeded.

A job with ``depends_on`` may live in another partition than its upstream jobs, so the owner of
the upstream's partition, right after a ``RunCompleted`` is durable, sends an
``UpstreamSucceeded`` request to each dependant (found in the read model's dependants index),
through the node like any other request: to a local runner, or forwarded to the owner.

Delivery is at least once. A request that fails is retried with backoff; a node that dies
between the append and the send loses nothing either, because a new owner, once it has
recovered a partition, relays again the successes among that partition's most recent events.
Repeats are harmless: the dependant's partition ignores a success at or before the slot it last
triggered for, and records the same success twice as once. Rereading recent events decodes only
the successes (of the others only the tag is read: after a restart with a million jobs, the
recent events are mostly registrations) and passes over records that are not events,
reporting each once (``projections.decoding``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from core import events as ev
from core.commands import AnyCommand, UpstreamSucceeded
from core.errors import CronlogError, LogCorrupted, NotFound
from eventlog.port import EventLog
from node.handoff import Handoff
from projections.decoding import EventDecoder
from projections.read_model import ReadModel

log = logging.getLogger(__name__)

RECENT_EVENTS = 10_000  # how far back a new owner looks for successes to relay again
_COMPLETED = frozenset({"RunCompleted"})
ATTEMPTS = 8


class DependencyRelay:
    def __init__(
        self,
        log_: EventLog,
        history: ReadModel,
        execute: Callable[[AnyCommand], Awaitable[list[ev.AnyEvent]]],
        decoder: EventDecoder | None = None,
    ) -> None:
        self._log = log_
        self._history = history
        self._execute = execute
        self._decoder = decoder or EventDecoder("relay")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._handoff = Handoff(self._loop)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            # Relays still retrying are dropped: a new owner relays recent successes again.
            asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    async def _cancel_all(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def appended(
        self, partition: int, offsets: Sequence[int], events: Sequence[ev.AnyEvent]
    ) -> None:
        """Called by a runner after an append is durable: one hand-off per batch."""
        completed = [e for e in events if isinstance(e, ev.RunCompleted)]
        if completed:
            self._handoff.post(self._spawn, completed)

    def recovered(self, partition: int) -> None:
        """Called by a runner once it has caught up: relay recent successes again."""
        self._handoff.post(self._spawn_recent, partition)

    def _spawn(self, completed: list[ev.RunCompleted]) -> None:
        self._task(self._relay_all(completed))

    def _spawn_recent(self, partition: int) -> None:
        self._task(self._relay_recent(partition))

    def _task(self, work: Coroutine[Any, Any, None]) -> None:
        """(On the relay's loop.) Run ``work``; should it fail, say so at once rather than when
        the task is collected."""
        self._loop.create_task(work).add_done_callback(_report)

    async def _relay_recent(self, partition: int) -> None:
        end = await asyncio.to_thread(self._log.end_offset, "events", partition)
        start = await asyncio.to_thread(self._log.start_offset, "events", partition)
        offset = max(start, end - RECENT_EVENTS)
        while offset < end:
            records = await asyncio.to_thread(self._log.read_events, partition, offset, 1000)
            if not records:
                break
            # Most recent events are not successes: only their tags are read.
            decoded = (self._decoder.decode_kind(record, _COMPLETED) for record in records)
            await self._relay_all([e for e in decoded if isinstance(e, ev.RunCompleted)])
            offset = records[-1].offset + 1

    async def _relay_all(self, completed: list[ev.RunCompleted]) -> None:
        """Look the dependants of a batch's successes up in one go (most jobs have none), then
        relay to each on its own, retrying."""
        if not completed:
            return
        found = await asyncio.to_thread(self._dependants_of, completed)
        for event, dependants in found:
            self._task(self._relay(event, dependants))

    def _dependants_of(
        self, completed: list[ev.RunCompleted]
    ) -> list[tuple[ev.RunCompleted, list[str]]]:
        found = []
        for event in completed:
            dependants = self._history.dependants(event.tenant, event.job_id)
            if dependants:
                found.append((event, dependants))
        return found

    async def _relay(self, completed: ev.RunCompleted, dependants: list[str]) -> None:
        for job_id in dependants:
            command = UpstreamSucceeded(
                job_id=job_id,
                upstream_job_id=completed.job_id,
                scheduled_for=completed.scheduled_for,
            )
            for attempt in range(ATTEMPTS):
                try:
                    await self._execute(command)
                    break
                except NotFound:
                    break  # the dependant is gone
                except CronlogError as err:
                    log.info("relay to %s, attempt %d: %s", job_id, attempt + 1, err)
                    await asyncio.sleep(min(30.0, 0.5 * 2**attempt))  # a backoff, not a wait


def _report(task: asyncio.Task[None]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    failure = task.exception()
    if isinstance(failure, LogCorrupted):  # the log has failed: the node stops and says why
        log.error("dependency relay stopped: %s", failure)
        return
    log.error("dependency relay failed", exc_info=failure)
