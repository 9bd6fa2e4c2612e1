"""The one place where errors become HTTP statuses. Every error body is JSON
``{"error", "message", "field"?}``; a lost lease also says whether the run was ``cancelled``.

=============================================  ======  =========================
raised                                         status  ``error``
=============================================  ======  =========================
body is not JSON, not UTF-8, nested too deep   400     ``malformed``
unknown field, wrong type, missing field,      400     ``bad_request``
value out of its documented range or pattern,
bad query parameter or ``If-Match``
``InvalidDefinition``: the body fits the       422     ``invalid``
schema, a rule beyond it refuses it
no or unknown bearer token                     401     ``unauthorized``
the tenant has all the jobs it may have        403     ``quota_exceeded``
``NotFound`` (or another tenant's id)          404     ``not_found``
a method the path does not take                405     ``method_not_allowed``
``LeaseLost``                                  409     ``lease_lost``
``Conflict``                                   409     ``conflict``
body over 1 MiB                                413     ``too_large``
a body that is not ``application/json``        415     ``unsupported_media_type``
the token spent its requests (``Retry-After``) 429     ``rate_limited``
a head over 64 KiB or 100 header fields        431     ``headers_too_large``
(answered before the app: ``api/request_head``)
``Unavailable``, ``Fenced``, any other error   503     ``unavailable``
of the ``CronlogError`` tree (a node's own)
=============================================  ======  =========================

400 and 422 split where ``/openapi.json`` does: a body or parameter that the document says is
wrong is a 400; a 422 is a definition the document cannot describe as wrong (a cron expression
that never fires, an unknown timezone, two ways of saying when). Every refusal is raised before
a command is sent, or is the core's own refusal, which decided nothing: bad input changes
nothing.
"""

from __future__ import annotations

import re

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from api.instants import RFC3339
from api.scheduler import Unavailable
from core.errors import Conflict, CronlogError, Fenced, InvalidDefinition, LeaseLost, NotFound
from core.jobs import JOB_ID, POOL


class ErrorBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    error: str
    message: str
    field: str | None = None
    cancelled: bool | None = None  # lease_lost only: the run was cancelled, stop working on it


class ApiError(Exception):
    """An error the API answers with ``status`` and an :class:`ErrorBody`."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        *,
        field: str | None = None,
        cancelled: bool | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(error=error, message=message, field=field, cancelled=cancelled)
        self.headers = headers or {}


def bad_request(field: str | None, message: str) -> ApiError:
    return ApiError(400, "bad_request", message, field=field)


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "unauthorized",
        "send Authorization: Bearer <token>",
        headers={"WWW-Authenticate": 'Bearer realm="cronlog"'},
    )


def too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"the request body is over {limit} bytes")


# msgspec's messages end with " - at `$.a.b[2]`"; the named fields are quoted with backticks.
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_NAMED = re.compile(r"^Object (?:contains unknown|missing required) field `(?P<name>[^`]+)`")
_REGEX = re.compile(r"^Expected `str` matching regex '(?P<pattern>.*)'$")
# What the wire format's patterns mean, in words a client can act on.
_PATTERNS = {
    RFC3339: "an RFC 3339 instant with Z or an offset, e.g. 2026-11-29T09:00:00Z",
    JOB_ID.pattern: "1-64 characters of A-Z a-z 0-9 _ -",
    POOL.pattern: "1-128 characters of A-Z a-z 0-9 _ . -",
}


def from_decode_error(exc: msgspec.DecodeError) -> ApiError:
    """A body msgspec refused: 400, naming the field path where there is one."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return ApiError(400, "malformed", f"the body is not valid JSON: {text}")
    at = _AT.search(text)
    path = at.group("path") if at else ""
    message = text[: at.start()] if at else text
    named = _NAMED.match(message)
    if named:
        path = f"{path}.{named.group('name')}" if path else named.group("name")
    regex = _REGEX.match(message)
    if regex:
        pattern = regex.group("pattern").replace("\\\\", "\\")  # msgspec shows it as repr()
        if pattern in _PATTERNS:
            message = f"must be {_PATTERNS[pattern]}"
    return bad_request(path or None, message)


def from_exception(exc: Exception) -> ApiError:
    match exc:
        case ApiError():
            return exc
        case msgspec.DecodeError():
            return from_decode_error(exc)
        case InvalidDefinition():
            return ApiError(422, "invalid", exc.message, field=exc.field)
        case NotFound():
            return ApiError(404, "not_found", str(exc))
        case LeaseLost():
            return ApiError(409, "lease_lost", str(exc))
        case Conflict():
            return ApiError(409, "conflict", str(exc))
        case Unavailable() | Fenced():
            return ApiError(503, "unavailable", str(exc), headers={"Retry-After": "1"})
        case HTTPException():
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
            return ApiError(exc.status_code, code, exc.detail, headers=dict(exc.headers or {}))
        case CronlogError():
            # The remaining deliberate errors are a node's own "cannot decide this now" (a
            # partition moving, a failed write): the request may succeed if retried.
            return ApiError(503, "unavailable", str(exc), headers={"Retry-After": "1"})
    return ApiError(500, "internal", "internal error")


def error_response(exc: ApiError) -> Response:
    return Response(
        msgspec.json.encode(exc.body),
        status_code=exc.status,
        headers=exc.headers,
        media_type="application/json",
    )


async def handle(request: Request, exc: Exception) -> Response:
    """The exception handler every error the API raises reaches."""
    return error_response(from_exception(exc))


async def client_gone(request: Request, exc: Exception) -> Response:
    """The client hung up before its request was read: nobody reads an answer, and nothing was
    decided. Handled here, not by the catch-all, which logs a traceback for a bug."""
    return Response(status_code=499)  # nginx's "client closed request"; never delivered


EXCEPTION_HANDLERS = {
    ClientDisconnect: client_gone,
    ApiError: handle,
    msgspec.DecodeError: handle,
    CronlogError: handle,
    HTTPException: handle,
    Exception: handle,
}
