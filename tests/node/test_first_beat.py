"""A call that starts late in its lease has its lease renewed before it runs out, so a quick
call's outcome is never an unknown one (a critical run set aside) for a start that was late."""

from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace

from core import events as ev
from core.jobs import HttpTarget, JobSpec
from node.executors import (
    BEAT_MARGIN_S,
    BEAT_TICK_S,
    _FirstBeats,
    _LeaseKeeper,
    first_beat_s,
    heartbeat_interval,
)

SPEC = JobSpec(
    name="j",
    tenant="team-a",
    target=HttpTarget(url="https://hooks.example.com/x"),
    run_at=1_000,
    lease_sec=1,
    timeout_sec=0.3,
    critical=True,
)


def lease(expires_at: int) -> ev.LeaseGranted:
    return ev.LeaseGranted(
        at=0,
        job_id="j",
        tenant="team-a",
        run_id="j.1000",
        scheduled_for=1_000,
        attempt=1,
        fencing_token=1,
        worker_id="n1/executor",
        lease_expires_at=expires_at,
        lateness_ms=0,
    )


def test_a_call_started_on_time_beats_at_a_third_of_its_lease() -> None:
    assert first_beat_s(lease(11_000), SPEC, now_ms=10_000) == heartbeat_interval(SPEC)


def test_a_call_started_late_beats_before_its_lease_runs_out() -> None:
    # 0.7 s of a 1 s lease gone before the call started (the finding): 0.3 s are left
    due = first_beat_s(lease(10_300), SPEC, now_ms=10_000)
    assert due == 0.3 - BEAT_MARGIN_S
    assert due < 0.3  # decided before the lease instant, so the outcome finds it live
    assert first_beat_s(lease(10_100), SPEC, now_ms=10_000) == 0.0  # at once


def test_first_beats_due_together_share_one_timer_and_come_at_most_a_tick_early() -> None:
    told: list[tuple[float, float]] = []  # (when due, when told), the loop's clock

    class Keeper:
        def __init__(self, due_at: float) -> None:
            self.due_at = due_at

        def due(self) -> None:
            told.append((self.due_at, loop.time()))

    async def main() -> int:
        beats = _FirstBeats(loop)
        start = loop.time()
        for i in range(200):
            delay = 0.2 + i * 0.0002  # all within 0.04 s of one another
            beats.add(Keeper(start + delay), delay)  # type: ignore[arg-type]
        timers = len(beats._due)  # one timer a tick
        await asyncio.sleep(0.2 + 0.04 + 0.1)
        return timers

    loop = asyncio.new_event_loop()
    try:
        timers = loop.run_until_complete(main())
    finally:
        loop.close()
    assert len(told) == 200
    assert timers <= 2  # a tick's calls share a timer (the 0.04 s may straddle two ticks)
    assert all(when >= due - BEAT_TICK_S for due, when in told)


def test_a_stopped_keeper_waiting_for_its_first_beat_holds_no_call() -> None:
    """A herd's keepers wait for their first beat's instant long after most calls ended: a
    stopped one lets its call (and its lease) go meanwhile."""
    loop = asyncio.new_event_loop()
    try:
        executors = SimpleNamespace(_first_beats=_FirstBeats(loop))
        call: asyncio.Future[object] = loop.create_future()
        gone = weakref.ref(call)
        keeper = _LeaseKeeper(executors, lease(2**52), SPEC, call)  # type: ignore[arg-type]
        call.set_result(None)
        keeper.stop()
        del call
        gc.collect()
        assert gone() is None  # the keeper, still waiting in _FirstBeats, let it go
        keeper.due()  # its instant comes: nothing to beat for
        assert not keeper.lost
    finally:
        loop.close()


def test_a_keeper_that_fails_does_not_leave_the_others_of_its_tick_unbeaten() -> None:
    told: list[str] = []

    class Keeper:
        def __init__(self, name: str) -> None:
            self.name = name

        def due(self) -> None:
            if self.name == "broken":
                raise RuntimeError("no heartbeat")
            told.append(self.name)

    loop = asyncio.new_event_loop()
    try:
        beats = _FirstBeats(loop)
        for name in ("first", "broken", "last"):
            beats.add(Keeper(name), 0.0)  # type: ignore[arg-type]
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    assert told == ["first", "last"]
