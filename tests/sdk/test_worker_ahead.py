"""The pull worker's claims that reach ahead, against a real ``cronlog serve`` (lead time 30 s):
runs leased before their slot and started at it, never before (also by a worker whose clock
runs ahead); the start reported; a pause between the lease and the check withdraws the run,
which is then never started."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cronlog_client import AsyncClient, Client, JobDefinition, RunContext, Worker

from tests.cli.test_serve import Serve
from tests.node.targets import Target
from tests.sdk.conftest import async_client, unique
from tools.chaos import skew

pytestmark = pytest.mark.slow
UTC = dt.UTC


def slot_in(seconds: float) -> dt.datetime:
    """A whole second at least ``seconds`` from now."""
    at = dt.datetime.now(UTC) + dt.timedelta(seconds=seconds)
    return at.replace(microsecond=0) + dt.timedelta(seconds=1)


def events_of(client: Client, job_id: str) -> list[dict[str, object]]:
    return [e.event for e in client.events(job=job_id, start="start")]


async def put_pull_jobs(
    cronlog: AsyncClient, jobs: list[str], slot: dt.datetime, pool: str
) -> None:
    """One-shot jobs due at ``slot`` whose runs a worker of ``pool`` claims."""
    for job_id in jobs:
        await cronlog.put_job(job_id, JobDefinition(name="a", run_at=slot, target=f"pull://{pool}"))


def test_runs_leased_ahead_start_at_their_slot_never_before(node: Serve, a: Client) -> None:
    pool = unique("ahead")
    slot = slot_in(4)  # within the worker's 5 s reach a moment after it starts claiming
    jobs = [unique("ahead") for _ in range(20)]
    started: dict[str, float] = {}
    everything = asyncio.Event()

    async def handle(run: RunContext) -> None:
        started[run.run_id] = time.time()
        if len(started) == len(jobs):
            everything.set()

    async def scenario() -> Worker:
        async with async_client(node) as cronlog:
            await put_pull_jobs(cronlog, jobs, slot, pool)
            worker = Worker(cronlog, pool, handle, concurrency=50, worker_id="w-ahead")
            running = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(everything.wait(), 20)
            worker.stop()
            await asyncio.wait_for(running, 30)
            return worker

    worker = asyncio.run(scenario())
    due = slot.timestamp()
    # The node and this test share the machine's clock: never early, at most a beat late.
    assert all(due <= at < due + 0.5 for at in started.values()), {
        run: at - due for run, at in started.items()
    }
    assert worker.withdrawn == 0
    history = events_of(a, jobs[0])
    [lease] = [e for e in history if e["type"] == "LeaseGranted"]
    [start] = [e for e in history if e["type"] == "RunStarted"]
    slot_ms = round(due * 1000)
    assert lease["at"] < slot_ms and lease["start_at"] == slot_ms  # granted ahead
    assert 0 <= start["started_at"] - slot_ms < 500  # the start as the worker reported it
    run = a.get_run(f"{jobs[0]}.{slot_ms}")
    assert run.state == "succeeded" and run.lateness_ms is not None and run.lateness_ms < 500


def test_a_pause_before_the_check_withdraws_a_run_leased_ahead(node: Serve, a: Client) -> None:
    pool = unique("withdrawn")
    slot = slot_in(6)
    job_id = unique("withdrawn")
    ran: list[str] = []

    async def handle(run: RunContext) -> None:
        ran.append(run.run_id)

    async def scenario() -> Worker:
        async with async_client(node) as cronlog:
            await cronlog.put_job(
                job_id, JobDefinition(name="w", run_at=slot, target=f"pull://{pool}")
            )
            worker = Worker(cronlog, pool, handle, worker_id="w-withdrawn")
            running = asyncio.ensure_future(worker.run())
            await leased(cronlog, job_id)  # leased ahead: held by the worker
            await cronlog.pause_job(job_id)
            # past the slot: the check (1 s before it) found the lease gone
            await asyncio.sleep(max(0.0, slot.timestamp() + 1.0 - time.time()))
            worker.stop()
            await asyncio.wait_for(running, 30)
            return worker

    worker = asyncio.run(scenario())
    assert ran == [] and worker.withdrawn == 1
    types = [e["type"] for e in events_of(a, job_id)]
    assert "LeaseGranted" in types and "RunStarted" not in types
    assert a.get_job(job_id).status == "paused"


def test_runs_held_past_their_check_are_not_started_by_a_worker_that_stops(
    node: Serve, a: Client
) -> None:
    """Runs held to one instant are checked together; a stop between the check and the start
    starts none of them and returns at once, without waiting for the instant."""
    pool = unique("held")
    slot = slot_in(4)
    jobs = [unique("held") for _ in range(30)]
    ran: list[str] = []

    async def handle(run: RunContext) -> None:
        ran.append(run.run_id)

    async def scenario() -> tuple[Worker, float]:
        async with async_client(node) as cronlog:
            for job_id in jobs:
                await cronlog.put_job(
                    job_id, JobDefinition(name="h", run_at=slot, target=f"pull://{pool}")
                )
            worker = Worker(cronlog, pool, handle, concurrency=50, worker_id="w-held")
            running = asyncio.ensure_future(worker.run())
            for job_id in jobs:
                await leased(cronlog, job_id)
            # the check goes about a second before the start, all thirty in one request
            while worker.heartbeat_requests == 0:
                await asyncio.sleep(0.02)
            assert time.time() < slot.timestamp() - 0.3, "the check came too late to test"
            worker.stop()
            await asyncio.wait_for(running, 30)
            return worker, time.time()

    worker, stopped_at = asyncio.run(scenario())
    assert ran == [] and worker.completed == 0 and worker.withdrawn == 0
    assert worker.heartbeat_requests == 1
    assert stopped_at < slot.timestamp()  # it did not wait for the instant
    assert all("RunStarted" not in [e["type"] for e in events_of(a, job_id)] for job_id in jobs)


async def leased(cronlog: AsyncClient, job_id: str) -> None:
    """Until the job's run is running (leased ahead), read as a user would."""
    for _ in range(100):
        page = await cronlog.job_runs(job_id)
        if page.runs and page.runs[0].state == "running":
            return
        await asyncio.sleep(0.05)  # the worker's claim, in another task, leases it
    raise AssertionError("the run was never leased ahead")


_SKEWED_WORKER = """
import asyncio, json, sys, time, urllib.request
from cronlog_client import AsyncClient, RunContext, Worker

url, token, pool, hook, count, true_now = sys.argv[1:7]
if time.time() - float(true_now) < 3.5:  # the skew took: this clock runs about 4 s ahead
    sys.exit(f"the wall clock is not ahead: {time.time() - float(true_now):.3f} s")
done = asyncio.Event()
seen = set()

async def handle(run: RunContext) -> None:
    # the start, said to a process whose clock is true (this one's is not)
    body = json.dumps({"run_id": run.run_id}).encode()
    request = urllib.request.Request(hook, body, {"Content-Type": "application/json"})
    await asyncio.to_thread(urllib.request.urlopen, request, timeout=5)
    seen.add(run.run_id)
    if len(seen) == int(count):
        done.set()

async def main() -> None:
    async with AsyncClient(url, token) as cronlog:
        worker = Worker(cronlog, pool, handle, concurrency=50, worker_id="w-skewed")
        running = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(done.wait(), 30)
        worker.stop()
        await asyncio.wait_for(running, 30)

asyncio.run(main())
"""


def test_a_worker_whose_clock_runs_ahead_never_starts_a_run_early(
    node: Serve, a: Client, tmp_path: Path
) -> None:
    """Issue 22's skew rule, as users would meet it: a worker process whose wall clock runs
    4 s ahead (libfaketime, the chaos harness's clock faults) holds runs leased ahead and
    starts each at its slot by the node's clock, never before: the start is the answer's
    ``start_in_ms`` waited on the monotonic clock, and no clock of the worker's is read."""
    clock = skew.SkewedClock(tmp_path / "worker.faketime")
    clock.set(4.0)
    target = Target().start()
    pool = unique("skewed")
    slot = slot_in(6)
    jobs = [unique("skewed") for _ in range(10)]
    try:
        for job_id in jobs:
            a.put_job(job_id, JobDefinition(name="s", run_at=slot, target=f"pull://{pool}"))
        worker = subprocess.run(
            [
                *(sys.executable, "-c", _SKEWED_WORKER),
                *(node.url, "token-a", pool, target.url, "10", repr(time.time())),
            ],
            env={**os.environ, **clock.env()},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert worker.returncode == 0, worker.stderr[-3000:]
        calls = target.wait_for(len(jobs), timeout_s=5)
    finally:
        target.stop()
    due = slot.timestamp()
    early = {c.body["run_id"]: round(c.received_at - due, 3) for c in calls if c.received_at < due}
    assert not early, early  # by the true clock: none before its slot
    assert all(c.received_at < due + 1.0 for c in calls)  # and none a second late
    history = events_of(a, jobs[0])
    [lease] = [e for e in history if e["type"] == "LeaseGranted"]
    assert lease["at"] < round(due * 1000) == lease["start_at"]  # it was leased ahead


def test_the_handlers_held_to_an_instant_begin_without_the_cycle_collector(node: Serve) -> None:
    # A herd's handlers beginning together set off a full collection that stood every start
    # behind it; the collector waits until they have all begun, then is back as it was.
    import gc

    pool = unique("nogc")
    slot = slot_in(3)
    jobs = [unique("nogc") for _ in range(20)]
    seen: list[bool] = []
    everything = asyncio.Event()

    async def handle(run: RunContext) -> None:
        seen.append(gc.isenabled())  # as it began
        if len(seen) == len(jobs):
            everything.set()
        await asyncio.sleep(0.2)

    async def scenario() -> None:
        async with async_client(node) as cronlog:
            await put_pull_jobs(cronlog, jobs, slot, pool)
            worker = Worker(cronlog, pool, handle, concurrency=50, worker_id="w-nogc")
            running = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(everything.wait(), 20)
            assert gc.isenabled()  # back once they have all begun
            worker.stop()
            await asyncio.wait_for(running, 30)

    assert gc.isenabled()
    asyncio.run(scenario())
    assert seen == [False] * len(jobs)
    assert gc.isenabled()
