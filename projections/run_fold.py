"""How a run's events make its :class:`~projections.views.RunView`: one pure fold, two callers.

The read model folds every event into the run it names as it arrives; the history answered
from the archive (:mod:`projections.archived_runs`) folds a job's archived events into the same
views. Both call these functions, so a run read back from the archive is the run the read model
held, field for field.

:func:`materialised` makes the view of a :class:`RunMaterialised` (keeping the attempts of an
earlier materialisation of the same slot, as the read model does). :func:`evolve` changes a
view's fields for any other run event and returns the state the run moves to; it never sets
``state`` itself, since the read model re-indexes the run by its old state first.
"""

from __future__ import annotations

from typing import assert_never

from core.events import (
    AnyEvent,
    CancelReason,
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
    RunStarted,
)
from projections.views import AskView, AttemptOutcome, AttemptView, RunStateName, RunView

LEASE_EXPIRED = "lease expired"

# Events that move a run; the others either make one (RunMaterialised) or leave it as it is.
RunChange = (
    RunReleased
    | LeaseGranted
    | RunStarted
    | RunCompleted
    | RunFailed
    | LeaseExpired
    | LeaseReturned
    | RetryScheduled
    | RunDeadLettered
    | RunCancelled
    | RunReplayed
    | RunOutcomeAsked
    | RunOutcomeAnswered
)


def materialised(event: RunMaterialised, earlier: RunView | None) -> RunView:
    """The run ``event`` makes; ``earlier`` is the view of the same slot's earlier run, if
    any: its attempts, first start and lateness stay (a replay shows them too)."""
    run = RunView(
        run_id=event.run_id,
        job_id=event.job_id,
        tenant=event.tenant,
        scheduled_for=event.scheduled_for,
        state="blocked" if event.blocked else "pending",
        attempt=event.attempt,
        trigger=str(event.trigger),
        available_at=event.available_at,
        idempotency_key=event.idempotency_key,
    )
    if earlier is not None:
        run.attempts, run.started_at, run.lateness_ms = (
            earlier.attempts,
            earlier.started_at,
            earlier.lateness_ms,
        )
        if run.idempotency_key is None:
            run.idempotency_key = earlier.idempotency_key
    return run


def evolve(run: RunView, event: RunChange) -> RunStateName | None:
    """Change ``run``'s fields for ``event``; the state it moves to (None: it stays as it is).
    ``run.state`` is left to the caller."""
    match event:
        case RunReleased():
            run.available_at = event.available_at
            return "pending"
        case LeaseGranted():
            # leased ahead: shown from its start_at until its worker reports the start
            start = event.at if event.start_at is None else event.start_at
            run.attempt = event.attempt
            run.attempts.append(
                AttemptView(
                    attempt=event.attempt,
                    fencing_token=event.fencing_token,
                    worker_id=event.worker_id,
                    started_at=start,
                )
            )
            if run.started_at is None:
                run.started_at, run.lateness_ms = start, event.lateness_ms
            return "running"
        case RunStarted():
            for attempt in run.attempts:
                if attempt.fencing_token == event.fencing_token:
                    attempt.started_at = event.started_at
            if run.attempts and run.attempts[0].fencing_token == event.fencing_token:
                run.started_at = event.started_at
                run.lateness_ms = event.started_at - event.scheduled_for
            return None
        case RunCompleted():
            if event.by_asking:  # its attempt was closed as failed; its target says otherwise
                _succeeded_after_all(run, event.fencing_token)
            else:
                _close_attempt(run, event.fencing_token, event.at, "succeeded", "")
            run.finished_at, run.error = event.at, ""
            return "succeeded"
        case RunFailed():
            _close_attempt(run, event.fencing_token, event.at, "failed", event.error)
            run.error = event.error
            return "failed"
        case LeaseExpired():
            if run.state == "cancelled":
                return None
            _close_attempt(run, event.fencing_token, event.at, "lease_expired", "")
            run.error = LEASE_EXPIRED
            return "failed"
        case LeaseReturned():
            # no worker received it: as if never granted
            first = bool(run.attempts) and run.attempts[0].fencing_token == event.fencing_token
            run.attempts = [a for a in run.attempts if a.fencing_token != event.fencing_token]
            if first:
                run.started_at, run.lateness_ms = None, None
            return "pending" if event.attempt == 1 else "retrying"
        case RetryScheduled():
            run.attempt, run.available_at = event.attempt, event.available_at
            return "retrying"
        case RunDeadLettered():
            run.error, run.dead_reason = event.error, str(event.reason)
            run.finished_at = event.at
            return "dead"
        case RunCancelled():
            if event.was_running:
                _close_attempt(run, event.fencing_token, event.at, "cancelled", "")
            run.finished_at = event.at
            return "cancelled"
        case RunReplayed():
            run.attempt, run.available_at = event.attempt, event.available_at
            run.finished_at, run.dead_reason, run.error = None, None, ""
            return "pending"
        case RunOutcomeAsked():
            ask = AskView(ask=event.ask, fencing_token=event.fencing_token, ask_at=event.ask_at)
            run.asks = [*run.asks, ask]
            return None  # still failed: the decision after the failure is being made
        case RunOutcomeAnswered():
            for ask in reversed(run.asks):
                if ask.fencing_token == event.fencing_token and ask.answer is None:
                    ask.answered_at, ask.answer = event.at, str(event.answer)
                    ask.status, ask.detail = event.status, event.detail
                    break
            return None
        case _:
            assert_never(event)


def fold(runs: dict[str, RunView], event: AnyEvent) -> None:
    """Fold ``event`` into ``runs`` (run id -> view), as the read model folds it into its
    records; events that are not about a run in ``runs`` (or making one) change nothing."""
    if isinstance(event, RunMaterialised):
        runs[event.run_id] = materialised(event, runs.get(event.run_id))
    elif isinstance(event, RunCancelled) and event.reason is CancelReason.WITHDRAWN:
        runs.pop(event.run_id, None)  # taken back before its slot: the read model drops it too
    elif isinstance(event, RunChange):
        run = runs.get(event.run_id)
        if run is not None:
            state = evolve(run, event)
            if state is not None:
                run.state = state


def _succeeded_after_all(run: RunView, token: int) -> None:
    for attempt in reversed(run.attempts):
        if attempt.fencing_token == token:
            attempt.outcome = "succeeded"
            return


def _close_attempt(run: RunView, token: int, at: int, outcome: AttemptOutcome, error: str) -> None:
    for attempt in reversed(run.attempts):
        if attempt.fencing_token == token and attempt.outcome is None:
            attempt.finished_at, attempt.outcome, attempt.error = at, outcome, error
            return
