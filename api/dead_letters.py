"""``POST /v1/runs/replay``: requeue the dead runs a filter names, or count them (``dry_run``).

A filter looks at the dead-letter index newest slot first; the slot and the job are read from
the index key, the reason from the run. One request replays at most ``limit`` runs and looks at
most at :data:`MAX_SCAN` dead runs; when it stopped before the end of the list it answers a
``next_cursor`` to go on from. Repeating a request is safe: a replayed run is no longer dead, so
it is not matched again, and a run that stopped being dead meanwhile is reported, not replayed.

Replays go to their partitions :data:`AT_ONCE` at a time: a partition decides a batch of
commands in one append, so a thousand replays cost a few dozen appends, not a thousand.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal, get_args

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from api.edge import Call, authenticate, decode, json_response
from api.instants import parse_rfc3339
from api.wire import Instant, JobId
from core.commands import ReplayRun
from core.decide import job_id_of_run
from core.errors import Conflict, CronlogError, InvalidDefinition, NotFound
from core.events import DeadReason
from core.ids import team_id

MAX_REPLAY = 1000
MAX_SCAN = 10_000
AT_ONCE = 64

Reason = Literal["attempts_exhausted", "permanent_failure", "outcome_unknown"]
assert set(get_args(Reason)) == {r.value for r in DeadReason}, "a dead reason the API lacks"


class ReplayFilterIn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Which dead runs to replay: every condition given must hold."""

    job_id: JobId | None = None
    reason: Reason | None = None
    scheduled_after: Instant | None = None
    scheduled_before: Instant | None = None
    limit: Annotated[int, Meta(ge=1, le=MAX_REPLAY)] = 100
    dry_run: bool = False
    cursor: Annotated[str, Meta(min_length=1, max_length=64)] | None = None


class ReplayRefused(msgspec.Struct, kw_only=True):
    run_id: str
    error: str
    message: str


class ReplayOut(msgspec.Struct, kw_only=True):
    dry_run: bool
    matched: int
    replayed: list[str]
    refused: list[ReplayRefused]
    scanned: int
    next_cursor: str | None


def _bounds(body: ReplayFilterIn) -> tuple[int | None, int | None]:
    after = None
    before = None
    if body.scheduled_after is not None:
        after = parse_rfc3339(body.scheduled_after, "scheduled_after")
    if body.scheduled_before is not None:
        before = parse_rfc3339(body.scheduled_before, "scheduled_before")
    if after is not None and before is not None and before <= after:
        raise InvalidDefinition("scheduled_before", "must be after scheduled_after")
    return after, before


async def _matching(call: Call, body: ReplayFilterIn) -> tuple[list[str], int, str | None]:
    """The log ids of the dead runs ``body`` names (up to its limit), how many dead runs were
    looked at, and the cursor to go on from (None: the list was read to its end)."""
    after, before = _bounds(body)
    job_id = None if body.job_id is None else call.job_id(body.job_id)
    history = call.scheduler.reader
    matched: list[str] = []
    scanned = 0
    cursor = body.cursor
    while scanned < MAX_SCAN:
        keys = await history.run_keys(call.tenant, "dead", cursor, min(1000, MAX_SCAN - scanned))
        if not keys:
            return matched, scanned, None
        for next_cursor, slot, run_id in keys:
            if len(matched) == body.limit:
                return matched, scanned, cursor
            scanned += 1
            cursor = next_cursor
            if before is not None and slot >= before:
                continue
            if after is not None and slot < after:
                # Newest first: every run after this one is older still.
                return matched, scanned, None
            if job_id is not None and job_id_of_run(run_id) != job_id:
                continue
            if body.reason is not None:
                run = await history.run(call.tenant, run_id)
                if run is None or run.dead_reason != body.reason:
                    continue
            matched.append(run_id)
    return matched, scanned, cursor


async def _replay(call: Call, run_id: str, slots: asyncio.Semaphore) -> ReplayRefused | None:
    async with slots:
        try:
            await call.scheduler.execute(ReplayRun(run_id=run_id, tenant=call.tenant))
        except (Conflict, NotFound) as e:
            error = "conflict" if isinstance(e, Conflict) else "not_found"
            return ReplayRefused(run_id=team_id(run_id), error=error, message=str(e))
        except CronlogError as e:
            return ReplayRefused(run_id=team_id(run_id), error="unavailable", message=str(e))
    return None


async def replay_dead_runs(request: Request) -> Response:
    call = authenticate(request)
    body = await decode(request, ReplayFilterIn)
    matched, scanned, cursor = await _matching(call, body)
    refused: list[ReplayRefused] = []
    if not body.dry_run:
        slots = asyncio.Semaphore(AT_ONCE)
        outcomes = await asyncio.gather(*(_replay(call, run_id, slots) for run_id in matched))
        refused = [o for o in outcomes if o is not None]
    refused_ids = {r.run_id for r in refused}
    return json_response(
        ReplayOut(
            dry_run=body.dry_run,
            matched=len(matched),
            replayed=[]
            if body.dry_run
            else [team_id(r) for r in matched if team_id(r) not in refused_ids],
            refused=refused,
            scanned=scanned,
            next_cursor=cursor,
        )
    )
