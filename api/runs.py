"""Run handlers: trigger, read, list, cancel, replay; and the pull workers' claim, heartbeat and
complete, where only the live lease's fencing token is heard (an outcome sent again after its
answer was lost is answered as it was recorded: :mod:`api.repeats`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from api.edge import (
    Call,
    authenticate,
    decode,
    json_response,
    lease_refused,
    on_job,
    page_size,
    query_choice,
    run_response,
    sourced_run,
)
from api.errors import bad_request
from api.held import Held
from api.instants import parse_rfc3339, to_rfc3339
from api.repeats import outcome_refused
from api.scheduler import Unavailable
from api.translate import claimed, complete_run, heartbeat_run, run_out
from api.wire import (
    ClaimedRun,
    ClaimIn,
    ClaimOut,
    CompleteIn,
    HeartbeatIn,
    HeartbeatOut,
    RunPage,
    TriggerIn,
)
from core.clock import Millis
from core.commands import CancelRun, HeartbeatRun, ReplayRun, TriggerRun
from core.decide import run_id_of
from core.errors import Conflict, LeaseLost
from core.events import Heartbeat, LeaseGranted, RunMaterialised
from core.ids import team_id
from projections.views import RUN_STATES, RunView

CATCH_UP_S = 5.0  # how long a trigger that decided nothing waits for the run it names

# -- runs --------------------------------------------------------------------------------------


async def trigger_run(request: Request) -> Response:
    """201 with the run a trigger made; 200 with the run it names when there is one already.

    A run is named by the ``Idempotency-Key`` first (the run that key made, whatever slot this
    request asks for), then by its identity, the job and ``scheduled_for``. The partition state
    forgets runs that succeeded or were cancelled, so the read model is asked before the command
    is sent: a slot that has run is not run again. When the command decides nothing (the key
    was used, or the slot's run is live or dead) the read model is asked again, and waited for
    briefly: a run decided without this request (a timer, another request) may not be in it yet.
    """
    call = authenticate(request)
    job_id = call.job_id(request.path_params["job_id"])
    key = request.headers.get("idempotency-key")
    if key is not None and not 1 <= len(key) <= 256:
        raise bad_request("Idempotency-Key", "must be 1-256 characters")
    body = await decode(request, TriggerIn, empty_ok=True)
    slot = (
        None if body.scheduled_for is None else parse_rfc3339(body.scheduled_for, "scheduled_for")
    )
    known = await _triggered(call, job_id, key, slot)
    if known is not None:
        return json_response(run_out(known))
    events = await on_job(
        call,
        job_id,
        TriggerRun(job_id=job_id, tenant=call.tenant, scheduled_for=slot, idempotency_key=key),
    )
    made = next((e for e in events if isinstance(e, RunMaterialised)), None)
    if made is not None:
        return await run_response(call, made.run_id, 201)
    if key is None and slot is None:
        # "Now" was a slot whose run exists, to the millisecond; which instant the partition
        # read as now is not known here.
        raise Conflict(f"a run of job {team_id(job_id)} for this instant exists already; try again")
    known = await _triggered(call, job_id, key, slot)
    if known is None:

        async def readable() -> bool:
            return await _triggered(call, job_id, key, slot) is not None

        if await call.scheduler.reader.until(job_id, readable, CATCH_UP_S):
            known = await _triggered(call, job_id, key, slot)
    if known is None:
        raise Unavailable(f"the run a trigger of job {team_id(job_id)} names is not readable yet")
    return json_response(run_out(known))


async def _triggered(
    call: Call, job_id: str, key: str | None, slot: Millis | None
) -> RunView | None:
    """The run a trigger names, as the read model knows it: the key's run, else the slot's."""
    history = call.scheduler.reader
    known = None if key is None else await history.run_by_key(call.tenant, job_id, key)
    if known is None and slot is not None:
        # A slot past the hot window may have run: the archive says so (never run it twice).
        found = await history.sourced_run(call.tenant, run_id_of(job_id, slot))
        known = None if found is None else found.view
    return known


async def get_run(request: Request) -> Response:
    call = authenticate(request)
    run_id = call.run_id(request.path_params["run_id"])
    return await run_response(call, run_id)  # past the hot window: from the archive


async def list_runs(request: Request) -> Response:
    call = authenticate(request)
    page = await call.scheduler.reader.runs(
        call.tenant,
        query_choice(request, "state", RUN_STATES) or "dead",
        page_size(call, request, 50),
        request.query_params.get("cursor"),
    )
    return json_response(
        # Runs by state: the read model's alone (live and dead runs never leave it; finished
        # ones past the history window are not listed here, GET /v1/jobs/{id}/runs has them).
        RunPage(
            runs=[run_out(v) for v in page.items],
            next_cursor=page.next_cursor,
            source="hot",
            gone_before=None,
        )
    )


async def cancel_run(request: Request) -> Response:
    call = authenticate(request)
    run_id = call.run_id(request.path_params["run_id"])
    view = (await sourced_run(call, run_id)).view
    if view.state == "succeeded":
        raise Conflict(f"run {team_id(run_id)} already succeeded")
    if view.state != "cancelled":
        await call.scheduler.execute(CancelRun(run_id=run_id, tenant=call.tenant))
    return await run_response(call, run_id)


async def replay_run(request: Request) -> Response:
    call = authenticate(request)
    run_id = call.run_id(request.path_params["run_id"])
    view = (await sourced_run(call, run_id)).view
    if view.state != "dead":
        raise Conflict(f"run {team_id(run_id)} is {view.state}; only a dead run can be replayed")
    await call.scheduler.execute(ReplayRun(run_id=run_id, tenant=call.tenant))
    return await run_response(call, run_id)


# -- pull workers ------------------------------------------------------------------------------


async def claim(request: Request) -> Response:
    call = authenticate(request)
    body = await decode(request, ClaimIn)
    if body.wait_sec > 0:
        held: Held = request.state.held
        await held.first_share("waiting claims", call.tenant, call.limits.max_waiting_claims)
        with held.hold("waiting claims", call.tenant, call.limits.max_waiting_claims):
            leases = await _claim_waiting(call, body, request.is_disconnected)
    else:
        leases = await call.scheduler.claim(
            call.tenant, body.pool, body.worker_id, body.limit, _horizon_ms(body)
        )
    try:
        runs = await _claimed(call, leases)
    except BaseException as err:  # the worker gets no answer: nobody holds these leases
        call.scheduler.return_leases(leases, f"the claim's answer could not be made: {err!r}")
        raise
    if leases and await request.is_disconnected():  # nobody to answer, nobody holds them
        call.scheduler.return_leases(leases, "the worker hung up before the claim's answer")
    return json_response(ClaimOut(runs=runs))


async def _claimed(call: Call, leases: list[LeaseGranted]) -> list[ClaimedRun]:
    """What the worker is told of each lease: the run and what its job says to run."""
    runs = []
    # one question a partition the leases came from (the jobs' specs say what to run)
    jobs = await call.scheduler.reader.jobs_by_id(call.tenant, [lease.job_id for lease in leases])
    # Read once the jobs are: a run leased ahead starts ``start_in_ms`` after the worker has
    # the answer, and what the node spent before it answers would make the start that late
    # (the jobs' questions under a herd's claims: a claim's thousand runs started 0.2 s late).
    now = call.scheduler.now_ms()
    for lease in leases:
        job = jobs[lease.job_id]
        if job is None:  # the port promised the read model caught up: it did not
            raise Unavailable(f"job {team_id(lease.job_id)} of a granted lease is not readable yet")
        runs.append(claimed(lease, job.spec, now))
    return runs


def _horizon_ms(body: ClaimIn) -> int:
    return round(body.ahead_sec * 1000)


async def _claim_waiting(
    call: Call, body: ClaimIn, gone: Callable[[], Awaitable[bool]]
) -> list[LeaseGranted]:
    """Claim; with nothing granted, wait until a run of the pool may be ready and claim again,
    until ``wait_sec`` has passed. Woken by the read model (a run became ready) or at the
    earliest instant a known run of the pool becomes ready (jitter, a retry's backoff). A
    worker that hung up (``gone``) is not leased anything more: its lease would run out
    unused."""
    scheduler = call.scheduler
    wakeups = scheduler.wakeups
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait_sec
    horizon = _horizon_ms(body)
    with wakeups.pool(call.tenant, body.pool) as signal:
        while True:  # each turn waits for a wake or a due instant; bounded by the deadline
            seen = signal.version
            leases = await scheduler.claim(
                call.tenant, body.pool, body.worker_id, body.limit, horizon
            )
            remaining = deadline - loop.time()
            if leases or remaining <= 0 or wakeups.closed:
                return leases
            now = scheduler.now_ms()
            # a run becomes claimable its horizon before it is ready
            due = [
                at - horizon
                for at in (
                    wakeups.next_due(call.tenant, body.pool, now + horizon),
                    scheduler.next_ready(call.tenant, body.pool, horizon),
                )
                if at is not None and at - horizon > now
            ]
            if due:  # a millisecond late, so the partition's clock has passed it too
                remaining = min(remaining, (min(due) - now + 1) / 1000)
            # runs of partitions whose history other nodes keep wake it too
            scheduler.watch_elsewhere(call.tenant, body.pool, deadline - loop.time())
            await wakeups.sleep(signal, seen, remaining)
            if await gone():
                return []


async def _fenced(call: Call, run_id: str, command: HeartbeatRun) -> list[Any]:
    """Send a command only the live lease may send (:func:`api.edge.lease_refused` says what
    a refusal answers)."""
    try:
        return await call.scheduler.execute(command)
    except LeaseLost as e:
        raise await lease_refused(call, run_id, e) from None


async def heartbeat(request: Request) -> Response:
    call = authenticate(request)
    run_id = call.run_id(request.path_params["run_id"])
    body = await decode(request, HeartbeatIn)
    events = await _fenced(call, run_id, heartbeat_run(run_id, body, call.tenant))
    beat = next((e for e in events if isinstance(e, Heartbeat)), None)  # none for a check
    return json_response(
        HeartbeatOut(
            run_id=team_id(run_id),
            lease_expires_at=None if beat is None else to_rfc3339(beat.lease_expires_at),
        )
    )


async def complete(request: Request) -> Response:
    """200 with the run once the outcome is recorded; the same for the same outcome sent again
    with the same token (its answer was lost: :mod:`api.repeats`); else the lease's refusal."""
    call = authenticate(request)
    run_id = call.run_id(request.path_params["run_id"])
    body = await decode(request, CompleteIn)
    command = complete_run(run_id, body, call.tenant)
    try:
        await call.scheduler.execute(command)
    except LeaseLost as e:
        refusal = await outcome_refused(call, command, e)
        if refusal is not None:
            raise refusal from None
    return await run_response(call, run_id)
