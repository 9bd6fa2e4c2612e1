"""``start_at`` and ``end_at`` bound every kind of schedule: no slot before the one or after the
other (both inclusive)."""

from __future__ import annotations

import pytest

from core import events as ev
from core.commands import PutJob, UpstreamSucceeded
from core.errors import InvalidDefinition
from core.jobs import JobSpec, PullTarget, first_slot, last_slots, next_slot, validate
from tests.core.harness import Sim

T0 = 1_764_403_200_000  # 2025-11-29T08:00:00Z
MIN = 60_000
POOL = PullTarget(pool="p")


def spec(**fields: object) -> JobSpec:
    return JobSpec(name="w", tenant="t", target=POOL, **fields)  # type: ignore[arg-type]


def materialised(sim: Sim) -> list[int]:
    decoded = [ev.decode(raw) for raw in sim.log]
    return [e.scheduled_for for e in decoded if isinstance(e, ev.RunMaterialised)]


def test_a_cron_job_fires_only_between_start_at_and_end_at() -> None:
    sim = Sim(T0)
    window = spec(schedule="*/10 * * * *", start_at=T0 + 25 * MIN, end_at=T0 + 60 * MIN)
    [registered] = sim.do(PutJob(job_id="t/w", spec=window))
    assert isinstance(registered, ev.JobRegistered)
    assert registered.next_slot == T0 + 30 * MIN  # the first fire at or after start_at
    sim.advance(3 * 60 * MIN)
    assert materialised(sim) == [T0 + m * MIN for m in (30, 40, 50, 60)]  # end_at inclusive
    assert sim.state.jobs["t/w"].next_slot is None


def test_a_fire_at_start_at_itself_counts() -> None:
    window = spec(schedule="*/10 * * * *", start_at=T0 + 20 * MIN)
    assert first_slot(window, T0) == T0 + 20 * MIN


def test_an_interval_job_stops_at_end_at() -> None:
    sim = Sim(T0)
    window = spec(interval_sec=900, start_at=T0 + 5 * MIN, end_at=T0 + 40 * MIN)
    sim.do(PutJob(job_id="t/w", spec=window))
    sim.advance(2 * 60 * MIN)
    assert materialised(sim) == [T0 + m * MIN for m in (5, 20, 35)]


def test_a_window_that_has_ended_has_no_slot() -> None:
    ended = spec(schedule="* * * * *", end_at=T0 - MIN)
    assert first_slot(ended, T0) is None
    assert next_slot(spec(interval_sec=60, end_at=T0), T0, T0 - 10 * MIN) is None


def test_misfires_count_only_slots_in_the_window() -> None:
    window = spec(schedule="* * * * *", start_at=T0 + 3 * MIN, end_at=T0 + 6 * MIN)
    assert last_slots(window, T0, T0 + 60 * MIN, 0, 100) == [T0 + m * MIN for m in (3, 4, 5, 6)]


def test_a_one_shot_must_lie_in_its_window() -> None:
    with pytest.raises(InvalidDefinition) as e:
        validate(spec(run_at=T0, start_at=T0 + 1))
    assert e.value.field == "run_at"
    validate(spec(run_at=T0, start_at=T0, end_at=T0))
    with pytest.raises(InvalidDefinition) as e:
        validate(spec(schedule="* * * * *", start_at=T0, end_at=T0 - 1))
    assert e.value.field == "end_at"


def test_a_dependency_job_ignores_upstream_slots_outside_its_window() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="t/up", spec=spec(schedule="0 * * * *")))
    dependant = spec(depends_on=("t/up",), start_at=T0 + 60 * MIN, end_at=T0 + 120 * MIN)
    sim.do(PutJob(job_id="t/down", spec=dependant))
    for slot in (T0, T0 + 60 * MIN, T0 + 180 * MIN):
        sim.do(UpstreamSucceeded(job_id="t/down", upstream_job_id="t/up", scheduled_for=slot))
    down = [
        e.scheduled_for
        for e in map(ev.decode, sim.log)
        if isinstance(e, ev.RunMaterialised) and e.job_id == "t/down"
    ]
    assert down == [T0 + 60 * MIN]
