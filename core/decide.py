"""``decide``: given a partition's state, one command and the time, the events to append.

``decide`` reads the state and never changes what :meth:`PartitionState.snapshot` encodes (it may
tidy the derived ``ready`` index). A command it refuses raises a :mod:`core.errors` error and
decides nothing. The caller appends the events and folds each through ``evolve``.

The run lifecycle (seed 2's state diagram, plus what production needs)::

    slot due ─► pending ─► running ─► (completed) ◄────────────┐ succeeded
       │  ▲        ▲          │                               │
       │  │        └─ retry ◄─┤ failed or lease expired,    asking ◄─┐ in progress,
       │  │           ▲       │ attempts remain               │  └───┘ no answer
       │  │           └───────┼─── failed, never seen ◄───────┤
       │  │                   ├─► asking: a critical run's   │
       │  │                   │   unknown outcome, its target │
       │  │                   │   can say (core.asking)       │
       │  └─ released         ├─► dead ─► (replayed) ─► pending ◄┘ unknown, asks run out
       │                      │   exhausted, permanent, or a critical run's unknown outcome
       └─► blocked (buffer_one)
    any live run ─► cancelled (a running one keeps its lease record until it runs out,
                                so the worker's next heartbeat learns of it)
    running ─► pending, same attempt: its lease reached no worker and was given back
               (``ReturnLease``: the claim's answer came after its asker stopped waiting)

Timers (``SlotDue``, ``LeaseDue``, ``AnswerDue``) come from the partition's timing wheel. The
wheel is an index, not the truth: a timer that no longer matches the state decides nothing.
"""

from __future__ import annotations

import heapq
from typing import TypedDict, assert_never

from core.asking import ASK_LIMIT, ASK_WAIT_MS, ask_delay_ms, can_ask
from core.clock import Millis
from core.commands import (
    AnswerDue,
    AnswerOutcome,
    AnyCommand,
    CancelJob,
    CancelRun,
    ClaimRuns,
    CompleteRun,
    ForgetDue,
    HeartbeatRun,
    LeaseDue,
    Outcome,
    PauseJob,
    PutJob,
    ReplayRun,
    ResumeJob,
    ReturnLease,
    SlotDue,
    StartRun,
    TriggerRun,
    UpstreamSucceeded,
)
from core.cron import suppressed_since_previous
from core.errors import Conflict, InvalidDefinition, LeaseLost, NotFound
from core.events import (
    AnyEvent,
    CancelReason,
    DeadReason,
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
    OutcomeAnswer,
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
    SkipReason,
    Trigger,
    UpstreamRecorded,
)
from core.ids import team_id
from core.jobs import (
    JobSpec,
    MisfirePolicy,
    OverlapPolicy,
    PullTarget,
    count_slots,
    first_slot,
    in_window,
    is_log_job_id,
    jitter_ms,
    judged,
    last_slots,
    next_slot,
    reach_ahead_ms,
    retry_delay_ms,
    slots_between,
)
from core.state import (
    JobState,
    JobStatus,
    PartitionState,
    RunState,
    RunStatus,
    compact_spec,
    ended_at,
    promote_due,
)

MAX_SLOTS_PER_DECISION = 1000  # a longer backlog continues on the next timer
MAX_CLAIM = 1000  # runs one claim may lease: a herd leased ahead in few requests
MAX_HORIZON_MS = 300_000  # a claim reaches at most this far ahead (the longest lead time)
# A pause or schedule change withdraws a push run's armed call only this long before its start
# at least: the time the node's executors are given to drop it.
ARM_GUARD_MS = 500
# ... and a run leased ahead to a pull worker only this long before its start at least: the
# partition answers its worker's check of the lease only once it has decided past this instant
# (an earlier check is held until then, ``node.runner``), so a run withdrawn is never started.
CHECK_GUARD_MS = 1_500
# A worker is asked (``check_ahead_ms`` in the claim's answer) to check a run leased ahead this
# long before its start: the partition holds a check that comes before CHECK_GUARD_MS and
# answers it at that instant (``node.runner``), so a herd's checks are read before it and
# answered together, whatever the worker's timing.
CHECK_AHEAD_MS = 3_000


def run_id_of(job_id: str, scheduled_for: Millis) -> str:
    """A run's id is its identity, (job, slot): two decisions for one slot name one run."""
    return f"{job_id}.{scheduled_for}"


def job_id_of_run(run_id: str) -> str:
    return run_id.rpartition(".")[0]


def decide(state: PartitionState, command: AnyCommand, now: Millis) -> list[AnyEvent]:
    match command:
        case PutJob():
            return _put_job(state, command, now)
        case PauseJob():
            return _pause(state, command, now)
        case ResumeJob():
            return _resume(state, command, now)
        case CancelJob():
            return _cancel_job(state, command, now)
        case TriggerRun():
            return _trigger(state, command, now)
        case ClaimRuns():
            return _claim(state, command, now)
        case StartRun():
            return _start(state, command, now)
        case HeartbeatRun():
            return _heartbeat(state, command, now)
        case CompleteRun():
            return _complete(state, command, now)
        case ReturnLease():
            return _return_lease(state, command, now)
        case AnswerOutcome():
            return _answered(state, command, now)
        case CancelRun():
            return _cancel_run(state, command, now)
        case ReplayRun():
            return _replay(state, command, now)
        case UpstreamSucceeded():
            return _upstream(state, command, now)
        case SlotDue():
            return _slot_due(
                state, command.job_id, now, command.through, command.reach_ms, command.critical
            )
        case LeaseDue():
            return _lease_due(state, command.run_id, now)
        case AnswerDue():
            return _answer_due(state, command.run_id, now)
        case ForgetDue():
            return _forget_due(state, command, now)


# -- lookups -----------------------------------------------------------------------------------


def _job(state: PartitionState, job_id: str, tenant: str | None) -> JobState:
    job = state.jobs.get(job_id)
    if job is None or (tenant is not None and job.spec.tenant != tenant):
        raise NotFound(f"job {team_id(job_id)} not found")
    return job


def _run(state: PartitionState, run_id: str, tenant: str | None) -> RunState:
    run = state.runs.get(run_id)
    if run is None or (tenant is not None and run.tenant != tenant):
        raise NotFound(f"run {team_id(run_id)} not found")
    return run


class _RunIds(TypedDict):
    at: Millis
    job_id: str
    tenant: str
    run_id: str
    scheduled_for: Millis
    attempt: int
    fencing_token: int


def _ids(run: RunState, now: Millis, attempt: int | None = None) -> _RunIds:
    """The fields every run event carries, for ``run`` as it stands."""
    return _RunIds(
        at=now,
        job_id=run.job_id,
        tenant=run.tenant,
        run_id=run.run_id,
        scheduled_for=run.scheduled_for,
        attempt=attempt or run.attempt,
        fencing_token=run.fencing_token,
    )


def _check_version(job: JobState, expected: int | None) -> None:
    if expected is not None and expected != job.version:
        raise Conflict(f"job {team_id(job.job_id)} is at version {job.version}, not {expected}")


def _not_cancelled(job: JobState) -> None:
    if job.status is JobStatus.CANCELLED:
        raise Conflict(f"job {team_id(job.job_id)} is cancelled")


def _live_lease(run: RunState, token: int) -> None:
    """The lease of ``token`` is live until the partition decides it expired (``LeaseExpired``),
    not at the instant it could: until then no other lease of the run exists, so the holder's
    heartbeat or outcome is still the truth. (A stalled log or a busy partition can hold the
    expiry back; refusing an outcome then would turn a success into a retry, or into
    ``outcome_unknown`` for a critical job.)"""
    if run.status is RunStatus.CANCELLED and run.fencing_token == token:
        raise LeaseLost(f"run {team_id(run.run_id)} was cancelled: stop working on it")
    if run.status is not RunStatus.RUNNING or run.fencing_token != token:
        raise LeaseLost(
            f"fencing token {token} does not hold the lease on run {team_id(run.run_id)}"
        )


# -- jobs --------------------------------------------------------------------------------------

_WHEN_FIELDS = ("schedule", "run_at", "interval_sec", "start_at", "end_at", "timezone")


def next_slot_after_update(
    old: JobSpec, new: JobSpec, next_slot: Millis | None, now: Millis
) -> Millis | None:
    """The next slot of a job whose definition changes from ``old`` to ``new`` at ``now``: a
    change of when it fires starts it afresh, any other change keeps the slot it had. (The API's
    preview of a change asks this too, so what it shows is what an update decides.)"""
    if any(getattr(new, f) != getattr(old, f) for f in _WHEN_FIELDS):
        return first_slot(new, now)
    return next_slot


def _put_job(state: PartitionState, cmd: PutJob, now: Millis) -> list[AnyEvent]:
    if not is_log_job_id(cmd.job_id, cmd.spec.tenant):
        raise InvalidDefinition("job_id", f"{cmd.job_id!r} is not a job id of {cmd.spec.tenant}")
    spec = judged(cmd.spec)
    job = state.jobs.get(cmd.job_id)
    if job is None:
        if cmd.expected_version not in (None, 0):
            raise Conflict(f"job {team_id(cmd.job_id)} does not exist yet")
        return [
            JobRegistered(
                at=now,
                job_id=cmd.job_id,
                tenant=spec.tenant,
                spec=spec,
                next_slot=first_slot(spec, now),
            )
        ]
    if job.spec.tenant != spec.tenant:
        raise NotFound(f"job {team_id(cmd.job_id)} not found")
    _not_cancelled(job)
    if job.spec == compact_spec(spec):  # as the state holds a definition
        return []  # an upsert of the same definition changes nothing
    if cmd.create_only:
        raise Conflict(f"job {team_id(cmd.job_id)} exists with another definition")
    _check_version(job, cmd.expected_version)
    slot = next_slot_after_update(job.spec, spec, job.next_slot, now)
    events: list[AnyEvent] = []
    if any(getattr(spec, f) != getattr(job.spec, f) for f in _WHEN_FIELDS):
        # A run materialised ahead of a slot of the old schedule is taken back: the old
        # schedule's slot that has not come yet does not run.
        events += [_withdrawn(run, now, slot) for run in _ahead_runs(state, job, now)]
    return [
        *events,
        JobUpdated(
            at=now,
            job_id=job.job_id,
            tenant=spec.tenant,
            spec=spec,
            version=job.version + 1,
            next_slot=slot,
        ),
    ]


def _pause(state: PartitionState, cmd: PauseJob, now: Millis) -> list[AnyEvent]:
    job = _job(state, cmd.job_id, cmd.tenant)
    _not_cancelled(job)
    _check_version(job, cmd.expected_version)
    if job.status is JobStatus.PAUSED:
        return []
    # A run materialised ahead of its slot is taken back: paused, the job's slot does not run,
    # and its next slot goes back to that run's slot (recorded as skipped if resumed late).
    events = _withdraw_ahead(state, job, now)
    events.append(
        JobPaused(at=now, job_id=job.job_id, tenant=job.spec.tenant, version=job.version + 1)
    )
    return events


def _resume(state: PartitionState, cmd: ResumeJob, now: Millis) -> list[AnyEvent]:
    job = _job(state, cmd.job_id, cmd.tenant)
    _not_cancelled(job)
    _check_version(job, cmd.expected_version)
    if job.status is JobStatus.ACTIVE:
        return []
    events: list[AnyEvent] = []
    slot = job.next_slot
    if slot is not None and slot <= now and job.spec.recurring:
        # The slots that came while paused are recorded as skipped, never silently dropped.
        last = last_slots(job.spec, slot - 1, now, job.anchor, 1)
        slot = next_slot(job.spec, now, job.anchor)
        events.append(
            RunSkipped(
                at=now,
                job_id=job.job_id,
                tenant=job.spec.tenant,
                scheduled_for=job.next_slot or 0,
                last_scheduled_for=last[-1] if last else job.next_slot or 0,
                count=count_slots(job.spec, (job.next_slot or 0) - 1, now, job.anchor),
                reason=SkipReason.PAUSED,
                next_slot=slot,
            )
        )
    events.append(
        JobResumed(
            at=now,
            job_id=job.job_id,
            tenant=job.spec.tenant,
            version=job.version + 1,
            next_slot=slot,
        )
    )
    return events


def _cancel_job(state: PartitionState, cmd: CancelJob, now: Millis) -> list[AnyEvent]:
    job = _job(state, cmd.job_id, cmd.tenant)
    _check_version(job, cmd.expected_version)
    if job.status is JobStatus.CANCELLED:
        return []
    events: list[AnyEvent] = [
        JobCancelled(at=now, job_id=job.job_id, tenant=job.spec.tenant, version=job.version + 1)
    ]
    for run_id in job.live:
        events.append(_cancelled(state.runs[run_id], now, CancelReason.JOB_CANCELLED))
    return events


def _goes_ahead(
    state: PartitionState, job: JobState, now: Millis, reach_ms: int, critical: bool = False
) -> bool:
    """Whether a job with live runs has its next slot materialised ahead: only under ``allow``,
    where the slot runs whatever is live, and only while each run of it still ahead of its slot
    starts within its reach (``core.jobs.reach_ahead_ms``: the arming time for a push job that
    is not critical; else none may be ahead), so that its runs ahead are one more than its
    slots within the reach at most. (A job whose runs each take longer than the gap between its
    slots thus keeps its starts ahead, armed, instead of deciding every slot at the slot; and a
    job whose slots come more often than the arming time keeps its calls armed that far ahead,
    so they start on time across a hand-over of its partition shorter than that: the calls go
    out from the executors that hold them.) ``critical``: a critical job reaches as far (a
    hand-over's last batch, ``core.partition.Partition.arm_ahead``)."""
    if job.spec.overlap_policy is not OverlapPolicy.ALLOW:
        return False
    reach = reach_ahead_ms(job.spec, reach_ms, critical=critical)
    # Every live run passes the cheap test first (its start within the reach); only one that
    # fails it is looked at as a run ahead. Called for nearly every slot of a busy job.
    limit = now + reach
    runs = state.runs
    return all(
        run.available_at <= limit or not _is_ahead(run, job, now)
        for run in (runs[run_id] for run_id in job.live)
    )


def _ahead_runs(state: PartitionState, job: JobState, now: Millis) -> list[RunState]:
    """The job's runs materialised ahead of a slot that has not come yet (the lead time)."""
    return [run for run in (state.runs[run_id] for run_id in job.live) if _is_ahead(run, job, now)]


def _is_ahead(run: RunState, job: JobState, now: Millis) -> bool:
    """Whether ``run`` (one of ``job``'s live runs) is materialised ahead of a slot that has not
    come yet: a manual trigger cannot name a future slot and a retry or replay follows a start,
    so a pending scheduled run of a later slot is one."""
    return (
        run.scheduled_for > now
        and (
            run.status is RunStatus.PENDING
            # leased ahead, its start not come: a pull worker learns it is withdrawn when it
            # checks the lease before the start (``HeartbeatRun.check``, answered once the
            # partition is past CHECK_GUARD_MS before it), so only while its start is that
            # far; a push run's armed call is dropped by the node's executor (told at once),
            # so only while its start is at least ARM_GUARD_MS away, and never a critical
            # job's: a drop that came too late would leave a call made for a slot scheduled
            # again
            # (docs/architecture.md, "Calls armed ahead").
            or (
                run.status is RunStatus.RUNNING
                and run.start_at is not None
                and run.start_at > now
                and (
                    run.start_at - now >= CHECK_GUARD_MS
                    if isinstance(job.spec.target, PullTarget)
                    else not job.spec.critical and run.start_at - now >= ARM_GUARD_MS
                )
            )
        )
        and run.trigger is Trigger.SCHEDULE
        and run.attempt == 1
    )


def _withdraw_ahead(state: PartitionState, job: JobState, now: Millis) -> list[AnyEvent]:
    """Withdraw the job's runs waiting ahead of their slot, its next slot set back to theirs
    (the slot is still to run, or to be recorded as skipped)."""
    ahead = _ahead_runs(state, job, now)
    back = min((run.scheduled_for for run in ahead), default=None)
    return [_withdrawn(run, now, back) for run in ahead]


def _withdrawn(run: RunState, now: Millis, next_after: Millis | None) -> RunCancelled:
    return RunCancelled(**_ids(run, now), reason=CancelReason.WITHDRAWN, next_slot=next_after)


def _cancelled(run: RunState, now: Millis, reason: CancelReason) -> RunCancelled:
    return RunCancelled(
        **_ids(run, now), reason=reason, was_running=run.status is RunStatus.RUNNING
    )


# -- slots -------------------------------------------------------------------------------------


def _materialised(
    job: JobState,
    slot: Millis,
    now: Millis,
    *,
    trigger: Trigger,
    blocked: bool = False,
    next_after: Millis | None = None,
    key: str | None = None,
) -> RunMaterialised:
    spec = job.spec
    return RunMaterialised(
        at=now,
        job_id=job.job_id,
        tenant=spec.tenant,
        run_id=run_id_of(job.job_id, slot),
        scheduled_for=slot,
        available_at=slot + jitter_ms(job.job_id, slot, spec.allow_jitter_sec),
        priority=spec.priority,
        trigger=trigger,
        blocked=blocked,
        next_slot=next_after,
        idempotency_key=key,
    )


def _slot_due(
    state: PartitionState,
    job_id: str,
    now: Millis,
    through: Millis | None,
    reach_ms: int = 0,
    critical: bool = False,
) -> list[AnyEvent]:
    """The slots due at ``now`` under the misfire and overlap policies, as they stand at
    ``now``; or, when none is due, the job's next slot if it comes by ``through`` (the lead
    time). A slot is materialised ahead only for a job with no live run, or under ``allow`` (the
    slot runs whatever is live) with each of its live runs ahead of its own slot starting within
    ``reach_ms`` (``_goes_ahead``), and only the one next slot: with a run live, any other
    overlap policy decides at the slot, against what is live then. The misfire rules compare a
    slot with ``now``, so a slot not yet come is never a misfire."""
    job = state.jobs.get(job_id)
    if job is None or job.status is not JobStatus.ACTIVE:
        return []
    first = job.next_slot
    if first is None:
        return []  # a stale timer
    spec = job.spec
    if first > now:
        if (
            through is None
            or first > through
            or (job.live and not _goes_ahead(state, job, now, reach_ms, critical))
        ):
            return []  # a stale timer, or a slot for the overlap policy to decide when it comes
        after = next_slot(spec, first, job.anchor) if spec.recurring else None
        ahead = _with_overlap(state, job, [first], after, now)
        return _with_dst_skips(job, ahead, _suppressed(job, first, first), now)
    if not spec.recurring:  # a one-shot: it runs however late (the API acknowledged it)
        return _with_overlap(state, job, [first], None, now)

    grace_ms = round(spec.misfire_grace_sec * 1000)
    late_until = now - grace_ms - 1  # slots at or before this are misfires
    on_time = slots_between(
        spec, max(first - 1, late_until), now, job.anchor, MAX_SLOTS_PER_DECISION
    )
    events: list[AnyEvent] = []
    to_run: list[Millis] = []
    skipped_last: list[Millis] = []
    if first <= late_until:
        if spec.misfire_policy == "catch_up":
            to_run = last_slots(spec, first - 1, late_until, job.anchor, spec.catch_up_limit)
        elif spec.misfire_policy == "fire_once" and not on_time:
            to_run = last_slots(spec, first - 1, late_until, job.anchor, 1)
        last_late = to_run[0] - 1 if to_run else late_until
        skipped_last = last_slots(spec, first - 1, last_late, job.anchor, 1)
        if skipped_last:
            after_skip = to_run[0] if to_run else (on_time[0] if on_time else None)
            events.append(
                RunSkipped(
                    at=now,
                    job_id=job_id,
                    tenant=spec.tenant,
                    scheduled_for=first,
                    last_scheduled_for=skipped_last[0],
                    count=count_slots(spec, first - 1, skipped_last[0], job.anchor),
                    reason=SkipReason.MISFIRE,
                    next_slot=after_skip
                    if after_skip is not None
                    else next_slot(spec, now, job.anchor),
                )
            )
    to_run += on_time
    final = next_slot(
        spec, to_run[-1] if len(on_time) == MAX_SLOTS_PER_DECISION else now, job.anchor
    )
    events += _with_overlap(state, job, to_run, final, now)
    through = to_run[-1] if to_run else (skipped_last[0] if skipped_last else first - 1)
    return _with_dst_skips(job, events, _suppressed(job, first, through), now)


def _suppressed(job: JobState, first: Millis, through: Millis) -> list[Millis]:
    """The instants a fall-back suppressed (see ``core.cron``) that this decision records.

    This decision handles the slots ``first`` to ``through``; the one before handled every
    slot up to the fire before ``first``, so each decision records the suppressed instants
    after that fire, up to ``through``, and every instant is recorded once. None come before
    the job was registered. Cheap unless a fall-back is near (``suppressed_since_previous``).
    """
    spec = job.spec
    if spec.schedule is None:
        return []
    suppressed = suppressed_since_previous(
        spec.schedule, spec.timezone, first, through, spec.day_rule
    )
    return [s for s in suppressed if s > job.registered_at] if suppressed else []


def _with_dst_skips(
    job: JobState, events: list[AnyEvent], suppressed: list[Millis], now: Millis
) -> list[AnyEvent]:
    """``events`` with a ``RunSkipped(reason=dst)`` for each suppressed instant, in time order.

    Each goes before the first event for a later slot, and carries the job's next slot as the
    events before it left it, so folding it changes nothing but the record.
    """
    if not suppressed:
        return events
    merged: list[AnyEvent] = []
    pending = iter(suppressed)
    instant = next(pending, None)
    current = job.next_slot
    for event in events:
        match event:
            case RunMaterialised() | RunSkipped() | RunCancelled():
                while instant is not None and instant < event.scheduled_for:
                    merged.append(_skipped(job, instant, SkipReason.DST, current, now))
                    instant = next(pending, None)
        merged.append(event)
        match event:
            case RunMaterialised(trigger=Trigger.SCHEDULE) | RunSkipped():
                current = event.next_slot
    while instant is not None:
        merged.append(_skipped(job, instant, SkipReason.DST, current, now))
        instant = next(pending, None)
    return merged


def _skipped(
    job: JobState, slot: Millis, reason: SkipReason, next_after: Millis | None, now: Millis
) -> RunSkipped:
    """One slot that will not run, and the job's next slot after it."""
    return RunSkipped(
        at=now,
        job_id=job.job_id,
        tenant=job.spec.tenant,
        scheduled_for=slot,
        last_scheduled_for=slot,
        count=1,
        reason=reason,
        next_slot=next_after,
    )


def _with_overlap(
    state: PartitionState,
    job: JobState,
    slots: list[Millis],
    final_next: Millis | None,
    now: Millis,
) -> list[AnyEvent]:
    """Materialise ``slots`` in order under the job's overlap policy."""
    spec = job.spec
    events: list[AnyEvent] = []
    live = [state.runs[r] for r in job.live if state.runs[r].status is not RunStatus.BLOCKED]
    live_ids = [r.run_id for r in live]
    blocked = job.blocked_run
    for i, slot in enumerate(slots):
        after = slots[i + 1] if i + 1 < len(slots) else final_next
        policy = spec.overlap_policy
        exists = run_id_of(job.job_id, slot) in state.runs
        if not exists and (not live_ids or policy == OverlapPolicy.ALLOW):
            events.append(_materialised(job, slot, now, trigger=Trigger.SCHEDULE, next_after=after))
            live_ids.append(run_id_of(job.job_id, slot))
        elif (
            exists
            or policy == OverlapPolicy.SKIP
            or (policy == OverlapPolicy.BUFFER_ONE and blocked)
        ):
            # ``exists``: a manual trigger of this very instant made the slot's run already
            # (one identity, one run); the slot is recorded as overlapping it.
            events.append(_skipped(job, slot, SkipReason.OVERLAP, after, now))
        elif policy == OverlapPolicy.BUFFER_ONE:
            events.append(
                _materialised(
                    job, slot, now, trigger=Trigger.SCHEDULE, blocked=True, next_after=after
                )
            )
            blocked = run_id_of(job.job_id, slot)
        else:  # cancel_other
            for run_id in live_ids:
                run = state.runs.get(run_id)
                if run is not None:
                    events.append(_cancelled(run, now, CancelReason.OVERLAP))
                else:  # materialised earlier in this same decision
                    events.append(
                        RunCancelled(
                            at=now,
                            job_id=job.job_id,
                            tenant=spec.tenant,
                            run_id=run_id,
                            scheduled_for=int(run_id.rpartition(".")[2]),
                            reason=CancelReason.OVERLAP,
                        )
                    )
            events.append(_materialised(job, slot, now, trigger=Trigger.SCHEDULE, next_after=after))
            live_ids = [run_id_of(job.job_id, slot)]
    return events


def _trigger(state: PartitionState, cmd: TriggerRun, now: Millis) -> list[AnyEvent]:
    job = _job(state, cmd.job_id, cmd.tenant)
    _not_cancelled(job)
    if cmd.idempotency_key is not None and cmd.idempotency_key in job.trigger_keys:
        return []
    slot = now if cmd.scheduled_for is None else cmd.scheduled_for
    if slot < 0:
        raise InvalidDefinition("scheduled_for", "must be an instant after 1970")
    if slot > now:
        # A future slot would collide with the schedule's own run of it; a one-shot job is the
        # way to run something later.
        raise InvalidDefinition("scheduled_for", "must not be in the future")
    if run_id_of(job.job_id, slot) in state.runs:
        return []  # the run of this slot exists: the identity (job, slot) makes it one run
    return [
        *_yield_to_overlap(state, job, now),
        _materialised(job, slot, now, trigger=Trigger.MANUAL, key=cmd.idempotency_key),
    ]


def _yield_to_overlap(state: PartitionState, job: JobState, now: Millis) -> list[AnyEvent]:
    """A run becoming live beside a run materialised ahead of its slot: under an overlap
    policy other than ``allow`` the ahead run is withdrawn, its slot timer goes back to the slot,
    and the policy decides there against what is live then, as without a lead."""
    if job.spec.overlap_policy is OverlapPolicy.ALLOW:
        return []
    return _withdraw_ahead(state, job, now)


def _upstream(state: PartitionState, cmd: UpstreamSucceeded, now: Millis) -> list[AnyEvent]:
    job = state.jobs.get(cmd.job_id)
    if job is None or job.status is not JobStatus.ACTIVE:
        return []
    if cmd.upstream_job_id not in job.spec.depends_on:
        return []
    if job.last_triggered is not None and cmd.scheduled_for <= job.last_triggered:
        return []  # a late or repeated delivery of a success that already counted
    if not in_window(job.spec, cmd.scheduled_for):
        return []  # a slot before start_at or after end_at does not count
    events: list[AnyEvent] = [
        UpstreamRecorded(
            at=now,
            job_id=job.job_id,
            tenant=job.spec.tenant,
            upstream_job_id=cmd.upstream_job_id,
            scheduled_for=cmd.scheduled_for,
        )
    ]
    done = dict(job.upstream)
    done[cmd.upstream_job_id] = max(cmd.scheduled_for, done.get(cmd.upstream_job_id, 0))
    if all(u in done for u in job.spec.depends_on):
        slot = max(done.values())  # the logical date the upstream runs were for
        if run_id_of(job.job_id, slot) not in state.runs:
            events += _yield_to_overlap(state, job, now)
            events.append(_materialised(job, slot, now, trigger=Trigger.DEPENDENCY))
    return events


# -- leases ------------------------------------------------------------------------------------


def _granted(job: JobState, run: RunState, token: int, worker_id: str, now: Millis) -> LeaseGranted:
    """The lease of ``run``: from now, or, for a run not available yet (a claim reaching
    ahead), from its ``available_at``, when its worker starts it."""
    start = max(now, run.available_at)
    return LeaseGranted(
        at=now,
        job_id=run.job_id,
        tenant=run.tenant,
        run_id=run.run_id,
        scheduled_for=run.scheduled_for,
        attempt=run.attempt,
        fencing_token=token,
        worker_id=worker_id,
        lease_expires_at=start + round(job.spec.lease_sec * 1000),
        lateness_ms=start - run.scheduled_for,
        trigger=run.trigger,
        start_at=start if start > now else None,
    )


def _claim(state: PartitionState, cmd: ClaimRuns, now: Millis) -> list[AnyEvent]:
    """Lease up to ``limit`` of the pool's ready runs, the most urgent first; with a horizon,
    runs that become ready within it too, each leased to start at its ``available_at``."""
    if not 1 <= cmd.limit <= MAX_CLAIM:
        raise InvalidDefinition("limit", f"must be between 1 and {MAX_CLAIM}")
    if not 0 <= cmd.horizon_ms <= MAX_HORIZON_MS:
        raise InvalidDefinition("ahead_sec", f"must be between 0 and {MAX_HORIZON_MS // 1000}")
    until = now + cmd.horizon_ms
    promote_due(state, cmd.pool, until)
    heap = state.ready.get(cmd.pool)
    if not heap:
        return []
    events: list[AnyEvent] = []
    skipped: list[AnyEvent] = []
    set_aside = []
    granted: set[str] = set()
    while heap and len(events) < cmd.limit:
        entry = heapq.heappop(heap)
        if not state.is_ready_entry_live(entry, cmd.pool) or entry[2] in granted:
            continue  # stale (or a second entry of a run leased here): tidy the derived index
        run = state.runs[entry[2]]
        set_aside.append(entry)  # kept: the LeaseGranted makes it stale when folded
        if run.available_at > until or (cmd.tenant is not None and run.tenant != cmd.tenant):
            continue
        job = state.jobs[run.job_id]
        granted.add(run.run_id)
        if _misfired_ahead(job, run, now):
            skipped += _skipped_ahead(job, run, now)
            continue
        token = state.last_token + len(events) + 1
        events.append(_granted(job, run, token, cmd.worker_id, now))
    for entry in set_aside:
        heapq.heappush(heap, entry)
    return skipped + events


def _start(state: PartitionState, cmd: StartRun, now: Millis) -> list[AnyEvent]:
    if not 0 <= cmd.horizon_ms <= MAX_HORIZON_MS:
        raise InvalidDefinition("horizon_ms", f"must be between 0 and {MAX_HORIZON_MS}")
    run = _run(state, cmd.run_id, None)
    if run.status is not RunStatus.PENDING or run.available_at > now + cmd.horizon_ms:
        raise Conflict(f"run {team_id(run.run_id)} is {run.status}, not ready")
    job = state.jobs[run.job_id]
    if _misfired_ahead(job, run, now):
        return _skipped_ahead(job, run, now)
    return [_granted(job, run, state.last_token + 1, cmd.worker_id, now)]


def _misfired_ahead(job: JobState, run: RunState, now: Millis) -> bool:
    """A run materialised ahead of its slot that starts more than the misfire grace after it
    (its node died before the slot and the next owner came late): under ``skip`` it does not
    run, as it would not have had it been materialised at its slot by that owner."""
    if not run.ahead or run.attempt != 1 or run.trigger is not Trigger.SCHEDULE:
        return False
    spec = job.spec
    if not spec.recurring or spec.misfire_policy is not MisfirePolicy.SKIP:
        return False
    return now - run.scheduled_for > round(spec.misfire_grace_sec * 1000)


def _skipped_ahead(job: JobState, run: RunState, now: Millis) -> list[AnyEvent]:
    """Withdraw a misfired run materialised ahead and record its slot as skipped, as the
    misfire rule records a slot it wakes up too late for."""
    return [
        _withdrawn(run, now, job.next_slot),
        _skipped(job, run.scheduled_for, SkipReason.MISFIRE, job.next_slot, now),
    ]


def _heartbeat(state: PartitionState, cmd: HeartbeatRun, now: Millis) -> list[AnyEvent]:
    run = state.runs.get(cmd.run_id)
    if run is None or (cmd.tenant is not None and run.tenant != cmd.tenant):
        raise LeaseLost(
            f"fencing token {cmd.fencing_token} does not hold the lease on run {cmd.run_id}"
        )
    _live_lease(run, cmd.fencing_token)
    if cmd.check:
        return []  # the lease holds: the worker may start its run
    started = _reported_start(run, cmd.started_late_ms, now)
    lease_ms = round(state.jobs[run.job_id].spec.lease_sec * 1000)
    # a beat before a run leased ahead has started never shortens its lease
    beat = Heartbeat(
        **_ids(run, now), lease_expires_at=max(now + lease_ms, run.lease_expires_at or 0)
    )
    return [beat] if started is None else [started, beat]


def _reported_start(run: RunState, late_ms: Millis | None, now: Millis) -> RunStarted | None:
    """The start of a run leased ahead, as its worker reports it with its first heartbeat or
    its outcome (None for a run that started with its lease, or was reported already)."""
    if run.start_at is None or late_ms is None:
        return None
    return RunStarted(
        **_ids(run, now), started_at=run.start_at + max(0, late_ms), trigger=run.trigger
    )


def _complete(state: PartitionState, cmd: CompleteRun, now: Millis) -> list[AnyEvent]:
    run = state.runs.get(cmd.run_id)
    if run is None or (cmd.tenant is not None and run.tenant != cmd.tenant):
        raise LeaseLost(
            f"fencing token {cmd.fencing_token} does not hold the lease on run {cmd.run_id}"
        )
    _live_lease(run, cmd.fencing_token)
    ids = _ids(run, now)
    reported = _reported_start(run, cmd.started_late_ms, now)
    started: list[AnyEvent] = [] if reported is None else [reported]
    if cmd.outcome is Outcome.SUCCEEDED:
        began = run.started_at if reported is None else reported.started_at
        done: list[AnyEvent] = [*started, RunCompleted(**ids, started_at=began or now)]
        return done + _release_blocked(state, run, now)
    failed = RunFailed(
        **ids, error=cmd.error[:2000], permanent=cmd.permanent, ambiguous=cmd.ambiguous
    )
    return [
        *started,
        failed,
        *_after_failure(
            state,
            run,
            now,
            failed.error,
            permanent=cmd.permanent,
            ambiguous=cmd.ambiguous,
            not_before=cmd.retry_after_ms,
        ),
    ]


def _return_lease(state: PartitionState, cmd: ReturnLease, now: Millis) -> list[AnyEvent]:
    """Give back a lease no worker received: the run is pending again, its attempt unchanged.
    Nothing when the lease has ended already (it ran out, or the run was cancelled)."""
    run = state.runs.get(cmd.run_id)
    if run is None or run.status is not RunStatus.RUNNING or run.fencing_token != cmd.fencing_token:
        return []
    return [LeaseReturned(**_ids(run, now))]


def _lease_due(state: PartitionState, run_id: str, now: Millis) -> list[AnyEvent]:
    run = state.runs.get(run_id)
    if run is None or run.lease_expires_at is None or run.lease_expires_at > now:
        return []
    if run.status not in (RunStatus.RUNNING, RunStatus.CANCELLED):
        return []
    expired = LeaseExpired(**_ids(run, now), lease_expires_at=run.lease_expires_at)
    if run.status is RunStatus.CANCELLED:
        return [expired]
    return [
        expired,
        *_after_failure(
            state,
            run,
            now,
            "lease expired: the worker stopped heartbeating",
            permanent=False,
            ambiguous=True,
            not_before=None,
        ),
    ]


def _after_failure(
    state: PartitionState,
    run: RunState,
    now: Millis,
    error: str,
    *,
    permanent: bool,
    ambiguous: bool,
    not_before: Millis | None,
) -> list[AnyEvent]:
    """A failed attempt becomes a retry, or a dead letter. The run's lease is already over."""
    spec = state.jobs[run.job_id].spec
    ids = _ids(run, now)
    reason = None
    if permanent:
        reason = DeadReason.PERMANENT_FAILURE
    elif ambiguous and spec.critical:
        # It may have taken effect; running it again could run it twice. Its target is asked
        # what became of it where it can say (core.asking); else an operator decides.
        if can_ask(spec):
            return [_asked(run, now, 1, now)]
        reason = DeadReason.OUTCOME_UNKNOWN
    elif run.attempt - run.budget_start + 1 >= spec.max_attempts:
        reason = DeadReason.ATTEMPTS_EXHAUSTED
    if reason is not None:
        dead: list[AnyEvent] = [RunDeadLettered(**ids, reason=reason, error=error)]
        return dead + _release_blocked(state, run, now)
    retry = run.attempt - run.budget_start + 1
    delay = retry_delay_ms(spec, run.run_id, retry)
    if not_before is not None:
        delay = max(delay, not_before)
    return [
        RetryScheduled(
            **_ids(run, now, attempt=run.attempt + 1), available_at=now + delay, delay_ms=delay
        )
    ]


# -- asking what became of an attempt (core.asking) --------------------------------------------


def _asked(run: RunState, now: Millis, ask: int, ask_at: Millis) -> RunOutcomeAsked:
    return RunOutcomeAsked(**_ids(run, now), ask=ask, ask_at=ask_at, answer_by=ask_at + ASK_WAIT_MS)


def _answered(state: PartitionState, cmd: AnswerOutcome, now: Millis) -> list[AnyEvent]:
    run = state.runs.get(cmd.run_id)
    if run is None or run.status is not RunStatus.ASKING or run.fencing_token != cmd.fencing_token:
        raise Conflict(
            f"run {team_id(cmd.run_id)} is not asking about fencing token {cmd.fencing_token}"
        )
    late = cmd.ask != run.ask
    if late and cmd.answer in (OutcomeAnswer.IN_PROGRESS, OutcomeAnswer.NO_ANSWER):
        return []  # an earlier ask's answer that says nothing new: the later ask stands
    # (An earlier ask's definite answer still counts: it is about the same attempt.)
    return _after_answer(state, run, now, cmd.ask, cmd.answer, cmd.status, cmd.detail)


def _answer_due(state: PartitionState, run_id: str, now: Millis) -> list[AnyEvent]:
    run = state.runs.get(run_id)
    if run is None or run.status is not RunStatus.ASKING:
        return []
    if run.answer_by is None or run.answer_by > now:
        return []  # a stale timer: answered, or asked again since
    detail = "no answer by the deadline"
    return _after_answer(state, run, now, run.ask, OutcomeAnswer.NO_ANSWER, None, detail)


def _after_answer(
    state: PartitionState,
    run: RunState,
    now: Millis,
    ask: int,
    answer: OutcomeAnswer,
    status: int | None,
    detail: str,
) -> list[AnyEvent]:
    """The answer to ask ``ask`` recorded, and what it leads to (the table of core.asking)."""
    ids = _ids(run, now)
    answered = RunOutcomeAnswered(**ids, ask=ask, answer=answer, status=status, detail=detail[:500])
    error = f"{run.last_error}; asked, the target answered {answer}"
    match answer:
        case OutcomeAnswer.SUCCEEDED:
            done = RunCompleted(**ids, started_at=run.started_at or now, by_asking=True)
            return [answered, done, *_release_blocked(state, run, now)]
        case OutcomeAnswer.FAILED | OutcomeAnswer.NEVER_SEEN:
            # Not taken effect, and (never seen) fenced at the target: safe to run again.
            failure = _after_failure(
                state, run, now, error, permanent=False, ambiguous=False, not_before=None
            )
            return [answered, *failure]
        case OutcomeAnswer.UNKNOWN:
            dead = RunDeadLettered(**ids, reason=DeadReason.OUTCOME_UNKNOWN, error=error)
            return [answered, dead, *_release_blocked(state, run, now)]
        case OutcomeAnswer.IN_PROGRESS | OutcomeAnswer.NO_ANSWER:
            if run.ask >= ASK_LIMIT:
                error = f"{run.last_error}; asked {run.ask} times, no definite answer"
                dead = RunDeadLettered(**ids, reason=DeadReason.OUTCOME_UNKNOWN, error=error)
                return [answered, dead, *_release_blocked(state, run, now)]
            return [answered, _asked(run, now, run.ask + 1, now + ask_delay_ms(run.ask))]
        case _:
            assert_never(answer)


def _release_blocked(state: PartitionState, ended: RunState, now: Millis) -> list[AnyEvent]:
    job = state.jobs[ended.job_id]
    if job.blocked_run is None or job.blocked_run == ended.run_id:
        return []
    others = [r for r in job.live if r not in (ended.run_id, job.blocked_run)]
    if others:
        return []  # under allow-then-buffer transitions another run may still be live
    run = state.runs[job.blocked_run]
    return [
        RunReleased(
            at=now,
            job_id=run.job_id,
            tenant=run.tenant,
            run_id=run.run_id,
            scheduled_for=run.scheduled_for,
            attempt=run.attempt,
            available_at=max(run.available_at, now),
        )
    ]


def _cancel_run(state: PartitionState, cmd: CancelRun, now: Millis) -> list[AnyEvent]:
    run = _run(state, cmd.run_id, cmd.tenant)
    if run.status is RunStatus.CANCELLED:
        return []
    events: list[AnyEvent] = [_cancelled(run, now, CancelReason.USER)]
    return events + _release_blocked(state, run, now)


def _replay(state: PartitionState, cmd: ReplayRun, now: Millis) -> list[AnyEvent]:
    run = _run(state, cmd.run_id, cmd.tenant)
    _not_cancelled(state.jobs[run.job_id])
    if run.status is not RunStatus.DEAD:
        raise Conflict(
            f"run {team_id(run.run_id)} is {run.status}; only a dead run can be replayed"
        )
    return [
        *_yield_to_overlap(state, state.jobs[run.job_id], now),
        RunReplayed(**_ids(run, now, attempt=run.attempt + 1), available_at=now),
    ]


def _forget_due(state: PartitionState, cmd: ForgetDue, now: Millis) -> list[AnyEvent]:
    """The job leaves the state a retention after it ended, if it is still over."""
    job = state.jobs.get(cmd.job_id)
    ended = ended_at(state, job) if job is not None else None
    if job is None or ended is None or ended + cmd.retention_ms > now:
        return []  # a stale timer: revived since, or forgotten already
    return [
        JobForgotten(
            at=now,
            job_id=job.job_id,
            tenant=job.spec.tenant,
            ended_at=ended,
            runs=tuple(state.kept.get(job.job_id, ())),
        )
    ]


def spec_of(state: PartitionState, job_id: str) -> JobSpec | None:
    job = state.jobs.get(job_id)
    return job.spec if job is not None else None
