"""What may be asked of a partition: requests from the API and workers, and the timers it arms.

Commands are not facts: the owner decides each one into zero or more events (or rejects it with
an error). They travel on the commands stream, so they too are tagged msgspec structs with one
codec. Every request carries the tenant that sent it; a job of another tenant is "not found".
"""

from __future__ import annotations

import enum

import msgspec

from core.clock import Millis
from core.events import OutcomeAnswer
from core.jobs import JobSpec


class Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


class PutJob(Command, tag=True, frozen=True, kw_only=True):
    """Register ``job_id``, or replace its definition (an upsert: the same spec is a no-op)."""

    job_id: str
    spec: JobSpec
    expected_version: int | None = None
    create_only: bool = False  # POST semantics: an existing job with another spec is a conflict


class PauseJob(Command, tag=True, frozen=True, kw_only=True):
    job_id: str
    tenant: str
    expected_version: int | None = None


class ResumeJob(Command, tag=True, frozen=True, kw_only=True):
    job_id: str
    tenant: str
    expected_version: int | None = None


class CancelJob(Command, tag=True, frozen=True, kw_only=True):
    job_id: str
    tenant: str
    expected_version: int | None = None


class TriggerRun(Command, tag=True, frozen=True, kw_only=True):
    """An ad-hoc or backfill run of ``scheduled_for``; the same slot twice is one run."""

    job_id: str
    tenant: str
    scheduled_for: Millis | None = None  # None: now
    idempotency_key: str | None = None


class ClaimRuns(Command, tag=True, frozen=True, kw_only=True):
    """A pull worker asks for up to ``limit`` ready runs of ``pool``; with ``horizon_ms``, also
    runs that become ready within that long, each leased ahead to start at its instant."""

    tenant: str | None  # None: a worker trusted with every tenant's runs in the pool
    pool: str
    worker_id: str
    limit: int = 1
    horizon_ms: Millis = 0


class StartRun(Command, tag=True, frozen=True, kw_only=True):
    """A push executor of the node (HTTP, Kafka topic) leases one ready run; with
    ``horizon_ms``, a run ready within it too, leased from its ``available_at`` (armed ahead:
    the executor makes the call then, on its own timer)."""

    run_id: str
    worker_id: str
    horizon_ms: Millis = 0


class HeartbeatRun(Command, tag=True, frozen=True, kw_only=True):
    """Extend the lease. ``check``: only ask whether the lease still holds (a worker about to
    start a run leased ahead), which decides nothing. ``started_late_ms``: the run leased ahead
    was started this long after its ``start_at`` (the first beat after the start says so)."""

    run_id: str
    fencing_token: int
    tenant: str | None = None
    check: bool = False
    started_late_ms: Millis | None = None


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class CompleteRun(Command, tag=True, frozen=True, kw_only=True):
    run_id: str
    fencing_token: int
    outcome: Outcome
    error: str = ""
    permanent: bool = False  # retrying cannot help (a 4xx from an HTTP target)
    ambiguous: bool = False  # it may have taken effect (a timeout after the request was sent)
    retry_after_ms: Millis | None = None  # the target's own "not before" (HTTP Retry-After)
    tenant: str | None = None
    # a run leased ahead: how long after its ``start_at`` it was started, when no heartbeat
    # said so first (a run done within a third of its lease)
    started_late_ms: Millis | None = None


class ReturnLease(Command, tag=True, frozen=True, kw_only=True):
    """The lease of ``fencing_token`` on ``run_id``, granted to a claim whose answer no worker
    received (the node that asked stopped waiting for it): give it back unused. Only the node
    that asked sends it, and only for an answer it handed to nobody."""

    run_id: str
    fencing_token: int


class AnswerOutcome(Command, tag=True, frozen=True, kw_only=True):
    """What a run's target answered when asked what became of the attempt of
    ``fencing_token`` (the node's executors ask its status URL: ``RunOutcomeAsked``)."""

    run_id: str
    fencing_token: int
    ask: int
    answer: OutcomeAnswer
    status: int | None = None
    detail: str = ""


class CancelRun(Command, tag=True, frozen=True, kw_only=True):
    run_id: str
    tenant: str


class ReplayRun(Command, tag=True, frozen=True, kw_only=True):
    run_id: str
    tenant: str


class UpstreamSucceeded(Command, tag=True, frozen=True, kw_only=True):
    """Delivered to a dependent job's partition when one of its upstream jobs succeeded."""

    job_id: str
    upstream_job_id: str
    scheduled_for: Millis


# Timers, armed in the partition's timing wheel; a stale timer decides nothing.


class SlotDue(Command, tag=True, frozen=True, kw_only=True):
    """The job's next slot is due, or is within the lead time: a slot after ``now`` and at or
    before ``through`` is materialised ahead of it (``core.decide`` says when). ``through``
    comes from the timer that fired (the partition's lead time), never from a clock read in
    the core, so the decision stays a function of the state, the command and ``now``. None,
    or a ``through`` before ``now``: only the slots due at ``now``. ``reach_ms`` (the
    partition's arming time, ``Partition.arm_ms``) is how far ahead of ``now`` a push job under
    ``allow`` that is not critical keeps its runs materialised while runs of it are still ahead
    of their slots (``core.jobs.reach_ahead_ms``, ``core.decide._goes_ahead``): its calls stay
    armed that far ahead, however short the gap between its slots. ``critical``: a critical
    job reaches that far too (a hand-over's last batch, ``Partition.arm_ahead``)."""

    job_id: str
    through: Millis | None = None
    reach_ms: int = 0
    critical: bool = False


class LeaseDue(Command, tag=True, frozen=True, kw_only=True):
    run_id: str


class AnswerDue(Command, tag=True, frozen=True, kw_only=True):
    """An ask of a run's outcome may have gone unanswered (its ``answer_by`` came)."""

    run_id: str


class ForgetDue(Command, tag=True, frozen=True, kw_only=True):
    """A job that ended ``retention_ms`` ago may leave the partition's state."""

    job_id: str
    retention_ms: int


AnyCommand = (
    PutJob
    | PauseJob
    | ResumeJob
    | CancelJob
    | TriggerRun
    | ClaimRuns
    | StartRun
    | HeartbeatRun
    | CompleteRun
    | ReturnLease
    | AnswerOutcome
    | CancelRun
    | ReplayRun
    | UpstreamSucceeded
    | SlotDue
    | LeaseDue
    | AnswerDue
    | ForgetDue
)

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyCommand] = msgspec.json.Decoder(AnyCommand)


def encode(command: AnyCommand) -> bytes:
    return _encoder.encode(command)


def decode(data: bytes) -> AnyCommand:
    return _decoder.decode(data)
