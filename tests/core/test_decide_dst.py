"""Suppressed repeats are recorded: a fixed-hour slot repeated by a fall-back runs once, at its
first occurrence, and its second occurrence ends in ``RunSkipped(reason=dst)``, recorded once,
when the job's next slot is handled. Driven through ``Sim`` on a fake clock."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import events as ev
from core.commands import PauseJob, PutJob, ResumeJob
from core.cron import CronSchedule
from core.errors import CronlogError
from core.jobs import Backoff, HttpTarget, JobSpec, PullTarget
from tests.core.harness import Sim

SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
NY = "America/New_York"
LORD_HOWE = "Australia/Lord_Howe"


def utc(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()) * SEC


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        name="job",
        tenant="team-a",
        target=PullTarget(pool="p"),
        schedule="30 1 * * *",
        timezone=NY,
        backoff=Backoff(base_sec=10, factor=2, cap_sec=600, jitter=False),
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def materialised(sim: Sim) -> list[int]:
    return [e.scheduled_for for e in sim.of_type(ev.RunMaterialised)]


def dst_skips(sim: Sim) -> list[ev.RunSkipped]:
    return [
        e
        for e in sim.of_type(ev.RunSkipped)
        if isinstance(e, ev.RunSkipped) and e.reason is ev.SkipReason.DST
    ]


def test_new_york_repeated_slot_runs_once_and_its_repeat_is_recorded() -> None:
    sim = Sim(utc("2024-11-02T20:00"))  # 16:00 EDT the day before the fall-back
    sim.do(PutJob(job_id="j", spec=spec()))
    sim.advance(utc("2024-11-04T12:00") - sim.now)
    assert materialised(sim) == [
        utc("2024-11-03T05:30"),  # 01:30 EDT
        utc("2024-11-04T06:30"),  # 01:30 EST the next day
    ]
    (skip,) = dst_skips(sim)
    assert skip.scheduled_for == skip.last_scheduled_for == utc("2024-11-03T06:30")  # 01:30 EST
    assert skip.count == 1
    # Recorded when the next slot came, just before it, and naming it as the next slot.
    assert skip.at == utc("2024-11-04T06:30")
    assert skip.next_slot == utc("2024-11-04T06:30")
    kinds = [
        (type(e).__name__, e.scheduled_for) for e in sim.events() if hasattr(e, "scheduled_for")
    ]
    at = kinds.index(("RunSkipped", utc("2024-11-03T06:30")))
    assert kinds[at + 1] == ("RunMaterialised", utc("2024-11-04T06:30"))
    assert sim.state.jobs["j"].next_slot == utc("2024-11-05T06:30")
    assert sim.replayed() == sim.state.snapshot()


def test_nothing_is_recorded_before_the_next_slot_is_handled() -> None:
    sim = Sim(utc("2024-11-02T20:00"))
    sim.do(PutJob(job_id="j", spec=spec()))
    sim.advance(utc("2024-11-04T06:00") - sim.now)  # the rest of the fall-back day
    assert materialised(sim) == [utc("2024-11-03T05:30")]
    assert dst_skips(sim) == []
    sim.advance(HOUR)
    assert [s.scheduled_for for s in dst_skips(sim)] == [utc("2024-11-03T06:30")]


def test_lord_howe_half_hour_fall_back() -> None:
    # 7 April 2024: 02:00 +11 -> 01:30 +10:30, so 01:45 happens at 14:45Z and again at 15:15Z.
    sim = Sim(utc("2024-04-06T10:00"))
    sim.do(PutJob(job_id="j", spec=spec(schedule="45 1 * * *", timezone=LORD_HOWE)))
    sim.advance(utc("2024-04-07T18:00") - sim.now)
    assert materialised(sim) == [utc("2024-04-06T14:45"), utc("2024-04-07T15:15")]
    (skip,) = dst_skips(sim)
    assert skip.scheduled_for == utc("2024-04-06T15:15")
    assert skip.next_slot == utc("2024-04-07T15:15")
    assert sim.replayed() == sim.state.snapshot()


def test_every_repeated_slot_is_recorded_once_in_time_order() -> None:
    sim = Sim(utc("2024-11-02T20:00"))
    sim.do(PutJob(job_id="j", spec=spec(schedule="*/20 1 * * *")))
    sim.advance(utc("2024-11-04T12:00") - sim.now)
    suppressed = [utc("2024-11-03T06:00"), utc("2024-11-03T06:20"), utc("2024-11-03T06:40")]
    assert [s.scheduled_for for s in dst_skips(sim)] == suppressed
    assert not set(suppressed) & set(materialised(sim))
    assert all(s.next_slot == utc("2024-11-04T06:00") for s in dst_skips(sim))
    assert sim.replayed() == sim.state.snapshot()


def test_hourly_job_fires_every_real_hour_and_records_no_dst_skip() -> None:
    sim = Sim(utc("2024-11-02T20:00"))
    sim.do(PutJob(job_id="j", spec=spec(schedule="0 * * * *")))
    sim.advance(utc("2024-11-04T12:00") - sim.now)
    fires = materialised(sim)
    assert fires[0] == utc("2024-11-02T21:00") and fires[-1] == utc("2024-11-04T12:00")
    assert all(b - a == HOUR for a, b in itertools.pairwise(fires))
    assert utc("2024-11-03T05:00") in fires and utc("2024-11-03T06:00") in fires  # 01:00 twice
    assert sim.of_type(ev.RunSkipped) == []


def test_spring_forward_records_nothing() -> None:
    sim = Sim(utc("2024-03-09T20:00"))
    sim.do(PutJob(job_id="j", spec=spec(schedule="30 2 * * *")))
    sim.advance(utc("2024-03-11T12:00") - sim.now)
    assert materialised(sim) == [utc("2024-03-10T07:00"), utc("2024-03-11T06:30")]
    assert sim.of_type(ev.RunSkipped) == []


def test_an_outage_across_the_fall_back_records_the_repeat_once() -> None:
    for policy in ("skip", "fire_once", "catch_up"):
        sim = Sim(utc("2024-11-02T20:00"))
        sim.do(PutJob(job_id="j", spec=spec(schedule="*/30 1 * * *", misfire_policy=policy)))
        sim.jump(utc("2024-11-05T12:00") - sim.now)  # down for three days
        skips = sim.of_type(ev.RunSkipped)
        assert [s.scheduled_for for s in dst_skips(sim)] == [
            utc("2024-11-03T06:00"),
            utc("2024-11-03T06:30"),
        ]
        # Time order: the misfire range starts at 01:00 EDT, before the suppressed instants.
        assert [s.scheduled_for for s in skips] == sorted(s.scheduled_for for s in skips)
        assert sim.state.jobs["j"].next_slot == utc("2024-11-06T06:00"), policy
        assert sim.replayed() == sim.state.snapshot()
        sim.advance(utc("2024-11-07T12:00") - sim.now)
        assert len(dst_skips(sim)) == 2


def test_a_repeat_before_registration_is_not_recorded() -> None:
    # Registered at 01:00 EST: 01:30 EST is still to come, and does not run (its first
    # occurrence, 01:30 EDT, has passed), so it is recorded.
    sim = Sim(utc("2024-11-03T06:00"))
    sim.do(PutJob(job_id="j", spec=spec()))
    sim.advance(utc("2024-11-04T12:00") - sim.now)
    assert materialised(sim) == [utc("2024-11-04T06:30")]
    assert [s.scheduled_for for s in dst_skips(sim)] == [utc("2024-11-03T06:30")]
    # Registered at 01:45 EST: the repeat came before the job existed.
    sim = Sim(utc("2024-11-03T06:45"))
    sim.do(PutJob(job_id="j", spec=spec()))
    sim.advance(utc("2024-11-04T12:00") - sim.now)
    assert materialised(sim) == [utc("2024-11-04T06:30")]
    assert dst_skips(sim) == []


# -- replay and once-only, with random timing and policies --------------------------------

T0 = utc("2026-11-01T03:00")  # New York falls back three hours later, at 06:00Z
SCHEDULES = ["30 1 * * *", "*/20 1 * * *", "0,30 0-3 * * *", "0 * * * *", "*/15 * * * * */20"]

specs = st.builds(
    spec,
    target=st.sampled_from([HttpTarget(url="http://127.0.0.1:9/"), PullTarget(pool="p")]),
    schedule=st.sampled_from(SCHEDULES),
    timezone=st.sampled_from([NY, NY, "UTC"]),
    misfire_policy=st.sampled_from(["skip", "fire_once", "catch_up"]),
    misfire_grace_sec=st.sampled_from([0.0, 60.0]),
    catch_up_limit=st.integers(1, 4),
    overlap_policy=st.sampled_from(["allow", "skip", "buffer_one", "cancel_other"]),
)
steps = st.one_of(
    st.tuples(st.just("advance"), st.integers(1, 6 * HOUR)),
    st.tuples(st.just("advance"), st.integers(3 * HOUR, 9 * HOUR)),
    st.tuples(st.just("jump"), st.integers(1, 9 * HOUR)),
    st.tuples(st.sampled_from(["pause", "resume"]), st.sampled_from(["a", "b"])),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs, specs, st.lists(steps, min_size=8, max_size=30))
def test_replay_rebuilds_state_and_each_repeat_is_recorded_once(
    first: JobSpec,
    second: JobSpec,
    program: list[tuple],  # type: ignore[type-arg]
) -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="a", spec=first))
    sim.do(PutJob(job_id="b", spec=second))
    for step in program:
        with contextlib.suppress(CronlogError):
            if step[0] == "advance":
                sim.advance(step[1])
            elif step[0] == "jump":
                sim.jump(step[1])
            else:
                command = PauseJob if step[0] == "pause" else ResumeJob
                sim.do(command(job_id=step[1], tenant="team-a"))
        assert sim.replayed() == sim.state.snapshot()
    recorded = Counter((s.job_id, s.scheduled_for) for s in dst_skips(sim))
    assert all(n == 1 for n in recorded.values())
    runs = {(e.job_id, e.scheduled_for) for e in sim.of_type(ev.RunMaterialised)}
    assert not set(recorded) & runs
    for job_id, job_spec in (("a", first), ("b", second)):
        schedule = CronSchedule.parse(job_spec.schedule or "", job_spec.timezone)
        possible = set(schedule.suppressed_between(T0, sim.now))
        assert {s for j, s in recorded if j == job_id} <= possible
