"""What every handler does at the edge: authenticate, read and decode the body, read query
parameters and the ``If-Match`` header, and answer with JSON from the read model.

A handler starts with :func:`authenticate`, which resolves the bearer token to the tenant the
whole request speaks for and spends one of the token's requests (429 with ``Retry-After`` when
it has none left); everything after it passes that tenant, and its limits, on.

Numbers in query parameters and headers are ASCII digits only (``str.isdigit`` takes "²"), of a
bounded length; a body is read only as ``application/json``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.auth import Tokens
from api.errors import ApiError, bad_request, too_large, unauthorized
from api.limits import Limits, TenantLimits
from api.rate import RequestRates
from api.scheduler import Scheduler
from api.translate import job_out, run_out
from core.commands import AnyCommand
from core.errors import Conflict, InvalidDefinition, LeaseLost, NotFound
from core.events import AnyEvent
from core.ids import log_job_id, team_id
from core.shares import Shares
from projections.history import SourcedRun
from projections.read_model import MAX_LIMIT
from projections.views import JobView, RunView

MAX_BODY_BYTES = 1 << 20
_NUMBER = re.compile(r"[0-9]{1,18}")  # fits an int64 and stays far from int()'s digit limit
_IF_MATCH = re.compile(r'(?:W/)?"?([0-9]{1,18})"?')  # 3, "3" or W/"3"

T = TypeVar("T")
C = TypeVar("C", bound=str)


@dataclass(frozen=True, slots=True)
class Call:
    """One authenticated request: the port, the tenant it speaks for, and that tenant's limits."""

    scheduler: Scheduler
    tenant: str
    limits: TenantLimits

    def job_id(self, job_id: str) -> str:
        """The log's id of the team's job ``job_id`` (:mod:`core.ids`): scoped by the tenant,
        unless the team owns a job of that bare id from before ids were scoped (and no scoped
        one)."""
        scoped = log_job_id(self.tenant, job_id)
        history = self.scheduler.reader
        if (
            history.has_unscoped_ids()
            and history.job_here(self.tenant, scoped) is None
            and history.job_here(self.tenant, job_id) is not None
        ):
            return job_id
        return scoped

    def run_id(self, run_id: str) -> str:
        """The log's id of the team's run ``run_id`` (``<job id>.<slot ms>``)."""
        return _run_in(self.tenant, self.job_id, run_id)

    def run_ids(self, run_ids: Sequence[str]) -> list[str]:
        """:meth:`run_id` of each, the history asked once whether bare ids from before ids
        were scoped exist, not once a run (a batch of a thousand heartbeats)."""
        if self.scheduler.reader.has_unscoped_ids():
            return [self.run_id(run_id) for run_id in run_ids]
        tenant = self.tenant
        return [_run_in(tenant, partial(log_job_id, tenant), run_id) for run_id in run_ids]


def _run_in(tenant: str, job_of: Callable[[str], str], run_id: str) -> str:
    job_id, dot, slot = run_id.rpartition(".")
    if not dot:  # not a run id at all; scoped, it names nothing
        return log_job_id(tenant, run_id)
    return f"{job_of(job_id)}.{slot}"


def authenticate(request: Request) -> Call:
    tokens: Tokens = request.state.tokens
    authorization = request.headers.get("authorization")
    tenant = tokens.tenant_of(authorization)
    if tenant is None or authorization is None:
        raise unauthorized()
    limits: TenantLimits = request.state.limits.of(tenant)
    rates: RequestRates = request.state.rates
    clock: Callable[[], float] = request.state.clock
    token = authorization.partition(" ")[2].strip()
    wait = rates.take(token, limits.requests_per_sec, limits.request_burst, clock(), tenant)
    if wait > 0:
        raise rate_limited(wait, limits.requests_per_sec)
    return Call(request.state.scheduler, tenant, limits)


def rate_limited(wait_s: float, per_sec: float) -> ApiError:
    return ApiError(
        429,
        "rate_limited",
        f"this token may make {per_sec:g} requests a second; try again in {wait_s:.2f} s",
        headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
    )


def edge_state(
    limits: Limits | None, clock: Callable[[], float] | None, shares: Shares | None = None
) -> dict[str, Any]:
    """What the edge keeps in the app's lifespan state besides the scheduler and tokens; with
    ``shares``, the requests per token are this member's share of the cluster's rate."""
    return {
        "limits": limits or Limits(),
        "rates": RequestRates(shares),
        "clock": clock or time.monotonic,
    }


async def read_body(request: Request, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    declared = request.headers.get("content-length", "")
    if len(declared) > 18 or (_NUMBER.fullmatch(declared) and int(declared) > max_bytes):
        raise too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


_json = msgspec.json.Decoder()


def as_type(value: Any, type_: type[T]) -> T:
    """``value`` (decoded JSON) as ``type_``. JSON Schema counts ``3.0`` as an integer, as the
    document's ``"type": "integer"`` then promises: a float with no fraction is read as an int
    wherever it stands, except inside a job's payload, which is kept exactly as sent."""
    payload = value.pop("payload", msgspec.UNSET) if isinstance(value, dict) else msgspec.UNSET
    value = _integral_floats_as_ints(value)
    if payload is not msgspec.UNSET:
        value["payload"] = payload
    return msgspec.convert(value, type_)


def _integral_floats_as_ints(value: Any) -> Any:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            slots: list[tuple[Any, Any]] = list(item.items())
        elif isinstance(item, list):
            slots = list(enumerate(item))
        else:
            continue
        for key, child in slots:
            if isinstance(child, float) and child.is_integer():
                item[key] = int(child)
            elif isinstance(child, dict | list):
                stack.append(child)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


async def decode(request: Request, type_: type[T], *, empty_ok: bool = False) -> T:
    """The body as ``type_``; msgspec's errors become 400s naming the field (``api/errors.py``).

    A body must say it is JSON (415 otherwise); one that nests too deeply for the decoder, or
    holds bytes that are not UTF-8, is a 400 naming the field."""
    body = await read_body(request)
    if empty_ok and not body.strip():
        body = b"{}"
    elif body:
        _check_json_content_type(request)
    # Of the request bodies, only a job's payload takes JSON of any shape.
    deep = "payload" if "payload" in getattr(type_, "__struct_fields__", ()) else None
    value = _decode_json(body, deep)
    try:
        return as_type(value, type_)
    except RecursionError:
        raise too_deep(deep) from None


async def read_json(request: Request, max_bytes: int, deep: str | None) -> Any:
    """The body as plain JSON values (up to ``max_bytes``), for a handler that converts its
    parts itself; ``deep`` is the field a body nested too deeply is blamed on."""
    body = await read_body(request, max_bytes)
    _check_json_content_type(request)
    return _decode_json(body, deep)


def refuse_oversized(raw: Any, field: str, most: int, what: str) -> None:
    """A batch body (plain JSON) whose ``field`` lists more than ``most`` items is a 400 naming
    the field before any item is read: the document's maxItems, as every bound it states."""
    if isinstance(raw, dict) and isinstance(raw.get(field), list):
        count = len(raw[field])
        if count > most:
            raise ApiError(
                400,
                "bad_request",
                f"a batch holds at most {most} {what}, not {count}; send several",
                field=field,
            )


async def read_typed_or_json(
    request: Request, max_bytes: int, typed: msgspec.json.Decoder[T], deep: str | None
) -> T | Any:
    """The body decoded at once as ``typed``'s type when it is one exactly (the common case,
    and a fraction of the cost of reading it item by item), else as plain JSON values (see
    :func:`read_json`) for a handler that answers each part on its own."""
    body = await read_body(request, max_bytes)
    _check_json_content_type(request)
    try:
        return typed.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return _decode_json(body, deep)


def _decode_json(body: bytes, deep: str | None) -> Any:
    try:
        return _json.decode(body)
    except RecursionError:
        raise too_deep(deep) from None
    except UnicodeDecodeError as e:
        raise _not_utf8(body, e.reason) from None
    except msgspec.DecodeError as e:
        # msgspec 0.22 raises UnicodeDecodeError for bytes that are not UTF-8; 0.23 a
        # DecodeError saying so. Either way the sender is told which field holds them.
        if "UTF-8" not in str(e):
            raise
        raise _not_utf8(body, str(e)) from None


def _not_utf8(body: bytes, reason: str) -> ApiError:
    return ApiError(400, "malformed", f"the body is not UTF-8: {reason}", field=not_utf8_at(body))


def too_deep(field: str | None) -> ApiError:
    return ApiError(400, "malformed", "the JSON nests too deeply to be read", field=field)


def _check_json_content_type(request: Request) -> None:
    given = request.headers.get("content-type", "")
    media = given.partition(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"the body must be application/json, not {given[:100]!r}",
            field="Content-Type",
        )


def not_utf8_at(body: bytes) -> str | None:
    """Where in a JSON body the first bytes that are not UTF-8 are: ``a.b[2]`` (the value of
    that field, or a key in it), or None if it cannot be told. Only called for a body already
    refused, so the cost of a second reading is paid by the sender of a bad one."""
    try:
        document = json.loads(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if any("\udc80" <= c <= "\udcff" for c in value):
                return path or None
        elif isinstance(value, dict):
            for key, child in reversed(list(value.items())):
                if any("\udc80" <= c <= "\udcff" for c in key):
                    return path or None
                stack.append((f"{path}.{key}" if path else key, child))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(value))))
    return None


_encoder = msgspec.json.Encoder()


def json_response(value: object, status: int = 200) -> Response:
    return Response(_encoder.encode(value), status_code=status, media_type="application/json")


def query_int(request: Request, default: int, maximum: int, name: str = "limit") -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    if not _NUMBER.fullmatch(text) or not 1 <= int(text) <= maximum:
        raise bad_request(name, f"must be an integer between 1 and {maximum}")
    return int(text)


def query_text(request: Request, name: str, max_chars: int) -> str | None:
    text = request.query_params.get(name)
    if text is not None and len(text) > max_chars:
        raise bad_request(name, f"must be at most {max_chars} characters")
    return text or None


def page_size(call: Call, request: Request, default: int) -> int:
    """``limit`` as the documented bound allows it (400 beyond), served as at most the tenant's
    ``max_page_size`` items: a larger page is cut, and its cursor goes on from there."""
    return min(query_int(request, default, MAX_LIMIT), call.limits.max_page_size)


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
        match = _IF_MATCH.fullmatch(header.strip())
        if match is None:
            raise bad_request("If-Match", "must be the job's version, an integer")
        from_header = int(match.group(1))
    if from_header is not None and in_body is not None and from_header != in_body:
        # Both are well-formed; only together are they wrong, which no schema can say.
        raise InvalidDefinition("version", "If-Match and the body's version disagree")
    return from_header if from_header is not None else in_body


async def job_view(call: Call, job_id: str) -> JobView:
    """The job whose log id is ``job_id``, if it is the caller's."""
    view = await call.scheduler.reader.job(call.tenant, job_id)
    if view is None:
        raise NotFound(f"job {team_id(job_id)} not found")
    return view


async def on_job(call: Call, job_id: str, command: AnyCommand) -> list[AnyEvent]:
    """``command`` for one of the caller's jobs. A job that ended and was forgotten by its
    partition (a retention after it ended: docs/architecture.md) is still in its history:
    the answer is 409, the job is over, rather than a 404 for a job the caller can read."""
    try:
        return await call.scheduler.execute(command)
    except NotFound:
        view = await call.scheduler.reader.job(call.tenant, job_id)
        if view is None:
            raise
        raise Conflict(
            f"job {team_id(job_id)} is {view.status}: it ended and is no longer scheduled"
        ) from None


async def run_view(call: Call, run_id: str) -> RunView:
    """The run whose log id is ``run_id``, if it is the caller's."""
    view = await call.scheduler.reader.run(call.tenant, run_id)
    if view is None:
        raise NotFound(f"run {team_id(run_id)} not found")
    return view


async def lease_refused(call: Call, run_id: str, err: LeaseLost) -> ApiError:
    """What a refused command of a run's lease (a heartbeat, an outcome) answers. The partition
    decides first (it holds the lease and knows whose run it is); only a refusal asks the read
    model, which may not have folded the run yet: a run the team does not have (another
    team's, or none) is a 404, never a lease error that would say it exists; else a 409 that
    says whether the run was cancelled (stop) or reclaimed (someone else has it). (An outcome
    sent again after its answer was lost is answered first by :mod:`api.repeats`.)"""
    return lease_refusal(await call.scheduler.reader.run(call.tenant, run_id), run_id, err)


def lease_refusal(now: RunView | None, run_id: str, err: LeaseLost) -> ApiError:
    """:func:`lease_refused`'s answer, from the run as the read model shows it ``now``."""
    if now is None:
        return ApiError(404, "not_found", f"run {team_id(run_id)} not found")
    return ApiError(409, "lease_lost", str(err), cancelled=now.state == "cancelled")


async def job_response(call: Call, job_id: str, status: int = 200) -> Response:
    view, newest = await call.scheduler.reader.job_and_latest_run(call.tenant, job_id)
    if view is None:
        raise NotFound(f"job {team_id(job_id)} not found")
    return json_response(job_out(view, call.scheduler.now_ms(), newest), status)


async def sourced_run(call: Call, run_id: str) -> SourcedRun:
    """The caller's run from the read model or, past the history window, the archive; a run
    past the window with no archive is gone, and the 404 says so."""
    history = call.scheduler.reader
    found = await history.sourced_run(call.tenant, run_id)
    if found is None:
        if not history.archived and history.past_window(run_id):
            raise NotFound(
                f"run {team_id(run_id)} not found: runs older than the history window "
                "(--history-window) leave history, and with archiving off (--no-archive) they "
                "are gone"
            )
        raise NotFound(f"run {team_id(run_id)} not found")
    return found


async def run_response(call: Call, run_id: str, status: int = 200) -> Response:
    found = await sourced_run(call, run_id)
    return json_response(run_out(found.view, found.source), status)


def over_rate(call: Call) -> ApiError:
    return ApiError(
        429,
        "rate_limited",
        f"this token may make {call.limits.requests_per_sec:g} requests a second, and each item"
        " of a batch counts as one; send the items refused so again in a moment",
    )


def take_items(request: Request, call: Call, n: int) -> int:
    """A batch (of jobs, of outcomes), where each item counts against the token's rate: how many
    of ``n`` items beyond the first the token may still send now."""
    if n <= 0:
        return 0
    rates: RequestRates = request.state.rates
    clock: Callable[[], float] = request.state.clock
    token = (request.headers.get("authorization") or "").partition(" ")[2].strip()
    limits = call.limits
    return rates.take_up_to(
        token, n, limits.requests_per_sec, limits.request_burst, clock(), call.tenant
    )
