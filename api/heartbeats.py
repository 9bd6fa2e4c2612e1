"""``POST /v1/runs:heartbeat``: many leases extended in one request, for pull workers that hold
runs by the thousand.

A worker heartbeats each run it holds every third of the run's lease. One request a run is
an HTTP request, an authentication and a decision each, and at 5,000 runs held (a lease of
15 s) that is a thousand requests a second, most of the worker's CPU spent on the way: its
heartbeats were answered late and leases ran out under running handlers. Here the beats that
come due together go in one request.

Each item is what ``POST /v1/runs/{run_id}/heartbeat`` takes, with the ``run_id`` in it, and
is answered as that request would be, in a result of its own: ``200`` with the new
``lease_expires_at``, or the error a single heartbeat would answer (400 for the item itself,
its ``field`` prefixed with the item's place, ``runs[3].fencing_token``; 404 for a run the team
does not have; 409 ``lease_lost`` when the token no longer holds the live lease, with
``cancelled``: stop working on the run; 429 past the token's rate; 503 when the run's
partition could not decide it now). One refused item refuses only itself; the request as a
whole is refused only when it is not a batch at all (not JSON, no ``runs`` list, none or more
than ``MAX_BATCH_RUNS`` items: 400 naming ``runs``).

Every item counts as one request against the token's rate, as a single heartbeat would (the
request itself pays for the first). The items that pass go to the scheduler together
(:meth:`Scheduler.execute_many`): one partition's heartbeats are decided in one batch and
appended in one durable write. The answer does not wait for the read model to fold them
(``visible=False``): it reads nothing from it, the new expiry is the ``Heartbeat`` event's, and
a worker heartbeating thousands of runs should not wait on a read model that lags under the
load those runs make. Only a refusal asks the read model, as a single heartbeat's does. A
replayed item is harmless: the same token extends the same lease again.

Worked example: ``{"runs": [A, B]}`` where B's run was cancelled answers ``{"results":
[{"index": 0, "status": 200, "run_id": "nightly.1796097600000", "lease_expires_at":
"2026-12-01T09:00:45Z"}, {"index": 1, "status": 409, "run_id": ..., "error": {"error":
"lease_lost", "message": ..., "cancelled": true}}], "extended": 1, "failed": 1}``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from api.edge import (
    as_type,
    authenticate,
    json_response,
    lease_refused,
    over_rate,
    read_typed_or_json,
    refuse_oversized,
    take_items,
)
from api.errors import ErrorBody, from_exception
from api.instants import to_rfc3339
from api.translate import heartbeat_run
from api.wire import FencingToken, StartedLate
from core.errors import CronlogError, LeaseLost, NotYetReadable
from core.events import AnyEvent, Heartbeat
from core.ids import team_id

MAX_BATCH_RUNS = 1000
# an item is a run id of up to 1,024 characters and a token: about 1.1 MiB for the most items
MAX_BATCH_BODY_BYTES = 2 << 20


class RunHeartbeat(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One lease to extend: POST /v1/runs/{run_id}/heartbeat's body, with its run."""

    run_id: Annotated[str, Meta(min_length=1, max_length=1024)]
    fencing_token: FencingToken
    check: bool = False
    started_late_ms: StartedLate | None = None


class HeartbeatBatchIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/runs:heartbeat: the leases to extend, each as POST
    /v1/runs/{run_id}/heartbeat takes it, with its ``run_id``.

    The document leaves the items' schema open on purpose: an item is read on its own and a bad
    one is answered in its result (400 naming ``runs[i].<field>``) while the request is a 200."""

    runs: Annotated[list[Any], Meta(min_length=1, max_length=MAX_BATCH_RUNS)]


class _WellFormed(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A batch whose every item is well formed, as nearly every worker's is: decoded at once."""

    runs: Annotated[list[RunHeartbeat], Meta(min_length=1, max_length=MAX_BATCH_RUNS)]


_well_formed = msgspec.json.Decoder(_WellFormed)


class HeartbeatResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One item's outcome: ``status`` is what POST /v1/runs/{run_id}/heartbeat would have
    answered (200 extended, until ``lease_expires_at``; else the error's); ``run_id`` the run
    it names (when it got that far)."""

    index: int
    status: int
    run_id: str | None = None
    lease_expires_at: str | None = None
    error: ErrorBody | None = None


class HeartbeatBatchOut(msgspec.Struct, kw_only=True):
    results: list[HeartbeatResult]
    extended: int
    failed: int


def _refused(index: int, err: Exception, run_id: str | None = None) -> HeartbeatResult:
    api_error = from_exception(err)
    body = api_error.body
    field = f"runs[{index}]" if body.field is None else f"runs[{index}].{body.field}"
    return HeartbeatResult(
        index=index,
        status=api_error.status,
        run_id=run_id,
        error=ErrorBody(error=body.error, message=body.message, field=field),
    )


def _extended(index: int, run_id: str, events: list[AnyEvent]) -> HeartbeatResult:
    """200: the lease extended until its new expiry (a check decides nothing: no expiry)."""
    beat = next((e for e in events if isinstance(e, Heartbeat)), None)
    return HeartbeatResult(
        index=index,
        status=200,
        run_id=team_id(run_id),
        lease_expires_at=None if beat is None else to_rfc3339(beat.lease_expires_at),
    )


async def heartbeat_runs(request: Request) -> Response:
    call = authenticate(request)
    raw = await read_typed_or_json(request, MAX_BATCH_BODY_BYTES, _well_formed, deep="runs")
    if isinstance(raw, _WellFormed):
        items: list[Any] = raw.runs
    else:
        refuse_oversized(raw, "runs", MAX_BATCH_RUNS, "heartbeats")
        items = msgspec.convert(raw, HeartbeatBatchIn).runs
    results: list[HeartbeatResult | None] = [None] * len(items)
    allowed = 1 + take_items(request, call, len(items) - 1)
    bodies: list[tuple[int, RunHeartbeat]] = []
    for i, item in enumerate(items):
        if i >= allowed:
            results[i] = _refused(i, over_rate(call))
            continue
        if isinstance(item, RunHeartbeat):
            bodies.append((i, item))
            continue
        try:
            bodies.append((i, as_type(item, RunHeartbeat)))
        except msgspec.ValidationError as err:
            results[i] = _refused(i, err)
    run_ids = call.run_ids([body.run_id for _, body in bodies])
    sent = [
        (i, heartbeat_run(run_id, body, call.tenant))
        for (i, body), run_id in zip(bodies, run_ids, strict=True)
    ]
    # As a single heartbeat: the partition decides first (it checks the run is the team's),
    # the read model is asked only about a refusal, which may not have folded the run yet.
    answers = await call.scheduler.execute_many([command for _, command in sent], visible=False)
    for (i, command), answer in zip(sent, answers, strict=True):
        if isinstance(answer, LeaseLost):
            refusal = await lease_refused(call, command.run_id, answer)
            results[i] = HeartbeatResult(
                index=i, status=refusal.status, run_id=team_id(command.run_id), error=refusal.body
            )
        elif isinstance(answer, NotYetReadable):
            # durable, only not yet in the read model, which this answer does not read
            results[i] = _extended(i, command.run_id, answer.events)
        elif isinstance(answer, CronlogError):
            results[i] = _refused(i, answer, team_id(command.run_id))
        else:
            results[i] = _extended(i, command.run_id, answer)
    done = [r for r in results if r is not None]
    assert len(done) == len(results)
    extended = sum(1 for r in done if r.status == 200)
    return json_response(
        HeartbeatBatchOut(results=done, extended=extended, failed=len(done) - extended)
    )
