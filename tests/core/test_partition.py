"""The partition as one object: its timers, kept up event by event, are the ones its state
calls for; and a snapshot restores the partition its history folds to."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import events as ev
from core.commands import PutJob
from core.errors import CronlogError, InvalidDefinition
from core.jobs import JobSpec
from core.partition import Partition
from core.state import PartitionState, evolve
from core.timers import all_timers
from tests.core.harness import Sim
from tests.core.test_determinism import (
    JOBS,
    RETENTION_MS,
    T0,
    _apply,
    dependants,
    one_shots,
    specs,
    steps,
)


def assert_timers_match_the_state(partition: Partition) -> None:
    """Every timer the state calls for is armed at its deadline (or already due), and nothing
    else is armed: the incremental ``timers_after`` agrees with ``all_timers``."""
    wheel = partition.wheel
    expected = dict(all_timers(partition.state, partition.retention_ms))
    armed = 0
    for key, deadline in expected.items():
        if key in wheel:
            assert wheel.deadline_of(key) == deadline, key
            armed += 1
        else:
            assert deadline <= wheel.now_ms + 10, (key, deadline, wheel.now_ms)  # due
    assert len(wheel) == armed  # no stale timer left behind


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(specs, specs, one_shots, dependants), st.lists(steps, min_size=5, max_size=40))
def test_timers_follow_the_state_and_a_snapshot_restores_the_folded_partition(
    initial: tuple[JobSpec, ...],
    program: list[tuple],  # type: ignore[type-arg]
) -> None:
    sim = Sim(T0, retention_ms=RETENTION_MS)
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
        snapshot, sim.now, tick_ms=10, wheel_size=64, retention_ms=RETENTION_MS
    )
    assert restored.snapshot() == snapshot == Partition(0, sim.now, folded).snapshot()
    assert_timers_match_the_state(restored)


def test_a_snapshot_of_another_format_is_refused() -> None:
    snapshot = Partition(0, T0).snapshot()
    with pytest.raises(InvalidDefinition) as err:
        Partition.restore(bytes([99]) + snapshot[1:], T0)
    assert err.value.field == "snapshot"
