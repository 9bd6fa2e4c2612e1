"""``/openapi.json``: the schemas come from the wire structs (``msgspec.json.schema_components``),
the paths from the table below. :func:`document` refuses a route the table does not describe,
so the document cannot silently fall behind the routes."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from api import wire
from api.errors import ErrorBody

REF = "#/components/schemas/{name}"
UNAUTHENTICATED = frozenset({"/healthz", "/readyz"})  # probes; every other path needs a token

# (method, path) -> summary, request body, success status, response body (``str``: plain
# text), error statuses, query parameters
Operation = tuple[str, type | None, int, type | None, tuple[int, ...], tuple[str, ...]]
_BAD = (400, 401, 413, 422)
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/jobs"): (
        "Create a job (201; a repeat with the same idempotency_key: 200, the same job)",
        wire.NewJob,
        201,
        wire.JobOut,
        (*_BAD, 409, 503),
        (),
    ),
    ("GET", "/v1/jobs"): (
        "List the tenant's jobs",
        None,
        200,
        wire.JobPage,
        (400, 401),
        ("status", "limit", "cursor"),
    ),
    ("PUT", "/v1/jobs/{job_id}"): (
        "Create (201) or replace (200) a job; the same body again changes nothing",
        wire.JobFields,
        200,
        wire.JobOut,
        (*_BAD, 404, 409, 503),
        (),
    ),
    ("GET", "/v1/jobs/{job_id}"): ("Read a job", None, 200, wire.JobOut, (401, 404), ()),
    ("PATCH", "/v1/jobs/{job_id}"): (
        "Change some fields, pause or resume; If-Match or version makes it conditional",
        wire.JobPatch,
        200,
        wire.JobOut,
        (*_BAD, 404, 409, 503),
        (),
    ),
    ("DELETE", "/v1/jobs/{job_id}"): (
        "Cancel a job and its live runs",
        None,
        200,
        wire.JobOut,
        (401, 404, 409, 503),
        (),
    ),
    ("GET", "/v1/jobs/{job_id}/runs"): (
        "A job's runs, newest slot first",
        None,
        200,
        wire.RunPage,
        (400, 401, 404),
        ("limit", "cursor"),
    ),
    ("POST", "/v1/jobs/{job_id}/runs"): (
        (
            "Trigger a run now or of a past slot (201); a slot that has a run, or a repeated"
            " Idempotency-Key header, answers that run (200)"
        ),
        wire.TriggerIn,
        201,
        wire.RunOut,
        (*_BAD, 404, 409, 503),
        (),
    ),
    ("GET", "/v1/jobs/{job_id}/preview"): (
        "The job's next fire times",
        None,
        200,
        wire.PreviewOut,
        (400, 401, 404),
        ("n",),
    ),
    ("POST", "/v1/schedules/preview"): (
        "The next fire times of a cron expression in a timezone",
        wire.SchedulePreviewIn,
        200,
        wire.PreviewOut,
        _BAD,
        (),
    ),
    ("GET", "/v1/runs"): (
        "Runs in one state (default: dead, the dead-letter list)",
        None,
        200,
        wire.RunPage,
        (400, 401),
        ("state", "limit", "cursor"),
    ),
    ("GET", "/v1/runs/{run_id}"): ("Read a run", None, 200, wire.RunOut, (401, 404), ()),
    ("POST", "/v1/runs/{run_id}/cancel"): (
        "Cancel a run (a running one learns it at its next heartbeat)",
        None,
        200,
        wire.RunOut,
        (401, 404, 409, 503),
        (),
    ),
    ("POST", "/v1/runs/{run_id}/replay"): (
        "Requeue a dead run with a fresh attempt budget",
        None,
        200,
        wire.RunOut,
        (401, 404, 409, 503),
        (),
    ),
    ("POST", "/v1/runs/{run_id}/heartbeat"): (
        "Extend the lease; 409 when it was lost (cancelled says whether the run was cancelled)",
        wire.HeartbeatIn,
        200,
        wire.HeartbeatOut,
        (*_BAD, 404, 409, 503),
        (),
    ),
    ("POST", "/v1/runs/{run_id}/complete"): (
        "Report the attempt's outcome; 409 unless the fencing token holds the live lease",
        wire.CompleteIn,
        200,
        wire.RunOut,
        (*_BAD, 404, 409, 503),
        (),
    ),
    ("POST", "/v1/workers/claim"): (
        "Lease up to limit ready runs of a pull pool",
        wire.ClaimIn,
        200,
        wire.ClaimOut,
        (*_BAD, 503),
        (),
    ),
    ("GET", "/metrics"): (
        "Prometheus metrics of this node (text exposition format); its own bearer token",
        None,
        200,
        str,
        (401,),
        (),
    ),
    ("GET", "/healthz"): ("The process is up", None, 200, wire.Health, (), ()),
    ("GET", "/readyz"): (
        "The node owns its partitions and has caught up",
        None,
        200,
        wire.Health,
        (503,),
        (),
    ),
}


def _ref(type_: type) -> dict[str, str]:
    return {"$ref": REF.format(name=type_.__name__)}


def _json_content(type_: type) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(type_)}}


def _operation(path: str, op: Operation) -> dict[str, Any]:
    summary, request, status, response, errors, query = op
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", path)
    ]
    parameters += [
        {"name": name, "in": "query", "required": False, "schema": {"type": "string"}}
        for name in query
    ]
    out: dict[str, Any] = {"summary": summary, "parameters": parameters}
    if request is not None:
        out["requestBody"] = {"required": True, "content": _json_content(request)}
    responses: dict[str, Any] = {}
    if response is str:
        text = {"text/plain": {"schema": {"type": "string"}}}
        responses[str(status)] = {"description": "OK", "content": text}
    elif response is not None:
        responses[str(status)] = {"description": "OK", "content": _json_content(response)}
    for code in errors:
        responses[str(code)] = {"description": "Error", "content": _json_content(ErrorBody)}
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
    _, schemas = msgspec.json.schema_components(
        (*wire.REQUEST_TYPES, *wire.RESPONSE_TYPES, ErrorBody), ref_template=REF
    )
    return msgspec.json.encode(
        {
            "openapi": "3.1.0",
            "info": {"title": "cronlog", "version": "1"},
            "paths": paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
        }
    )
