"""The partition as one object: its timers, kept up event by event, are the ones its state
calls for; and a snapshot restores the partition its history folds to."""

from __future__ import annotations

import contextlib
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace as msgspec_replace

from core import events as ev
from core.commands import PutJob
from core.errors import CronlogError, InvalidDefinition
from core.jobs import HttpTarget, JobSpec
from core.partition import DEFAULT_PARK_MS, Partition
from core.state import PartitionState, evolve
from core.timers import all_timers
from tests.core.harness import Sim
from tests.core.test_determinism import (
    JOBS,
    RETENTION_MS,
    T0,
    _apply,
    dependants,
    leads,
    one_shots,
    specs,
    steps,
)


def assert_timers_match_the_state(partition: Partition) -> None:
    """Every timer the state calls for is armed at its deadline (or already due), and nothing
    else is armed: the incremental ``timers_after`` agrees with ``all_timers``."""
    wheel = partition.wheel
    expected = dict(
        all_timers(partition.state, partition.retention_ms, partition.lead_ms, partition.arm_ms)
    )
    for key in expected:
        if key[0] == "ready":  # a push run's call is armed its arming time ahead of its start
            expected[key] -= partition.arm_ms
    parked = partition.parked()
    armed = 0
    for key, deadline in expected.items():
        if key in wheel:
            assert wheel.deadline_of(key) == deadline, key
            armed += 1
        elif key[0] == "slot" and key[1] in parked:
            # parked: armed a span or more before its slot, and not yet due to be
            assert wheel.now_ms < parked[key[1]] <= deadline - DEFAULT_PARK_MS, key
        else:
            assert deadline <= wheel.now_ms + 10, (key, deadline, wheel.now_ms)  # due
    assert len(wheel) == armed  # no stale timer left behind


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.tuples(specs, specs, one_shots, dependants),
    st.lists(steps, min_size=5, max_size=40),
    leads,
    st.sampled_from([0, 2_000]),  # the arming time: push jobs' runs materialised that far ahead
)
def test_timers_follow_the_state_and_a_snapshot_restores_the_folded_partition(
    initial: tuple[JobSpec, ...],
    program: list[tuple],  # type: ignore[type-arg]
    lead_ms: int,
    arm_ms: int,
) -> None:
    sim = Sim(T0, retention_ms=RETENTION_MS, lead_ms=lead_ms, arm_ms=arm_ms)
    leases: list[ev.LeaseGranted] = []
    for job_id, spec in zip(JOBS, initial, strict=True):
        sim.do(PutJob(job_id=job_id, spec=spec))
    for step in program:
        with contextlib.suppress(CronlogError):
            _apply(sim, step, leases)
        assert_timers_match_the_state(sim.partition)
    folded = PartitionState(0)
    for raw in sim.log:
        evolve(folded, ev.decode(raw))
    snapshot = sim.partition.snapshot()
    restored = Partition.restore(
        snapshot,
        sim.now,
        tick_ms=10,
        wheel_size=64,
        retention_ms=RETENTION_MS,
        lead_ms=lead_ms,
        arm_ms=arm_ms,
    )
    assert restored.snapshot() == snapshot == Partition(0, sim.now, folded).snapshot()
    assert_timers_match_the_state(restored)


def test_a_snapshot_of_another_format_is_refused() -> None:
    snapshot = Partition(0, T0).snapshot()
    with pytest.raises(InvalidDefinition) as err:
        Partition.restore(bytes([99]) + snapshot[1:], T0)
    assert err.value.field == "snapshot"


# Jobs whose next slot is hours or days away, so that a restore parks them, and steps that
# reach it.
daily = st.builds(
    msgspec_replace, specs, schedule=st.sampled_from(["30 1 * * *", "0 12 * * 1", "0 0 1 * *"])
)  # a day's slot a few hours away (a 10-minute span); a week's or a month's (a day's span)
hours = st.one_of(
    st.tuples(st.just("advance"), st.integers(3_600_000, 10_800_000)),
    st.tuples(st.just("jump"), st.integers(86_400_000, 4 * 86_400_000)),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.tuples(daily, daily, specs, dependants),
    st.lists(steps, min_size=3, max_size=20),
    st.lists(st.one_of(steps, hours, st.tuples(st.just("put"), st.sampled_from(JOBS), daily)),
             min_size=5, max_size=40),
)  # fmt: skip
def test_a_partition_with_parked_slots_decides_what_one_with_every_timer_armed_decides(
    initial: tuple[JobSpec, ...],
    before: list[tuple],  # type: ignore[type-arg]
    after: list[tuple],  # type: ignore[type-arg]
) -> None:
    sim = Sim(T0, retention_ms=RETENTION_MS)
    leases: list[ev.LeaseGranted] = []
    for job_id, spec in zip(JOBS, initial, strict=True):
        sim.do(PutJob(job_id=job_id, spec=spec))
    for step in before:
        with contextlib.suppress(CronlogError):
            _apply(sim, step, leases)
    snapshot = sim.partition.snapshot()
    driven = []
    for park_ms in (DEFAULT_PARK_MS, 0):  # 0: every timer in the wheel
        again = Sim(sim.now, retention_ms=RETENTION_MS)
        again.partition = Partition.restore(
            snapshot, sim.now, tick_ms=10, wheel_size=64, retention_ms=RETENTION_MS,
            park_ms=park_ms,
        )  # fmt: skip
        again.ready = deque(sim.ready)
        again_leases = list(leases)
        for step in after:
            with contextlib.suppress(CronlogError):
                _apply(again, step, again_leases)
            assert_timers_match_the_state(again.partition)
        driven.append((again.log, again.partition.snapshot()))
    parked, armed = driven
    assert parked == armed  # the same events, in the same order, and the same state


def test_a_far_slot_is_parked_at_restore_and_fires_at_its_instant() -> None:
    sim = Sim(T0)  # 23:00 UTC
    daily = JobSpec(
        name="j", tenant="t1", target=HttpTarget(url="http://127.0.0.1:9/"), schedule="30 1 * * *"
    )
    soon = msgspec_replace(daily, schedule="*/5 * * * *")
    sim.do(PutJob(job_id="daily", spec=daily))
    sim.do(PutJob(job_id="soon", spec=soon))
    slot = sim.state.jobs["daily"].next_slot
    assert slot == T0 + 150 * 60_000
    again = Sim(sim.now)
    again.partition = Partition.restore(
        sim.partition.snapshot(), sim.now, tick_ms=10, wheel_size=64
    )
    assert set(again.partition.parked()) == {"daily"}  # the slot 5 minutes away is armed
    assert ("slot", "daily") not in again.wheel and ("slot", "soon") in again.wheel
    take = again.partition.parked()["daily"]
    assert take <= slot - DEFAULT_PARK_MS
    assert again.partition.next_deadline() <= min(take, sim.state.jobs["soon"].next_slot or 0)
    again.advance(slot - again.now - 1)
    assert again.partition.parked() == {} and again.wheel.deadline_of(("slot", "daily")) == slot
    assert not [e for e in again.events() if e.job_id == "daily"]
    again.advance(1)
    [fired] = [
        e for e in again.events() if isinstance(e, ev.RunMaterialised) and e.job_id == "daily"
    ]
    assert fired.scheduled_for == slot and fired.at == slot


def test_a_parked_slot_fires_among_equal_deadlines_where_it_would_have() -> None:
    """Taken into the wheel after a job armed since, a parked slot still fires first: it keeps
    the arming number it had when the partition was built."""
    daily = JobSpec(
        name="j", tenant="t1", target=HttpTarget(url="http://127.0.0.1:9/"), schedule="30 1 * * *"
    )
    sim = Sim(T0)
    sim.do(PutJob(job_id="parked", spec=daily))
    logs = []
    for park_ms in (DEFAULT_PARK_MS, 0):
        again = Sim(sim.now)
        again.partition = Partition.restore(
            sim.partition.snapshot(), sim.now, tick_ms=10, wheel_size=64, park_ms=park_ms
        )
        assert set(again.partition.parked()) == ({"parked"} if park_ms else set())
        again.do(PutJob(job_id="later", spec=daily))  # the same slot, armed now
        again.advance(4 * 3_600_000)
        logs.append(again.events())
    parked, armed = logs
    fired = [e.job_id for e in parked if isinstance(e, ev.RunMaterialised)]
    assert fired[:2] == ["parked", "later"]
    assert parked == armed


def test_a_slot_days_away_waits_in_its_day_and_fires_at_its_instant() -> None:
    weekly = JobSpec(
        name="j", tenant="t1", target=HttpTarget(url="http://127.0.0.1:9/"), schedule="0 12 * * 1"
    )
    sim = Sim(T0)  # Saturday 23:00 UTC
    sim.do(PutJob(job_id="weekly", spec=weekly))
    slot = sim.state.jobs["weekly"].next_slot
    assert slot == T0 + 37 * 3_600_000  # Monday noon
    again = Sim(sim.now)
    again.partition = Partition.restore(
        sim.partition.snapshot(), sim.now, tick_ms=10, wheel_size=64
    )
    monday = slot - 12 * 3_600_000
    assert again.partition.parked() == {"weekly": monday - DEFAULT_PARK_MS}  # the day's span
    assert again.partition.next_deadline() == monday - DEFAULT_PARK_MS
    again.advance(slot - again.now)
    [fired] = [e for e in again.events() if isinstance(e, ev.RunMaterialised)]
    assert fired.scheduled_for == slot and fired.at == slot and again.partition.parked() == {}


def test_a_partition_says_how_far_behind_its_timers_it_is() -> None:
    """What the node's stall watch reads: the deadline of the oldest timer that came due and
    is not decided yet, until it is taken."""
    p = Partition(0, T0)
    spec = JobSpec(
        name="j", tenant="t1", target=HttpTarget(url="http://127.0.0.1:9/"), schedule="* * * * *"
    )
    p.handle(PutJob(job_id="a", spec=spec), T0)
    slot = p.state.jobs["a"].next_slot
    assert slot is not None and p.overdue_since() is None
    p.advance(slot + 2_500)  # the driver looked 2.5 s late
    assert p.overdue_since() == slot
    assert p.take_due() == (slot, ("slot", "a"))
    assert p.overdue_since() is None and p.take_due() is None


def test_one_teams_herd_of_due_timers_does_not_hold_back_anothers() -> None:
    """A thousand slots of team a come due at once; team b's slot, due a moment later, is
    taken second, not a thousand and first. Each team's own still go oldest first."""
    p = Partition(0, T0)
    herd = JobSpec(
        name="h", tenant="a", target=HttpTarget(url="http://127.0.0.1:9/"), run_at=T0 + 1000
    )
    for i in range(1000):
        p.handle(PutJob(job_id=f"a/{i:04d}", spec=herd), T0)
    b = msgspec_replace(herd, tenant="b", run_at=T0 + 1001)
    p.handle(PutJob(job_id="b/one", spec=b), T0)
    p.advance(T0 + 1001)
    assert p.due_count() == 1001 and p.overdue_since() == T0 + 1000
    order = [p.next_due() for _ in range(4)]
    assert order == [
        ("slot", "a/0000"),
        ("slot", "b/one"),
        ("slot", "a/0001"),
        ("slot", "a/0002"),
    ]
