"""cronlog's HTTP API: ``create_app(scheduler, tokens)``.

Handlers are thin: authenticate, decode the body strictly, translate to one core command, send it
through the :class:`~api.scheduler.Scheduler` port, and answer from the read model (which has
caught up with the command's events by the time ``execute`` returns). Every ``/v1`` call speaks
for the tenant of its bearer token, and passes that tenant to every command and query: another
tenant's job or run is simply not found.

The scheduler and the tokens reach handlers through Starlette's lifespan state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import msgspec
from msgspec import UNSET
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import openapi
from api.auth import Tokens
from api.errors import EXCEPTION_HANDLERS, ApiError, bad_request, too_large, unauthorized
from api.instants import parse_rfc3339, to_local, to_rfc3339
from api.scheduler import Scheduler, Unavailable
from api.translate import (
    claimed,
    job_id_for_key,
    job_out,
    random_job_id,
    run_out,
    spec_of,
)
from api.wire import (
    ClaimIn,
    ClaimOut,
    CompleteIn,
    FireTime,
    Health,
    HeartbeatIn,
    HeartbeatOut,
    JobFields,
    JobPage,
    JobPatch,
    NewJob,
    PreviewOut,
    RunPage,
    SchedulePreviewIn,
    TriggerIn,
)
from core.commands import (
    CancelJob,
    CancelRun,
    CompleteRun,
    HeartbeatRun,
    Outcome,
    PauseJob,
    PutJob,
    ReplayRun,
    ResumeJob,
    TriggerRun,
)
from core.cron import CronSchedule
from core.decide import MAX_CLAIM, run_id_of
from core.errors import Conflict, InvalidDefinition, LeaseLost, NotFound
from core.events import Heartbeat, JobRegistered, JobUpdated, RunMaterialised
from core.jobs import POOL, JobSpec, next_slot, validate_job_id
from projections.views import JOB_STATUSES, RUN_STATES, JobView, RunView

MAX_BODY_BYTES = 1 << 20
MAX_PAGE = 200
MAX_PREVIEW = 100
MAX_RETRY_AFTER_SEC = 7 * 86_400

T = TypeVar("T")
C = TypeVar("C", bound=str)


# -- plumbing ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One authenticated request: the port, and the tenant it speaks for."""

    scheduler: Scheduler
    tenant: str


def _call(request: Request) -> Call:
    tokens: Tokens = request.state.tokens
    tenant = tokens.tenant_of(request.headers.get("authorization"))
    if tenant is None:
        raise unauthorized()
    return Call(request.state.scheduler, tenant)


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large(MAX_BODY_BYTES)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large(MAX_BODY_BYTES)
        chunks.append(chunk)
    return b"".join(chunks)


_decoders: dict[type, msgspec.json.Decoder[Any]] = {}


def _decoder(type_: type[T]) -> msgspec.json.Decoder[T]:
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    return decoder


async def _decode(request: Request, type_: type[T], *, empty_ok: bool = False) -> T:
    """The body as ``type_``; msgspec's errors become 400s naming the field (``api/errors.py``)."""
    body = await _body(request)
    if empty_ok and not body.strip():
        body = b"{}"
    return _decoder(type_).decode(body)


_encoder = msgspec.json.Encoder()


def _json(value: object, status: int = 200) -> Response:
    return Response(_encoder.encode(value), status_code=status, media_type="application/json")


def _limit(request: Request, default: int, maximum: int, name: str = "limit") -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise bad_request(name, f"must be an integer between 1 and {maximum}")
    return int(text)


def _choice(request: Request, name: str, allowed: tuple[C, ...]) -> C | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    for choice in allowed:
        if choice == value:
            return choice
    raise bad_request(name, f"must be one of {', '.join(allowed)}")


def _expected_version(request: Request, in_body: int | None = None) -> int | None:
    """``If-Match: 3`` (an ETag-style ``"3"`` too) or the body's ``version``; they must agree."""
    header = request.headers.get("if-match")
    from_header = None
    if header is not None:
        text = header.strip().removeprefix("W/").strip('"')
        if not text.isdigit():
            raise bad_request("If-Match", "must be the job's version, an integer")
        from_header = int(text)
    if from_header is not None and in_body is not None and from_header != in_body:
        raise bad_request("version", "If-Match and the body's version disagree")
    return from_header if from_header is not None else in_body


def _job_view(call: Call, job_id: str) -> JobView:
    view = call.scheduler.history.job(call.tenant, job_id)
    if view is None:
        raise NotFound(f"job {job_id} not found")
    return view


def _run_view(call: Call, run_id: str) -> RunView:
    view = call.scheduler.history.run(call.tenant, run_id)
    if view is None:
        raise NotFound(f"run {run_id} not found")
    return view


def _job(call: Call, job_id: str, status: int = 200) -> Response:
    return _json(job_out(_job_view(call, job_id)), status)


def _run(call: Call, run_id: str, status: int = 200) -> Response:
    return _json(run_out(_run_view(call, run_id)), status)


# -- jobs --------------------------------------------------------------------------------------


async def create_job(request: Request) -> Response:
    call = _call(request)
    body = await _decode(request, NewJob)
    if body.job_id is not UNSET and body.idempotency_key is not UNSET:
        raise InvalidDefinition("idempotency_key", "give job_id or idempotency_key, not both")
    if body.job_id is not UNSET:
        validate_job_id(body.job_id)
        job_id = body.job_id
    elif body.idempotency_key is not UNSET:
        job_id = job_id_for_key(call.tenant, body.idempotency_key)
    else:
        job_id = random_job_id()
    spec = spec_of(body, call.tenant)
    # create_only: a repeat with the same body changes nothing, another body is a conflict
    events = await call.scheduler.execute(PutJob(job_id=job_id, spec=spec, create_only=True))
    created = any(isinstance(e, JobRegistered) for e in events)
    return _job(call, job_id, 201 if created else 200)


async def put_job(request: Request) -> Response:
    call = _call(request)
    job_id = request.path_params["job_id"]
    validate_job_id(job_id)
    body = await _decode(request, JobFields)
    spec = spec_of(body, call.tenant)
    expected = _expected_version(request)
    events = await call.scheduler.execute(
        PutJob(job_id=job_id, spec=spec, expected_version=expected)
    )
    created = any(isinstance(e, JobRegistered) for e in events)
    return _job(call, job_id, 201 if created else 200)


async def get_job(request: Request) -> Response:
    return _job(_call(request), request.path_params["job_id"])


async def list_jobs(request: Request) -> Response:
    call = _call(request)
    page = call.scheduler.history.jobs(
        call.tenant,
        _choice(request, "status", JOB_STATUSES),
        _limit(request, 50, MAX_PAGE),
        request.query_params.get("cursor"),
    )
    return _json(JobPage(jobs=[job_out(v) for v in page.items], next_cursor=page.next_cursor))


def _changes_definition(body: JobPatch) -> bool:
    return any(getattr(body, f) is not UNSET for f in JobFields.__struct_fields__)


async def patch_job(request: Request) -> Response:
    call = _call(request)
    job_id = request.path_params["job_id"]
    body = await _decode(request, JobPatch)
    expected = _expected_version(request, None if body.version is UNSET else body.version)
    view = _job_view(call, job_id)
    if expected is not None and expected != view.version:
        raise Conflict(f"job {job_id} is at version {view.version}, not {expected}")
    if _changes_definition(body):
        spec = spec_of(body, call.tenant, base=view.spec)
        # The merge read view.spec: writing it back is conditional on nothing having changed since.
        events = await call.scheduler.execute(
            PutJob(job_id=job_id, spec=spec, expected_version=view.version)
        )
        expected = next((e.version for e in events if isinstance(e, JobUpdated)), expected)
    if body.status == "paused":
        await call.scheduler.execute(
            PauseJob(job_id=job_id, tenant=call.tenant, expected_version=expected)
        )
    elif body.status == "active":
        await call.scheduler.execute(
            ResumeJob(job_id=job_id, tenant=call.tenant, expected_version=expected)
        )
    return _job(call, job_id)


async def delete_job(request: Request) -> Response:
    call = _call(request)
    job_id = request.path_params["job_id"]
    expected = _expected_version(request)
    await call.scheduler.execute(
        CancelJob(job_id=job_id, tenant=call.tenant, expected_version=expected)
    )
    return _job(call, job_id)


async def job_runs(request: Request) -> Response:
    call = _call(request)
    job_id = request.path_params["job_id"]
    _job_view(call, job_id)
    page = call.scheduler.history.runs_of(
        call.tenant, job_id, _limit(request, 20, MAX_PAGE), request.query_params.get("cursor")
    )
    return _json(RunPage(runs=[run_out(v) for v in page.items], next_cursor=page.next_cursor))


# -- schedules ---------------------------------------------------------------------------------


def _fire_times(view: JobView, after: int, n: int) -> list[int]:
    """The next ``n`` slots of a job after ``after`` (fewer for a one-shot, none once over)."""
    spec = view.spec
    if view.status in ("cancelled", "finished"):
        return []
    if spec.schedule is not None:
        return CronSchedule.parse(spec.schedule, spec.timezone).preview(after, n)
    if spec.interval_sec is not None:
        anchor = view.next_slot if view.next_slot is not None else spec.start_at or after
        fires: list[int] = []
        slot = next_slot(spec, after, anchor)
        while slot is not None and len(fires) < n:
            fires.append(slot)
            slot = next_slot(spec, slot, anchor)
        return fires
    return [view.next_slot] if view.next_slot is not None else []


def _preview(timezone: str, fires: list[int]) -> list[FireTime]:
    zone = ZoneInfo(timezone)  # validated with the schedule it belongs to
    return [FireTime(at=to_rfc3339(ms), local=to_local(ms, zone)) for ms in fires]


async def preview_job(request: Request) -> Response:
    call = _call(request)
    view = _job_view(call, request.path_params["job_id"])
    n = _limit(request, 10, MAX_PREVIEW, "n")
    spec: JobSpec = view.spec
    fires = _fire_times(view, call.scheduler.now_ms(), n)
    return _json(
        PreviewOut(
            job_id=view.job_id,
            schedule=spec.schedule,
            timezone=spec.timezone,
            fires=_preview(spec.timezone, fires),
        )
    )


async def preview_schedule(request: Request) -> Response:
    call = _call(request)
    body = await _decode(request, SchedulePreviewIn)
    if not 1 <= body.n <= MAX_PREVIEW:
        raise InvalidDefinition("n", f"must be between 1 and {MAX_PREVIEW}")
    schedule = CronSchedule.parse(body.schedule, body.timezone)
    after = call.scheduler.now_ms() if body.after is None else parse_rfc3339(body.after, "after")
    fires = schedule.preview(after, body.n)
    return _json(
        PreviewOut(
            schedule=schedule.expression,
            timezone=body.timezone,
            fires=_preview(body.timezone, fires),
        )
    )


# -- runs --------------------------------------------------------------------------------------


async def trigger_run(request: Request) -> Response:
    call = _call(request)
    job_id = request.path_params["job_id"]
    key = request.headers.get("idempotency-key")
    if key is not None and not 1 <= len(key) <= 256:
        raise bad_request("Idempotency-Key", "must be 1-256 characters")
    body = await _decode(request, TriggerIn, empty_ok=True)
    slot = (
        None if body.scheduled_for is None else parse_rfc3339(body.scheduled_for, "scheduled_for")
    )
    events = await call.scheduler.execute(
        TriggerRun(job_id=job_id, tenant=call.tenant, scheduled_for=slot, idempotency_key=key)
    )
    made = next((e for e in events if isinstance(e, RunMaterialised)), None)
    if made is not None:
        return _run(call, made.run_id, 201)
    if slot is not None:  # the run of this slot exists, or the key was used for it
        return _run(call, run_id_of(job_id, slot))
    # The key was used before, for a run the read model cannot name by key (RunView has no
    # idempotency key yet): say so rather than guess which run it was.
    raise Conflict(f"Idempotency-Key {key!r} was already used to trigger a run of job {job_id}")


async def get_run(request: Request) -> Response:
    return _run(_call(request), request.path_params["run_id"])


async def list_runs(request: Request) -> Response:
    call = _call(request)
    page = call.scheduler.history.runs(
        call.tenant,
        _choice(request, "state", RUN_STATES) or "dead",
        _limit(request, 50, MAX_PAGE),
        request.query_params.get("cursor"),
    )
    return _json(RunPage(runs=[run_out(v) for v in page.items], next_cursor=page.next_cursor))


async def cancel_run(request: Request) -> Response:
    call = _call(request)
    run_id = request.path_params["run_id"]
    view = _run_view(call, run_id)
    if view.state == "succeeded":
        raise Conflict(f"run {run_id} already succeeded")
    if view.state != "cancelled":
        await call.scheduler.execute(CancelRun(run_id=run_id, tenant=call.tenant))
    return _run(call, run_id)


async def replay_run(request: Request) -> Response:
    call = _call(request)
    run_id = request.path_params["run_id"]
    view = _run_view(call, run_id)
    if view.state != "dead":
        raise Conflict(f"run {run_id} is {view.state}; only a dead run can be replayed")
    await call.scheduler.execute(ReplayRun(run_id=run_id, tenant=call.tenant))
    return _run(call, run_id)


# -- pull workers ------------------------------------------------------------------------------


async def claim(request: Request) -> Response:
    call = _call(request)
    body = await _decode(request, ClaimIn)
    if not POOL.match(body.pool):
        raise InvalidDefinition("pool", "must be 1-128 characters of A-Z a-z 0-9 _ . -")
    if not 1 <= len(body.worker_id) <= 128:
        raise InvalidDefinition("worker_id", "must be 1-128 characters")
    if not 1 <= body.limit <= MAX_CLAIM:
        raise InvalidDefinition("limit", f"must be between 1 and {MAX_CLAIM}")
    leases = await call.scheduler.claim(call.tenant, body.pool, body.worker_id, body.limit)
    runs = []
    for lease in leases:
        job = call.scheduler.history.job(call.tenant, lease.job_id)
        if job is None:  # the port promised the read model caught up: it did not
            raise Unavailable(f"job {lease.job_id} of a granted lease is not readable yet")
        runs.append(claimed(lease, job.spec))
    return _json(ClaimOut(runs=runs))


async def _fenced(call: Call, run_id: str, command: HeartbeatRun | CompleteRun) -> list[Any]:
    """Send a command only the live lease may send; a lost lease is a 409 that says whether
    the run was cancelled (stop) or reclaimed (someone else has it)."""
    _run_view(call, run_id)  # another tenant's run: 404, not a lease error
    try:
        return await call.scheduler.execute(command)
    except LeaseLost as e:
        now = call.scheduler.history.run(call.tenant, run_id)
        cancelled = now is not None and now.state == "cancelled"
        raise ApiError(409, "lease_lost", str(e), cancelled=cancelled) from None


async def heartbeat(request: Request) -> Response:
    call = _call(request)
    run_id = request.path_params["run_id"]
    body = await _decode(request, HeartbeatIn)
    events = await _fenced(
        call,
        run_id,
        HeartbeatRun(run_id=run_id, fencing_token=body.fencing_token, tenant=call.tenant),
    )
    beat = next(e for e in events if isinstance(e, Heartbeat))
    return _json(HeartbeatOut(run_id=run_id, lease_expires_at=to_rfc3339(beat.lease_expires_at)))


async def complete(request: Request) -> Response:
    call = _call(request)
    run_id = request.path_params["run_id"]
    body = await _decode(request, CompleteIn)
    retry_after = body.retry_after_sec
    if retry_after is not None and not 0 <= retry_after <= MAX_RETRY_AFTER_SEC:
        raise InvalidDefinition("retry_after_sec", f"must be between 0 and {MAX_RETRY_AFTER_SEC}")
    await _fenced(
        call,
        run_id,
        CompleteRun(
            run_id=run_id,
            fencing_token=body.fencing_token,
            outcome=Outcome(body.status),
            error=body.error,
            permanent=body.permanent,
            ambiguous=body.ambiguous,
            retry_after_ms=None if retry_after is None else round(retry_after * 1000),
            tenant=call.tenant,
        ),
    )
    return _run(call, run_id)


# -- service -----------------------------------------------------------------------------------


async def healthz(request: Request) -> Response:
    return _json(Health(status="ok"))


async def readyz(request: Request) -> Response:
    scheduler: Scheduler = request.state.scheduler
    if not scheduler.ready():
        raise Unavailable("the node does not own its partitions yet, or is catching up")
    return _json(Health(status="ready"))


Endpoint = Callable[[Request], Awaitable[Response]]

ROUTES: list[tuple[str, str, Endpoint]] = [
    ("POST", "/v1/jobs", create_job),
    ("GET", "/v1/jobs", list_jobs),
    ("PUT", "/v1/jobs/{job_id}", put_job),
    ("GET", "/v1/jobs/{job_id}", get_job),
    ("PATCH", "/v1/jobs/{job_id}", patch_job),
    ("DELETE", "/v1/jobs/{job_id}", delete_job),
    ("GET", "/v1/jobs/{job_id}/runs", job_runs),
    ("POST", "/v1/jobs/{job_id}/runs", trigger_run),
    ("GET", "/v1/jobs/{job_id}/preview", preview_job),
    ("POST", "/v1/schedules/preview", preview_schedule),
    ("GET", "/v1/runs", list_runs),
    ("GET", "/v1/runs/{run_id}", get_run),
    ("POST", "/v1/runs/{run_id}/cancel", cancel_run),
    ("POST", "/v1/runs/{run_id}/replay", replay_run),
    ("POST", "/v1/runs/{run_id}/heartbeat", heartbeat),
    ("POST", "/v1/runs/{run_id}/complete", complete),
    ("POST", "/v1/workers/claim", claim),
    ("GET", "/healthz", healthz),
    ("GET", "/readyz", readyz),
]


def _routes(document: bytes) -> list[Route]:
    async def openapi_json(request: Request) -> Response:
        return Response(document, media_type="application/json")

    # One route per (method, path): the router answers 405 for a path known under other methods.
    routes = [Route(path, endpoint, methods=[method]) for method, path, endpoint in ROUTES]
    return [*routes, Route("/openapi.json", openapi_json, methods=["GET"])]


def create_app(scheduler: Scheduler, tokens: Mapping[str, str]) -> Starlette:
    """The API over ``scheduler``; ``tokens`` maps each bearer token to its tenant."""
    state = {"scheduler": scheduler, "tokens": Tokens(tokens)}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        yield state

    document = openapi.document([(method, path) for method, path, _ in ROUTES])
    return Starlette(
        routes=_routes(document),
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
