"""The API's wire format: every request and response body, as msgspec structs.

Request structs forbid unknown fields, so a typo (``"retires": 3``) is a 400 naming the field
rather than a job silently created with the default. Job fields default to ``UNSET``: one struct
serves a full definition (POST, PUT: unset means the default) and a partial one (PATCH: unset
means unchanged). Instants are RFC 3339 strings here and int milliseconds everywhere else
(``api/instants.py`` converts).

These structs are also the source of ``/openapi.json``'s schemas, bounds and patterns included:
the decoder refuses what the document says is out of range (400), so the two cannot disagree.
The core checks the same bounds again (``core.jobs.validate``), from the same constants.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from api.instants import RFC3339
from core.cron import DayRule
from core.decide import MAX_CLAIM, MAX_HORIZON_MS
from core.jobs import (
    DAY_MS,
    JOB_ID,
    MAX_ATTEMPTS,
    MAX_CALLS_PER_SEC,
    MAX_CATCH_UP,
    MAX_DEPENDS_ON,
    MAX_NAME_CHARS,
    MAX_PRIORITY,
    MAX_TAGS,
    POOL,
    TAG,
    Backoff,
    MisfirePolicy,
    OverlapPolicy,
    Target,
)

DAY_SEC = DAY_MS // 1000
INT64_MAX = 2**63 - 1  # versions and fencing tokens: the read model stores them as msgpack ints
MAX_RETRY_AFTER_SEC = 7 * DAY_SEC
MAX_PREVIEW = 100
MAX_SLOTS = 1000  # of a job's slots listed at once (GET /v1/jobs/{job_id}/slots)
MAX_IDEMPOTENCY_KEY = 256
MAX_ERROR_CHARS = 8192  # of a worker's error text, the run keeps this much
MAX_CLAIM_WAIT_SEC = 30.0  # the longest a claim long-polls (``wait_sec``)
MAX_AHEAD_SEC = MAX_HORIZON_MS // 1000  # the furthest a claim reaches ahead (``ahead_sec``)
MAX_SEARCH_CHARS = 200  # GET /v1/jobs?q=

JobId = Annotated[str, Meta(pattern=JOB_ID.pattern)]
Instant = Annotated[str, Meta(pattern=RFC3339, examples=["2026-11-29T09:00:00Z"])]
Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME_CHARS)]
Schedule = Annotated[str, Meta(min_length=1, max_length=256, examples=["0 9 * * 1-5"])]
Timezone = Annotated[str, Meta(min_length=1, max_length=64, examples=["Europe/London"])]
Seconds = Annotated[float, Meta(ge=0, le=DAY_SEC)]
# the seconds field of a per-second cron schedule: "0", "*/10", "0,30", "5-10"
Seconds_ = Annotated[
    str, Meta(min_length=1, max_length=64, pattern=r"^[0-9*/,-]+$", examples=["*/10"])
]
PositiveSeconds = Annotated[float, Meta(gt=0, le=DAY_SEC)]
Tag = Annotated[str, Meta(pattern=f"^{TAG.pattern}$", examples=["team=payments"])]

# -- requests ----------------------------------------------------------------------------------


class SecretRefIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A header value the node reads from its secrets directory at each call
    (``{"from_file": "name"}``), so the credential is never written into the log."""

    from_file: str | UnsetType = UNSET
    from_env: str | UnsetType = UNSET  # refused with a reason: see api/translate.py


class HttpTargetIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="http"):
    url: Annotated[str, Meta(min_length=1, max_length=2048)]
    headers: dict[str, str | SecretRefIn] = {}
    # the team's calls to the URL's origin share it
    max_calls_per_sec: Annotated[float, Meta(ge=0.01, le=MAX_CALLS_PER_SEC)] | None = None
    # where a guard answers what became of an attempt (core.asking)
    status_url: Annotated[str, Meta(min_length=1, max_length=2048)] | None = None


class KafkaTargetIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="kafka"):
    topic: Annotated[str, Meta(min_length=1, max_length=249)]


class PullTargetIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="pull"):
    pool: Annotated[str, Meta(pattern=POOL.pattern)]


# "https://svc/hook", "kafka://topic", "pull://pool", or the object forms
TargetIn = (
    Annotated[str, Meta(min_length=1, max_length=2048, examples=["pull://reports"])]
    | HttpTargetIn
    | KafkaTargetIn
    | PullTargetIn
)


class BackoffIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    base_sec: PositiveSeconds | UnsetType = UNSET
    factor: Annotated[float, Meta(ge=1, le=10)] | UnsetType = UNSET
    cap_sec: Annotated[float, Meta(gt=0, le=7 * DAY_SEC)] | UnsetType = UNSET
    jitter: bool | UnsetType = UNSET


class JobFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A job's definition as clients write it. Exactly one of ``schedule``, ``run_at`` and
    ``interval_sec`` (none with ``depends_on``); ``retries`` N allows N + 1 attempts.

    ``schedule`` has 5 fields; the seconds of a per-second schedule go in ``seconds`` (a sixth
    field is refused: Quartz reads it first, croniter last). ``start_at`` and ``end_at`` bound
    every kind of schedule. A ``run_at`` (or ``end_at``) more than a minute in the past is
    refused unless ``allow_past`` is true."""

    name: Name | UnsetType = UNSET
    schedule: Schedule | UnsetType | None = UNSET
    seconds: Seconds_ | UnsetType | None = UNSET
    run_at: Instant | UnsetType | None = UNSET
    interval_sec: Annotated[float, Meta(ge=1, le=366 * DAY_SEC)] | UnsetType | None = UNSET
    start_at: Instant | UnsetType | None = UNSET
    end_at: Instant | UnsetType | None = UNSET
    allow_past: bool | UnsetType = UNSET  # a request option, not kept with the job
    timezone: Timezone | UnsetType = UNSET
    payload: Any = UNSET
    target: TargetIn | UnsetType = UNSET
    retries: Annotated[int, Meta(ge=0, le=MAX_ATTEMPTS - 1)] | UnsetType = UNSET
    timeout_sec: PositiveSeconds | UnsetType = UNSET
    lease_sec: Annotated[float, Meta(ge=1, le=3600)] | UnsetType = UNSET
    priority: Annotated[int, Meta(ge=0, le=MAX_PRIORITY)] | UnsetType = UNSET
    misfire_policy: MisfirePolicy | UnsetType = UNSET
    misfire_grace_sec: Seconds | UnsetType = UNSET
    catch_up_limit: Annotated[int, Meta(ge=1, le=MAX_CATCH_UP)] | UnsetType = UNSET
    overlap_policy: OverlapPolicy | UnsetType = UNSET
    allow_jitter_sec: Seconds | UnsetType = UNSET
    critical: bool | UnsetType = UNSET
    depends_on: Annotated[list[JobId], Meta(max_length=MAX_DEPENDS_ON)] | UnsetType = UNSET
    backoff: BackoffIn | UnsetType = UNSET
    tags: Annotated[list[Tag], Meta(max_length=MAX_TAGS)] | UnsetType = UNSET


class JobDefinition(JobFields, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """PUT /v1/jobs/{job_id}: a whole definition, so ``name`` and ``target`` are required."""

    name: Name
    target: TargetIn


class NewJob(JobDefinition, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/jobs: give ``job_id`` to choose the id, or ``idempotency_key`` to make retries of
    the request land on the same job, or neither for a fresh id (not both)."""

    job_id: JobId | UnsetType = UNSET
    idempotency_key: (
        Annotated[str, Meta(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)] | UnsetType
    ) = UNSET


class JobPatch(JobFields, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """PATCH /v1/jobs/{job_id}: the fields given replace the job's; ``status`` pauses or resumes;
    ``version`` (or ``If-Match``) makes the change conditional."""

    status: Literal["active", "paused"] | UnsetType = UNSET
    version: Annotated[int, Meta(ge=1, le=INT64_MAX)] | UnsetType = UNSET


class TriggerIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    scheduled_for: Instant | None = None  # the slot to run (a backfill); absent: now


class SchedulePreviewIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    schedule: Schedule
    seconds: Seconds_ | None = None
    timezone: Timezone = "UTC"
    n: Annotated[int, Meta(ge=1, le=MAX_PREVIEW)] = 10
    after: Instant | None = None  # preview from this instant; absent: now


class ClaimIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pool: Annotated[str, Meta(pattern=POOL.pattern)]
    worker_id: Annotated[str, Meta(min_length=1, max_length=128)]
    limit: Annotated[int, Meta(ge=1, le=MAX_CLAIM)] = 1
    # Long polling: with no run ready, answer as soon as one is (or after this many seconds,
    # with none); 0 answers at once.
    wait_sec: Annotated[float, Meta(ge=0, le=MAX_CLAIM_WAIT_SEC)] = 0.0
    # Reach ahead: lease runs that become ready within this many seconds too, each to start at
    # its start_at (never before); 0 leases only runs ready now.
    ahead_sec: Annotated[float, Meta(ge=0, le=MAX_AHEAD_SEC)] = 0.0


FencingToken = Annotated[int, Meta(ge=0, le=INT64_MAX)]


StartedLate = Annotated[int, Meta(ge=0, le=86_400_000)]  # ms after a run's start_at


class HeartbeatIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    fencing_token: FencingToken
    # a run leased ahead, about to start: only ask whether the lease still holds
    check: bool = False
    # a run leased ahead: it started this long after its start_at (the first beat after it)
    started_late_ms: StartedLate | None = None


class CompleteIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    fencing_token: FencingToken
    status: Literal["succeeded", "failed"]
    error: str = ""  # kept up to MAX_ERROR_CHARS characters
    permanent: bool = False  # retrying cannot help: dead-letter it now
    ambiguous: bool = False  # the attempt may have taken effect (e.g. timed out after sending)
    # the target's own "not before"
    retry_after_sec: Annotated[float, Meta(ge=0, le=MAX_RETRY_AFTER_SEC)] | None = None
    # a run leased ahead that no heartbeat reported started: how long after its start_at
    started_late_ms: StartedLate | None = None


# -- responses ---------------------------------------------------------------------------------


class JobOut(msgspec.Struct, kw_only=True):
    job_id: str
    tenant: str
    name: str
    status: Literal["active", "paused", "cancelled", "finished"]
    version: int
    next_run_at: str | None
    # when that run will actually be ready to start: the slot plus the job's stable jitter
    next_fire_at: str | None
    created_at: str
    updated_at: str
    schedule: str | None
    seconds: str | None
    run_at: str | None
    interval_sec: float | None
    start_at: str | None
    end_at: str | None
    timezone: str
    payload: Any
    target: Target
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
    tags: list[str]
    day_rule: DayRule
    last_run: RunSummary | None = None


class JobPage(msgspec.Struct, kw_only=True):
    jobs: list[JobOut]
    next_cursor: str | None


class AttemptOut(msgspec.Struct, kw_only=True):
    attempt: int
    fencing_token: int
    worker_id: str
    started_at: str
    finished_at: str | None
    outcome: Literal["succeeded", "failed", "lease_expired", "cancelled"] | None
    error: str


class AskOut(msgspec.Struct, kw_only=True):
    ask: int
    fencing_token: int
    ask_at: str
    answered_at: str | None
    answer: (
        Literal["succeeded", "failed", "never_seen", "in_progress", "unknown", "no_answer"] | None
    )
    status: int | None
    detail: str


RunState = Literal[
    "blocked", "pending", "running", "succeeded", "failed", "retrying", "dead", "cancelled"
]


HistorySource = Literal["hot", "archive"]


class RunOut(msgspec.Struct, kw_only=True):
    run_id: str
    job_id: str
    state: RunState
    attempt: int
    trigger: str
    scheduled_for: str
    available_at: str
    started_at: str | None
    finished_at: str | None
    lateness_ms: int | None
    error: str
    dead_reason: str | None
    attempts: list[AttemptOut]
    source: HistorySource
    asks: list[AskOut]


class RunSummary(msgspec.Struct, kw_only=True):
    run_id: str
    state: RunState
    trigger: str
    scheduled_for: str
    started_at: str | None
    finished_at: str | None
    lateness_ms: int | None
    error: str
    dead_reason: str | None


class RunPage(msgspec.Struct, kw_only=True):
    runs: list[RunOut]
    next_cursor: str | None
    source: HistorySource
    gone_before: str | None


class ClaimedRun(msgspec.Struct, kw_only=True):
    """A leased run: do the work, heartbeat before ``lease_expires_at``, complete with the token.
    ``idempotency_key`` names the slot, not the attempt: pass it to the target so a repeat of
    the same slot (after a lost lease) is recognised."""

    run_id: str
    job_id: str
    scheduled_for: str
    attempt: int
    fencing_token: int
    lease_expires_at: str
    lease_sec: float
    payload: Any
    idempotency_key: str
    timeout_sec: float
    # leased ahead (a claim with ahead_sec): when to start it, and how long from this answer
    # that is by the node's clock (wait that long from receipt: never early whatever the clocks)
    start_at: str | None = None
    start_in_ms: int = 0
    # how long before its start to check the lease (0: at most 1 s before, a node that does
    # not hold early checks); the node answers a check once the start is 1.5 s away
    check_ahead_ms: int = 0


class ClaimOut(msgspec.Struct, kw_only=True):
    runs: list[ClaimedRun]


class HeartbeatOut(msgspec.Struct, kw_only=True):
    run_id: str
    lease_expires_at: str | None  # None: a check, which extends nothing


class FireTime(msgspec.Struct, kw_only=True):
    at: str  # UTC
    local: str  # the wall-clock reading in the schedule's timezone, with its offset


class PreviewOut(msgspec.Struct, kw_only=True):
    timezone: str
    fires: list[FireTime]
    schedule: str | None = None
    seconds: str | None = None
    job_id: str | None = None


class SlotOut(msgspec.Struct, kw_only=True):
    """One slot of a job's schedule, and its run if it has one."""

    scheduled_for: str
    run_id: str
    state: str | None  # the run's state; None: the slot has no run
    due: bool  # the slot has come (only a slot that has come can be triggered)


class SlotsOut(msgspec.Struct, kw_only=True):
    job_id: str
    slots: list[SlotOut]
    more: bool  # the range holds more slots than were listed


class Health(msgspec.Struct, kw_only=True, omit_defaults=True):
    status: Literal["ok", "ready"]
    # this start of the node (GET /healthz): its peers tell a node started again from the last
    boot: str | None = None


REQUEST_TYPES: tuple[type, ...] = (
    NewJob,
    JobDefinition,
    JobFields,
    JobPatch,
    TriggerIn,
    SchedulePreviewIn,
    ClaimIn,
    HeartbeatIn,
    CompleteIn,
)
RESPONSE_TYPES: tuple[type, ...] = (
    JobOut,
    JobPage,
    RunOut,
    RunPage,
    ClaimOut,
    HeartbeatOut,
    PreviewOut,
    SlotsOut,
    Health,
)
