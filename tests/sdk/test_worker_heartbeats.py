"""The pull worker's heartbeats in batches, against a real ``cronlog serve``: a worker holding
many runs beats them in a few requests a period, not one a run, and a lease lost (a run
cancelled) reaches its handler through a batch while the other runs' leases are extended."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
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
BATCH = "/v1/runs:heartbeat"


class Counting(httpx.AsyncBaseTransport):
    """The client's own transport, counting requests by path and the beats each batch holds,
    by run."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.paths: Counter[str] = Counter()
        self.beats: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.paths[path] += 1
        if path == BATCH:
            self.beats.update(beat["run_id"] for beat in json.loads(request.content)["runs"])
        return await self.inner.handle_async_request(request)

    @property
    def single_heartbeats(self) -> int:
        return sum(n for p, n in self.paths.items() if p.endswith("/heartbeat") and p != BATCH)

    async def aclose(self) -> None:
        await self.inner.aclose()


def counted(cronlog: AsyncClient) -> Counting:
    """Count what ``cronlog`` sends, through its own transport."""
    counting = Counting(cronlog._http._transport)
    cronlog._http._transport = counting
    return counting


async def jobs(cronlog: AsyncClient, pool: str, n: int, **spec: Any) -> list[str]:
    """``n`` jobs of one run each, due now; their runs' ids."""
    at = dt.datetime.now(UTC).replace(microsecond=0)
    ids = [unique(pool) for _ in range(n)]
    made = await cronlog.create_jobs(
        [NewJob(job_id=i, name="h", run_at=at, target=f"pull://{pool}", **spec) for i in ids]
    )
    assert made.failed == 0, made
    return [f"{i}.{int(at.timestamp() * 1000)}" for i in ids]


async def until(predicate: Any, timeout_s: float = 20) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


def test_a_worker_holding_many_runs_beats_them_in_a_few_requests(node: Serve) -> None:
    # A beat a second (60 a second, under the team's rate, each item counting), three a run.
    runs, lease_sec, hold_sec = 60, 3.0, 3.6
    pool = unique("many")
    finished: list[str] = []
    lost: list[str] = []

    async def hold(run: RunContext) -> None:
        await asyncio.sleep(hold_sec)  # longer than the lease: only the heartbeats keep it
        (lost if run.lost.is_set() else finished).append(run.run_id)

    async def scenario() -> None:  # team-b: its rate is all this test's
        async with AsyncClient(node.url, "token-b") as cronlog:
            made = await jobs(cronlog, pool, runs, lease_sec=lease_sec)
            counting = counted(cronlog)
            # Not spread: the sixty beat in one instant each period. (Spread, a beat with no
            # request in flight goes at once: as many requests as round trips fit the spread.)
            worker = Worker(cronlog, pool, hold, concurrency=runs, heartbeat_spread_per_sec=1e9)
            task = asyncio.ensure_future(worker.run())
            await until(lambda: len(finished) + len(lost) == runs)
            worker.stop()
            await asyncio.wait_for(task, 20)
            assert not lost and worker.lost == 0 and worker.completed == runs
            assert counting.single_heartbeats == 0
            # Every run beat through several periods; the sixty went in a few requests each
            # time (those due within a round trip of each other together).
            assert set(counting.beats) == set(made) and min(counting.beats.values()) >= 2
            beats = sum(counting.beats.values())
            assert counting.paths[BATCH] <= beats // 10, counting.paths
            assert worker.heartbeat_requests == counting.paths[BATCH]
            views = [await cronlog.get_run(r) for r in made]
            assert Counter(v.state for v in views) == {"succeeded": runs}
            assert {len(v.attempts) for v in views} == {1}  # no lease ran out

    asyncio.run(scenario())


def test_a_lost_lease_reaches_its_handler_through_a_batch(node: Serve) -> None:
    pool = unique("lost")
    began = asyncio.Event()
    stopped: list[str] = []
    release = asyncio.Event()

    async def handle(run: RunContext) -> None:
        if run.payload == "cancelled":
            began.set()
            try:
                await asyncio.Event().wait()  # works until told to stop
            except asyncio.CancelledError:
                stopped.append(f"cancelled={run.cancelled}")
                raise
        await release.wait()

    async def scenario() -> None:
        async with AsyncClient(node.url, "token-a") as cronlog:
            [doomed] = await jobs(cronlog, pool, 1, lease_sec=1.5, payload="cancelled")
            [kept] = await jobs(cronlog, pool, 1, lease_sec=1.5)
            counting = counted(cronlog)
            worker = Worker(cronlog, pool, handle, concurrency=2)
            task = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(began.wait(), 20)
            assert (await cronlog.cancel_run(doomed)).state == "cancelled"
            await until(lambda: stopped and worker.lost == 1)  # the next beat tells it
            assert stopped == ["cancelled=True"] and worker.completed == 0
            await asyncio.sleep(2.0)  # past the kept run's lease: its beats keep it
            release.set()
            await until(lambda: worker.completed == 1)
            worker.stop()
            await asyncio.wait_for(task, 20)
            assert counting.single_heartbeats == 0 and counting.paths[BATCH] >= 2
            assert counting.beats[doomed] >= 1
            assert (await cronlog.get_run(doomed)).state == "cancelled"
            run = await cronlog.get_run(kept)
            assert run.state == "succeeded" and len(run.attempts) == 1

    asyncio.run(scenario())


def test_runs_started_together_spread_their_first_heartbeats(node: Serve) -> None:
    # Sixty runs started in one instant, a beat a second; spread at 100 a second, their first
    # beats take half a second (within half a period), not one instant, and keep their places.
    runs, lease_sec, hold_sec = 60, 3.0, 3.6
    pool = unique("spread")
    finished: list[str] = []

    async def hold(run: RunContext) -> None:
        await asyncio.sleep(hold_sec)
        if not run.lost.is_set():
            finished.append(run.run_id)

    async def scenario() -> None:
        async with AsyncClient(node.url, "token-b") as cronlog:
            made = await jobs(cronlog, pool, runs, lease_sec=lease_sec)
            counting = counted(cronlog)
            sent: list[tuple[float, list[str]]] = []
            inner = counting.handle_async_request

            async def timed(request: httpx.Request) -> httpx.Response:
                if request.url.path == BATCH:
                    beats = [b["run_id"] for b in json.loads(request.content)["runs"]]
                    sent.append((asyncio.get_running_loop().time(), beats))
                return await inner(request)

            counting.handle_async_request = timed  # type: ignore[method-assign]
            worker = Worker(cronlog, pool, hold, concurrency=runs, heartbeat_spread_per_sec=100)
            task = asyncio.ensure_future(worker.run())
            await until(lambda: len(finished) == runs or worker.lost > 0)
            worker.stop()
            await asyncio.wait_for(task, 20)
            assert worker.lost == 0 and worker.completed == runs
            first: dict[str, float] = {}
            for at, beats in sent:
                for run_id in beats:
                    first.setdefault(run_id, at)
            assert set(first) == set(made)
            # the first round: several requests over most of half a second, not one
            assert max(first.values()) - min(first.values()) >= 0.3, sent
            assert len({at for at in first.values()}) >= 3, sent
            views = [await cronlog.get_run(r) for r in made]
            assert {len(v.attempts) for v in views} == {1}  # no lease ran out

    asyncio.run(scenario())


def test_a_herd_s_first_heartbeats_are_spread_within_half_a_period() -> None:
    from cronlog_client.worker import SPREAD_BEATS_PER_SEC, first_beat_delays

    herd = first_beat_delays(10_000, 10.0)  # 10,000 at 2,000 a second: over 5 s
    assert herd[0] == 0.0 and herd[1] == 1 / SPREAD_BEATS_PER_SEC and herd[-1] < 5.0
    assert max(first_beat_delays(100_000, 10.0)) == 5.0  # never past half a period
    assert max(first_beat_delays(60, 1.0)) < 0.03  # 60 runs: one batch still
    # a claim's group after another's still spreading: after it, not beside it
    assert first_beat_delays(2, 10.0, queued_for=0.5) == [0.5, 0.5 + 1 / SPREAD_BEATS_PER_SEC]
