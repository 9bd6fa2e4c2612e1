"""``/openapi.json``, the API's contract: the schemas come from the wire structs
(``msgspec.json.schema_components``: bounds, patterns and required fields included), the paths
from the table below. :func:`document` refuses a route the table does not describe, so the
document cannot silently fall behind the routes.

Every status a route can answer is listed with it. The split the error table in
``api/errors.py`` states holds here too: a request the document says is wrong is a 400, and a
422 is reserved for what a schema cannot say (a cron expression that never fires, an unknown
timezone, an opaque cursor this listing never gave out). ``tests/contract`` holds the service
to this document with schemathesis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from api import (
    batch,
    changes,
    completions,
    dead_letters,
    events_stream,
    field_docs,
    heartbeats,
    stats,
    team,
    time_travel,
    wire,
)
from api.errors import ErrorBody
from api.instants import RFC3339
from core.jobs import JOB_ID, MAX_NAME_CHARS, TAG, TENANT
from projections.read_model import MAX_LIMIT
from projections.views import JOB_STATUSES, RUN_STATES

REF = "#/components/schemas/{name}"
UNAUTHENTICATED = frozenset({"/healthz", "/readyz"})  # probes; every other path needs a token
RUN_ID = r"^[A-Za-z0-9_-]{1,64}\.[0-9]{1,18}$"  # <job_id>.<scheduled_for ms>
IF_MATCH = r'^(W/)?"?[0-9]{1,18}"?$'

_QUERY: dict[str, dict[str, Any]] = {
    "limit": {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_LIMIT,
        "description": "items a page holds at most (served as at most the tenant's page size)",
    },
    "cursor": {"type": "string", "description": "the next_cursor of the page before"},
    "status": {"enum": list(JOB_STATUSES), "description": "only jobs with this status"},
    "state": {
        "enum": list(RUN_STATES),
        "default": "dead",
        "description": "only runs in this state (dead: the dead letters)",
    },
    "n": {
        "type": "integer",
        "minimum": 1,
        "maximum": wire.MAX_PREVIEW,
        "default": 10,
        "description": "how many fire times to list",
    },
    "q": {
        "type": "string",
        "maxLength": wire.MAX_SEARCH_CHARS,
        "description": "only jobs whose name or id holds this text, in any case",
    },
    "name": {
        "type": "string",
        "maxLength": MAX_NAME_CHARS,
        "description": "only jobs with exactly this name (names need not be unique)",
    },
    "tag": {
        "type": "string",
        "pattern": f"^{TAG.pattern}$",
        "description": "only jobs labelled with this tag (one of their tags)",
    },
    "window_min": {
        "type": "integer",
        "minimum": 1,
        "maximum": stats.MAX_WINDOW_MIN,
        "default": stats.DEFAULT_WINDOW_MIN,
        "description": "the window: this many minutes up to the end of the current one",
    },
    "step_min": {
        "type": "integer",
        "minimum": 1,
        "maximum": stats.MAX_STEP_MIN,
        "description": "minutes a point adds up (default: the window in 120 points at most;"
        f" at most {stats.MAX_POINTS} points)",
    },
    # GET /v1/events (api/events_stream.py)
    "follow": {
        "type": "boolean",
        "default": False,
        "description": "keep the stream open and send events as they are decided",
    },
    "from": {
        "type": "string",
        "pattern": events_stream.FROM,
        "description": "start, end or an RFC 3339 instant (default: end when following, else"
        " start); cursor or Last-Event-ID take precedence",
    },
    "event_cursor": {
        "type": "string",
        "pattern": events_stream.CURSOR,
        "description": "resume after the event whose id this is",
    },
    "job": {"type": "string", "pattern": JOB_ID.pattern, "description": "only this job's"},
    "tenant": {
        "type": "string",
        "pattern": TENANT.pattern,
        "description": "only this team's (the operator's token; a team's reads its own)",
    },
    "from_instant": {"type": "string", "pattern": RFC3339, "description": "the first instant"},
    "to_instant": {"type": "string", "pattern": RFC3339, "description": "the last instant"},
    "slots_limit": {
        "type": "integer",
        "minimum": 1,
        "maximum": wire.MAX_SLOTS,
        "default": wire.MAX_SLOTS,
        "description": "slots listed at most (more says whether the range holds others)",
    },
    "max_events": {
        "type": "integer",
        "minimum": 1,
        "maximum": events_stream.MAX_LIMIT,
        "description": f"end the stream after this many events (default when not following:"
        f" {events_stream.DEFAULT_LIMIT})",
    },
    # GET /v1/operator/state (api/time_travel.py)
    "state_partition": {
        "type": "integer",
        "minimum": 0,
        "maximum": time_travel.MAX_NUMBER,
        "description": "the partition (default: the job's)",
    },
    "state_offset": {
        "type": "integer",
        "minimum": 0,
        "maximum": time_travel.MAX_NUMBER,
        "description": "the state of the events below this offset (default: the log's end)",
    },
    "state_at": {
        "type": "string",
        "pattern": RFC3339,
        "description": "the state after the events decided at or before this instant",
    },
    "state_job": {
        "type": "string",
        "pattern": JOB_ID.pattern,
        "description": "only this job and its runs (with its tenant)",
    },
    "state_tenant": {
        "type": "string",
        "pattern": TENANT.pattern,
        "description": "only this team's jobs and runs",
    },
}
_QUERY_NAMES = {  # a query parameter whose schema differs by route
    "state_partition": "partition",
    "state_offset": "offset",
    "state_at": "at",
    "state_job": "job",
    "state_tenant": "tenant",
    "event_cursor": "cursor",
    "from_instant": "from",
    "to_instant": "to",
    "slots_limit": "limit",
}
_REQUIRED = frozenset({"from_instant", "to_instant"})
_HEADERS: dict[str, dict[str, Any]] = {
    "If-Match": {"type": "string", "pattern": IF_MATCH, "description": "the job's version"},
    "Idempotency-Key": {
        "type": "string",
        "minLength": 1,
        "maxLength": wire.MAX_IDEMPOTENCY_KEY,
        "description": "names the run this trigger makes; a repeat answers that run",
    },
    "Last-Event-ID": {
        "type": "string",
        "pattern": events_stream.LAST_EVENT_ID,
        "description": "the id of the last event received: resume after it (empty: none)",
    },
}
_PATH_PARAMETERS = {
    "job_id": "the job's id, as the team names it",
    "run_id": "the run's id: <job id>.<slot in ms since the epoch>",
}
_RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}},
}
_DESCRIPTIONS = {
    200: "OK",
    201: "Created",
    400: "The request does not match this document; field names the part",
    401: "No bearer token, or not one this service knows",
    403: "The tenant has all the jobs it may have (events: another team's)",
    404: "Not found (or another tenant's)",
    409: "Conflicts with the current state (a version, a run's state, a lost lease)",
    413: "The body is over 1 MiB (a batch: over 16 MiB)",
    415: "The body is not application/json",
    422: "Well-formed, but refused by a rule this document cannot state; field names it",
    429: "This token has spent its requests for now, or its team holds as many waiting"
    " requests open as it may",
    503: "The owning partition cannot decide now; nothing was decided",
}


# The groups of the document (Swagger UI at /docs shows one section each), in the order shown; an
# operation's group is the first whose path prefix its path has (:func:`tag_of`).
TAGS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("jobs", "Create, change, read and run jobs", ("/v1/jobs", "/v1/schedules")),
    ("runs", "Runs and dead letters: read, cancel, replay", ("/v1/runs",)),
    ("workers", "Pull workers: claim runs, extend leases, report outcomes", ("/v1/workers",)),
    ("team", "The team's limits and figures", ("/v1/team", "/v1/stats")),
    ("events", "The audit stream", ("/v1/events",)),
    ("operator", "For the operator's tokens: metrics, time travel", ("/metrics", "/v1/operator")),
    ("probes", "Liveness and readiness, without a token", ("/healthz", "/readyz")),
)
_WORKER_CALLS = ("/heartbeat", "/complete", "/v1/runs:heartbeat", "/v1/runs:complete")


def tag_of(path: str) -> str:
    """The group of the operation at ``path``: a worker's own calls on runs are the workers'."""
    if path.endswith(_WORKER_CALLS):
        return "workers"
    for name, _, prefixes in TAGS:
        if path.startswith(prefixes):
            return name
    raise ValueError(f"{path} is in no group of the document (openapi.TAGS)")


@dataclass(frozen=True)
class Operation:
    summary: str
    ok: tuple[int, ...] = (200,)
    response: type | None = None  # ``str``: plain text
    request: type | None = None
    body_required: bool = True
    errors: tuple[int, ...] = ()  # besides those every operation of its kind answers
    query: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    stream: bool = False  # the response is text/event-stream


_DEFINE = (403, 409, 422, 503)
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/jobs"): Operation(
        "Create a job (201); a repeat with the same job_id or idempotency_key and body answers"
        " the same job (200)",
        (200, 201),
        wire.JobOut,
        wire.NewJob,
        errors=_DEFINE,
    ),
    ("POST", "/v1/jobs:batch"): Operation(
        f"Create up to {batch.MAX_BATCH_JOBS} jobs at once (more: 400). Each item is answered"
        " in a result of its own, as POST /v1/jobs would answer it (201, 200, or its error,"
        " the field prefixed with jobs[i]); each item counts as a request against the token's"
        " rate. The items of one partition are appended in one write",
        response=batch.JobBatchOut,
        request=batch.JobBatchIn,
        errors=(503,),
    ),
    ("GET", "/v1/jobs"): Operation(
        "List the tenant's jobs, each with the run of its newest slot; q finds those whose"
        " name or id holds it, name those called exactly that, tag those labelled with it",
        response=wire.JobPage,
        errors=(422,),
        query=("status", "q", "name", "tag", "limit", "cursor"),
    ),
    ("PUT", "/v1/jobs/{job_id}"): Operation(
        "Create (201) or replace (200) a job; the same body again changes nothing",
        (200, 201),
        wire.JobOut,
        wire.JobDefinition,
        errors=(*_DEFINE, 404),
        headers=("If-Match",),
    ),
    ("GET", "/v1/jobs/{job_id}"): Operation("Read a job", response=wire.JobOut, errors=(404,)),
    ("PATCH", "/v1/jobs/{job_id}"): Operation(
        "Change some fields, pause or resume; If-Match or version makes it conditional",
        response=wire.JobOut,
        request=wire.JobPatch,
        errors=(404, 409, 422, 503),
        headers=("If-Match",),
    ),
    ("DELETE", "/v1/jobs/{job_id}"): Operation(
        "Cancel a job and its live runs (the job and its history stay readable)",
        response=wire.JobOut,
        errors=(404, 409, 503),
        headers=("If-Match",),
    ),
    ("GET", "/v1/jobs/{job_id}/runs"): Operation(
        "A job's runs, newest slot first",
        response=wire.RunPage,
        errors=(404, 422),
        query=("limit", "cursor"),
    ),
    ("POST", "/v1/jobs/{job_id}/runs"): Operation(
        "Trigger a run now or of a past slot (201); a slot that has a run, or a repeated"
        " Idempotency-Key header, answers that run (200)",
        (200, 201),
        wire.RunOut,
        wire.TriggerIn,
        body_required=False,
        errors=(404, 409, 422, 503),
        headers=("Idempotency-Key",),
    ),
    ("GET", "/v1/jobs/{job_id}/preview"): Operation(
        "The job's next fire times", response=wire.PreviewOut, errors=(404,), query=("n",)
    ),
    ("GET", "/v1/jobs/{job_id}/slots"): Operation(
        "The job's slots from one instant to another, each with its run's state: what a"
        " backfill of the range would trigger (the slots that are due and have no run)",
        response=wire.SlotsOut,
        errors=(404, 422),
        query=("from_instant", "to_instant", "slots_limit"),
    ),
    ("POST", "/v1/schedules/preview"): Operation(
        "The next fire times of a cron expression in a timezone (fewer near the end of 9999)",
        response=wire.PreviewOut,
        request=wire.SchedulePreviewIn,
        errors=(422,),
    ),
    ("GET", "/v1/runs"): Operation(
        "Runs in one state (default: dead, the dead-letter list)",
        response=wire.RunPage,
        errors=(422,),
        query=("state", "limit", "cursor"),
    ),
    ("GET", "/v1/runs/{run_id}"): Operation("Read a run", response=wire.RunOut, errors=(404,)),
    ("POST", "/v1/runs/{run_id}/cancel"): Operation(
        "Cancel a run (a running one learns it at its next heartbeat)",
        response=wire.RunOut,
        errors=(404, 409, 503),
    ),
    ("POST", "/v1/runs/{run_id}/replay"): Operation(
        "Requeue a dead run with a fresh attempt budget",
        response=wire.RunOut,
        errors=(404, 409, 503),
    ),
    ("POST", "/v1/runs/{run_id}/heartbeat"): Operation(
        "Extend the lease; 409 when it was lost (cancelled says whether the run was cancelled)",
        response=wire.HeartbeatOut,
        request=wire.HeartbeatIn,
        errors=(404, 409, 503),
    ),
    ("POST", "/v1/runs/{run_id}/complete"): Operation(
        "Report the attempt's outcome; 409 unless the fencing token holds the live lease, or"
        " the same outcome was recorded with it (sent again: answered 200 as it was)",
        response=wire.RunOut,
        request=wire.CompleteIn,
        errors=(404, 409, 503),
    ),
    ("POST", "/v1/runs:complete"): Operation(
        f"Report up to {completions.MAX_BATCH_RUNS} attempts' outcomes at once (more: 400). Each"
        " item is what POST /v1/runs/{run_id}/complete takes, with its run_id, and is answered in"
        " a result of its own as that request would be (200, or its error: 409 lease_lost"
        " unless the fencing token holds the live lease or recorded that outcome already, the"
        " field prefixed with runs[i]); each"
        " item counts as a request against the token's rate. The items of one partition are"
        " appended in one write",
        response=completions.CompletionBatchOut,
        request=completions.CompletionBatchIn,
        errors=(503,),
    ),
    ("POST", "/v1/runs:heartbeat"): Operation(
        f"Extend up to {heartbeats.MAX_BATCH_RUNS} leases at once (more: 400). Each item is what"
        " POST /v1/runs/{run_id}/heartbeat takes, with its run_id, and is answered in a result"
        " of its own as that request would be (200 with lease_expires_at, or its error: 409"
        " lease_lost when the lease was lost, cancelled saying whether the run was cancelled;"
        " the field prefixed with runs[i]); each item counts as a request against the token's"
        " rate. The items of one partition are appended in one write",
        response=heartbeats.HeartbeatBatchOut,
        request=heartbeats.HeartbeatBatchIn,
        errors=(503,),
    ),
    ("POST", "/v1/workers/claim"): Operation(
        "Lease up to limit ready runs of a pull pool; with wait_sec, wait up to that long for"
        " one (long polling: answered as soon as a run is ready)",
        response=wire.ClaimOut,
        request=wire.ClaimIn,
        errors=(503,),
    ),
    ("GET", "/v1/events"): Operation(
        "The audit stream as Server-Sent Events: the team's events (the operator's token:"
        " every team's) from a cursor, an instant, the start or the end; with follow, live."
        " Each event: id (a cursor) and data {partition, offset, event} (docs/events.md)",
        stream=True,
        errors=(403, 422),
        query=("follow", "from", "event_cursor", "job", "tenant", "max_events"),
        headers=("Last-Event-ID",),
    ),
    ("GET", "/metrics"): Operation(
        "Prometheus metrics of this node (text exposition format); its own bearer token",
        response=str,
    ),
    ("GET", "/v1/operator/state"): Operation(
        "Time travel, for the operator's token only (a team's: 403): what a partition believed"
        " as of an offset or an instant (what was due, pending, leased and to whom, running,"
        " dead), from the nearest snapshot before it plus the events after it; 422 naming"
        " offset or at when that would fold more events than the node allows",
        response=time_travel.StateOut,
        errors=(403, 422, 429),
        query=("state_partition", "state_job", "state_tenant", "state_offset", "state_at"),
    ),
    ("GET", "/healthz"): Operation("The process is up", response=wire.Health),
    ("GET", "/readyz"): Operation(
        "The node owns its partitions and has caught up", response=wire.Health, errors=(503,)
    ),
    # -- what the status UI asks beyond the above (any client may) --
    ("POST", "/v1/jobs/{job_id}/preview"): Operation(
        "What a change would do to the job's next fire times, before it is made: the times"
        " before and after it, and the slots it would add and drop (nothing is written)",
        response=changes.ChangePreviewOut,
        request=wire.JobFields,
        errors=(404, 422),
        query=("n",),
    ),
    ("POST", "/v1/runs/replay"): Operation(
        "Requeue the dead runs a filter names, up to limit (dry_run: only count them); go on"
        " from next_cursor while it is not null",
        response=dead_letters.ReplayOut,
        request=dead_letters.ReplayFilterIn,
        errors=(422,),
    ),
    ("GET", "/v1/stats"): Operation(
        "The team's scheduling delay (p50, p99) and runs by outcome, a point per step_min over"
        " the last window_min minutes, and its runs by state now",
        response=stats.StatsOut,
        errors=(422,),
        query=("window_min", "step_min"),
    ),
    ("GET", "/v1/team"): Operation(
        "The team this token speaks for: its name, its jobs (not cancelled) and its limits",
        response=team.TeamOut,
    ),
}

_EXAMPLE_JOB = {
    "name": "nightly-report",
    "schedule": "0 9 * * 1-5",
    "timezone": "Europe/London",
    "target": "pull://reports",
    "payload": {"report": "daily"},
    "retries": 3,
}
_EXAMPLES: dict[type, dict[str, Any]] = {
    wire.NewJob: _EXAMPLE_JOB,
    batch.JobBatchIn: {"jobs": [_EXAMPLE_JOB, {**_EXAMPLE_JOB, "name": "weekly-report"}]},
    wire.JobDefinition: _EXAMPLE_JOB,
    wire.JobPatch: {"status": "paused"},
    wire.SchedulePreviewIn: {"schedule": "30 1 * * *", "timezone": "America/New_York", "n": 5},
    wire.ClaimIn: {"pool": "reports", "worker_id": "worker-1", "limit": 10, "wait_sec": 1},
}


# One event of GET /v1/events, as Server-Sent Events carry it (OpenAPI 3.1: ``schema`` describes
# each event of a text/event-stream).
_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": "One event of the stream: its cursor (id) and the event (data)",
    "properties": {
        "id": {
            "type": "string",
            "pattern": events_stream.CURSOR,
            "description": "the cursor that resumes the stream right after this event",
        },
        "event": {"type": "string", "description": "always the default, message"},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "type": "object",
                "required": ["partition", "offset", "event"],
                "properties": {
                    "partition": {"type": "integer", "minimum": 0},
                    "offset": {"type": "integer", "minimum": 0},
                    "event": {
                        "type": "object",
                        "description": "the event as the log holds it (docs/events.md)",
                    },
                },
            },
            "description": "{partition, offset, event}: the event as the log holds it",
        },
        "retry": {"type": "integer", "description": "milliseconds to wait before reconnecting"},
    },
}


def _ref(type_: type) -> dict[str, str]:
    return {"$ref": REF.format(name=type_.__name__)}


def _json_content(type_: type) -> dict[str, Any]:
    content: dict[str, Any] = {"schema": _ref(type_)}
    if type_ in _EXAMPLES:
        content["example"] = _EXAMPLES[type_]
    return {"application/json": content}


def _statuses(path: str, op: Operation) -> list[int]:
    """Every status the route answers: its own, and those of every route of its kind."""
    codes = set(op.errors)
    if path not in UNAUTHENTICATED:
        codes.add(401)
        if path.startswith("/v1/"):
            codes.add(429)  # only tenants' tokens have request buckets
    if op.request is not None:
        codes |= {400, 413, 415}
    if op.query or op.headers:
        codes.add(400)
    return sorted(codes)


def _parameters(path: str, op: Operation) -> list[dict[str, Any]]:
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "description": _PATH_PARAMETERS[name],
            "schema": {"type": "string", "pattern": RUN_ID if name == "run_id" else JOB_ID.pattern},
        }
        for name in re.findall(r"{(\w+)}", path)
    ]
    parameters += [
        {
            "name": _QUERY_NAMES.get(name, name),
            "in": "query",
            "required": name in _REQUIRED,
            "description": _QUERY[name].get("description", ""),
            "schema": _QUERY[name],
        }
        for name in op.query
    ]
    parameters += [
        {
            "name": name,
            "in": "header",
            "required": False,
            "description": _HEADERS[name].get("description", ""),
            "schema": _HEADERS[name],
        }
        for name in op.headers
    ]
    return parameters


def _operation(path: str, op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "tags": [tag_of(path)],
        "summary": op.summary,
        "parameters": _parameters(path, op),
    }
    if op.request is not None:
        out["requestBody"] = {"required": op.body_required, "content": _json_content(op.request)}
    responses: dict[str, Any] = {}
    for code in op.ok:
        if op.stream:
            content = {"text/event-stream": {"schema": _SSE_EVENT}}
        elif op.response is str:
            content = {"text/plain": {"schema": {"type": "string"}}}
        else:
            content = {} if op.response is None else _json_content(op.response)
        responses[str(code)] = {"description": _DESCRIPTIONS[code], "content": content}
    for code in _statuses(path, op):
        response: dict[str, Any] = {
            "description": _DESCRIPTIONS[code],
            "content": _json_content(ErrorBody),
        }
        if code in (429, 503):
            response["headers"] = _RETRY_AFTER
        if code == 401:
            response["headers"] = {
                "WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}
            }
        responses[str(code)] = response
    out["responses"] = responses
    if path not in UNAUTHENTICATED:
        out["security"] = [{"bearer": []}]
    return out


def document(routes: list[tuple[str, str]]) -> bytes:
    """The OpenAPI 3.1 document for ``routes`` (method, path), encoded."""
    missing = [route for route in routes if route not in OPERATIONS]
    if missing:
        raise ValueError(f"routes without an OpenAPI description: {missing}")
    paths: dict[str, dict[str, Any]] = {}
    for method, path in routes:
        paths.setdefault(path, {})[method.lower()] = _operation(path, OPERATIONS[method, path])
    bodies = {t for op in OPERATIONS.values() for t in (op.request, op.response) if t}
    bodies.discard(str)
    _, schemas = msgspec.json.schema_components(
        (
            *wire.REQUEST_TYPES,
            *wire.RESPONSE_TYPES,
            *sorted(bodies - {*wire.REQUEST_TYPES, *wire.RESPONSE_TYPES}, key=str),
            ErrorBody,
        ),
        ref_template=REF,
    )
    field_docs.describe(schemas)
    return msgspec.json.encode(
        {
            "openapi": "3.1.0",
            "info": {"title": "cronlog", "version": "1"},
            "tags": [{"name": name, "description": text} for name, text, _ in TAGS],
            "paths": paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
        }
    )
