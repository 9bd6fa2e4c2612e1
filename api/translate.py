"""Between the wire format (``api/wire.py``) and the core: job definitions in, views out.

Job ids
    ``POST /v1/jobs`` with an ``idempotency_key`` derives the id from the tenant and the key
    (``j_`` + base32 of their SHA-256), so a retried request names the same job, lands on the
    same partition, and the core's create-only ``PutJob`` makes the repeat a no-op. Without a key
    the id is random.

Merging
    A definition is applied over a base: the defaults for a new job, the current spec for a
    PATCH. Giving any one of ``schedule``, ``run_at`` or ``interval_sec`` replaces how the job is
    timed (the other two are cleared), so ``{"schedule": "0 9 * * *"}`` turns a one-shot job
    into a recurring one without also having to send ``"run_at": null``. ``seconds`` goes with
    ``schedule``: a ``schedule`` without it fires at second 0, and ``seconds`` alone changes
    the seconds of the job's schedule. The core keeps the two as one 6-field expression,
    seconds last (``core.cron.with_seconds``), and the API shows them apart again.
"""

from __future__ import annotations

import base64
import hashlib
import random
import secrets
import threading
from collections.abc import Callable
from typing import Any, Literal, Protocol, assert_never

import msgspec
from msgspec import UNSET

from api.instants import parse_rfc3339, to_rfc3339
from api.wire import (
    MAX_ERROR_CHARS,
    AskOut,
    AttemptOut,
    BackoffIn,
    ClaimedRun,
    HistorySource,
    HttpTargetIn,
    JobFields,
    JobOut,
    KafkaTargetIn,
    PullTargetIn,
    RunOut,
    RunSummary,
    SecretRefIn,
    TargetIn,
)
from core.commands import CompleteRun, HeartbeatRun, Outcome
from core.cron import DayRule, day_rule_matters, split_seconds, with_seconds
from core.decide import CHECK_AHEAD_MS
from core.errors import InvalidDefinition
from core.events import LeaseGranted
from core.ids import idempotency_key, team_id
from core.jobs import (
    MAX_ATTEMPTS,
    Backoff,
    HttpTarget,
    JobSpec,
    KafkaTarget,
    PullTarget,
    SecretRef,
    Target,
    checked,
    jitter_ms,
)
from projections.views import JobView, RunView

MAX_IDEMPOTENCY_KEY = 256
_WHEN = ("schedule", "run_at", "interval_sec")
_INSTANTS = ("run_at", "start_at", "end_at")
_REQUEST_ONLY = ("allow_past", "seconds")  # not JobSpec fields as they are


# Base32 (RFC 4648's alphabet, lower case) ten bits, two letters, at a time: the standard
# library's encoder is written in Python and was a twentieth of a batch registration's time.
_B32 = "abcdefghijklmnopqrstuvwxyz234567"
_B32_PAIRS = [a + b for a in _B32 for b in _B32]


def _b32(data: bytes) -> str:
    """``data`` (a multiple of 5 bytes) in unpadded lower-case base32."""
    if len(data) % 5:
        return base64.b32encode(data).decode().rstrip("=").lower()
    n = int.from_bytes(data, "big")
    return "".join([_B32_PAIRS[(n >> s) & 1023] for s in range(len(data) * 8 - 10, -1, -10)])


# A job id needs to be unique, not secret (ids are each team's own: core/ids.py), so it is
# drawn from a generator seeded once from the system's randomness: one system call per id was
# a tenth of a registration's time on a machine whose getrandom is slow.
_ids = random.Random(secrets.token_bytes(32))
_ids_lock = threading.Lock()


def random_job_id() -> str:
    with _ids_lock:
        bits = _ids.getrandbits(120)
    return "j_" + _b32(bits.to_bytes(15, "big"))


def job_id_for_key(tenant: str, key: str) -> str:
    """The job a tenant's ``idempotency_key`` names: the same pair always gives the same id."""
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
        raise InvalidDefinition(
            "idempotency_key", f"must be 1-{MAX_IDEMPOTENCY_KEY} characters long"
        )
    digest = hashlib.sha256(f"{tenant}\n{key}".encode()).digest()
    return "j_" + _b32(digest[:20])  # 32 letters


def _header_value(name: str, value: str | SecretRefIn) -> str | SecretRef:
    if isinstance(value, str):
        return value
    field = f"target.headers.{name}"
    if value.from_env is not UNSET:
        # The node's environment holds the operator's own secrets and is shared by every team:
        # a team naming a variable could have any of them sent to a URL of its choosing.
        raise InvalidDefinition(
            field,
            "from_env is not offered (the node's environment is shared by every team); ask the"
            " operator to put the secret in the team's secrets directory and use from_file",
        )
    if value.from_file is UNSET:
        raise InvalidDefinition(field, 'a secret reference is {"from_file": "<name>"}')
    return SecretRef(from_file=value.from_file)


def target_of(value: TargetIn) -> Target:
    match value:
        case HttpTargetIn(url=url, headers=headers, max_calls_per_sec=rate, status_url=status):
            return HttpTarget(
                url=url,
                headers={name: _header_value(name, v) for name, v in headers.items()},
                max_calls_per_sec=rate,
                status_url=status,
            )
        case KafkaTargetIn(topic=topic):
            return KafkaTarget(topic=topic)
        case PullTargetIn(pool=pool):
            return PullTarget(pool=pool)
        case str() if value.startswith(("http://", "https://")):
            return HttpTarget(url=value)
        case str() if value.startswith("kafka://"):
            return KafkaTarget(topic=value.removeprefix("kafka://"))
        case str() if value.startswith("pull://"):
            return PullTarget(pool=value.removeprefix("pull://"))
        case str():
            raise InvalidDefinition(
                "target", f"{value!r} is not an http(s)://, kafka://topic or pull://pool target"
            )
        case _:
            assert_never(value)


def _backoff(given: BackoffIn, base: Backoff) -> Backoff:
    changes = {f: v for f in given.__struct_fields__ if (v := getattr(given, f)) is not UNSET}
    return msgspec.structs.replace(base, **changes)


def _given(fields: JobFields) -> dict[str, Any]:
    """The definition fields ``fields`` sets, converted to :class:`JobSpec` terms."""
    out: dict[str, Any] = {}
    for name in JobFields.__struct_fields__:
        value = getattr(fields, name)
        if value is UNSET or name in _REQUEST_ONLY:
            continue
        if name == "schedule" and value is not None:
            check_five_fields(value)
        if name in _INSTANTS and value is not None:
            value = parse_rfc3339(value, name)
        elif name == "target":
            value = target_of(value)
        elif name in ("depends_on", "tags"):
            value = tuple(value)
        elif name == "retries":
            if not 0 <= value < MAX_ATTEMPTS:
                raise InvalidDefinition("retries", f"must be between 0 and {MAX_ATTEMPTS - 1}")
            name, value = "max_attempts", value + 1
        out[name] = value
    return out


def spec_of(
    fields: JobFields,
    tenant: str,
    base: JobSpec | None = None,
    scope: Callable[[str], str] = lambda job_id: job_id,
) -> JobSpec:
    """The definition ``fields`` describes, over ``base`` (None: a new job). Validated: raises
    :class:`InvalidDefinition` naming the first bad field in the API's terms. ``scope`` gives
    the log's id of a job the team names (``depends_on``)."""
    given = _given(fields)
    if "depends_on" in given:
        given["depends_on"] = tuple(scope(upstream) for upstream in given["depends_on"])
    if fields.seconds is not UNSET:
        schedule = given.get("schedule", base.schedule if base is not None else None)
        if schedule is None and fields.seconds is not None:
            raise InvalidDefinition("seconds", "only a job with a schedule takes seconds")
        if schedule is not None:
            given["schedule"] = with_seconds(split_seconds(schedule)[0], fields.seconds)
    if given.get("schedule") is not None:
        # A schedule the request sets is read as crontab reads it. The field is written only
        # where the two rules differ, so every other definition stays as it was (a repeated
        # create with an idempotency key still matches the job it made).
        matters = day_rule_matters(given["schedule"])
        given["day_rule"] = DayRule.CRONTAB if matters else DayRule.EITHER
    backoff = given.pop("backoff", None)
    if base is None:
        for required in ("name", "target"):
            if required not in given:
                raise InvalidDefinition(required, "is required")
        spec = JobSpec(tenant=tenant, **given)
    else:
        if any(f in given for f in _WHEN) or given.get("depends_on"):
            for f in _WHEN:
                given.setdefault(f, None)
        spec = msgspec.structs.replace(base, **given)
    if backoff is not None:
        spec = msgspec.structs.replace(spec, backoff=_backoff(backoff, spec.backoff))
    return checked(spec)


# -- views out ---------------------------------------------------------------------------------


def check_five_fields(schedule: str) -> None:
    """A job's ``schedule`` has five fields; a sixth is refused rather than guessed at."""
    if len(schedule.split()) == 6:
        raise InvalidDefinition(
            "schedule",
            f"{schedule!r} has 6 fields, which Quartz reads seconds first and croniter seconds"
            " last; give the 5 fields (minute hour day-of-month month day-of-week) here and the"
            ' seconds in "seconds", e.g. {"schedule": "* * * * *", "seconds": "*/10"}',
        )


def _instant(ms: int | None) -> str | None:
    return None if ms is None else to_rfc3339(ms)


def next_run(view: JobView, now: int) -> int | None:
    """The job's next slot as a user means it: a run materialised ahead of its slot (the lead
    time) is the next run until its slot comes, as it would be without a lead."""
    ahead = view.ahead_slot
    if ahead is not None and ahead > now and view.status == "active":
        return ahead
    return view.next_slot


def _fire(view: JobView, slot: int | None) -> int | None:
    if slot is None:
        return None
    return slot + jitter_ms(view.job_id, slot, view.spec.allow_jitter_sec)


def job_out(view: JobView, now: int, last_run: RunView | None = None) -> JobOut:
    """``view`` as the API shows it at ``now``; ``last_run``: the run of its newest slot, if
    asked."""
    spec = view.spec
    schedule, seconds = (None, None) if spec.schedule is None else split_seconds(spec.schedule)
    upcoming = next_run(view, now)
    return JobOut(
        job_id=team_id(view.job_id),
        tenant=view.tenant,
        name=view.name,
        status=view.status,
        version=view.version,
        next_run_at=_instant(upcoming),
        next_fire_at=_instant(_fire(view, upcoming)),
        created_at=to_rfc3339(view.created_at),
        updated_at=to_rfc3339(view.updated_at),
        schedule=schedule,
        seconds=seconds,
        run_at=_instant(spec.run_at),
        interval_sec=spec.interval_sec,
        start_at=_instant(spec.start_at),
        end_at=_instant(spec.end_at),
        timezone=spec.timezone,
        payload=spec.payload,
        target=spec.target,
        retries=spec.max_attempts - 1,
        timeout_sec=spec.timeout_sec,
        lease_sec=spec.lease_sec,
        priority=spec.priority,
        misfire_policy=spec.misfire_policy,
        misfire_grace_sec=spec.misfire_grace_sec,
        catch_up_limit=spec.catch_up_limit,
        overlap_policy=spec.overlap_policy,
        allow_jitter_sec=spec.allow_jitter_sec,
        critical=spec.critical,
        depends_on=[team_id(upstream) for upstream in spec.depends_on],
        backoff=spec.backoff,
        tags=list(spec.tags),
        day_rule=spec.day_rule,
        last_run=None if last_run is None else run_summary(last_run),
    )


def run_summary(view: RunView) -> RunSummary:
    return RunSummary(
        run_id=team_id(view.run_id),
        state=view.state,
        trigger=view.trigger,
        scheduled_for=to_rfc3339(view.scheduled_for),
        started_at=_instant(view.started_at),
        finished_at=_instant(view.finished_at),
        lateness_ms=view.lateness_ms,
        error=view.error,
        dead_reason=view.dead_reason,
    )


class _Completion(Protocol):
    """An attempt's outcome as a worker sends it: ``CompleteIn``, or an item of a batch."""

    @property
    def fencing_token(self) -> int: ...
    @property
    def status(self) -> Literal["succeeded", "failed"]: ...
    @property
    def error(self) -> str: ...
    @property
    def permanent(self) -> bool: ...
    @property
    def ambiguous(self) -> bool: ...
    @property
    def retry_after_sec(self) -> float | None: ...
    @property
    def started_late_ms(self) -> int | None: ...


class _Beat(Protocol):
    """A heartbeat as a worker sends it: ``HeartbeatIn``, or an item of a batch."""

    @property
    def fencing_token(self) -> int: ...
    @property
    def check(self) -> bool: ...
    @property
    def started_late_ms(self) -> int | None: ...


def heartbeat_run(run_id: str, body: _Beat, tenant: str) -> HeartbeatRun:
    """The command a worker's heartbeat for ``run_id`` (the log's id) becomes."""
    return HeartbeatRun(
        run_id=run_id,
        fencing_token=body.fencing_token,
        tenant=tenant,
        check=body.check,
        started_late_ms=body.started_late_ms,
    )


def complete_run(run_id: str, body: _Completion, tenant: str) -> CompleteRun:
    """The command a worker's outcome for ``run_id`` (the log's id) becomes."""
    retry_after = body.retry_after_sec
    return CompleteRun(
        run_id=run_id,
        fencing_token=body.fencing_token,
        outcome=Outcome(body.status),
        error=body.error[:MAX_ERROR_CHARS],
        permanent=body.permanent,
        ambiguous=body.ambiguous,
        retry_after_ms=None if retry_after is None else round(retry_after * 1000),
        tenant=tenant,
        started_late_ms=body.started_late_ms,
    )


def run_out(view: RunView, source: HistorySource = "hot") -> RunOut:
    return RunOut(
        source=source,
        run_id=team_id(view.run_id),
        job_id=team_id(view.job_id),
        state=view.state,
        attempt=view.attempt,
        trigger=view.trigger,
        scheduled_for=to_rfc3339(view.scheduled_for),
        available_at=to_rfc3339(view.available_at),
        started_at=_instant(view.started_at),
        finished_at=_instant(view.finished_at),
        lateness_ms=view.lateness_ms,
        error=view.error,
        dead_reason=view.dead_reason,
        attempts=[
            AttemptOut(
                attempt=a.attempt,
                fencing_token=a.fencing_token,
                worker_id=a.worker_id,
                started_at=to_rfc3339(a.started_at),
                finished_at=_instant(a.finished_at),
                outcome=a.outcome,
                error=a.error,
            )
            for a in view.attempts
        ],
        asks=[
            AskOut(
                ask=a.ask,
                fencing_token=a.fencing_token,
                ask_at=to_rfc3339(a.ask_at),
                answered_at=_instant(a.answered_at),
                answer=a.answer,  # type: ignore[arg-type]
                status=a.status,
                detail=a.detail,
            )
            for a in view.asks
        ],
    )


def claimed(lease: LeaseGranted, spec: JobSpec, now: int) -> ClaimedRun:
    """A leased run as a worker gets it; ``now``: the node's clock as it answers, from which a
    run leased ahead starts ``start_in_ms`` later."""
    start = lease.start_at
    return ClaimedRun(
        run_id=team_id(lease.run_id),
        job_id=team_id(lease.job_id),
        scheduled_for=to_rfc3339(lease.scheduled_for),
        attempt=lease.attempt,
        fencing_token=lease.fencing_token,
        lease_expires_at=to_rfc3339(lease.lease_expires_at),
        lease_sec=spec.lease_sec,
        payload=spec.payload,
        idempotency_key=idempotency_key(lease.job_id, lease.scheduled_for),
        timeout_sec=spec.timeout_sec,
        start_at=None if start is None else to_rfc3339(start),
        start_in_ms=0 if start is None else max(0, start - now),
        check_ahead_ms=0 if start is None else CHECK_AHEAD_MS,
    )
