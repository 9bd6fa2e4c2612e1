"""One log line per decision that matters, with the ids to find it by (a herd: one line for a
team's runs fired together).

The decisions: a run **fired** (its slot came or is a lead time away, or someone triggered it:
``RunMaterialised``), was **retried** (``RetryScheduled``), **dead-lettered**
(``RunDeadLettered``), had a lease no worker received **given back** (``LeaseReturned``),
slots **skipped** (``RunSkipped``); a partition **fenced** (another
writer took it), and a partition **moved** (assigned to this node, or given up). Each is one
record of the ``cronlog.decisions`` logger at INFO whose message reads on its own in the text
format, and whose ``extra`` fields carry the ids as fields of their own in the JSON format
(``cronlog serve --log-format json``, see
:func:`formatter`)::

    {"level": "INFO", "logger": "cronlog.decisions",
     "message": "fired run nightly.1796097600000 of job nightly (team-a, partition 2): schedule",
     "decision": "fired", "job_id": "nightly", "run_id": "nightly.1796097600000",
     "tenant": "team-a", "partition": 2, "scheduled_for": 1796097600000, "trigger": "schedule",
     "time": "2026-12-01T04:00:00.012345+00:00"}

Ids are the team's own (``core.ids.team_id``) and the tenant's name: the log is the operator's,
who already sees every team; nothing of a payload or an error text is logged.

A line costs tens of microseconds, and the midnight herd is tens of thousands of runs fired
at once. So the run decisions are not logged on the partition's thread: :class:`DecisionLog`
takes each appended batch (a reference, nothing copied) and a thread of its own writes the
lines, ``LINGER_S`` at most after the append, with what the partitions appended meanwhile. A
team's runs one partition fired within those lines beyond ``FIRED_LINES_PER_BATCH`` are one
``fired`` line that names every run (``run_ids``, ``count``, the first and last slot) rather
than a line each. At a steady 2,000 runs a second each partition's batches carried a run or
two, so a line a run cost the node's interpreter 7% of its samples (``python -m
bench.sustained --profile``); gathered for ``LINGER_S``, a partition's runs make a line or two a
window. The queue is bounded; batches beyond it are dropped, counted
(``cronlog_decision_lines_dropped_total``) and said in one warning, never waited for. With the
logger above INFO nothing is queued at all. A line that fails to be written (a handler's
error) does not stop the lines after it; the failures of one writing are counted and logged
once, with the first one's traceback.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from core import events as ev
from core.ids import team_id
from node.worker import ThreadWorker

log = logging.getLogger("cronlog.decisions")
MAX_PENDING_EVENTS = 500_000  # events queued for their lines, over all batches
# A team's runs fired on a partition in one writing of lines up to this many get a line each;
# beyond it, one line names them all (a line costs 12-20 µs of the node's interpreter, a herd's
# fired in one line far less).
FIRED_LINES_PER_BATCH = 16
# How long the writing thread gathers appended batches after the first it takes, before it
# writes their lines: how late a decision's line may be.
LINGER_S = 0.25

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class DecisionLog(ThreadWorker):
    """Writes the lines of appended batches on a thread of its own (see the module): a
    service of the node (:mod:`node.supervisor`). ``stop`` writes what is queued first."""

    _thread_name = "decision-log"

    def __init__(
        self,
        *,
        on_dropped: Callable[[int], None] = lambda n: None,
        on_failed: Callable[[], None] = lambda: None,
        max_pending: int = MAX_PENDING_EVENTS,
        linger_s: float = LINGER_S,
    ) -> None:
        self._queue: queue.SimpleQueue[tuple[int, Sequence[ev.AnyEvent]] | None]
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # events queued
        self._max_pending = max_pending
        self._dropping = False
        self._on_dropped = on_dropped
        self._on_failed = on_failed
        self._linger_s = linger_s

    def appended(self, partition: int, events: Sequence[ev.AnyEvent]) -> None:
        """(On the partition's thread.) Queue ``events``, just appended, for their lines."""
        if not log.isEnabledFor(logging.INFO):
            return
        with self._lock:
            if self._pending + len(events) > self._max_pending:
                first = not self._dropping
                self._dropping = True
            else:
                self._pending += len(events)
                self._dropping = False
                self._queue.put((partition, events))
                return
        self._on_dropped(len(events))
        if first:
            log.warning(
                "decision lines are being dropped: more than %d events wait to be logged"
                " (cronlog_decision_lines_dropped_total counts them)",
                self._max_pending,
            )

    def _wake(self) -> None:
        if self.alive:
            self._queue.put(None)  # behind what is queued: that is written first

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            taken, stopping = self._gather(first)
            by_partition: dict[int, list[ev.AnyEvent]] = {}
            for partition, events in taken:
                by_partition.setdefault(partition, []).extend(events)
            try:
                for partition, events in by_partition.items():
                    write(partition, events, self._failed)
            finally:
                with self._lock:
                    self._pending -= sum(len(events) for _, events in taken)
            if stopping:
                return

    def _gather(
        self, first: tuple[int, Sequence[ev.AnyEvent]]
    ) -> tuple[list[tuple[int, Sequence[ev.AnyEvent]]], bool]:
        """``first`` and the batches queued within ``linger_s`` of it; whether ``stop`` came
        meanwhile (what is queued before it is written at once)."""
        taken = [first]
        deadline = time.monotonic() + self._linger_s
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return taken, False
            if item is None:
                return taken, True
            taken.append(item)

    def _failed(self, partition: int, error: Exception, lines: int) -> None:
        self._on_failed()
        more = f" (and {lines - 1} more of its lines in this writing)" if lines > 1 else ""
        log.error("partition %d: writing a decision line failed%s", partition, more, exc_info=error)


def write(
    partition: int,
    events: Sequence[ev.AnyEvent],
    failed: Callable[[int, Exception, int], None] | None = None,
) -> None:
    """Log the decisions among ``events``, which ``partition``'s owner appended. A team's runs
    fired together beyond ``FIRED_LINES_PER_BATCH`` (a herd's) are one line naming them all.
    A line that cannot be written does not stop the next ones; ``failed(partition, first
    error, lines that failed)`` is told once, after them (a handler that fails every line says
    so once a writing, not once a line); without it the first error is raised at once."""
    # Most events are no decision an operator follows run by run (a lease, a completion):
    # passed over by type at once, not through every case of the match below.
    events = [event for event in events if type(event) in _DECISIONS]
    herds = _herds(events)
    said: set[tuple[str, str]] = set()
    first: Exception | None = None
    failures = 0
    for event in events:
        try:
            _line(event, partition, herds, said)
        except Exception as err:
            if failed is None:
                raise
            first = first or err
            failures += 1
    if first is not None and failed is not None:
        failed(partition, first, failures)


def _line(
    event: ev.AnyEvent,
    partition: int,
    herds: dict[tuple[str, str], list[ev.RunMaterialised]],
    said: set[tuple[str, str]],
) -> None:
    match event:
        case ev.RunMaterialised():
            group = (event.tenant, event.trigger.value)
            herd = herds.get(group)
            if herd is None:
                _run("fired", event, partition, group[1], trigger=group[1])
            elif group not in said:
                said.add(group)
                _fired_together(herd, partition)
        case ev.RetryScheduled():
            _run(
                "retried",
                event,
                partition,
                f"attempt {event.attempt} in {event.delay_ms} ms",
                attempt=event.attempt,
                delay_ms=event.delay_ms,
            )
        case ev.RunDeadLettered():
            _run(
                "dead-lettered",
                event,
                partition,
                f"{event.reason.value} after attempt {event.attempt}",
                attempt=event.attempt,
                reason=event.reason.value,
            )
        case ev.LeaseReturned():
            _run(
                "lease-returned",
                event,
                partition,
                f"lease {event.fencing_token} reached no worker: given back, the run is pending",
                attempt=event.attempt,
                fencing_token=event.fencing_token,
            )
        case ev.RunSkipped():
            count = "some" if event.count is None else str(event.count)
            job_id = team_id(event.job_id)
            log.info(
                "skipped %s slot(s) of job %s (%s, partition %d): %s",
                count,
                job_id,
                event.tenant,
                partition,
                event.reason.value,
                extra={
                    "decision": "skipped",
                    "job_id": job_id,
                    "tenant": event.tenant,
                    "partition": partition,
                    "scheduled_for": event.scheduled_for,
                    "last_scheduled_for": event.last_scheduled_for,
                    "count": event.count,
                    "reason": event.reason.value,
                },
            )
        case _:
            pass  # not a decision an operator follows run by run


# The events that make a line (``_line``).
_DECISIONS: frozenset[type] = frozenset(
    (ev.RunMaterialised, ev.RetryScheduled, ev.RunDeadLettered, ev.LeaseReturned, ev.RunSkipped)
)


def _herds(events: Sequence[ev.AnyEvent]) -> dict[tuple[str, str], list[ev.RunMaterialised]]:
    """The runs fired in ``events`` by team and trigger, where a team's are more than
    ``FIRED_LINES_PER_BATCH``."""
    groups: dict[tuple[str, str], list[ev.RunMaterialised]] = {}
    for event in events:
        if isinstance(event, ev.RunMaterialised):
            groups.setdefault((event.tenant, event.trigger.value), []).append(event)
    return {group: runs for group, runs in groups.items() if len(runs) > FIRED_LINES_PER_BATCH}


def _fired_together(runs: list[ev.RunMaterialised], partition: int) -> None:
    first = runs[0]
    trigger = first.trigger.value
    run_ids = [team_id(run.run_id) for run in runs]
    slots = [run.scheduled_for for run in runs]
    log.info(
        "fired %d runs of %s (partition %d): %s: %s",
        len(runs),
        first.tenant,
        partition,
        trigger,
        " ".join(run_ids),
        extra={
            "decision": "fired",
            "run_ids": run_ids,
            "count": len(runs),
            "tenant": first.tenant,
            "partition": partition,
            "scheduled_for": min(slots),
            "last_scheduled_for": max(slots),
            "trigger": trigger,
        },
    )


def _run(decision: str, event: ev.RunEvent, partition: int, detail: str, **more: Any) -> None:
    job_id, run_id = team_id(event.job_id), team_id(event.run_id)
    log.info(
        "%s run %s of job %s (%s, partition %d): %s",
        decision,
        run_id,
        job_id,
        event.tenant,
        partition,
        detail,
        extra={
            "decision": decision,
            "job_id": job_id,
            "run_id": run_id,
            "tenant": event.tenant,
            "partition": partition,
            "scheduled_for": event.scheduled_for,
            **more,
        },
    )


def fenced(partition: int) -> None:
    log.warning(
        "partition %d: fenced, another node owns it now",
        partition,
        extra={"decision": "fenced", "partition": partition},
    )


def moved(
    node_id: str,
    partitions: Sequence[int],
    owned: Sequence[int],
    *,
    assigned: bool,
    reason: str = "",
) -> None:
    """``partitions`` assigned to this node, or given up by it (``reason``: why); ``owned``:
    what it owns now."""
    if not partitions or not log.isEnabledFor(logging.INFO):
        return
    if assigned:  # the words the chaos harness and the failover test wait for
        text = f"{node_id} owns partitions {sorted(owned)}"
    else:
        text = f"{node_id} gave up partitions {sorted(partitions)}: {reason}"
    log.info(
        text,
        extra={
            "decision": "partition moved",
            "node_id": node_id,
            "partitions": sorted(partitions),
            "owned": sorted(owned),
            "direction": "assigned" if assigned else "revoked",
            **({} if assigned else {"reason": reason}),
        },
    )


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``cronlog serve --log-format``: ``text`` (one readable line) or
    ``json`` (one JSON object a line, every record's ``extra`` fields included)."""
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    if log_format == "json":
        from pythonjsonlogger.core import RESERVED_ATTRS
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",  # RFC 3339 in UTC, to the microsecond
            # uvicorn's copy of its message with terminal colours in it
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],
        )
    raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
