"""The API's bodies as typed structs: what a client sends, and what it reads back.

They mirror the service's ``/openapi.json`` (a test holds them to it). Reading is lenient: a
field this version does not know is ignored, and fields added to the API after this version
have defaults, so an older client keeps working against a newer node. Instants are read as
timezone-aware ``datetime`` (UTC); one sent may be an aware ``datetime`` or an RFC 3339 string
(``2026-11-29T09:00:00Z``). Job fields left ``UNSET`` are not sent: on create, the API's
default; on a patch, unchanged.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "UNSET",
    "Attempt",
    "Backoff",
    "BackoffIn",
    "Beat",
    "ChangePreview",
    "ClaimedRun",
    "Completion",
    "CompletionBatch",
    "CompletionResult",
    "Event",
    "FireTime",
    "HeartbeatBatch",
    "HeartbeatOut",
    "HeartbeatResult",
    "HttpTarget",
    "ItemError",
    "Job",
    "JobBatch",
    "JobDefinition",
    "JobPage",
    "JobPatch",
    "JobResult",
    "KafkaTarget",
    "NewJob",
    "Preview",
    "PullTarget",
    "ReplayOut",
    "ReplayRefused",
    "Run",
    "RunPage",
    "RunSummary",
    "SecretRef",
    "Slot",
    "Slots",
    "Stats",
    "StatsFigures",
    "StatsPoint",
    "Target",
    "Team",
    "TeamLimits",
    "UnsetType",
]

Instant = dt.datetime | str
JobStatus = Literal["active", "paused", "cancelled", "finished"]
RunState = Literal[
    "blocked", "pending", "running", "succeeded", "failed", "retrying", "dead", "cancelled"
]
MisfirePolicy = Literal["skip", "fire_once", "catch_up"]
OverlapPolicy = Literal["allow", "skip", "buffer_one", "cancel_other"]

# -- targets -----------------------------------------------------------------------------------


class SecretRef(msgspec.Struct, frozen=True, kw_only=True):
    """A header value the node reads from its secrets directory at each call."""

    from_file: str


class HttpTarget(msgspec.Struct, frozen=True, kw_only=True, tag="http"):
    url: str
    headers: dict[str, str | SecretRef] = {}
    max_calls_per_sec: float | None = None
    # where the target's guard answers what became of an attempt (RunGuard.answer): a critical
    # run whose outcome is unknown is asked about there instead of being set aside
    status_url: str | None = None


class KafkaTarget(msgspec.Struct, frozen=True, kw_only=True, tag="kafka"):
    topic: str


class PullTarget(msgspec.Struct, frozen=True, kw_only=True, tag="pull"):
    pool: str


# A string is the short form: "https://svc/hook", "kafka://topic", "pull://pool".
Target = str | HttpTarget | KafkaTarget | PullTarget


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    base_sec: float = 10.0
    factor: float = 2.0
    cap_sec: float = 3600.0
    jitter: bool = True


class BackoffIn(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    base_sec: float | UnsetType = UNSET
    factor: float | UnsetType = UNSET
    cap_sec: float | UnsetType = UNSET
    jitter: bool | UnsetType = UNSET


# -- what a client writes ----------------------------------------------------------------------


class _Fields(msgspec.Struct, frozen=True, kw_only=True):
    """A job's definition. Exactly one of ``schedule`` (5 fields; per-second schedules put the
    seconds in ``seconds``), ``run_at`` and ``interval_sec``, or ``depends_on``.
    ``start_at``/``end_at`` bound any of them; ``allow_past`` lets a ``run_at`` or ``end_at``
    that has passed through."""

    name: str | UnsetType = UNSET
    schedule: str | UnsetType | None = UNSET
    seconds: str | UnsetType | None = UNSET
    run_at: Instant | UnsetType | None = UNSET
    interval_sec: float | UnsetType | None = UNSET
    start_at: Instant | UnsetType | None = UNSET
    end_at: Instant | UnsetType | None = UNSET
    timezone: str | UnsetType = UNSET
    payload: Any = UNSET
    target: Target | UnsetType = UNSET
    retries: int | UnsetType = UNSET
    timeout_sec: float | UnsetType = UNSET
    lease_sec: float | UnsetType = UNSET
    priority: int | UnsetType = UNSET
    misfire_policy: MisfirePolicy | UnsetType = UNSET
    misfire_grace_sec: float | UnsetType = UNSET
    catch_up_limit: int | UnsetType = UNSET
    overlap_policy: OverlapPolicy | UnsetType = UNSET
    allow_jitter_sec: float | UnsetType = UNSET
    critical: bool | UnsetType = UNSET
    depends_on: list[str] | UnsetType = UNSET
    backoff: BackoffIn | UnsetType = UNSET
    tags: list[str] | UnsetType = UNSET
    allow_past: bool | UnsetType = UNSET


class JobDefinition(_Fields, frozen=True, kw_only=True):
    """A whole definition (``put_job``): ``name`` and ``target`` are required."""

    name: str
    target: Target


class NewJob(JobDefinition, frozen=True, kw_only=True):
    """``create_job``: ``job_id`` chooses the id; ``idempotency_key`` makes a retried create
    land on the same job; neither: a fresh id."""

    job_id: str | UnsetType = UNSET
    idempotency_key: str | UnsetType = UNSET


class JobPatch(_Fields, frozen=True, kw_only=True):
    """``patch_job``: the fields given replace the job's; ``status`` pauses or resumes."""

    status: Literal["active", "paused"] | UnsetType = UNSET
    version: int | UnsetType = UNSET


# -- what a client reads -----------------------------------------------------------------------


class RunSummary(msgspec.Struct, kw_only=True):
    """A run without its attempts (a job's newest run)."""

    run_id: str
    state: RunState
    trigger: str
    scheduled_for: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    lateness_ms: int | None
    error: str
    dead_reason: str | None


class Job(msgspec.Struct, kw_only=True):
    job_id: str
    tenant: str
    name: str
    status: JobStatus
    version: int
    next_run_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    schedule: str | None
    run_at: dt.datetime | None
    interval_sec: float | None
    start_at: dt.datetime | None
    timezone: str
    payload: Any
    target: HttpTarget | KafkaTarget | PullTarget
    retries: int
    timeout_sec: float
    lease_sec: float
    priority: int
    misfire_policy: MisfirePolicy
    misfire_grace_sec: float
    catch_up_limit: int
    overlap_policy: OverlapPolicy
    allow_jitter_sec: float
    critical: bool
    depends_on: list[str]
    backoff: Backoff
    # newer fields: defaults keep an older node readable
    next_fire_at: dt.datetime | None = None
    seconds: str | None = None
    end_at: dt.datetime | None = None
    tags: list[str] = []
    # "either": a node from before the crontab rule read every schedule that way
    day_rule: str = "either"
    last_run: RunSummary | None = None


class ItemError(msgspec.Struct, kw_only=True):
    """Why an item of a batch was refused: what its single request (POST /v1/jobs, POST
    /v1/runs/{run_id}/complete, POST /v1/runs/{run_id}/heartbeat) would have answered;
    ``field`` starts with ``jobs[<index>]`` or ``runs[<index>]``."""

    error: str
    message: str
    field: str | None = None
    cancelled: bool | None = None


class JobResult(msgspec.Struct, kw_only=True):
    """One item of a batch: ``status`` 201 created, 200 already there as given, else the
    refusal's status with its ``error``."""

    index: int
    status: int
    job_id: str | None = None
    version: int | None = None
    error: ItemError | None = None

    @property
    def ok(self) -> bool:
        return self.status in (200, 201)


class JobBatch(msgspec.Struct, kw_only=True):
    """What ``create_jobs`` did, one result per job given, in order."""

    results: list[JobResult]
    created: int
    existing: int
    failed: int

    @property
    def refused(self) -> list[JobResult]:
        return [r for r in self.results if not r.ok]


class Completion(msgspec.Struct, kw_only=True):
    """One attempt's outcome, for ``complete_many``: what ``complete`` sends, with its run.
    ``started_late_ms``: a run leased ahead that no heartbeat reported started."""

    run_id: str
    fencing_token: int
    status: Literal["succeeded", "failed"] = "succeeded"
    error: str = ""
    permanent: bool = False
    ambiguous: bool = False
    retry_after_sec: float | None = None
    started_late_ms: int | None = None


class CompletionResult(msgspec.Struct, kw_only=True):
    """One outcome of ``complete_many``: ``status`` 200 recorded, else the refusal's status
    with its ``error`` (409 ``lease_lost``: the lease is gone, ``error.cancelled`` says
    whether the run was cancelled)."""

    index: int
    status: int
    run_id: str | None = None
    error: ItemError | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


class CompletionBatch(msgspec.Struct, kw_only=True):
    """What ``complete_many`` did, one result per outcome given, in order."""

    results: list[CompletionResult]
    completed: int
    failed: int

    @property
    def refused(self) -> list[CompletionResult]:
        return [r for r in self.results if not r.ok]


class Beat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One run's heartbeat, for ``heartbeat_many``: what ``heartbeat`` sends, with its run.
    ``check``: only ask whether the lease holds (a run leased ahead, about to start);
    ``started_late_ms``: the run leased ahead started this long after its ``start_at``."""

    run_id: str
    fencing_token: int
    check: bool = False
    started_late_ms: int | None = None


class HeartbeatResult(msgspec.Struct, kw_only=True):
    """One heartbeat of ``heartbeat_many``: ``status`` 200 extended (until
    ``lease_expires_at``), else the refusal's status with its ``error`` (409 ``lease_lost``:
    stop working on the run, ``error.cancelled`` says whether it was cancelled)."""

    index: int
    status: int
    run_id: str | None = None
    lease_expires_at: dt.datetime | None = None
    error: ItemError | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


class HeartbeatBatch(msgspec.Struct, kw_only=True):
    """What ``heartbeat_many`` did, one result per heartbeat given, in order."""

    results: list[HeartbeatResult]
    extended: int
    failed: int

    @property
    def refused(self) -> list[HeartbeatResult]:
        return [r for r in self.results if not r.ok]


class JobPage(msgspec.Struct, kw_only=True):
    jobs: list[Job]
    next_cursor: str | None


class Attempt(msgspec.Struct, kw_only=True):
    attempt: int
    worker_id: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    outcome: Literal["succeeded", "failed", "lease_expired", "cancelled"] | None
    error: str
    fencing_token: int | None = None  # the attempt's lease's token


class Ask(msgspec.Struct, kw_only=True):
    """One ask of a run's target about what became of an attempt of unknown outcome (its
    ``status_url``); ``answer`` is None while the ask waits."""

    ask: int
    fencing_token: int
    ask_at: dt.datetime
    answered_at: dt.datetime | None = None
    answer: str | None = None  # succeeded, failed, never_seen, in_progress, unknown, no_answer
    status: int | None = None
    detail: str = ""


class Run(msgspec.Struct, kw_only=True):
    run_id: str
    job_id: str
    state: RunState
    attempt: int
    trigger: str
    scheduled_for: dt.datetime
    available_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    lateness_ms: int | None
    error: str
    dead_reason: str | None
    attempts: list[Attempt]
    # "archive": the run left the server's history window and was read back from the archive
    # (defaults keep answers of servers from before the field readable).
    source: Literal["hot", "archive"] = "hot"
    # a critical run's asks of its target about attempts of unknown outcome, oldest first
    asks: list[Ask] = []


class RunPage(msgspec.Struct, kw_only=True):
    runs: list[Run]
    next_cursor: str | None
    source: Literal["hot", "archive"] = "hot"  # "archive" when any run came from there
    # With archiving off: runs of slots before this instant are gone, none older is listed.
    gone_before: dt.datetime | None = None


class ClaimedRun(msgspec.Struct, kw_only=True):
    """A leased run: do the work, heartbeat before ``lease_expires_at``, complete with the
    token. Pass ``idempotency_key`` and ``fencing_token`` on to what the work calls."""

    run_id: str
    job_id: str
    scheduled_for: dt.datetime
    attempt: int
    fencing_token: int
    lease_expires_at: dt.datetime
    lease_sec: float
    payload: Any
    idempotency_key: str
    timeout_sec: float
    # leased ahead: start it at start_at, start_in_ms after the answer came (never before)
    start_at: dt.datetime | None = None
    start_in_ms: int = 0
    # how long before the start to check the lease; the node holds a check sent earlier than
    # 1.5 s before it and answers then (0: a node that answers at once; check at most 1 s before)
    check_ahead_ms: int = 0


class ClaimOut(msgspec.Struct, kw_only=True):
    runs: list[ClaimedRun]


class HeartbeatOut(msgspec.Struct, kw_only=True):
    run_id: str
    lease_expires_at: dt.datetime | None  # None: a check, which extends nothing


class FireTime(msgspec.Struct, kw_only=True):
    at: dt.datetime
    local: str  # the wall-clock reading in the schedule's timezone, with its offset


class Preview(msgspec.Struct, kw_only=True):
    timezone: str
    fires: list[FireTime]
    schedule: str | None = None
    seconds: str | None = None
    job_id: str | None = None


class Slot(msgspec.Struct, kw_only=True):
    scheduled_for: dt.datetime
    run_id: str
    state: RunState | None  # None: the slot has no run
    due: bool


class Slots(msgspec.Struct, kw_only=True):
    job_id: str
    slots: list[Slot]
    more: bool


class ChangePreview(msgspec.Struct, kw_only=True):
    """What a change would do to a job's fire times (nothing is changed)."""

    job_id: str
    before: Preview
    after: Preview
    added: list[FireTime]
    dropped: list[FireTime]
    compared_until: dt.datetime | None


class ReplayRefused(msgspec.Struct, kw_only=True):
    run_id: str
    error: str
    message: str


class ReplayOut(msgspec.Struct, kw_only=True):
    """What a replay of dead runs by filter did (or, dry, would do); go on with next_cursor."""

    dry_run: bool
    matched: int
    replayed: list[str]
    refused: list[ReplayRefused]
    scanned: int
    next_cursor: str | None


class StatsFigures(msgspec.Struct, kw_only=True):
    started: int
    delay_p50_ms: float | None
    delay_p99_ms: float | None
    delay_max_ms: int | None
    delay_mean_ms: float | None
    succeeded: int
    failed: int
    retried: int
    dead: int
    cancelled: int
    skipped: int


class StatsPoint(StatsFigures, kw_only=True):
    at: dt.datetime


class Stats(msgspec.Struct, kw_only=True):
    """A team's figures by step over a window (scheduling delay, outcomes)."""

    since: dt.datetime
    until: dt.datetime
    step_min: int
    points: list[StatsPoint]
    total: StatsFigures
    runs_by_state: dict[str, int]


class TeamLimits(msgspec.Struct, kw_only=True):
    max_jobs: int
    max_depends_on: int
    max_name_chars: int
    max_page_size: int
    requests_per_sec: float
    request_burst: int
    max_waiting_claims: int = 256
    max_event_streams: int = 8


class Team(msgspec.Struct, kw_only=True):
    tenant: str
    jobs: int
    limits: TeamLimits


class Health(msgspec.Struct, kw_only=True):
    status: str


class Event(msgspec.Struct, kw_only=True):
    """One event of the audit stream: where it is in the log, the event as the log holds it
    (``docs/events.md``: a dict with ``type``, ``at``, ``job_id``, ``tenant``, ...), and the
    cursor that resumes the stream right after it."""

    partition: int
    offset: int
    event: dict[str, Any]
    cursor: str = ""

    @property
    def type(self) -> str:
        return str(self.event.get("type", ""))
