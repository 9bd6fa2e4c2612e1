"""Job handlers: create, upsert, read, list, patch, cancel, a job's runs, and schedule previews."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol
from zoneinfo import ZoneInfo

from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from api.edge import (
    Call,
    authenticate,
    decode,
    expected_version,
    job_response,
    job_view,
    json_response,
    on_job,
    page_size,
    query_choice,
    query_int,
    query_text,
)
from api.errors import bad_request
from api.instants import parse_rfc3339, to_local, to_rfc3339
from api.quota import JobQuota, check_definition
from api.scheduler import Unavailable
from api.translate import (
    check_five_fields,
    job_id_for_key,
    job_out,
    next_run,
    random_job_id,
    run_out,
    spec_of,
)
from api.wire import (
    MAX_PREVIEW,
    MAX_SEARCH_CHARS,
    MAX_SLOTS,
    FireTime,
    JobDefinition,
    JobFields,
    JobPage,
    JobPatch,
    NewJob,
    PreviewOut,
    RunPage,
    SchedulePreviewIn,
    SlotOut,
    SlotsOut,
)
from core.commands import CancelJob, PauseJob, PutJob, ResumeJob
from core.cron import CronSchedule, DayRule, split_seconds, with_seconds
from core.decide import run_id_of
from core.egress import EgressPolicy
from core.errors import Conflict, InvalidDefinition, NotFound
from core.events import AnyEvent, JobRegistered, JobUpdated
from core.ids import log_job_id, team_id
from core.jobs import (
    MAX_NAME_CHARS,
    TAG,
    JobSpec,
    Target,
    canonical,
    next_slot,
    slots_between,
    validate_job_id,
)
from projections.views import JOB_STATUSES, JobView

CATCH_UP_S = 5.0  # how long an upsert that decided nothing waits to read the job it names

# -- jobs --------------------------------------------------------------------------------------


PAST_TOLERANCE_MS = 60_000  # clocks differ and requests take time: "now" is not the past


def not_past(call: Call, fields: JobFields, spec: JobSpec, existing: JobSpec | None) -> None:
    """Refuse a ``run_at`` or ``end_at`` that has passed (a job that runs at once, or never),
    unless ``allow_past`` asks for it; one the job already had is not asked about again."""
    if fields.allow_past is True:
        return
    now = call.scheduler.now_ms()
    for name in ("run_at", "end_at"):
        at = getattr(spec, name)
        if at is None or at >= now - PAST_TOLERANCE_MS:
            continue
        if existing is not None and getattr(existing, name) == at:
            continue
        then = "run at once" if name == "run_at" else "never run again"
        raise InvalidDefinition(
            name,
            f"{to_rfc3339(at)} has passed, so the job would {then}; send"
            ' "allow_past": true if that is what you want',
        )


def within_egress(request: Request, spec: JobSpec) -> JobSpec:
    """``spec``, if its target is within the operator's egress policy (else a 422 naming
    ``target``): a refused target is never written to the log."""
    policy: EgressPolicy = request.state.egress
    policy.check_target(spec.tenant, spec.target)
    return spec


class TargetCheck(Protocol):
    def check_target(self, tenant: str, target: Target) -> None: ...


def is_fresh(body: NewJob, key: str | None = None) -> bool:
    """Whether the create names no job, so :func:`new_job` draws a new random id for it."""
    return body.job_id is UNSET and body.idempotency_key is UNSET and key is None


def new_job_id(call: Call, body: NewJob, key: str | None = None) -> str:
    """The log id of the job a create names: its ``job_id``, or the one its idempotency key
    (``key`` for a batch's item that gives none) stands for, or one drawn now."""
    if body.job_id is not UNSET and body.idempotency_key is not UNSET:
        raise InvalidDefinition("idempotency_key", "give job_id or idempotency_key, not both")
    if body.job_id is not UNSET:
        validate_job_id(body.job_id)
        return call.job_id(body.job_id)
    if body.idempotency_key is not UNSET:
        return call.job_id(job_id_for_key(call.tenant, body.idempotency_key))
    if key is not None:
        return call.job_id(job_id_for_key(call.tenant, key))
    # Drawn just now from 120 random bits: no job has it, scoped or not, so history is not
    # asked (two lookups a create, a fifth of a batch's time).
    return log_job_id(call.tenant, random_job_id())


async def new_job(
    call: Call,
    policy: TargetCheck,
    body: NewJob,
    key: str | None = None,
    *,
    job_id: str | None = None,
    known: Mapping[str, JobView | None] | None = None,
) -> tuple[str, PutJob | None]:
    """The job ``body`` names and the create it asks for, checked as every create is; a
    refusal names the field. No create (None) for a repeat of one whose job has finished with
    this definition: it is answered as it stands. ``key`` stands in for an ``idempotency_key``
    the body does not give (a batch's items); ``job_id``: :func:`new_job_id`'s, when known;
    ``known``: the jobs a batch looked up at once, by id."""
    if job_id is None:
        job_id = new_job_id(call, body, key)
    spec = spec_of(body, call.tenant, scope=call.job_id)
    policy.check_target(spec.tenant, spec.target)
    if is_fresh(body, key):
        existing = None
    elif known is not None and job_id in known:
        existing = known[job_id]
    else:
        existing = await call.scheduler.reader.job(call.tenant, job_id)
    if existing is not None and existing.status in ("cancelled", "finished"):
        # A repeat of a create whose job is over, answered as the partition answers it while it
        # holds the job, and after it forgot the job too (it would register it again).
        if existing.status == "cancelled":
            raise Conflict(f"job {team_id(job_id)} is cancelled")
        if existing.spec != canonical(spec):
            raise Conflict(f"job {team_id(job_id)} exists with another definition")
        return job_id, None
    not_past(call, body, spec, existing.spec if existing else None)
    await check_definition(call, job_id, spec, existing.spec if existing else None)
    # create_only: a repeat with the same body changes nothing, another body is a conflict
    return job_id, PutJob(job_id=job_id, spec=spec, create_only=True)


async def create_job(request: Request) -> Response:
    call = authenticate(request)
    body = await decode(request, NewJob)
    job_id = new_job_id(call, body)
    # looked up once, for the create's checks and the quota's
    known = {} if is_fresh(body) else await call.scheduler.reader.jobs_by_id(call.tenant, [job_id])
    job_id, command = await new_job(call, request.state.egress, body, job_id=job_id, known=known)
    if command is None:
        return await job_response(call, job_id)
    quota: JobQuota = request.state.quota
    async with quota.admit(call, job_id, fresh=is_fresh(body), known=known):
        events = await call.scheduler.execute(command)
    return await _upserted(call, job_id, events)


async def put_job(request: Request) -> Response:
    call = authenticate(request)
    validate_job_id(request.path_params["job_id"])
    job_id = call.job_id(request.path_params["job_id"])
    body = await decode(request, JobDefinition)
    spec = within_egress(request, spec_of(body, call.tenant, scope=call.job_id))
    expected = expected_version(request)
    existing = await call.scheduler.reader.job(call.tenant, job_id)
    not_past(call, body, spec, existing.spec if existing else None)
    await check_definition(call, job_id, spec, existing.spec if existing else None)
    quota: JobQuota = request.state.quota
    async with quota.admit(call, job_id, known={job_id: existing}):
        events = await call.scheduler.execute(
            PutJob(job_id=job_id, spec=spec, expected_version=expected)
        )
    return await _upserted(call, job_id, events)


async def _upserted(call: Call, job_id: str, events: list[AnyEvent]) -> Response:
    """201 with the job a create or upsert registered, 200 with the one it found as given.

    A request that decided nothing found the job as an earlier request left it, perhaps one
    whose answer was lost, decided through another node: this node's read model may not have
    folded it yet. It is waited for briefly; "not found" would be false, so unavailable it is.
    """
    created = any(isinstance(e, JobRegistered) for e in events)
    history = call.scheduler.reader
    if not events and await history.job(call.tenant, job_id) is None:

        async def readable() -> bool:
            return await history.job(call.tenant, job_id) is not None

        if not await history.until(job_id, readable, CATCH_UP_S):
            raise Unavailable(f"job {team_id(job_id)} exists but is not readable yet; try again")
    return await job_response(call, job_id, 201 if created else 200)


async def get_job(request: Request) -> Response:
    call = authenticate(request)
    return await job_response(call, call.job_id(request.path_params["job_id"]))


def query_tag(request: Request) -> str | None:
    tag = request.query_params.get("tag")
    if tag is not None and not TAG.fullmatch(tag):
        raise bad_request("tag", "must be 1-64 characters of A-Z a-z 0-9 _ . : = -")
    return tag


async def list_jobs(request: Request) -> Response:
    call = authenticate(request)
    history = call.scheduler.reader
    q = query_text(request, "q", MAX_SEARCH_CHARS)
    name = query_text(request, "name", MAX_NAME_CHARS)
    page = await history.jobs(
        call.tenant,
        query_choice(request, "status", JOB_STATUSES),
        page_size(call, request, 50),
        request.query_params.get("cursor"),
        # Every job named ``name`` holds it: the search's page, cut to the exact name, is one
        # the search itself could have answered (fewer than limit, the same next_cursor).
        search=q or name,
        tag=query_tag(request),
    )
    now = call.scheduler.now_ms()
    views = [v for v in page.items if name is None or v.name == name]
    newest = await history.latest_runs(call.tenant, [v.job_id for v in views])
    jobs = [job_out(v, now, run) for v, run in zip(views, newest, strict=True)]
    return json_response(JobPage(jobs=jobs, next_cursor=page.next_cursor))


def _changes_definition(body: JobPatch) -> bool:
    return any(
        getattr(body, f) is not UNSET for f in JobFields.__struct_fields__ if f != "allow_past"
    )


async def patch_job(request: Request) -> Response:
    call = authenticate(request)
    job_id = call.job_id(request.path_params["job_id"])
    body = await decode(request, JobPatch)
    expected = expected_version(request, None if body.version is UNSET else body.version)
    view = await job_view(call, job_id)
    if expected is not None and expected != view.version:
        raise Conflict(f"job {team_id(job_id)} is at version {view.version}, not {expected}")
    if _changes_definition(body):
        spec = within_egress(request, spec_of(body, call.tenant, base=view.spec, scope=call.job_id))
        not_past(call, body, spec, view.spec)
        await check_definition(call, job_id, spec, view.spec)
        # The merge read view.spec: writing it back is conditional on nothing having changed since.
        events = await call.scheduler.execute(
            PutJob(job_id=job_id, spec=spec, expected_version=view.version)
        )
        expected = next((e.version for e in events if isinstance(e, JobUpdated)), expected)
    if body.status == "paused":
        await on_job(
            call, job_id, PauseJob(job_id=job_id, tenant=call.tenant, expected_version=expected)
        )
    elif body.status == "active":
        await on_job(
            call, job_id, ResumeJob(job_id=job_id, tenant=call.tenant, expected_version=expected)
        )
    return await job_response(call, job_id)


async def delete_job(request: Request) -> Response:
    call = authenticate(request)
    job_id = call.job_id(request.path_params["job_id"])
    expected = expected_version(request)
    try:
        await call.scheduler.execute(
            CancelJob(job_id=job_id, tenant=call.tenant, expected_version=expected)
        )
    except NotFound:
        # Forgotten by its partition a retention after it ended (docs/architecture.md): a
        # repeated delete still answers with the job, as it did before.
        if await call.scheduler.reader.job(call.tenant, job_id) is None:
            raise
    return await job_response(call, job_id)


async def job_runs(request: Request) -> Response:
    call = authenticate(request)
    job_id = call.job_id(request.path_params["job_id"])
    await job_view(call, job_id)
    page = await call.scheduler.reader.runs_of(  # past the hot window: the archive
        call.tenant,
        job_id,
        page_size(call, request, 20),
        request.query_params.get("cursor"),
    )
    return json_response(
        RunPage(
            runs=[run_out(r.view, r.source) for r in page.items],
            next_cursor=page.next_cursor,
            source=page.source,
            gone_before=None if page.gone_before is None else to_rfc3339(page.gone_before),
        )
    )


# -- schedules ---------------------------------------------------------------------------------


def fire_times(view: JobView, after: int, n: int) -> list[int]:
    """The next ``n`` slots of a job after ``after`` (fewer for a one-shot, none once over)."""
    spec = view.spec
    if view.status in ("cancelled", "finished"):
        return []
    if spec.schedule is not None:
        return CronSchedule.parse(spec.schedule, spec.timezone, spec.day_rule).preview(after, n)
    if spec.interval_sec is not None:
        anchor = view.next_slot if view.next_slot is not None else spec.start_at or after
        fires: list[int] = []
        slot = next_slot(spec, after, anchor)
        while slot is not None and len(fires) < n:
            fires.append(slot)
            slot = next_slot(spec, slot, anchor)
        return fires
    upcoming = next_run(view, after)  # a one-shot's run materialised ahead is still to come
    return [upcoming] if upcoming is not None else []


def _anchor(view: JobView) -> int:
    """An interval job's grid: its next slot lies on it, else its start, else its creation."""
    return next(t for t in (view.next_slot, view.spec.start_at, view.created_at) if t is not None)


async def job_slots(request: Request) -> Response:
    """The job's schedule's slots in ``[from, to]``, each with its run's state: what a backfill
    of that range would trigger (the slots that have come and have no run)."""
    call = authenticate(request)
    job_id = call.job_id(request.path_params["job_id"])
    view = await job_view(call, job_id)
    limit = query_int(request, MAX_SLOTS, MAX_SLOTS)
    start, end = (parse_rfc3339(_required(request, name), name) for name in ("from", "to"))
    if end < start:
        raise InvalidDefinition("to", "must not be before from")
    if not view.spec.recurring:
        raise InvalidDefinition(
            "job_id", "the job has no schedule (a one-shot or dependency-triggered job)"
        )
    slots = slots_between(view.spec, start - 1, end, _anchor(view), limit + 1)
    now = call.scheduler.now_ms()
    out = []
    history = call.scheduler.reader
    runs = await asyncio.gather(
        *(history.run(call.tenant, run_id_of(job_id, slot)) for slot in slots[:limit])
    )
    for slot, run in zip(slots[:limit], runs, strict=True):
        out.append(
            SlotOut(
                scheduled_for=to_rfc3339(slot),
                run_id=team_id(run_id_of(job_id, slot)),
                state=None if run is None else run.state,
                due=slot <= now,
            )
        )
    return json_response(SlotsOut(job_id=team_id(job_id), slots=out, more=len(slots) > limit))


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if value is None:
        raise bad_request(name, "is required")
    return value


def fire_list(timezone: str, fires: list[int]) -> list[FireTime]:
    zone = ZoneInfo(timezone)  # validated with the schedule it belongs to
    return [FireTime(at=to_rfc3339(ms), local=to_local(ms, zone)) for ms in fires]


async def preview_job(request: Request) -> Response:
    call = authenticate(request)
    view = await job_view(call, call.job_id(request.path_params["job_id"]))
    n = query_int(request, 10, MAX_PREVIEW, "n")
    spec: JobSpec = view.spec
    fires = fire_times(view, call.scheduler.now_ms(), n)
    schedule, seconds = (None, None) if spec.schedule is None else split_seconds(spec.schedule)
    return json_response(
        PreviewOut(
            job_id=team_id(view.job_id),
            schedule=schedule,
            seconds=seconds,
            timezone=spec.timezone,
            fires=fire_list(spec.timezone, fires),
        )
    )


async def preview_schedule(request: Request) -> Response:
    call = authenticate(request)
    body = await decode(request, SchedulePreviewIn)
    check_five_fields(body.schedule)
    # As a job that sets this schedule now would read it.
    schedule = CronSchedule.parse(
        with_seconds(body.schedule, body.seconds), body.timezone, DayRule.CRONTAB
    )
    after = call.scheduler.now_ms() if body.after is None else parse_rfc3339(body.after, "after")
    fires = schedule.preview(after, body.n)
    five, seconds = split_seconds(schedule.expression)
    return json_response(
        PreviewOut(
            schedule=five,
            seconds=seconds,
            timezone=body.timezone,
            fires=fire_list(body.timezone, fires),
        )
    )
