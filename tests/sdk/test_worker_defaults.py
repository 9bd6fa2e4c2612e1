"""The Worker without a node: how far its claims reach ahead, and runs held ahead whose
check fails."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

import pytest
from cronlog_client import RunContext, Worker
from cronlog_client.models import ClaimedRun
from cronlog_client.worker import DEFAULT_AHEAD_SEC, HERD_AHEAD_SEC, HERD_CONCURRENCY


async def handle(run: RunContext) -> None:
    return None


def worker(**options: Any) -> Worker:
    return Worker(None, "p", handle, **options)  # type: ignore[arg-type]


def test_a_worker_with_room_for_a_herd_reaches_further_ahead() -> None:
    assert worker().ahead_sec == DEFAULT_AHEAD_SEC == 5.0
    assert worker(concurrency=HERD_CONCURRENCY - 1).ahead_sec == DEFAULT_AHEAD_SEC
    assert worker(concurrency=HERD_CONCURRENCY).ahead_sec == HERD_AHEAD_SEC == 15.0
    assert worker(concurrency=50_000, ahead_sec=2).ahead_sec == 2  # as asked
    assert worker(ahead_sec=0).ahead_sec == 0
    with pytest.raises(ValueError, match="ahead_sec"):
        worker(ahead_sec=301)


def test_runs_held_ahead_whose_check_fails_give_their_room_back_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug while checking runs held to their start ends their task with a logged error, and
    the room they took is free again: the worker is not left claiming less for ever."""
    ran: list[str] = []

    async def record(run: RunContext) -> None:
        ran.append(run.run_id)

    async def scenario() -> Worker:
        w = Worker(None, "p", record, concurrency=10, check_sec=0.05)  # type: ignore[arg-type]

        async def broken(leases: list[tuple[str, int, float]], **_: object) -> list[object]:
            raise RuntimeError("a bug in the checks")

        w._beater.check_many = broken  # type: ignore[assignment,method-assign]
        loop = asyncio.get_running_loop()
        runs = [claimed(f"j{i}.1", start_in_ms=100) for i in range(3)]
        w._free -= len(runs)  # as the claim loop does before it claims
        received = loop.time()  # one claim's answer: the three are held to one instant
        for run in runs:
            w._hold(run, received)
        await asyncio.wait(set(w._running), timeout=5)
        return w

    with caplog.at_level(logging.ERROR, logger="cronlog_client.worker"):
        w = asyncio.run(scenario())
    assert ran == [] and not w._running
    assert w._free == 10  # all three runs' room given back
    assert any(
        "3 runs held to their start could not be started" in r.message for r in caplog.records
    )


def test_a_group_whose_task_failed_before_its_check_takes_no_more_runs() -> None:
    """Its task ended before the group closed: a run leased to the same instant afterwards
    goes to a group of its own, whose task holds it, not to the dead one's list."""

    async def scenario() -> tuple[Worker, bool]:
        w = Worker(None, "p", handle, concurrency=10, check_sec=0.05)  # type: ignore[arg-type]
        instant = w._instant

        async def broken_once(at: float) -> None:
            w._instant = instant  # type: ignore[method-assign]
            raise RuntimeError("a bug before the check")

        w._instant = broken_once  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        received = loop.time()
        w._free -= 2
        w._hold(claimed("j0.1", start_in_ms=5_000), received)
        await asyncio.wait(set(w._running), timeout=5)
        w._hold(claimed("j1.1", start_in_ms=5_000), received)
        held_anew = [c.run_id for c in next(iter(w._holds.values()))] == ["j1.1"]
        for task in w._running:
            task.cancel()
        return w, held_anew

    w, held_anew = asyncio.run(scenario())
    assert held_anew  # a new group, with a task of its own, holds the later run
    assert w._free == 9  # the failed group's run gave its room back


def test_runs_held_ahead_are_checked_when_the_node_says_and_told_it_holds_the_check() -> None:
    """A node that holds early checks says how long before the start to send them
    (``check_ahead_ms``): the group's check goes then, as one held request a batch; a node
    that says nothing is checked ``check_sec`` before the start, through the queue."""

    async def scenario(check_ahead_ms: int) -> tuple[float, float, bool]:
        w = Worker(None, "p", handle, concurrency=10, check_sec=0.5)  # type: ignore[arg-type]
        asked: list[float] = []
        how: list[bool] = []
        instant = w._instant

        def noted(at: float) -> asyncio.Future[None]:
            asked.append(at)
            return instant(at)

        async def check_many(leases: list[object], *, held: bool = False) -> list[object]:
            how.append(held)
            raise RuntimeError("enough: the check was asked")

        w._instant = noted  # type: ignore[method-assign]
        w._beater.check_many = check_many  # type: ignore[assignment,method-assign]
        loop = asyncio.get_running_loop()
        received = loop.time()
        w._free -= 1
        w._hold(claimed("j0.1", start_in_ms=800, check_ahead_ms=check_ahead_ms), received)
        await asyncio.wait(set(w._running), timeout=5)
        return asked[0] - received, 0.8, how[0]

    checked, start, held = asyncio.run(scenario(check_ahead_ms=700))
    assert round(start - checked, 3) == 0.7 and held
    checked, start, held = asyncio.run(scenario(check_ahead_ms=0))
    assert round(start - checked, 3) == 0.5 and not held


def claimed(run_id: str, start_in_ms: int, check_ahead_ms: int = 0) -> ClaimedRun:
    now = dt.datetime.now(dt.UTC)
    return ClaimedRun(
        run_id=run_id,
        job_id=run_id.rpartition(".")[0],
        scheduled_for=now,
        attempt=1,
        fencing_token=1,
        lease_expires_at=now,
        lease_sec=60.0,
        payload=None,
        idempotency_key="k",
        timeout_sec=60.0,
        start_in_ms=start_in_ms,
        check_ahead_ms=check_ahead_ms,
    )
