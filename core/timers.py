"""Which timers a partition needs armed, derived from its state.

Three kinds of timer, keyed so that re-arming replaces:

``("slot", job_id)``   the job's next slot is due, or is a lead time away (``slot_timer``):
                       decide ``SlotDue``;
``("lease", run_id)``  a lease may have run out: decide ``LeaseDue``;
``("ready", run_id)``  a run for a push target (HTTP, Kafka topic) may start: the node's
                       executor asks to lease it (``StartRun``). Pull runs need no timer:
                       workers claim them;
``("ask", run_id)``    a run's target is to be asked what became of its attempt
                       (``RunOutcomeAsked.ask_at``): the node's executors ask its status
                       URL and report the answer (``AnswerOutcome``);
``("answer", run_id)`` that ask's deadline (``answer_by``): decide ``AnswerDue``;
``("forget", job_id)`` the job ended (``ended_at``) a retention ago: decide ``ForgetDue``.
                       The retention is the partition's setting, so these are armed by
                       :func:`forget_timer`, not here.

:func:`timers_after` says what one event changes; :func:`all_timers` rebuilds every timer of a
state, which is how a new owner fills its wheel after catching up the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import assert_never

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
from core.jobs import OverlapPolicy, reach_ahead_ms
from core.state import JobStatus, PartitionState, RunState, RunStatus, ended_at

TimerKey = tuple[str, str]
# (key, deadline): a deadline of None cancels the timer
TimerChange = tuple[TimerKey, Millis | None]


def slot_timer(
    state: PartitionState, job_id: str, lead_ms: int = 0, reach_ms: int = 0
) -> TimerChange:
    """The job's slot timer as its state stands: its next slot, or None (cancel it); a lead
    time ahead of it while the job has no live run, or, under the ``allow`` overlap policy,
    once the start of its latest live run is its reach away (``core.jobs.reach_ahead_ms``: the
    arming time for a push job that is not critical; else: has come). ``core.decide``
    materialises the next slot ahead only then, one at a time, so such a job's runs are
    materialised, and their calls armed, ``reach_ms`` ahead of now."""
    return _slot_timer(state, job_id, lead_ms, reach_ms)


def _slot_timer(
    state: PartitionState, job_id: str, lead_ms: int = 0, reach_ms: int = 0
) -> TimerChange:
    job = state.jobs.get(job_id)
    if job is None or job.status is not JobStatus.ACTIVE or job.next_slot is None:
        return (("slot", job_id), None)
    if lead_ms and not job.live:
        return (("slot", job_id), job.next_slot - lead_ms)
    if lead_ms and job.spec.overlap_policy is OverlapPolicy.ALLOW:
        # The slot runs whatever is live; the runs materialised ahead must have come within the
        # reach of their start first. No live run is ahead of its slot once every live run's
        # available_at has come (a run's slot, and a start leased ahead, are never after its
        # available_at).
        latest = max(state.runs[run_id].available_at for run_id in job.live)
        reach = reach_ahead_ms(job.spec, reach_ms)
        return (
            ("slot", job_id),
            min(job.next_slot, max(job.next_slot - lead_ms, latest - reach)),
        )
    return (("slot", job_id), job.next_slot)


def _ready_timer(state: PartitionState, run: RunState) -> list[TimerChange]:
    job = state.jobs.get(run.job_id)
    if (
        job is None
        or job.spec.pool is not None  # a pull target: its pool's workers claim the run
        or run.status is not RunStatus.PENDING
    ):
        return [(("ready", run.run_id), None)]
    return [(("ready", run.run_id), run.available_at)]


def timers_after(
    state: PartitionState, event: AnyEvent, lead_ms: int = 0, reach_ms: int = 0
) -> list[TimerChange]:
    """The timer changes ``event`` calls for; ``state`` has already folded it. With a lead
    time the slot timer also moves when the job's live runs come and go (``slot_timer``)."""
    match event:
        case JobUpdated():
            # A new target may move its pending runs between the executors and a pool.
            changes = [_slot_timer(state, event.job_id, lead_ms, reach_ms)]
            for run_id in state.jobs[event.job_id].live:
                changes += _ready_timer(state, state.runs[run_id])
            return changes
        case JobRegistered() | JobResumed() | RunSkipped():
            return [_slot_timer(state, event.job_id, lead_ms, reach_ms)]
        case JobPaused() | JobCancelled():
            return [(("slot", event.job_id), None)]
        case RunMaterialised():
            changes = [_slot_timer(state, event.job_id, lead_ms, reach_ms)]
            run = state.runs.get(event.run_id)
            if run is not None:
                changes += _ready_timer(state, run)
            return changes
        case RunReleased() | RetryScheduled():
            run = state.runs.get(event.run_id)
            changes = _ready_timer(state, run) if run is not None else []
            if lead_ms:  # a live run's start moved: under ``allow``, so does the slot timer
                changes.append(_slot_timer(state, event.job_id, lead_ms, reach_ms))
            return changes
        case RunReplayed():
            run = state.runs.get(event.run_id)
            changes = _ready_timer(state, run) if run is not None else []
            if lead_ms:  # live again: the next slot is decided at the slot
                changes.append(_slot_timer(state, event.job_id, lead_ms, reach_ms))
            return changes
        case LeaseGranted() | Heartbeat():
            return [
                (("ready", event.run_id), None),
                (("lease", event.run_id), event.lease_expires_at),
            ]
        case RunCompleted() | RunDeadLettered():
            changes = [(("ready", event.run_id), None), (("lease", event.run_id), None)]
            changes += _no_ask(event.run_id)
            if lead_ms:  # perhaps the last live run: the next slot may be materialised ahead
                changes.append(_slot_timer(state, event.job_id, lead_ms, reach_ms))
            return changes
        case LeaseExpired():
            return [(("ready", event.run_id), None), (("lease", event.run_id), None)]
        case LeaseReturned():
            run = state.runs.get(event.run_id)
            changes = [(("lease", event.run_id), None)]
            return changes + (_ready_timer(state, run) if run is not None else [])
        case RunCancelled():
            if event.was_running:  # keep the lease timer: it clears the cancelled run
                changes = [(("ready", event.run_id), None)]
            else:  # pending, or asking (a run cancelled while its target was asked)
                changes = [(("ready", event.run_id), None), (("lease", event.run_id), None)]
                changes += _no_ask(event.run_id)
            if lead_ms or event.reason is CancelReason.WITHDRAWN:  # the next slot moved
                changes.append(_slot_timer(state, event.job_id, lead_ms, reach_ms))
            return changes
        case RunOutcomeAsked():
            return [
                (("ask", event.run_id), event.ask_at),
                (("answer", event.run_id), event.answer_by),
            ]
        case RunOutcomeAnswered():
            return _no_ask(event.run_id)
        case RunFailed():
            # The attempt ended: its lease is gone (a retry or dead letter follows as its own
            # event). Left armed, the timer would fire for a run that holds no lease.
            return [(("lease", event.run_id), None)]
        case UpstreamRecorded() | RunStarted():
            return []
        case JobForgotten():
            return [(("slot", event.job_id), None)]
        case _:
            assert_never(event)


def _no_ask(run_id: str) -> list[TimerChange]:
    return [(("ask", run_id), None), (("answer", run_id), None)]


def forget_timer(state: PartitionState, job_id: str, retention_ms: int) -> TimerChange:
    """When the job may be forgotten: a retention after it ended (None: it has not ended, or
    is gone)."""
    job = state.jobs.get(job_id)
    if job is None or job.ended_at is None:
        return (("forget", job_id), None)
    return (("forget", job_id), job.ended_at + retention_ms)


def all_timers(
    state: PartitionState, retention_ms: int | None = None, lead_ms: int = 0, reach_ms: int = 0
) -> Iterator[tuple[TimerKey, Millis]]:
    """Every timer ``state`` calls for; the forget timers too when ``retention_ms`` is given."""
    for job in state.jobs.values():
        key, deadline = _slot_timer(state, job.job_id, lead_ms, reach_ms)
        if deadline is not None:
            yield key, deadline
        if retention_ms is not None and (ended := ended_at(state, job)) is not None:
            yield ("forget", job.job_id), ended + retention_ms
    yield from run_timers(state)


def run_timers(state: PartitionState) -> Iterator[tuple[TimerKey, Millis]]:
    """The lease, ready and ask timers of every run ``state`` holds."""
    for run in state.runs.values():
        if run.lease_expires_at is not None:
            yield ("lease", run.run_id), run.lease_expires_at
        if run.status is RunStatus.ASKING and run.ask_at is not None:
            # a new owner asks at once what its predecessor was asking
            yield ("ask", run.run_id), run.ask_at
        if run.answer_by is not None:
            yield ("answer", run.run_id), run.answer_by
        for key, deadline in _ready_timer(state, run):
            if deadline is not None:
                yield key, deadline
