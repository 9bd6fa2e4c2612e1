"""A team's own scheduling figures, a minute at a time: what the status UI plots.

The node's Prometheus metrics span every team and name none (``node/metrics.py``), so a team
cannot be shown its own delay from them. The read model folds every partition's events on every
node, so it keeps, per team and per minute of decision time (``event.at``), a :class:`Minute`:

- the **scheduling delay** of each scheduled run's first start (the ``lateness_ms`` of its
  first ``LeaseGranted``: start minus slot), as counts in :data:`DELAY_BOUNDS_MS` buckets, with
  their sum and maximum. Manual triggers and dependency runs are left out, as a backfill of past
  slots would otherwise read as hours of delay;
- **outcomes**: runs that succeeded, went to the dead letters or were cancelled, attempts that
  failed (a lease that ran out counts as a failed attempt), retries scheduled, slots skipped.

Quantiles are read from the buckets the way Prometheus' ``histogram_quantile`` does (linear
within the bucket the rank falls in), the top bucket capped at the maximum seen, so p99 of a
minute with one 7 ms start reads 7 ms, not the bucket's 10 ms bound.

A worked example: a team whose job fires every second for a minute, each start 3 ms after its
slot, and one failure that is retried: the minute holds ``delay[2] == 60`` (the 2-5 ms
bucket), ``started == 60``, ``failed == 1``, ``retried == 1``, ``succeeded == 60``; its p50
interpolates inside 2-5 ms and is capped at the 3 ms maximum.

Minutes older than :data:`RETENTION_MS` before the newest one of a team are deleted as the
team's newest minute moves on (a range delete, once an hour at most), so a team's figures stay
within about 20,000 keys whatever the node's age.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import assert_never

import msgspec

from core.clock import Millis
from core.events import (
    AnyEvent,
    CancelReason,
    Heartbeat,
    JobCancelled,
    JobForgotten,
    JobPaused,
    JobRegistered,
    JobResumed,
    JobUpdated,
    LeaseExpired,
    LeaseGranted,
    LeaseReturned,
    RetryScheduled,
    RunCancelled,
    RunCompleted,
    RunDeadLettered,
    RunFailed,
    RunMaterialised,
    RunOutcomeAnswered,
    RunOutcomeAsked,
    RunReleased,
    RunReplayed,
    RunSkipped,
    RunStarted,
    UpstreamRecorded,
)

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
RETENTION_MS = 14 * 24 * HOUR_MS
# Upper bounds (inclusive) of the delay buckets; one more bucket holds what lies beyond.
DELAY_BOUNDS_MS = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 300_000,
)  # fmt: skip
OUTCOMES = ("succeeded", "failed", "retried", "dead", "cancelled", "skipped")


class Minute(msgspec.Struct, kw_only=True, gc=False):
    """One team's figures for one minute (or, merged, for several)."""

    delay: list[int] = msgspec.field(default_factory=lambda: [0] * (len(DELAY_BOUNDS_MS) + 1))
    delay_sum_ms: int = 0
    delay_max_ms: int = 0
    started: int = 0  # scheduled runs' first starts: the delay's sample count
    succeeded: int = 0
    failed: int = 0  # attempts
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    skipped: int = 0  # slots


def minute_of(at: Millis) -> Millis:
    return at - at % MINUTE_MS


def observe(minute: Minute, event: AnyEvent, *, first_scheduled_start: bool) -> bool:
    """Count ``event`` into ``minute``; False when it counts for nothing (the caller then need
    not store the minute). ``first_scheduled_start``: a ``LeaseGranted`` that is the first start
    of a scheduled run, so its lateness is a scheduling delay."""
    match event:
        case LeaseGranted() | RunStarted():
            # a lease granted ahead counts at its reported start (RunStarted), not at the grant
            if not first_scheduled_start:
                return False
            late = (
                event.lateness_ms
                if isinstance(event, LeaseGranted)
                else event.started_at - event.scheduled_for
            )
            delay = max(0, late)
            minute.delay[_bucket(delay)] += 1
            minute.delay_sum_ms += delay
            minute.delay_max_ms = max(minute.delay_max_ms, delay)
            minute.started += 1
        case RunCompleted():
            minute.succeeded += 1
        case RunFailed() | LeaseExpired():
            minute.failed += 1
        case RetryScheduled():
            minute.retried += 1
        case RunDeadLettered():
            minute.dead += 1
        case RunCancelled():
            if event.reason is not CancelReason.WITHDRAWN:  # withdrawn: never a run to count
                minute.cancelled += 1
        case RunSkipped():
            # A long outage of a per-second job is one skip too many to count cheaply: it is
            # at least one slot.
            minute.skipped += event.count or 1
        case (
            JobRegistered()
            | JobUpdated()
            | JobPaused()
            | JobResumed()
            | JobCancelled()
            | RunMaterialised()
            | RunReleased()
            | Heartbeat()
            | RunReplayed()
            | UpstreamRecorded()
            | JobForgotten()
            | RunOutcomeAsked()
            | RunOutcomeAnswered()
            | LeaseReturned()  # rare (a claim's answer lost): its grant stays counted
        ):
            return False
        case _:
            assert_never(event)
    return True


def _bucket(delay_ms: int) -> int:
    for i, bound in enumerate(DELAY_BOUNDS_MS):
        if delay_ms <= bound:
            return i
    return len(DELAY_BOUNDS_MS)


def merged(minutes: Iterable[Minute]) -> Minute:
    """The figures of several minutes as one."""
    out = Minute()
    for m in minutes:
        out.delay = [a + b for a, b in zip(out.delay, m.delay, strict=True)]
        out.delay_sum_ms += m.delay_sum_ms
        out.delay_max_ms = max(out.delay_max_ms, m.delay_max_ms)
        for name in ("started", *OUTCOMES):
            setattr(out, name, getattr(out, name) + getattr(m, name))
    return out


def quantile(minute: Minute, q: float) -> float | None:
    """The ``q`` quantile (0 < q < 1) of the delay in ms, or None without samples."""
    total = sum(minute.delay)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(minute.delay):
        if count and seen + count >= rank:
            lower = 0 if i == 0 else DELAY_BOUNDS_MS[i - 1]
            upper = DELAY_BOUNDS_MS[i] if i < len(DELAY_BOUNDS_MS) else minute.delay_max_ms
            upper = min(upper, minute.delay_max_ms)
            lower = min(lower, upper)
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
    return float(minute.delay_max_ms)
