"""State compaction: a job that ended leaves the partition's state and its wheel a retention
after it ended, decided from events; until then a repeated command is answered from the job."""

from __future__ import annotations

import pytest

from core import events as ev
from core.commands import (
    CancelJob,
    ClaimRuns,
    CompleteRun,
    HeartbeatRun,
    Outcome,
    PutJob,
    ReplayRun,
    TriggerRun,
)
from core.errors import Conflict, LeaseLost, NotFound
from core.jobs import JobSpec, PullTarget
from core.partition import Partition
from core.state import PartitionState, evolve
from core.timers import all_timers
from projections.state_store import MemoryStateStore
from tests.core.harness import Sim
from tests.core.test_determinism import T0

RETENTION = 3_600_000
POOL = PullTarget(pool="p")


def _sim() -> Sim:
    return Sim(T0, retention_ms=RETENTION)


def one_shot(at: int = T0 + 60_000, attempts: int = 4) -> JobSpec:
    return JobSpec(name="once", tenant="t1", target=POOL, run_at=at, max_attempts=attempts)


def every_minute() -> JobSpec:
    return JobSpec(name="cron", tenant="t1", target=POOL, schedule="* * * * *")


def _claim_and_finish(sim: Sim, outcome: Outcome = Outcome.SUCCEEDED) -> ev.LeaseGranted:
    [lease] = sim.do(ClaimRuns(tenant="t1", pool="p", worker_id="w", limit=1))
    assert isinstance(lease, ev.LeaseGranted)
    sim.do(
        CompleteRun(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            outcome=outcome,
            permanent=outcome is Outcome.FAILED,
        )
    )
    return lease


def _forgotten(sim: Sim) -> list[ev.JobForgotten]:
    return sim.of_type(ev.JobForgotten)  # type: ignore[return-value]


def _keys_of(sim: Sim, job_id: str) -> set[tuple[str, str]]:
    return {key for key, _ in all_timers(sim.state, RETENTION) if key[1].startswith(job_id)}


def test_a_one_shot_that_ran_is_forgotten_a_retention_after_it_ended() -> None:
    sim = _sim()
    spec = one_shot()
    sim.do(PutJob(job_id="a", spec=spec))
    sim.advance(60_000)
    _claim_and_finish(sim)
    ended = sim.now
    assert sim.state.jobs["a"].ended_at == ended
    assert ("forget", "a") in sim.wheel
    # A late repeat of the create, within the retention, is the same job: nothing happens.
    assert sim.do(PutJob(job_id="a", spec=spec, create_only=True)) == []
    sim.advance(RETENTION - 1)
    assert "a" in sim.state.jobs and not _forgotten(sim)
    sim.advance(1)
    [gone] = _forgotten(sim)
    assert (gone.job_id, gone.ended_at, gone.at, gone.runs) == ("a", ended, ended + RETENTION, ())
    assert "a" not in sim.state.jobs and not sim.state.runs
    assert len(sim.wheel) == 0 and _keys_of(sim, "a") == set()


def test_a_cancelled_job_answers_as_cancelled_until_it_is_forgotten() -> None:
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=every_minute()))
    sim.advance(1000)
    sim.do(CancelJob(job_id="a", tenant="t1"))
    assert sim.do(CancelJob(job_id="a", tenant="t1")) == []  # a repeat: nothing to do
    with pytest.raises(Conflict, match="cancelled"):
        sim.do(PutJob(job_id="a", spec=every_minute()))
    sim.advance(RETENTION)
    assert [e.job_id for e in _forgotten(sim)] == ["a"]
    # Deleting a job is cancelling it (DELETE /v1/jobs/{id}): it leaves the state and the wheel.
    assert "a" not in sim.state.jobs and not sim.state.runs and not sim.state.kept
    assert len(sim.wheel) == 0 and _keys_of(sim, "a") == set()
    with pytest.raises(NotFound):
        sim.do(CancelJob(job_id="a", tenant="t1"))
    # After the retention the id is free: registering it is a new job, at version 1.
    [registered] = sim.do(PutJob(job_id="a", spec=every_minute()))
    assert isinstance(registered, ev.JobRegistered) and registered.version == 1


def test_a_job_cancelled_while_its_run_waited_for_a_worker_leaves_the_pool_s_index() -> None:
    """Its run never claimed, nothing else in the pool: once the job is forgotten the pool's
    ready index holds nothing of it (a pool nobody claims from would keep it forever)."""
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=one_shot()))
    sim.advance(60_000)
    assert [run.status.value for run in sim.state.runs.values()] == ["pending"]
    sim.do(CancelJob(job_id="a", tenant="t1"))
    sim.advance(RETENTION)
    assert [e.job_id for e in _forgotten(sim)] == ["a"]
    assert not sim.state.jobs and not sim.state.runs and len(sim.wheel) == 0
    assert sim.state.ready == {} and sim.state.later == {}


def test_a_cancelled_run_still_leased_holds_its_job_until_the_lease_runs_out() -> None:
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=one_shot(T0 + 1000)))
    sim.advance(1000)
    [lease] = sim.do(ClaimRuns(tenant="t1", pool="p", worker_id="w", limit=1))
    assert isinstance(lease, ev.LeaseGranted)
    sim.do(CancelJob(job_id="a", tenant="t1"))
    assert sim.state.jobs["a"].ended_at is None  # the worker must still learn of the cancel
    sim.advance(RETENTION)
    assert not _forgotten(sim)  # the lease (30 s) ran out first: the job ended then
    with pytest.raises(LeaseLost):
        sim.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token))
    expired = sim.of_type(ev.LeaseExpired)[0].at
    assert sim.state.jobs["a"].ended_at == expired
    sim.advance(expired + RETENTION - sim.now)
    assert [e.job_id for e in _forgotten(sim)] == ["a"]
    assert not sim.state.runs


def test_a_dead_run_keeps_its_job_until_it_is_replayed_and_succeeds() -> None:
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=one_shot(T0 + 1000)))
    sim.advance(1000)
    lease = _claim_and_finish(sim, Outcome.FAILED)  # permanent: dead at once
    assert sim.state.runs[lease.run_id].status == "dead"
    sim.advance(3 * RETENTION)
    assert not _forgotten(sim) and sim.state.jobs["a"].ended_at is None
    sim.do(ReplayRun(run_id=lease.run_id, tenant="t1"))
    _claim_and_finish(sim)
    sim.advance(RETENTION)
    assert [e.job_id for e in _forgotten(sim)] == ["a"]


def test_a_cancelled_job_takes_its_dead_runs_along() -> None:
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=one_shot(T0 + 1000)))
    sim.advance(1000)
    lease = _claim_and_finish(sim, Outcome.FAILED)
    sim.do(CancelJob(job_id="a", tenant="t1"))
    sim.advance(RETENTION)
    [gone] = _forgotten(sim)
    assert gone.runs == (lease.run_id,)
    assert not sim.state.runs and not sim.state.kept


def test_a_trigger_within_the_retention_revives_the_job() -> None:
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=one_shot(T0 + 1000)))
    sim.advance(1000)
    _claim_and_finish(sim)
    sim.advance(RETENTION // 2)
    sim.do(TriggerRun(job_id="a", tenant="t1"))
    assert sim.state.jobs["a"].ended_at is None and ("forget", "a") not in sim.wheel
    sim.advance(RETENTION)
    assert not _forgotten(sim)  # its manual run is pending: the job is live again
    _claim_and_finish(sim)
    sim.advance(RETENTION)
    assert len(_forgotten(sim)) == 1


def test_a_recurring_job_past_its_end_is_forgotten() -> None:
    sim = _sim()
    spec = JobSpec(name="c", tenant="t1", target=POOL, schedule="* * * * *", end_at=T0 + 60_000)
    sim.do(PutJob(job_id="a", spec=spec))
    sim.advance(60_000)
    _claim_and_finish(sim)
    assert sim.state.jobs["a"].next_slot is None
    sim.advance(RETENTION)
    assert [e.job_id for e in _forgotten(sim)] == ["a"]


def test_recurring_and_paused_jobs_are_never_forgotten() -> None:
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=every_minute()))
    sim.do(PutJob(job_id="b", spec=JobSpec(name="d", tenant="t1", target=POOL, depends_on=("a",))))
    sim.jump(10 * RETENTION)
    assert not _forgotten(sim)
    assert sim.state.jobs["a"].ended_at is None and sim.state.jobs["b"].ended_at is None


def test_the_store_drops_a_forgotten_job_and_loads_what_the_partition_holds() -> None:
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=one_shot(T0 + 1000)))
    sim.do(PutJob(job_id="b", spec=every_minute()))
    sim.advance(1000)
    _claim_and_finish(sim, Outcome.FAILED)
    sim.do(CancelJob(job_id="a", tenant="t1"))
    sim.advance(RETENTION)
    assert _forgotten(sim)
    store = MemoryStateStore()
    events = sim.events()
    store.save(sim.state, list(enumerate(events)))
    loaded, offset = store.load()
    assert offset == len(events)
    assert loaded.snapshot() == sim.state.snapshot()
    assert not [k for k, _ in store.dump() if b"/a" in k]  # nothing of the forgotten job
    # Saved event by event, the store holds the same bytes.
    step = MemoryStateStore()
    folded = PartitionState(0)
    for offset, event in enumerate(events):
        evolve(folded, event)
        step.save(folded, [(offset, event)])
    assert step.dump() == store.dump()


def test_the_retention_only_says_when_the_decision_is_taken() -> None:
    """Replaying the log folds what was decided, whatever the setting is now."""
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=one_shot(T0 + 1000)))
    sim.advance(1000)
    _claim_and_finish(sim)
    sim.advance(RETENTION)
    snapshot = sim.partition.snapshot()
    other = Partition.restore(snapshot, sim.now, retention_ms=5)
    assert other.snapshot() == snapshot and "a" not in other.state.jobs
    with pytest.raises(ValueError):
        Partition(0, T0, retention_ms=-1)


def test_a_job_that_ended_before_states_had_ended_at_is_forgotten_after_an_upgrade() -> None:
    """A store written by an earlier version holds cancelled jobs without ``ended_at``: they are
    forgotten a retention after their registration, so at the first start if that is past."""
    sim = _sim()
    sim.do(PutJob(job_id="a", spec=every_minute()))
    sim.do(PutJob(job_id="b", spec=every_minute()))
    sim.do(CancelJob(job_id="a", tenant="t1"))
    old = sim.state
    old.jobs["a"].ended_at = None  # as the earlier version stored it
    later = sim.now + 2 * RETENTION
    upgraded = Partition(0, later, PartitionState.restore(old.snapshot()), retention_ms=RETENTION)
    upgraded.advance(later)
    due = []
    while (key := upgraded.next_due()) is not None:
        due.append(key)
    assert [k for k in due if k[0] == "forget"] == [("forget", "a")]
    [gone] = upgraded.fire(("forget", "a"), later)
    assert isinstance(gone, ev.JobForgotten)
    assert gone.ended_at == old.jobs["a"].registered_at
    assert "a" not in upgraded.state.jobs and "b" in upgraded.state.jobs
