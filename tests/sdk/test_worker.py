"""The pull worker against a real ``cronlog serve``: long-polling claims that see a run the
moment it is ready, heartbeats, completion, lease loss and cancellation surfaced to the handler,
timeouts, concurrency and a graceful stop."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from cronlog_client import (
    AsyncClient,
    Client,
    JobDefinition,
    PermanentFailure,
    RetryLater,
    RunContext,
    Worker,
)
from cronlog_client.models import BackoffIn, Run

from tests.cli.test_serve import Serve
from tests.sdk.conftest import async_client, unique

pytestmark = pytest.mark.slow
UTC = dt.UTC


def at(seconds: float) -> dt.datetime:
    return dt.datetime.now(UTC) + dt.timedelta(seconds=seconds)


def empty_claims(node: Serve) -> float:
    """The node's count of claims that found nothing (its own figure)."""
    token = (node.data_dir / "metrics_token").read_text().strip()
    text = httpx.get(
        f"{node.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).text
    found = re.search(r'^cronlog_claims_total\{outcome="empty"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def settled(client: Client, run_id: str, states: set[str], timeout_s: float = 15) -> Run:
    """The run once it is in one of ``states`` (a separate process: read until it is)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = client.get_run(run_id)
        if run.state in states or time.monotonic() > deadline:
            return run
        time.sleep(0.05)


async def working(
    node: Serve,
    pool: str,
    handler: Callable[[RunContext], Any],
    body: Callable[[AsyncClient, Worker], Awaitable[None]],
    **options: Any,
) -> Worker:
    """Run a worker of ``pool`` while ``body`` runs; stop it after."""
    async with async_client(node) as cronlog:
        worker = Worker(cronlog, pool, handler, worker_id=f"w-{pool}", **options)
        running = asyncio.ensure_future(worker.run())
        try:
            await body(cronlog, worker)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 30)
    return worker


def test_an_idle_worker_gets_a_run_the_moment_it_is_due(node: Serve, a: Client) -> None:
    pool = unique("due")
    started: list[float] = []
    done = asyncio.Event()

    async def handle(run: RunContext) -> None:
        started.append(time.time())
        done.set()

    async def body(cronlog: AsyncClient, worker: Worker) -> None:
        await asyncio.sleep(0.5)  # let the worker settle into its long poll
        before = empty_claims(node)
        run_at = at(2.0)
        await cronlog.put_job(
            unique("due"), JobDefinition(name="d", run_at=run_at, target=f"pull://{pool}")
        )
        await asyncio.wait_for(done.wait(), 10)
        late = started[0] - run_at.timestamp()
        assert 0 <= late < 0.5, late  # not a poll interval late
        # Two seconds idle cost the node a look or two, not a spin.
        assert empty_claims(node) - before <= 3

    asyncio.run(working(node, pool, handle, body, wait_sec=20))


def test_a_run_ready_later_wakes_the_claim_at_its_time(node: Serve, a: Client) -> None:
    """The run is materialised at its slot but ready only after its jitter: the claim sleeps
    until then, not until its wait_sec ends."""
    pool = unique("jitter")
    started: list[float] = []
    done = asyncio.Event()

    async def handle(run: RunContext) -> None:
        started.append(time.time())
        done.set()

    async def body(cronlog: AsyncClient, worker: Worker) -> None:
        job = await cronlog.put_job(
            unique("jitter"),
            JobDefinition(name="j", run_at=at(0.3), allow_jitter_sec=3, target=f"pull://{pool}"),
        )
        assert job.next_fire_at is not None and job.next_run_at is not None
        fire = job.next_fire_at.timestamp()
        await asyncio.wait_for(done.wait(), 10)
        assert 0 <= started[0] - fire < 0.5, (started[0], fire, job.next_run_at)

    asyncio.run(working(node, pool, handle, body, wait_sec=20))


def test_failures_retry_after_what_the_handler_says_and_permanent_ones_dead_letter(
    node: Serve, a: Client
) -> None:
    pool = unique("flaky")
    starts: dict[str, list[float]] = {}

    def handle(run: RunContext) -> None:  # a plain function: it runs in a thread
        starts.setdefault(run.job_id, []).append(time.time())
        if run.payload == "permanent":
            raise PermanentFailure("the input is malformed")
        if run.attempt == 1:
            raise RetryLater(1.0, "the downstream is busy")

    async def body(cronlog: AsyncClient, worker: Worker) -> None:
        backoff = BackoffIn(base_sec=0.2, jitter=False)  # the handler's 1 s is later: it wins
        flaky = await cronlog.put_job(
            unique("flaky"),
            JobDefinition(name="f", run_at=at(0), target=f"pull://{pool}", backoff=backoff),
        )
        broken = await cronlog.put_job(
            unique("broken"),
            JobDefinition(name="b", run_at=at(0), target=f"pull://{pool}", payload="permanent"),
        )
        ok = await asyncio.to_thread(settled, a, f"{flaky.job_id}.{_slot(flaky)}", {"succeeded"})
        assert ok.state == "succeeded" and [x.outcome for x in ok.attempts] == [
            "failed",
            "succeeded",
        ]
        first, second = starts[flaky.job_id]
        assert 1.0 <= second - first < 1.6  # woken when the retry became ready
        dead = await asyncio.to_thread(settled, a, f"{broken.job_id}.{_slot(broken)}", {"dead"})
        assert (dead.state, dead.dead_reason) == ("dead", "permanent_failure")
        assert "PermanentFailure: the input is malformed" in dead.error

    asyncio.run(working(node, pool, handle, body))


def test_a_cancelled_run_stops_its_handler_and_is_not_completed(node: Serve, a: Client) -> None:
    pool = unique("cancel")
    began = threading.Event()
    stopped: list[str] = []

    async def handle(run: RunContext) -> None:
        began.set()
        try:
            await asyncio.Event().wait()  # works until told to stop
        except asyncio.CancelledError:
            stopped.append(f"cancelled={run.cancelled}")
            raise

    async def body(cronlog: AsyncClient, worker: Worker) -> None:
        job = await cronlog.put_job(
            unique("cancel"),
            JobDefinition(name="c", run_at=at(0), lease_sec=1.5, target=f"pull://{pool}"),
        )
        await asyncio.to_thread(began.wait, 10)
        run_id = f"{job.job_id}.{_slot(job)}"
        assert (await cronlog.cancel_run(run_id)).state == "cancelled"
        deadline = time.monotonic() + 5
        # the next heartbeat tells it; the worker counts the run lost once the handler ended
        while (not stopped or not worker.lost) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert stopped == ["cancelled=True"]
        assert worker.lost == 1 and worker.completed == 0
        assert (await cronlog.get_run(run_id)).state == "cancelled"

    asyncio.run(working(node, pool, handle, body))


def test_a_handler_past_the_jobs_timeout_is_cancelled_and_fails_ambiguous(
    node: Serve, a: Client
) -> None:
    pool = unique("slow")

    async def handle(run: RunContext) -> None:
        await asyncio.sleep(30)  # far past the job's timeout

    async def body(cronlog: AsyncClient, worker: Worker) -> None:
        job = await cronlog.put_job(
            unique("slow"),
            JobDefinition(
                name="s", run_at=at(0), timeout_sec=1, retries=0, target=f"pull://{pool}"
            ),
        )
        run = await asyncio.to_thread(settled, a, f"{job.job_id}.{_slot(job)}", {"dead"})
        assert run.state == "dead" and "timed out after 1 s" in run.error

    asyncio.run(working(node, pool, handle, body))


def test_concurrency_and_a_graceful_stop(node: Serve, a: Client) -> None:
    pool = unique("many")
    running = 0
    most = 0
    release = asyncio.Event()
    finished: list[str] = []

    async def handle(run: RunContext) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        finished.append(run.run_id)

    async def scenario() -> None:
        async with async_client(node) as cronlog:
            worker = Worker(cronlog, pool, handle, concurrency=3, drain_sec=10)
            task = asyncio.ensure_future(worker.run())
            jobs = [
                await cronlog.put_job(
                    unique("many"), JobDefinition(name="m", run_at=at(0), target=f"pull://{pool}")
                )
                for _ in range(5)
            ]
            deadline = time.monotonic() + 10
            while most < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert (most, running) == (3, 3)  # no more than its room
            worker.stop()  # stop claiming; the three in flight finish
            await asyncio.sleep(0.2)
            assert not task.done()
            release.set()
            await asyncio.wait_for(task, 10)
            assert len(finished) == 3 and worker.completed == 3
            states = sorted([(await cronlog.job_runs(j.job_id)).runs[0].state for j in jobs])
            assert states == ["pending", "pending", "succeeded", "succeeded", "succeeded"]

    asyncio.run(scenario())


def test_a_stop_cuts_a_handler_that_will_not_finish(node: Serve, a: Client) -> None:
    pool = unique("stuck")
    began = asyncio.Event()

    async def handle(run: RunContext) -> None:
        began.set()
        await asyncio.Event().wait()

    async def scenario() -> None:
        async with async_client(node) as cronlog:
            worker = Worker(cronlog, pool, handle, drain_sec=0.5)
            task = asyncio.ensure_future(worker.run())
            job = await cronlog.put_job(
                unique("stuck"),
                JobDefinition(
                    name="s",
                    run_at=at(0),
                    backoff=BackoffIn(base_sec=60),
                    target=f"pull://{pool}",
                ),
            )
            await asyncio.wait_for(began.wait(), 10)
            worker.stop()
            await asyncio.wait_for(task, 10)
            run = await cronlog.get_run(f"{job.job_id}.{_slot(job)}")
            # Failed at once as "may have taken effect": retried without waiting for the lease.
            assert run.state == "retrying"
            assert run.attempts[0].error == "the worker stopped before it finished"

    asyncio.run(scenario())


def _slot(job: Any) -> int:
    return int(job.run_at.timestamp() * 1000)


def test_a_claim_whose_worker_hung_up_leases_nothing(node: Serve, a: Client) -> None:
    pool = unique("gone")
    body = {"pool": pool, "worker_id": "gone", "wait_sec": 10}
    with pytest.raises(httpx.ReadTimeout):  # the worker gives up waiting and hangs up
        httpx.post(
            f"{node.url}/v1/workers/claim",
            json=body,
            headers={"Authorization": "Bearer token-a"},
            timeout=0.5,
        )
    job = a.put_job(unique("gone"), JobDefinition(name="g", run_at=at(0), target=f"pull://{pool}"))
    [claimed] = a.claim(pool, "here", wait_sec=5)
    assert (claimed.run_id, claimed.attempt) == (f"{job.job_id}.{_slot(job)}", 1)
