"""What every handler does at the edge: authenticate, read and decode the body, read query
parameters and the ``If-Match`` header, and answer with JSON from the read model.

A handler starts with :func:`authenticate`, which resolves the bearer token to the tenant the
whole request speaks for; everything after it passes that tenant on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.auth import Tokens
from api.errors import bad_request, too_large, unauthorized
from api.scheduler import Scheduler
from api.translate import job_out, run_out
from core.errors import NotFound
from core.ids import log_job_id, team_id
from projections.views import JobView, RunView

MAX_BODY_BYTES = 1 << 20
MAX_PAGE = 200

T = TypeVar("T")
C = TypeVar("C", bound=str)


@dataclass(frozen=True, slots=True)
class Call:
    """One authenticated request: the port, and the tenant it speaks for."""

    scheduler: Scheduler
    tenant: str

    def job_id(self, job_id: str) -> str:
        """The log's id of the team's job ``job_id`` (:mod:`core.ids`): scoped by the tenant,
        unless the team owns a job of that bare id from before ids were scoped (and no scoped
        one)."""
        scoped = log_job_id(self.tenant, job_id)
        history = self.scheduler.history
        if (
            history.has_unscoped_ids()
            and history.job(self.tenant, scoped) is None
            and history.job(self.tenant, job_id) is not None
        ):
            return job_id
        return scoped

    def run_id(self, run_id: str) -> str:
        """The log's id of the team's run ``run_id`` (``<job id>.<slot ms>``)."""
        job_id, dot, slot = run_id.rpartition(".")
        if not dot:  # not a run id at all; scoped, it names nothing
            return log_job_id(self.tenant, run_id)
        return f"{self.job_id(job_id)}.{slot}"


def authenticate(request: Request) -> Call:
    tokens: Tokens = request.state.tokens
    tenant = tokens.tenant_of(request.headers.get("authorization"))
    if tenant is None:
        raise unauthorized()
    return Call(request.state.scheduler, tenant)


async def read_body(request: Request) -> bytes:
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


def decoder_of(type_: type[T]) -> msgspec.json.Decoder[T]:
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    return decoder


async def decode(request: Request, type_: type[T], *, empty_ok: bool = False) -> T:
    """The body as ``type_``; msgspec's errors become 400s naming the field (``api/errors.py``)."""
    body = await read_body(request)
    if empty_ok and not body.strip():
        body = b"{}"
    return decoder_of(type_).decode(body)


_encoder = msgspec.json.Encoder()


def json_response(value: object, status: int = 200) -> Response:
    return Response(_encoder.encode(value), status_code=status, media_type="application/json")


def query_int(request: Request, default: int, maximum: int, name: str = "limit") -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise bad_request(name, f"must be an integer between 1 and {maximum}")
    return int(text)


def query_choice(request: Request, name: str, allowed: tuple[C, ...]) -> C | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    for choice in allowed:
        if choice == value:
            return choice
    raise bad_request(name, f"must be one of {', '.join(allowed)}")


def expected_version(request: Request, in_body: int | None = None) -> int | None:
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


def job_view(call: Call, job_id: str) -> JobView:
    """The job whose log id is ``job_id``, if it is the caller's."""
    view = call.scheduler.history.job(call.tenant, job_id)
    if view is None:
        raise NotFound(f"job {team_id(job_id)} not found")
    return view


def run_view(call: Call, run_id: str) -> RunView:
    """The run whose log id is ``run_id``, if it is the caller's."""
    view = call.scheduler.history.run(call.tenant, run_id)
    if view is None:
        raise NotFound(f"run {team_id(run_id)} not found")
    return view


def job_response(call: Call, job_id: str, status: int = 200) -> Response:
    return json_response(job_out(job_view(call, job_id)), status)


def run_response(call: Call, run_id: str, status: int = 200) -> Response:
    return json_response(run_out(run_view(call, run_id)), status)
