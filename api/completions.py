"""``POST /v1/runs:complete``: many attempts' outcomes in one request, for pull workers that
finish runs by the hundred.

Each item is what ``POST /v1/runs/{run_id}/complete`` takes, with the ``run_id`` in it, and is
answered as that request would be, in a result of its own: ``200`` recorded, or the error a
single completion would answer (400 or 422 for the item itself, its ``field`` prefixed with the
item's place, ``runs[3].fencing_token``; 404 for a run the team does not have; 409
``lease_lost`` when the token no longer holds the live lease, with ``cancelled``, unless the
item repeats the outcome that token recorded (200); 429 past the token's rate; 503 when the
run's partition could not decide it now). One refused item refuses only itself; the request
as a whole is refused only when it is not a batch at all (not JSON, no ``runs`` list, none or
more than ``MAX_BATCH_RUNS`` items: 400 naming ``runs``).

Every item counts as one request against the token's rate, as a single completion would (the
request itself pays for the first). The items that pass go to the scheduler together
(:meth:`Scheduler.execute_many`): one partition's items are decided in one batch and appended
in one durable write, and the answer comes once they are durable, so a completion the worker
hears recorded is never lost. A batch sent again (its answer was lost) is safe: the partition
refuses an outcome whose lease it already ended and records nothing twice, and an item that
repeats the outcome recorded for its token is answered 200 as the first was
(:mod:`api.repeats`); one that does not (the other outcome, a lease that expired since) is 409.

Worked example: ``{"runs": [A, B]}`` where B's lease ran out answers ``{"results": [{"index":
0, "status": 200, "run_id": "nightly.1796097600000"}, {"index": 1, "status": 409, "run_id":
..., "error": {"error": "lease_lost", "message": ..., "cancelled": false}}], "completed": 1,
"failed": 1}``.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from api.edge import (
    as_type,
    authenticate,
    json_response,
    over_rate,
    read_json,
    refuse_oversized,
    take_items,
)
from api.errors import ErrorBody, from_exception
from api.repeats import CATCH_UP_S, outcome_refused
from api.translate import complete_run
from api.wire import MAX_RETRY_AFTER_SEC, FencingToken, StartedLate
from core.commands import CompleteRun
from core.errors import CronlogError, LeaseLost, NotYetReadable
from core.ids import team_id

MAX_BATCH_RUNS = 1000
# an item is a few fields and an error text of up to MAX_ERROR_CHARS characters
MAX_BATCH_BODY_BYTES = 4 << 20


class RunCompletion(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One attempt's outcome: POST /v1/runs/{run_id}/complete's body, with its run."""

    run_id: Annotated[str, Meta(min_length=1, max_length=1024)]
    fencing_token: FencingToken
    status: Literal["succeeded", "failed"]
    error: str = ""  # kept up to MAX_ERROR_CHARS characters
    permanent: bool = False
    ambiguous: bool = False
    retry_after_sec: Annotated[float, Meta(ge=0, le=MAX_RETRY_AFTER_SEC)] | None = None
    started_late_ms: StartedLate | None = None


class CompletionBatchIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/runs:complete: the outcomes to record, each as POST
    /v1/runs/{run_id}/complete takes it, with its ``run_id``.

    The document leaves the items' schema open on purpose: an item is read on its own and a bad
    one is answered in its result (400 naming ``runs[i].<field>``) while the request is a 200."""

    runs: Annotated[list[Any], Meta(min_length=1, max_length=MAX_BATCH_RUNS)]


class CompletionResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One item's outcome: ``status`` is what POST /v1/runs/{run_id}/complete would have
    answered (200 recorded, else the error's); ``run_id`` the run it names (when it got that
    far)."""

    index: int
    status: int
    run_id: str | None = None
    error: ErrorBody | None = None


class CompletionBatchOut(msgspec.Struct, kw_only=True):
    results: list[CompletionResult]
    completed: int
    failed: int


def _refused(index: int, err: Exception, run_id: str | None = None) -> CompletionResult:
    api_error = from_exception(err)
    body = api_error.body
    field = f"runs[{index}]" if body.field is None else f"runs[{index}].{body.field}"
    return CompletionResult(
        index=index,
        status=api_error.status,
        run_id=run_id,
        error=ErrorBody(error=body.error, message=body.message, field=field),
    )


async def complete_runs(request: Request) -> Response:
    call = authenticate(request)
    raw = await read_json(request, MAX_BATCH_BODY_BYTES, deep="runs")
    refuse_oversized(raw, "runs", MAX_BATCH_RUNS, "outcomes")
    shape = msgspec.convert(raw, CompletionBatchIn)
    results: list[CompletionResult | None] = [None] * len(shape.runs)
    allowed = 1 + take_items(request, call, len(shape.runs) - 1)
    sent: list[tuple[int, CompleteRun]] = []
    for i, item in enumerate(shape.runs):
        if i >= allowed:
            results[i] = _refused(i, over_rate(call))
            continue
        try:
            body = as_type(item, RunCompletion)
        except msgspec.ValidationError as err:
            results[i] = _refused(i, err)
            continue
        sent.append((i, complete_run(call.run_id(body.run_id), body, call.tenant)))
    # As a single completion: the partition decides first (it checks the run is the team's),
    # the read model is asked only about a refusal, which may not have folded the run yet.
    answers = await call.scheduler.execute_many([command for _, command in sent])
    # one wait for the history for every refused item, as one completion waits
    deadline = time.monotonic() + CATCH_UP_S
    for (i, command), answer in zip(sent, answers, strict=True):
        if isinstance(answer, LeaseLost):
            wait_s = max(0.0, deadline - time.monotonic())
            refusal = await outcome_refused(call, command, answer, wait_s)
            if refusal is None:  # sent again after its answer was lost: recorded
                results[i] = CompletionResult(index=i, status=200, run_id=team_id(command.run_id))
                continue
            results[i] = CompletionResult(
                index=i, status=refusal.status, run_id=team_id(command.run_id), error=refusal.body
            )
        elif isinstance(answer, NotYetReadable):
            # durable, only not yet in the read model, which this answer does not read
            results[i] = CompletionResult(index=i, status=200, run_id=team_id(command.run_id))
        elif isinstance(answer, CronlogError):
            results[i] = _refused(i, answer, team_id(command.run_id))
        else:
            results[i] = CompletionResult(index=i, status=200, run_id=team_id(command.run_id))
    done = [r for r in results if r is not None]
    assert len(done) == len(results)
    completed = sum(1 for r in done if r.status == 200)
    return json_response(
        CompletionBatchOut(results=done, completed=completed, failed=len(done) - completed)
    )
