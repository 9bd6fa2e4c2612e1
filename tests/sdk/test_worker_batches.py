"""The pull worker's completions in batches, against a real ``cronlog serve``: runs that finish
together are completed in one request, a refused outcome is reported for its run alone, a stop
sends what waits, a batch whose answer was lost is sent again without losing or double-counting
an outcome, and claims take more than the node's per-claim limit in several claims."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import Counter
from typing import Any

import httpx
import pytest
from cronlog_client import AsyncClient, RunContext, Worker
from cronlog_client.models import NewJob

from tests.cli.test_serve import Serve
from tests.sdk.conftest import unique

pytestmark = pytest.mark.slow
UTC = dt.UTC
BATCH = "/v1/runs:complete"


class Counting(httpx.AsyncBaseTransport):
    """httpx's transport, counting requests by path; ``lose`` batches of completions are
    delivered but their answers lost (``deliver=True``) or never sent (``deliver=False``)."""

    def __init__(self, lose: int = 0, deliver: bool = True) -> None:
        self._http = httpx.AsyncHTTPTransport()
        self.paths: Counter[str] = Counter()
        self.lose, self.deliver = lose, deliver

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.paths[path] += 1
        if path == BATCH and self.lose:
            self.lose -= 1
            if self.deliver:
                response = await self._http.handle_async_request(request)
                await response.aread()
                await response.aclose()
            raise httpx.ReadError("the connection dropped before the answer")
        return await self._http.handle_async_request(request)

    @property
    def single_completes(self) -> int:
        return sum(n for p, n in self.paths.items() if p.endswith("/complete") and p != BATCH)

    async def aclose(self) -> None:
        await self._http.aclose()


class FakeSleep:
    """The worker's backoffs, noted and not waited (one turn of the loop)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(0)


async def jobs(cronlog: AsyncClient, pool: str, n: int, **spec: Any) -> list[str]:
    """``n`` jobs of one run each, due now; their runs' ids."""
    at = dt.datetime.now(UTC).replace(microsecond=0)
    ids = [unique(pool) for _ in range(n)]
    made = await cronlog.create_jobs(
        [NewJob(job_id=i, name="b", run_at=at, target=f"pull://{pool}", **spec) for i in ids]
    )
    assert made.failed == 0, made
    return [f"{i}.{int(at.timestamp() * 1000)}" for i in ids]


class Gate:
    """Handlers that wait until ``n`` of them have started, then until ``open``."""

    def __init__(self, n: int) -> None:
        self.n, self.started = n, 0
        self.all_started, self.open = asyncio.Event(), asyncio.Event()
        self.handled: list[str] = []

    async def __call__(self, run: RunContext) -> None:
        self.started += 1
        if self.started >= self.n:
            self.all_started.set()
        await self.open.wait()
        self.handled.append(run.run_id)


async def until(predicate: Any, timeout_s: float = 15) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


def test_runs_that_finish_together_are_completed_in_one_request(node: Serve) -> None:
    pool = unique("together")
    transport = Counting()
    gate = Gate(60)

    async def scenario() -> None:  # team-b: its rate is all this test's
        async with AsyncClient(node.url, "token-b", transport=transport) as cronlog:
            made = await jobs(cronlog, pool, 60)
            worker = Worker(cronlog, pool, gate, concurrency=60, complete_linger_sec=3600)
            task = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(gate.all_started.wait(), 20)
            gate.open.set()  # sixty finish together: nothing else can join, they go at once
            await until(lambda: worker.completed == 60)
            worker.stop()
            await asyncio.wait_for(task, 20)
            assert transport.paths[BATCH] == 1 and transport.single_completes == 0
            assert worker.complete_requests == 1 and (worker.lost, worker.refused) == (0, 0)
            states = Counter([(await cronlog.get_run(j)).state for j in made])
            assert states == {"succeeded": 60}

    asyncio.run(scenario())


def test_a_refused_outcome_is_reported_for_its_run_only(
    node: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    pool = unique("refused")
    transport = Counting()
    gate = Gate(3)

    async def scenario() -> None:
        async with AsyncClient(node.url, "token-a", transport=transport) as cronlog:
            made = await jobs(cronlog, pool, 3, lease_sec=60)  # no heartbeat in the test
            worker = Worker(cronlog, pool, gate, concurrency=3)
            task = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(gate.all_started.wait(), 20)
            cancelled, *kept = made
            assert (await cronlog.cancel_run(cancelled)).state == "cancelled"
            gate.open.set()  # the handler does not know yet: it returns, and its outcome goes
            await until(lambda: worker.completed + worker.lost == 3)
            worker.stop()
            await asyncio.wait_for(task, 20)
            assert transport.paths[BATCH] == 1  # the three went together
            assert (worker.completed, worker.lost, worker.refused) == (2, 1, 0)
            assert (await cronlog.get_run(cancelled)).state == "cancelled"
            for run_id in kept:
                assert (await cronlog.get_run(run_id)).state == "succeeded"
            told = [r.getMessage() for r in caplog.records if "lease was lost" in r.getMessage()]
            assert len(told) == 1 and cancelled in told[0], told

    with caplog.at_level(logging.INFO, logger="cronlog_client.worker"):
        asyncio.run(scenario())


def test_a_stop_sends_the_outcomes_that_wait(node: Serve) -> None:
    """One run done, one still working, an hour's linger: the stop sends the first at once."""
    pool = unique("flush")
    transport = Counting()
    release, slow_began = asyncio.Event(), asyncio.Event()

    async def handle(run: RunContext) -> None:
        if run.payload == "slow":
            slow_began.set()
            await release.wait()
        else:  # done while the other still works: its outcome waits for the linger
            await slow_began.wait()

    async def scenario() -> None:
        async with AsyncClient(node.url, "token-a", transport=transport) as cronlog:
            [quick] = await jobs(cronlog, pool, 1)
            [slow] = await jobs(cronlog, pool, 1, payload="slow")
            worker = Worker(cronlog, pool, handle, concurrency=2, complete_linger_sec=3600)
            task = asyncio.ensure_future(worker.run())
            await until(lambda: worker._completer._queue)  # the quick outcome waits
            assert transport.paths[BATCH] == 0
            worker.stop()
            await until(lambda: worker.completed == 1)
            assert (await cronlog.get_run(quick)).state == "succeeded"
            assert (await cronlog.get_run(slow)).state == "running"
            release.set()
            await asyncio.wait_for(task, 20)
            assert (await cronlog.get_run(slow)).state == "succeeded"
            assert worker.completed == 2 and transport.paths[BATCH] == 2

    asyncio.run(scenario())


@pytest.mark.parametrize("deliver", [True, False], ids=["answer-lost", "not-sent"])
def test_a_batch_that_failed_in_transport_is_sent_again_without_loss(
    node: Serve, deliver: bool
) -> None:
    pool = unique("again")
    transport = Counting(lose=1, deliver=deliver)
    gate = Gate(5)
    sleep = FakeSleep()

    async def scenario() -> None:
        client = AsyncClient(node.url, "token-a", transport=transport, retries=0)
        async with client as cronlog:
            made = await jobs(cronlog, pool, 5, lease_sec=60)
            worker = Worker(cronlog, pool, gate, concurrency=5, sleep=sleep)
            task = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(gate.all_started.wait(), 20)
            gate.open.set()
            await until(lambda: worker.completed + worker.lost + worker.refused == 5)
            worker.stop()
            await asyncio.wait_for(task, 20)
            assert transport.paths[BATCH] == 2  # the batch, then the same batch again
            assert sleep.waits == [0.5]  # the single path's first backoff
            # Recorded once: the node records nothing twice, and answers the repeat of a
            # delivered batch as the first was, so the worker reads no run back.
            assert (worker.completed, worker.lost, worker.refused) == (5, 0, 0)
            read_back = [p for p in transport.paths if p.startswith("/v1/runs/")]
            assert all(p.endswith(("/heartbeat", "/complete")) for p in read_back), read_back
            for job in made:
                run = await cronlog.get_run(job)
                assert run.state == "succeeded" and len(run.attempts) == 1

    asyncio.run(scenario())


def test_a_worker_holding_more_than_a_claim_gives_claims_again_and_completes_all(
    node: Serve,
) -> None:
    """120 runs held at once, more than the node's 100 a claim: claimed in several claims; the
    outcomes past the token's rate (each item counts) are answered 429 and sent again."""
    pool = unique("wide")
    transport = Counting()
    gate = Gate(120)

    async def scenario() -> None:
        async with AsyncClient(node.url, "token-a", transport=transport) as cronlog:
            made = await jobs(cronlog, pool, 120)
            worker = Worker(cronlog, pool, gate, concurrency=150)
            task = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(gate.all_started.wait(), 20)
            assert transport.paths["/v1/workers/claim"] >= 2
            gate.open.set()
            await until(lambda: worker.completed == 120, timeout_s=30)
            worker.stop()
            await asyncio.wait_for(task, 20)
            assert (worker.lost, worker.refused) == (0, 0)
            assert transport.single_completes == 0 and transport.paths[BATCH] < 10
            states = Counter([(await cronlog.get_run(j)).state for j in made])
            assert states == {"succeeded": 120}

    asyncio.run(scenario())
