"""Every fact cronlog records, as frozen tagged msgspec structs, and their one codec.

Events are a public, versioned contract (``docs/events.md``): audit consumers read the events
stream without reading anything else, so every event carries the job, the tenant and the time it
was decided, and every run event carries the run, its slot, its attempt and its fencing token.
Evolve them by adding fields with defaults; never retype, rename or remove one.

Encoding is JSON with a ``"type"`` tag, so the stream is readable by any consumer.
"""

from __future__ import annotations

import enum

import msgspec

from core.clock import Millis
from core.jobs import JobSpec


class SkipReason(enum.StrEnum):
    MISFIRE = "misfire"  # the scheduler woke up past the grace period and the policy dropped it
    OVERLAP = "overlap"  # an earlier run was still live and the overlap policy dropped it
    DST = "dst"  # a local time repeated by a daylight-saving fall-back (fires once only)
    PAUSED = "paused"  # the job was paused when the slot came


class DeadReason(enum.StrEnum):
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    PERMANENT_FAILURE = "permanent_failure"
    OUTCOME_UNKNOWN = "outcome_unknown"  # a critical run whose attempt may have taken effect


class CancelReason(enum.StrEnum):
    USER = "user"
    JOB_CANCELLED = "job_cancelled"
    OVERLAP = "overlap"  # superseded by a newer slot under cancel_other
    # A run materialised ahead of its slot (the lead time), taken back before the slot came:
    # the job was paused or its schedule changed. Not a run that was cancelled: the job's next
    # slot goes back to ``next_slot`` and the read model drops the run's record.
    WITHDRAWN = "withdrawn"


class OutcomeAnswer(enum.StrEnum):
    """What became of an attempt whose outcome was unknown, as its target's status URL answered
    (``RunOutcomeAnswered``; docs/architecture.md, "Asking a target what became of a run")."""

    SUCCEEDED = "succeeded"  # the key's work was done: the run completes
    FAILED = "failed"  # handled, and it answered no success: retried like any failure
    # the attempt never arrived, and the target now refuses it should it arrive late (fenced):
    # retried like any failure
    NEVER_SEEN = "never_seen"
    IN_PROGRESS = "in_progress"  # still being handled: asked again later
    UNKNOWN = "unknown"  # the target cannot tell (its handling died midway): set aside
    # no answer in the protocol (unreachable, timed out, an error, not a status answer, or no
    # answer by the deadline): asked again later
    NO_ANSWER = "no_answer"


class Trigger(enum.StrEnum):
    SCHEDULE = "schedule"
    MANUAL = "manual"  # POST /v1/jobs/{id}/runs
    DEPENDENCY = "dependency"  # every upstream job succeeded


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Fields every event has."""

    at: Millis  # when the owner decided it
    job_id: str
    tenant: str


class JobRegistered(Event, tag=True, frozen=True, kw_only=True):
    spec: JobSpec
    version: int = 1
    next_slot: Millis | None = None  # the first slot, None for dependency-triggered jobs


class JobUpdated(Event, tag=True, frozen=True, kw_only=True):
    spec: JobSpec
    version: int
    next_slot: Millis | None = None


class JobPaused(Event, tag=True, frozen=True, kw_only=True):
    version: int


class JobResumed(Event, tag=True, frozen=True, kw_only=True):
    version: int
    next_slot: Millis | None = None


class JobCancelled(Event, tag=True, frozen=True, kw_only=True):
    version: int


class JobForgotten(Event, tag=True, frozen=True, kw_only=True):
    """The job left the partition's state: it ended at ``ended_at`` (cancelled, or nothing left
    that can fire: a one-shot that ran, a recurring job past its ``end_at``) and the retention
    after that has passed. ``runs``: the dead runs of a cancelled job, dropped with it. History
    keeps the job; only the scheduler forgets it (see docs/architecture.md)."""

    ended_at: Millis
    runs: tuple[str, ...] = ()


class RunEvent(Event, frozen=True, kw_only=True):
    """Fields every run event has."""

    run_id: str
    scheduled_for: Millis  # the slot, a UTC instant; (job_id, scheduled_for) is the run identity
    attempt: int = 1
    fencing_token: int = 0  # the live lease's token, 0 when none was granted yet


class RunMaterialised(RunEvent, tag=True, frozen=True, kw_only=True):
    available_at: Millis  # the slot plus the job's jitter offset
    priority: int
    trigger: Trigger = Trigger.SCHEDULE
    blocked: bool = False  # held back by the overlap policy (buffer_one) until the live run ends
    next_slot: Millis | None = None  # the job's next slot after this one
    idempotency_key: str | None = None


class RunSkipped(Event, tag=True, frozen=True, kw_only=True):
    """Slots that will not run: ``count`` slots from ``scheduled_for`` to ``last_scheduled_for``.

    ``count`` is None when there were too many to count cheaply (a long outage of a per-second job).
    """

    scheduled_for: Millis
    last_scheduled_for: Millis
    count: int | None = 1
    reason: SkipReason
    next_slot: Millis | None = None


class RunReleased(RunEvent, tag=True, frozen=True, kw_only=True):
    """A held-back run became ready: the live run it waited behind has ended."""

    available_at: Millis


class LeaseGranted(RunEvent, tag=True, frozen=True, kw_only=True):
    worker_id: str
    lease_expires_at: Millis
    lateness_ms: Millis  # start minus slot, the timeliness measure
    # What made the run: only a scheduled run's lateness is a scheduling delay (a backfill's
    # slot may be days past). Events from before the field read as scheduled.
    trigger: Trigger = Trigger.SCHEDULE
    # A lease granted ahead of the run's start (a claim that reached ahead): the instant the
    # worker starts it, never before, and from which the lease counts; ``lateness_ms`` is then
    # that instant's, and the start itself is reported later (``RunStarted``). None: the run
    # starts at ``at``.
    start_at: Millis | None = None


class RunStarted(RunEvent, tag=True, frozen=True, kw_only=True):
    """A run whose lease was granted ahead of its start was started, by its worker's word (its
    first heartbeat or its outcome): ``started_at`` is the lease's ``start_at`` plus how late
    the worker says it started, so the scheduling delay measures the start, not the grant."""

    started_at: Millis
    trigger: Trigger = Trigger.SCHEDULE  # as the lease's: what the delay is measured as


class Heartbeat(RunEvent, tag=True, frozen=True, kw_only=True):
    lease_expires_at: Millis


class RunCompleted(RunEvent, tag=True, frozen=True, kw_only=True):
    started_at: Millis
    # the attempt's own outcome was unknown, and the target's status URL answered that it had
    # succeeded (``RunOutcomeAnswered`` before this event says when and what)
    by_asking: bool = False


class RunFailed(RunEvent, tag=True, frozen=True, kw_only=True):
    error: str
    permanent: bool = False  # the target said retrying cannot help
    ambiguous: bool = False  # the attempt may have taken effect (timeout, lost lease)


class LeaseExpired(RunEvent, tag=True, frozen=True, kw_only=True):
    lease_expires_at: Millis


class LeaseReturned(RunEvent, tag=True, frozen=True, kw_only=True):
    """The lease of ``fencing_token`` reached no worker, and was given back unused: the node
    that claimed it for a worker stopped waiting before the owner's answer came (or could not
    give the answer), so nobody holds the token. The run is pending again as it was before the
    grant, its attempt unchanged; the token stays spent (a worker that shows it is refused)."""


class RunOutcomeAsked(RunEvent, tag=True, frozen=True, kw_only=True):
    """The attempt (``fencing_token``) may or may not have taken effect, and its job's target
    can say (``HttpTarget.status_url``): the run waits while its owner asks. ``ask`` counts the
    asks of this attempt from 1; the owner's executors ask at ``ask_at``, and an ask with no
    answer by ``answer_by`` counts as unanswered (``OutcomeAnswer.NO_ANSWER``)."""

    ask: int
    ask_at: Millis
    answer_by: Millis


class RunOutcomeAnswered(RunEvent, tag=True, frozen=True, kw_only=True):
    """What the target answered to ask ``ask`` about the attempt of ``fencing_token``; the
    decision it leads to (``RunCompleted`` with ``by_asking``, ``RetryScheduled``,
    ``RunDeadLettered`` or the next ``RunOutcomeAsked``) follows as its own event."""

    ask: int
    answer: OutcomeAnswer
    status: int | None = None  # succeeded: the HTTP status the target's handler answered
    detail: str = ""  # why there was no answer, or what the target added


class RetryScheduled(RunEvent, tag=True, frozen=True, kw_only=True):
    """The next attempt (``attempt`` is the new number) may start at ``available_at``."""

    available_at: Millis
    delay_ms: Millis


class RunDeadLettered(RunEvent, tag=True, frozen=True, kw_only=True):
    reason: DeadReason
    error: str


class RunCancelled(RunEvent, tag=True, frozen=True, kw_only=True):
    reason: CancelReason
    was_running: bool = False
    # reason ``withdrawn`` only: the job's next slot from here on (the withdrawn run's own slot
    # when a pause took it back, so that it is still the slot to run or to record as skipped)
    next_slot: Millis | None = None


class RunReplayed(RunEvent, tag=True, frozen=True, kw_only=True):
    """A dead run requeued by an operator; ``attempt`` is the new attempt's number and the run
    gets a fresh budget of ``max_attempts``."""

    available_at: Millis


class UpstreamRecorded(Event, tag=True, frozen=True, kw_only=True):
    """An upstream job of a dependency-triggered job succeeded for ``scheduled_for``."""

    upstream_job_id: str
    scheduled_for: Millis


AnyEvent = (
    JobRegistered
    | JobUpdated
    | JobPaused
    | JobResumed
    | JobCancelled
    | RunMaterialised
    | RunSkipped
    | RunReleased
    | LeaseGranted
    | RunStarted
    | Heartbeat
    | RunCompleted
    | RunFailed
    | LeaseExpired
    | LeaseReturned
    | RunOutcomeAsked
    | RunOutcomeAnswered
    | RetryScheduled
    | RunDeadLettered
    | RunCancelled
    | RunReplayed
    | UpstreamRecorded
    | JobForgotten
)

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


def encode(event: AnyEvent) -> bytes:
    return _encoder.encode(event)


def decode(data: bytes) -> AnyEvent:
    return _decoder.decode(data)
