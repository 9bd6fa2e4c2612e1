"""The API's wire format: every request and response body, as msgspec structs.

Request structs forbid unknown fields, so a typo (``"retires": 3``) is a 400 naming the field
rather than a job silently created with the default. Job fields default to ``UNSET``: one struct
serves a full definition (POST, PUT: unset means the default) and a partial one (PATCH: unset
means unchanged). Instants are RFC 3339 strings here and int milliseconds everywhere else
(``api/instants.py`` converts).

These structs are also the source of ``/openapi.json``'s schemas.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from core.jobs import Backoff, MisfirePolicy, OverlapPolicy, Target

# -- requests ----------------------------------------------------------------------------------


class SecretRefIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A header value the node reads from its secrets directory at each call
    (``{"from_file": "name"}``), so the credential is never written into the log."""

    from_file: str | UnsetType = UNSET
    from_env: str | UnsetType = UNSET  # refused with a reason: see api/translate.py


class HttpTargetIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="http"):
    url: str
    headers: dict[str, str | SecretRefIn] = {}
    max_calls_per_sec: float | None = None  # the team's calls to the URL's origin share it


class KafkaTargetIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="kafka"):
    topic: str


class PullTargetIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="pull"):
    pool: str


# "https://svc/hook", "kafka://topic", "pull://pool", or the object forms
TargetIn = str | HttpTargetIn | KafkaTargetIn | PullTargetIn


class BackoffIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    base_sec: float | UnsetType = UNSET
    factor: float | UnsetType = UNSET
    cap_sec: float | UnsetType = UNSET
    jitter: bool | UnsetType = UNSET


class JobFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A job's definition as clients write it. Exactly one of ``schedule``, ``run_at`` and
    ``interval_sec`` (none with ``depends_on``); ``retries`` N allows N + 1 attempts."""

    name: str | UnsetType = UNSET
    schedule: str | UnsetType | None = UNSET
    run_at: str | UnsetType | None = UNSET
    interval_sec: float | UnsetType | None = UNSET
    start_at: str | UnsetType | None = UNSET
    timezone: str | UnsetType = UNSET
    payload: Any = UNSET
    target: TargetIn | UnsetType = UNSET
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


class NewJob(JobFields, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/jobs: give ``job_id`` to choose the id, or ``idempotency_key`` to make retries of
    the request land on the same job, or neither for a fresh id."""

    job_id: str | UnsetType = UNSET
    idempotency_key: str | UnsetType = UNSET


class JobPatch(JobFields, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """PATCH /v1/jobs/{job_id}: the fields given replace the job's; ``status`` pauses or resumes;
    ``version`` (or ``If-Match``) makes the change conditional."""

    status: Literal["active", "paused"] | UnsetType = UNSET
    version: int | UnsetType = UNSET


class TriggerIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    scheduled_for: str | None = None  # the slot to run (a backfill); absent: now


class SchedulePreviewIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    schedule: str
    timezone: str = "UTC"
    n: int = 10
    after: str | None = None  # preview from this instant; absent: now


class ClaimIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pool: str
    worker_id: str
    limit: int = 1


class HeartbeatIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    fencing_token: int


class CompleteIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    fencing_token: int
    status: Literal["succeeded", "failed"]
    error: str = ""
    permanent: bool = False  # retrying cannot help: dead-letter it now
    ambiguous: bool = False  # the attempt may have taken effect (e.g. timed out after sending)
    retry_after_sec: float | None = None  # the target's own "not before"


# -- responses ---------------------------------------------------------------------------------


class JobOut(msgspec.Struct, kw_only=True):
    job_id: str
    tenant: str
    name: str
    status: Literal["active", "paused", "cancelled", "finished"]
    version: int
    next_run_at: str | None
    created_at: str
    updated_at: str
    schedule: str | None
    run_at: str | None
    interval_sec: float | None
    start_at: str | None
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


class JobPage(msgspec.Struct, kw_only=True):
    jobs: list[JobOut]
    next_cursor: str | None


class AttemptOut(msgspec.Struct, kw_only=True):
    attempt: int
    worker_id: str
    started_at: str
    finished_at: str | None
    outcome: Literal["succeeded", "failed", "lease_expired", "cancelled"] | None
    error: str


class RunOut(msgspec.Struct, kw_only=True):
    run_id: str
    job_id: str
    state: Literal[
        "blocked", "pending", "running", "succeeded", "failed", "retrying", "dead", "cancelled"
    ]
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


class RunPage(msgspec.Struct, kw_only=True):
    runs: list[RunOut]
    next_cursor: str | None


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


class ClaimOut(msgspec.Struct, kw_only=True):
    runs: list[ClaimedRun]


class HeartbeatOut(msgspec.Struct, kw_only=True):
    run_id: str
    lease_expires_at: str


class FireTime(msgspec.Struct, kw_only=True):
    at: str  # UTC
    local: str  # the wall-clock reading in the schedule's timezone, with its offset


class PreviewOut(msgspec.Struct, kw_only=True):
    timezone: str
    fires: list[FireTime]
    schedule: str | None = None
    job_id: str | None = None


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok", "ready"]


REQUEST_TYPES: tuple[type, ...] = (
    NewJob,
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
    Health,
)
