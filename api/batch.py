"""``POST /v1/jobs:batch``: many creates in one request, for a team that moves a thousand
crontabs at once.

Each item is what ``POST /v1/jobs`` takes, and is answered as that request would be, in a
result of its own: ``201`` created, ``200`` already there with the same definition, or the
error a single create would answer (400, 403, 409, 422, 429, 503), its ``field`` prefixed with
the item's place (``jobs[3].schedule``). One bad item refuses only itself; the request as a
whole is refused only when it is not a batch at all (not JSON, no ``jobs`` list, none or more
than ``MAX_BATCH_JOBS`` items: 400 naming ``jobs``).

The same rules hold as for single creates, item by item and in order:

- every item spends one of the token's requests (the request itself pays for the first); the
  items past what the bucket holds are answered 429 and changed nothing;
- each new job takes a place in the tenant's ``max_jobs``; the items past them are 403;
- the definition, the egress policy and the tenant's bounds are checked as for one create.

The items that pass go to the scheduler together (:meth:`Scheduler.execute_many`): a
partition's items are decided in one batch and appended in one durable write, and the answer
comes once they are durable and readable. Replays are safe when every item names its job
(``job_id`` or ``idempotency_key``), or when the batch carries an ``idempotency_key``: an item
that names neither then gets the id of ``<batch key>#<its index>``, so the same batch sent
again answers 200 for what it created the first time.

Worked example: ``{"jobs": [A, B, C]}`` where B has a bad schedule and the tenant has one
place left answers ``{"results": [{"index": 0, "status": 201, ...}, {"index": 1, "status":
422, "error": {"field": "jobs[1].schedule", ...}}, {"index": 2, "status": 403, ...}],
"created": 1, "existing": 0, "failed": 2}``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType
from starlette.requests import Request
from starlette.responses import Response

from api.edge import (
    Call,
    as_type,
    authenticate,
    json_response,
    over_rate,
    read_json,
    refuse_oversized,
    take_items,
    too_deep,
)
from api.errors import ApiError, ErrorBody, from_exception
from api.jobs import CATCH_UP_S, is_fresh, new_job, new_job_id
from api.quota import JobQuota, quota_exceeded
from api.wire import MAX_IDEMPOTENCY_KEY, NewJob
from core.commands import PutJob
from core.egress import EgressPolicy, refuse_unknown_kind
from core.errors import CronlogError, EgressDenied
from core.events import AnyEvent, JobRegistered
from core.ids import team_id
from core.jobs import HttpTarget, KafkaTarget, PullTarget, Target

MAX_BATCH_JOBS = 1000
# A batch's key, with "#<index>" after it, is each item's idempotency key: it leaves room.
MAX_BATCH_KEY = MAX_IDEMPOTENCY_KEY - 16
# A batch's body may be larger than one job's: 1,000 jobs of a few KiB each.
MAX_BATCH_BODY_BYTES = 16 << 20


class JobBatchIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/jobs:batch: the jobs to create, each as POST /v1/jobs takes it. With
    ``idempotency_key``, an item that names neither ``job_id`` nor ``idempotency_key`` gets the
    job of ``<idempotency_key>#<its index>``, so the batch may be sent again safely.

    The document leaves the items' schema open on purpose: an item is read on its own and a
    bad one is answered in its result (400 or 422 naming ``jobs[i].<field>``) while the request
    is a 200, so the request itself is not wrong when an item is."""

    jobs: Annotated[list[Any], Meta(min_length=1, max_length=MAX_BATCH_JOBS)]
    idempotency_key: Annotated[str, Meta(min_length=1, max_length=MAX_BATCH_KEY)] | UnsetType = (
        UNSET
    )


class _Shape(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The batch with its items unread: each is read on its own, so one bad item refuses only
    itself."""

    jobs: list[Any]
    idempotency_key: Annotated[str, Meta(min_length=1, max_length=MAX_BATCH_KEY)] | UnsetType = (
        UNSET
    )


class JobResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One item's outcome: ``status`` is what POST /v1/jobs would have answered (201 created,
    200 already there as given, else the error's), ``job_id`` the job it names (when it got
    that far), ``version`` the job's version on success."""

    index: int
    status: int
    job_id: str | None = None
    version: int | None = None
    error: ErrorBody | None = None


class JobBatchOut(msgspec.Struct, kw_only=True):
    results: list[JobResult]
    created: int
    existing: int
    failed: int


class _Targets:
    """The egress policy's verdicts within one batch, by target: a migration's thousand jobs
    call a handful of URLs, and a verdict depends on the URL (an HTTP target) or on the team
    and topic (a Kafka target) alone (:meth:`EgressPolicy.check_target`)."""

    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._reasons: dict[tuple[str, ...], str | None] = {}

    def check_target(self, tenant: str, target: Target) -> None:
        match target:
            case HttpTarget(url=url, status_url=status):
                if status is not None:
                    asked = ("http", status)
                    if asked not in self._reasons:
                        self._reasons[asked] = self._policy.check_url(status)
                    if (refused := self._reasons[asked]) is not None:
                        raise EgressDenied(refused, field="target.status_url")
                key: tuple[str, ...] = ("http", url)
                if key not in self._reasons:
                    self._reasons[key] = self._policy.check_url(url)
            case KafkaTarget(topic=topic):
                key = ("kafka", tenant, topic)
                if key not in self._reasons:
                    self._reasons[key] = self._policy.check_topic(tenant, topic)
            case PullTarget():
                self._policy.check_target(tenant, target)
                return
            case _:
                refuse_unknown_kind(target)
        reason = self._reasons[key]
        if reason is not None:
            raise EgressDenied(reason)


def _refused(index: int, err: Exception, job_id: str | None = None) -> JobResult:
    api_error = from_exception(err)
    body = api_error.body
    field = f"jobs[{index}]" if body.field is None else f"jobs[{index}].{body.field}"
    return JobResult(
        index=index,
        status=api_error.status,
        job_id=job_id,
        error=ErrorBody(error=body.error, message=body.message, field=field),
    )


async def create_jobs(request: Request) -> Response:
    call = authenticate(request)
    raw = await read_json(request, MAX_BATCH_BODY_BYTES, deep="jobs")
    refuse_oversized(raw, "jobs", MAX_BATCH_JOBS, "jobs")
    # Converted as it came: an item's payload is kept exactly as sent (as_type reads each item).
    shape = msgspec.convert(raw, _Shape)
    if not shape.jobs:
        raise ApiError(400, "bad_request", "must hold at least one job", field="jobs")
    results: list[JobResult | None] = [None] * len(shape.jobs)
    allowed = 1 + take_items(request, call, len(shape.jobs) - 1)
    batch_key = None if shape.idempotency_key is UNSET else shape.idempotency_key
    commands: list[tuple[int, PutJob]] = []
    fresh: set[str] = set()  # ids drawn for their items: no job has them
    targets = _Targets(request.state.egress)
    # Each item's job id first, then every job the batch names looked up at once (one
    # question a partition where other nodes keep history), then each item decided.
    named: list[tuple[int, NewJob, str | None, str]] = []
    for i, item in enumerate(shape.jobs):
        if i >= allowed:
            results[i] = _refused(i, over_rate(call))
            continue
        try:
            body = as_type(item, NewJob)
            key = None if batch_key is None else f"{batch_key}#{i}"
            named.append((i, body, key, new_job_id(call, body, key)))
        except (ApiError, msgspec.ValidationError, CronlogError) as err:
            results[i] = _refused(i, err)
        except RecursionError:
            results[i] = _refused(i, too_deep("payload"))
    asked = [job_id for _, body, key, job_id in named if not is_fresh(body, key)]
    known = await call.scheduler.reader.jobs_by_id(call.tenant, asked)
    for i, body, key, job_id in named:
        try:
            _, command = await new_job(call, targets, body, key, job_id=job_id, known=known)
            if command is not None:
                commands.append((i, command))
                if is_fresh(body, key):
                    fresh.add(job_id)
            else:  # its job has finished with this definition: there as given
                view = known.get(job_id)
                version = None if view is None else view.version
                results[i] = JobResult(index=i, status=200, job_id=team_id(job_id), version=version)
        except (ApiError, msgspec.ValidationError, CronlogError) as err:
            results[i] = _refused(i, err)
        except RecursionError:
            results[i] = _refused(i, too_deep("payload"))
    quota: JobQuota = request.state.quota
    async with quota.admit_many(
        call, [command.job_id for _, command in commands], fresh, known
    ) as admitted:
        sent = []
        for (i, command), ok in zip(commands, admitted, strict=True):
            if ok:
                sent.append((i, command))
            else:
                results[i] = _refused(i, quota_exceeded(call), team_id(command.job_id))
        answers = await call.scheduler.execute_many([command for _, command in sent])
    await _settle(call, sent, answers, results)
    done = [r for r in results if r is not None]
    assert len(done) == len(results)
    created = sum(1 for r in done if r.status == 201)
    existing = sum(1 for r in done if r.status == 200)
    return json_response(
        JobBatchOut(
            results=done, created=created, existing=existing, failed=len(done) - created - existing
        )
    )


async def _settle(
    call: Call,
    sent: list[tuple[int, PutJob]],
    answers: list[list[AnyEvent] | CronlogError],
    results: list[JobResult | None],
) -> None:
    """Each sent item's result from its answer. An item that decided nothing found its job as
    an earlier request (or item) left it; as for one create, it is waited for briefly if this
    node's read model has not folded it yet."""
    history = call.scheduler.reader
    repeated = [
        command.job_id for (_, command), answer in zip(sent, answers, strict=True) if answer == []
    ]
    views = dict(
        zip(
            repeated,
            await asyncio.gather(*(history.job(call.tenant, job_id) for job_id in repeated)),
            strict=True,
        )
    )
    deadline = time.monotonic() + CATCH_UP_S  # one wait for them all, as one create waits
    for job_id, view in views.items():
        if view is None:

            async def readable(job_id: str = job_id) -> bool:
                return await history.job(call.tenant, job_id) is not None

            if await history.until(job_id, readable, max(0.0, deadline - time.monotonic())):
                views[job_id] = await history.job(call.tenant, job_id)
    for (i, command), answer in zip(sent, answers, strict=True):
        job_id = team_id(command.job_id)
        if isinstance(answer, CronlogError):
            results[i] = _refused(i, answer, job_id)
            continue
        registered = next((e for e in answer if isinstance(e, JobRegistered)), None)
        if registered is not None:
            results[i] = JobResult(index=i, status=201, job_id=job_id, version=registered.version)
            continue
        view = views.get(command.job_id)
        if view is None:
            results[i] = JobResult(
                index=i,
                status=503,
                job_id=job_id,
                error=ErrorBody(
                    error="unavailable",
                    message=f"job {job_id} exists but is not readable yet; try again",
                ),
            )
        else:
            results[i] = JobResult(index=i, status=200, job_id=job_id, version=view.version)
