"""cronlog's HTTP API: ``create_app(scheduler, tokens)``.

Handlers are thin: authenticate, decode the body strictly, translate to one core command, send it
through the :class:`~api.scheduler.Scheduler` port, and answer from the read model (which has
caught up with the command's events by the time ``execute`` returns). Every ``/v1`` call speaks
for the tenant of its bearer token, and passes that tenant to every command and query: another
tenant's job or run is simply not found.

The scheduler, the tokens, the tenants' limits and the request buckets reach handlers through
Starlette's lifespan state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, request_response
from starlette.types import Receive, Scope, Send

from api import events_stream, openapi, time_travel, ui
from api.auth import Tokens
from api.batch import create_jobs
from api.changes import preview_change
from api.completions import complete_runs
from api.dead_letters import replay_dead_runs
from api.edge import edge_state, json_response
from api.errors import EXCEPTION_HANDLERS, unauthorized
from api.heartbeats import heartbeat_runs
from api.held import Held
from api.jobs import (
    create_job,
    delete_job,
    get_job,
    job_runs,
    job_slots,
    list_jobs,
    patch_job,
    preview_job,
    preview_schedule,
    put_job,
)
from api.limits import Limits
from api.quota import JobQuota
from api.runs import (
    cancel_run,
    claim,
    complete,
    get_run,
    heartbeat,
    list_runs,
    replay_run,
    trigger_run,
)
from api.scheduler import Scheduler, Unavailable
from api.stats import team_stats
from api.team import get_team
from api.wire import Health
from core.egress import EgressPolicy
from core.shares import Shares

# -- service -----------------------------------------------------------------------------------


async def healthz(request: Request) -> Response:
    return json_response(Health(status="ok", boot=request.state.boot))


async def readyz(request: Request) -> Response:
    scheduler: Scheduler = request.state.scheduler
    # The node says why (its partitions, its services down, a worker process of it that is
    # not ready); the port only whether.
    readiness: Callable[[], list[str]] | None = getattr(scheduler, "readiness", None)
    if readiness is not None:
        reasons = await asyncio.to_thread(readiness)  # it may ask sibling processes
        if reasons:
            raise Unavailable("not ready: " + "; ".join(reasons))
    elif not scheduler.ready():
        raise Unavailable("the node does not own its partitions yet, or is catching up")
    return json_response(Health(status="ready"))


Endpoint = Callable[[Request], Awaitable[Response]]

ROUTES: list[tuple[str, str, Endpoint]] = [
    ("POST", "/v1/jobs", create_job),
    ("POST", "/v1/jobs:batch", create_jobs),
    ("GET", "/v1/jobs", list_jobs),
    ("PUT", "/v1/jobs/{job_id}", put_job),
    ("GET", "/v1/jobs/{job_id}", get_job),
    ("PATCH", "/v1/jobs/{job_id}", patch_job),
    ("DELETE", "/v1/jobs/{job_id}", delete_job),
    ("GET", "/v1/jobs/{job_id}/runs", job_runs),
    ("POST", "/v1/jobs/{job_id}/runs", trigger_run),
    ("GET", "/v1/jobs/{job_id}/preview", preview_job),
    ("GET", "/v1/jobs/{job_id}/slots", job_slots),
    ("POST", "/v1/schedules/preview", preview_schedule),
    ("GET", "/v1/runs", list_runs),
    ("GET", "/v1/runs/{run_id}", get_run),
    ("POST", "/v1/runs/{run_id}/cancel", cancel_run),
    ("POST", "/v1/runs/{run_id}/replay", replay_run),
    ("POST", "/v1/runs/{run_id}/heartbeat", heartbeat),
    ("POST", "/v1/runs/{run_id}/complete", complete),
    ("POST", "/v1/runs:complete", complete_runs),
    ("POST", "/v1/runs:heartbeat", heartbeat_runs),
    ("POST", "/v1/workers/claim", claim),
    ("GET", "/v1/events", events_stream.events),
    ("GET", "/healthz", healthz),
    ("GET", "/readyz", readyz),
    # what the status UI asks beyond the above (any client may)
    ("POST", "/v1/jobs/{job_id}/preview", preview_change),
    ("POST", "/v1/runs/replay", replay_dead_runs),
    ("GET", "/v1/stats", team_stats),
    ("GET", "/v1/team", get_team),
]


class Metrics(Protocol):
    """What ``GET /metrics`` serves: the node's Prometheus text exposition."""

    content_type: str

    def render(self) -> bytes: ...


def _metrics_endpoint(metrics: Metrics, token: str) -> Endpoint:
    # The metrics span every tenant, so no tenant's token opens them: the operator's does.
    operator = Tokens({token: "metrics"})

    async def serve_metrics(request: Request) -> Response:
        if operator.tenant_of(request.headers.get("authorization")) is None:
            raise unauthorized()
        body = await run_in_threadpool(metrics.render)  # it reads the node's state
        return Response(body, media_type=metrics.content_type)

    return serve_metrics


def _by_method(handlers: dict[str, Endpoint]) -> Endpoint:
    allowed = ", ".join(sorted({*handlers, *(("HEAD",) if "GET" in handlers else ())}))

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        handler = handlers.get(method)
        if handler is None:
            raise HTTPException(405, headers={"Allow": allowed})
        return await handler(request)

    return endpoint


class _AnyMethod:
    """An ASGI app, not a function, so the router hands it every method (a function endpoint
    would be given GET alone) and :func:`_by_method` answers those the path lacks."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._app = request_response(endpoint)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def create_app(
    scheduler: Scheduler,
    tokens: Mapping[str, str],
    *,
    metrics: Metrics | None = None,
    metrics_token: str | None = None,
    limits: Limits | None = None,
    clock: Callable[[], float] | None = None,
    egress: EgressPolicy | None = None,
    operator_token: str | None = None,
    past_states: time_travel.PastStates | None = None,
    shares: Shares | None = None,
    boot: str | None = None,
) -> Starlette:
    """The API over ``scheduler``; ``tokens`` maps each bearer token to its tenant.

    With ``metrics``, ``GET /metrics`` serves them to requests bearing ``metrics_token``.
    ``limits`` are the tenants' (default: :class:`~api.limits.TenantLimits` for every one);
    ``clock`` gives the request buckets seconds on a monotonic scale (default: the real one).
    ``egress`` is the operator's policy a job's target must pass to be registered (the node's
    executors apply it again at each call); by default, the public internet only.
    ``operator_token`` reads every team's events on ``GET /v1/events`` (a team's token reads
    its own). With ``past_states``, ``GET /v1/operator/state`` answers ``operator_token``'s
    bearer what a partition believed as of an offset or an instant (``api/time_travel.py``).
    ``shares`` are the node's of its teams' limits across a cluster (``core.shares``): the
    requests per token and the requests held open are then the cluster's, not each node's.
    ``boot`` is this start of the node, which ``GET /healthz`` answers (``node.peer_watch``).
    """
    state = {
        "scheduler": scheduler,
        "tokens": Tokens(tokens),
        "quota": JobQuota(),
        "held": Held(shares, clock or time.monotonic),
        "operator": events_stream.operator_tokens(operator_token),
        **edge_state(limits, clock, shares),
        "egress": egress if egress is not None else EgressPolicy(),
        "boot": boot,
    }

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        yield state

    table = list(ROUTES)
    if metrics is not None:
        if not metrics_token:
            raise ValueError("metrics need a metrics_token: they are never served unauthenticated")
        table.append(("GET", "/metrics", _metrics_endpoint(metrics, metrics_token)))
    if past_states is not None:
        if not operator_token:
            raise ValueError("past states need an operator_token: they span every team")
        table.append(("GET", time_travel.PATH, time_travel.endpoint(past_states, operator_token)))
    document = openapi.document([(method, path) for method, path, _ in table])

    async def openapi_json(request: Request) -> Response:
        return Response(document, media_type="application/json")

    # One route per path, taking each of its methods: the router answers any other with 405 and
    # an Allow header that lists them all.
    by_path: dict[str, dict[str, Endpoint]] = {}
    for method, path, endpoint in table:
        by_path.setdefault(path, {})[method] = endpoint
    # Each route takes every method and answers 405 itself for those its path lacks, so a path
    # is matched by its shape alone; a literal segment comes before a template where paths
    # overlap, so /v1/runs/replay is never read as the run "replay" (GET is 405, not 404).
    routes = [
        Route(path, _AnyMethod(_by_method(handlers)))
        for path, handlers in sorted(
            by_path.items(), key=lambda item: [s.startswith("{") for s in item[0].split("/")]
        )
    ]
    return Starlette(
        # the status UI and the docs page: static files, not API (api/ui.py)
        routes=[*routes, Route("/openapi.json", openapi_json, methods=["GET"]), *ui.routes()],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
