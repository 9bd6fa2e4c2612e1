"""``GET /v1/operator/state``: what a partition believed as of an offset or an instant.

    GET /v1/operator/state?partition=3&at=2026-11-30T02:00:00Z
    GET /v1/operator/state?job=nightly&tenant=team-a&offset=120000
    GET /v1/operator/state?partition=3&tenant=team-a        (now)

The operator's question (every team's state is in it), so only the operator's token opens it;
a team's token is refused with 403. The answer is :func:`projections.time_travel.report`, the
same JSON ``python -m tools.replay state`` prints: the jobs (status, next slot, live runs) and
the runs (status, attempt, worker, lease) the partition held, optionally of one tenant or one
job, with the offset it reflects, the snapshot it started from and the events folded after it.

It is read from the nearest snapshot before the point plus the tail, on a thread of the API's
pool, one question at a time per node (429 while one runs), and refused with 422 naming
``offset`` or ``at`` when it would fold more than the node's bound (``max_events``): a point
older than every snapshot kept is the replay tool's job, on a copy of the log.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from api.auth import Tokens
from api.edge import json_response
from api.errors import ApiError, bad_request, unauthorized
from api.held import Held
from api.instants import RFC3339, parse_rfc3339
from api.scheduler import Scheduler
from core.errors import TooMuchToFold
from core.ids import log_job_id
from core.jobs import JOB_ID, TENANT
from eventlog.port import EventLog, partition_for
from eventlog.snapshots import SnapshotStore
from projections import time_travel

PATH = "/v1/operator/state"
DEFAULT_MAX_EVENTS = 1_000_000  # about ten seconds of folding on a loaded core
MAX_NUMBER = 10**18 - 1  # a partition or an offset: 18 digits, far from int()'s limit
WHO = "the operator"


@dataclass(frozen=True)
class PastStates:
    """Where the endpoint reads: the node's log (archive + hot log) and its snapshots."""

    log: EventLog
    snapshots: SnapshotStore | None
    max_events: int = DEFAULT_MAX_EVENTS


class JobAsOf(msgspec.Struct, kw_only=True):
    """A job as the partition held it then."""

    job_id: str  # the log's id: <tenant>/<job id>
    tenant: str
    status: str
    version: int
    next_slot: int | None
    live_runs: list[str]


class AsOf(msgspec.Struct, kw_only=True):
    """Where the answer stands in the partition's log."""

    offset: int  # the state holds the events below it
    instant: int | None  # epoch ms, when an instant was asked for


class StateOut(msgspec.Struct, kw_only=True):
    """The partition's state as of a point: what was due, pending, leased and to whom,
    running, dead (each run's fields as the partition state holds them)."""

    partition: int
    as_of: AsOf
    from_snapshot: int | None  # the offset of the snapshot the answer started from
    events_folded: int
    jobs: list[JobAsOf]
    runs: list[dict[str, Any]]


def endpoint(past: PastStates, operator_token: str) -> Callable[[Request], Awaitable[Response]]:
    operator = Tokens({operator_token: WHO})
    held = Held()

    async def state_as_of(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        if operator.tenant_of(authorization) is None:
            team: Tokens = request.state.tokens
            if team.tenant_of(authorization) is not None:
                raise ApiError(403, "forbidden", "the operator's token only: it spans every team")
            raise unauthorized()
        query = _query(request, past.log.num_partitions)
        with held.hold("state questions", WHO, 1):
            report = await run_in_threadpool(_answer, past, request.state.scheduler, query)
        return json_response(report)

    return state_as_of


@dataclass(frozen=True)
class _Query:
    partition: int
    offset: int | None
    instant: int | None
    tenant: str | None
    job: str | None  # the log's id


def _query(request: Request, partitions: int) -> _Query:
    params = request.query_params
    tenant = params.get("tenant")
    if tenant is not None and not TENANT.match(tenant):
        raise bad_request("tenant", "must be 1-64 characters of A-Z a-z 0-9 _ . -")
    job = params.get("job")
    if job is not None:
        if not JOB_ID.match(job):
            raise bad_request("job", "must be 1-64 characters of A-Z a-z 0-9 _ -")
        if tenant is None:
            raise bad_request("tenant", "a job is named with its tenant")
        job = log_job_id(tenant, job)
    partition = _number(params.get("partition"), "partition")
    if partition is None:
        if job is None:
            raise bad_request("partition", "name a partition, or a job with its tenant")
        partition = partition_for(job, partitions)
    if partition >= partitions:
        raise bad_request("partition", f"must be between 0 and {partitions - 1}")
    offset = _number(params.get("offset"), "offset")
    at = params.get("at")
    if at is not None and offset is not None:
        raise bad_request("at", "ask for an offset or an instant, not both")
    instant = None if at is None else _instant(at)
    return _Query(partition, offset, instant, tenant, job)


def _number(text: str | None, name: str) -> int | None:
    if text is None:
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise bad_request(name, "must be a non-negative integer")
    return int(text)


def _instant(text: str) -> int:
    if not re.match(RFC3339, text):
        raise bad_request("at", "must be an RFC 3339 instant, e.g. 2026-11-30T02:00:00Z")
    return parse_rfc3339(text, "at")


def _answer(past: PastStates, scheduler: Scheduler, query: _Query) -> dict[str, Any]:
    try:
        answer = time_travel.state_at(
            past.log,
            past.snapshots,
            query.partition,
            scheduler.events_decoder,
            offset=query.offset,
            instant=query.instant,
            max_events=past.max_events,
        )
    except TooMuchToFold as exc:
        raise ApiError(
            422,
            "too_far",
            f"{exc.message}: ask python -m tools.replay state on a copy of the log",
            field=exc.field,
        ) from exc
    return time_travel.report(answer, query.instant, query.tenant, query.job)
