"""The partition state machine, walked through the run lifecycle with a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core import events as ev
from core.commands import (
    CancelJob,
    CancelRun,
    ClaimRuns,
    CompleteRun,
    HeartbeatRun,
    Outcome,
    PauseJob,
    PutJob,
    ReplayRun,
    ResumeJob,
    StartRun,
    TriggerRun,
    UpstreamSucceeded,
)
from core.decide import decide, run_id_of
from core.errors import Conflict, InvalidDefinition, LeaseLost, NotFound
from core.jobs import HttpTarget, PullTarget
from core.state import RunStatus
from tests.core.harness import Sim, spec

T0 = int(datetime(2026, 3, 2, tzinfo=UTC).timestamp() * 1000)  # a Monday, 00:00 UTC
SEC = 1000
MIN = 60 * SEC
HTTP = HttpTarget(url="http://127.0.0.1:9/hook")


def put(sim: Sim, job_id: str, **kw: object) -> None:
    sim.do(PutJob(job_id=job_id, spec=spec(**kw)))


def start_ready(sim: Sim, worker: str = "node-1") -> list[ev.LeaseGranted]:
    """Lease every push run whose start time came, as the node's executor would."""
    granted = []
    while sim.ready:
        for e in sim.do(StartRun(run_id=sim.ready.popleft(), worker_id=worker)):
            assert isinstance(e, ev.LeaseGranted)
            granted.append(e)
    return granted


def complete(
    sim: Sim, lease: ev.LeaseGranted, outcome: Outcome = Outcome.SUCCEEDED, **kw: object
) -> list[ev.AnyEvent]:
    return sim.do(
        CompleteRun(run_id=lease.run_id, fencing_token=lease.fencing_token, outcome=outcome, **kw)
    )  # type: ignore[arg-type]


# -- registration and slots ----------------------------------------------------------------


def test_register_fires_each_slot_once_on_time() -> None:
    sim = Sim(T0 + 30 * SEC)
    put(sim, "j1")
    assert sim.state.jobs["j1"].next_slot == T0 + MIN
    sim.advance(3 * MIN)
    slots = [e.scheduled_for for e in sim.of_type(ev.RunMaterialised)]
    assert slots == [T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN]
    leases = start_ready(sim)
    # all three are leased at 00:03:30
    assert [lease.lateness_ms for lease in leases] == [150 * SEC, 90 * SEC, 30 * SEC]


def test_each_slot_materialised_at_its_instant() -> None:
    sim = Sim(T0)
    put(sim, "j1")
    at = {}
    for _ in range(3):
        sim.advance(MIN)
        for lease in start_ready(sim):
            at[lease.scheduled_for] = lease.at
            complete(sim, lease)
    assert all(started == slot for slot, started in at.items())
    assert len(at) == 3


def test_put_same_spec_is_a_no_op_and_another_spec_updates() -> None:
    sim = Sim(T0)
    put(sim, "j1")
    assert sim.do(PutJob(job_id="j1", spec=spec())) == []
    with pytest.raises(Conflict):
        sim.do(PutJob(job_id="j1", spec=spec(name="other"), create_only=True))
    (updated,) = sim.do(PutJob(job_id="j1", spec=spec(schedule="*/5 * * * *")))
    assert isinstance(updated, ev.JobUpdated) and updated.version == 2
    assert updated.next_slot == T0 + 5 * MIN
    with pytest.raises(Conflict):
        sim.do(PutJob(job_id="j1", spec=spec(name="x"), expected_version=1))


def test_invalid_definition_names_the_field_and_changes_nothing() -> None:
    sim = Sim(T0)
    before = sim.state.snapshot()
    with pytest.raises(InvalidDefinition) as err:
        sim.do(PutJob(job_id="j1", spec=spec(max_attempts=0)))
    assert err.value.field == "max_attempts"
    with pytest.raises(InvalidDefinition) as err:
        sim.do(PutJob(job_id="bad id!", spec=spec()))
    assert err.value.field == "job_id"
    assert sim.state.snapshot() == before and sim.log == []


def test_another_tenant_sees_not_found() -> None:
    sim = Sim(T0)
    put(sim, "j1")
    with pytest.raises(NotFound):
        sim.do(PauseJob(job_id="j1", tenant="team-b"))
    with pytest.raises(NotFound):
        sim.do(PutJob(job_id="j1", spec=spec(tenant="team-b")))


def test_one_shot_in_the_past_still_runs_once() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="once", spec=spec(schedule=None, run_at=T0 - 3_600 * SEC)))
    (run,) = sim.of_type(ev.RunMaterialised)
    assert run.scheduled_for == T0 - 3_600 * SEC
    sim.advance(10 * MIN)
    assert len(sim.of_type(ev.RunMaterialised)) == 1
    assert sim.state.jobs["once"].next_slot is None


def test_interval_job_and_jitter_spreads_the_herd_deterministically() -> None:
    sim = Sim(T0)
    for i in range(20):
        put(sim, f"h{i}", schedule="0 * * * *", allow_jitter_sec=60)
    sim.advance(60 * MIN)
    runs = sim.of_type(ev.RunMaterialised)
    assert len(runs) == 20 and {r.scheduled_for for r in runs} == {T0 + 60 * MIN}
    offsets = {r.available_at - r.scheduled_for for r in runs}
    assert all(0 <= o < 60 * SEC for o in offsets) and len(offsets) > 10
    sim2 = Sim(T0)
    put(sim2, "every", schedule=None, interval_sec=90)
    sim2.advance(5 * MIN)
    assert [r.scheduled_for - T0 for r in sim2.of_type(ev.RunMaterialised)] == [
        0,
        90 * SEC,
        180 * SEC,
        270 * SEC,
    ]


# -- leases, heartbeats, fencing --------------------------------------------------------------


def test_seed_walkthrough_leases_priorities_and_late_completion() -> None:
    sim = Sim(T0)
    pull = PullTarget(pool="p")
    put(sim, "billing", target=pull, priority=5, schedule="0 * * * *")
    put(sim, "report", target=pull, priority=9, schedule="0 * * * *")
    put(sim, "metrics", target=pull, priority=1, schedule="0 * * * *", lease_sec=30)
    sim.advance(60 * MIN)
    assert len(sim.of_type(ev.RunMaterialised)) == 3
    (a,) = sim.do(ClaimRuns(tenant="team-a", pool="p", worker_id="w-1"))
    (b,) = sim.do(ClaimRuns(tenant="team-a", pool="p", worker_id="w-1"))
    assert [a.job_id, b.job_id] == ["report", "billing"]  # priority 9 before 5
    complete(sim, a)
    complete(sim, b)
    (m,) = sim.do(ClaimRuns(tenant="team-a", pool="p", worker_id="w-2"))
    assert m.job_id == "metrics" and m.lease_expires_at == sim.now + 30 * SEC
    sim.advance(31 * SEC)  # w-2 died: the lease runs out
    expired = sim.of_type(ev.LeaseExpired)
    assert [e.run_id for e in expired] == [m.run_id]
    (retry,) = sim.of_type(ev.RetryScheduled)
    assert retry.attempt == 2 and retry.delay_ms == 10 * SEC
    with pytest.raises(LeaseLost):  # w-2 wakes up and completes late
        complete(sim, m)
    sim.advance(10 * SEC)
    (m2,) = sim.do(ClaimRuns(tenant="team-a", pool="p", worker_id="w-3"))
    assert m2.run_id == m.run_id and m2.attempt == 2 and m2.fencing_token > m.fencing_token
    complete(sim, m2)
    assert sim.state.runs == {}


def test_heartbeat_extends_only_the_live_token() -> None:
    sim = Sim(T0)
    put(sim, "j", lease_sec=30, target=PullTarget(pool="p"), schedule=None, run_at=T0)
    (lease,) = sim.do(ClaimRuns(tenant=None, pool="p", worker_id="w"))
    sim.advance(20 * SEC)
    (hb,) = sim.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token))
    assert isinstance(hb, ev.Heartbeat) and hb.lease_expires_at == sim.now + 30 * SEC
    sim.advance(20 * SEC)  # past the first expiry, inside the extended one
    assert sim.of_type(ev.LeaseExpired) == []
    with pytest.raises(LeaseLost):
        sim.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token + 1))


def test_tokens_strictly_increase_across_runs_and_attempts() -> None:
    sim = Sim(T0)
    put(sim, "j", lease_sec=5, max_attempts=5)
    tokens = []
    for _ in range(4):
        sim.advance(MIN)
        tokens += [lease.fencing_token for lease in start_ready(sim)]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens) and len(tokens) >= 4


# -- failures, retries, dead letters ----------------------------------------------------------


def test_failures_back_off_exponentially_then_dead_letter_and_replay() -> None:
    sim = Sim(T0)
    put(sim, "flaky", schedule=None, run_at=T0, max_attempts=3)
    delays = []
    for _ in range(3):
        (lease,) = start_ready(sim)
        out = complete(sim, lease, Outcome.FAILED, error="upstream 500")
        if isinstance(out[-1], ev.RetryScheduled):
            delays.append(out[-1].delay_ms)
            sim.advance(out[-1].delay_ms)
    assert delays == [10 * SEC, 20 * SEC]
    (dead,) = sim.of_type(ev.RunDeadLettered)
    assert dead.reason == ev.DeadReason.ATTEMPTS_EXHAUSTED and dead.error == "upstream 500"
    assert sim.state.runs[dead.run_id].status is RunStatus.DEAD
    assert sim.ready == deque_empty()
    (replayed,) = sim.do(ReplayRun(run_id=dead.run_id, tenant="team-a"))
    assert isinstance(replayed, ev.RunReplayed) and replayed.attempt == 4
    (lease,) = start_ready(sim)
    assert lease.attempt == 4
    out = complete(sim, lease, Outcome.FAILED, error="again")
    assert isinstance(out[-1], ev.RetryScheduled)  # the replay opened a fresh budget


def deque_empty() -> object:
    from collections import deque

    return deque()


def test_permanent_failure_dead_letters_at_once() -> None:
    sim = Sim(T0)
    put(sim, "j", schedule=None, run_at=T0)
    (lease,) = start_ready(sim)
    out = complete(sim, lease, Outcome.FAILED, error="404", permanent=True)
    assert isinstance(out[-1], ev.RunDeadLettered)
    assert out[-1].reason == ev.DeadReason.PERMANENT_FAILURE


def test_retry_after_is_honoured() -> None:
    sim = Sim(T0)
    put(sim, "j", schedule=None, run_at=T0)
    (lease,) = start_ready(sim)
    out = complete(sim, lease, Outcome.FAILED, error="429", retry_after_ms=120 * SEC)
    assert isinstance(out[-1], ev.RetryScheduled) and out[-1].delay_ms == 120 * SEC


def test_critical_run_with_unknown_outcome_is_never_retried() -> None:
    sim = Sim(T0)
    put(sim, "pay", schedule=None, run_at=T0, critical=True, lease_sec=10)
    start_ready(sim)
    sim.advance(11 * SEC)  # the worker vanished mid-call: did the charge happen?
    (dead,) = sim.of_type(ev.RunDeadLettered)
    assert dead.reason == ev.DeadReason.OUTCOME_UNKNOWN
    assert sim.of_type(ev.RetryScheduled) == [] and not sim.ready
    # A definite failure (the target answered "not done") may still be retried.
    put(sim, "pay2", schedule=None, run_at=sim.now, critical=True)
    (lease,) = start_ready(sim)
    assert isinstance(complete(sim, lease, Outcome.FAILED, error="503")[-1], ev.RetryScheduled)
    sim.advance(MIN)
    (lease,) = start_ready(sim)
    out = complete(sim, lease, Outcome.FAILED, error="timeout", ambiguous=True)
    assert out[-1].reason == ev.DeadReason.OUTCOME_UNKNOWN  # type: ignore[union-attr]


# -- misfires ------------------------------------------------------------------------------


def test_misfire_policies_after_an_outage() -> None:
    results = {}
    for policy in ("skip", "fire_once", "catch_up"):
        sim = Sim(T0)
        put(sim, "j", misfire_policy=policy, catch_up_limit=3, overlap_policy="allow")
        sim.jump(35 * MIN + 30 * SEC)  # down from 00:00 to 00:35:30
        runs = [e.scheduled_for for e in sim.of_type(ev.RunMaterialised)]
        (skipped,) = sim.of_type(ev.RunSkipped)
        results[policy] = ([(s - T0) // MIN for s in runs], skipped.count, skipped.reason)
        assert skipped.scheduled_for == T0 + MIN
        assert sim.state.jobs["j"].next_slot == T0 + 36 * MIN
    # 00:35 is inside the 60 s grace: it is on time and runs under every policy.
    assert results["skip"] == ([35], 34, "misfire")
    assert results["fire_once"] == ([35], 34, "misfire")
    assert results["catch_up"] == ([32, 33, 34, 35], 31, "misfire")


def test_fire_once_runs_the_latest_missed_slot_when_none_is_on_time() -> None:
    sim = Sim(T0)
    put(sim, "j", schedule="*/10 * * * *")
    sim.jump(35 * MIN)  # slots 10, 20, 30 all late
    assert [(e.scheduled_for - T0) // MIN for e in sim.of_type(ev.RunMaterialised)] == [30]
    (skipped,) = sim.of_type(ev.RunSkipped)
    assert (skipped.scheduled_for - T0) // MIN == 10 and skipped.count == 2
    assert (skipped.last_scheduled_for - T0) // MIN == 20


def test_catch_up_is_bounded_after_a_long_outage() -> None:
    sim = Sim(T0)
    put(
        sim,
        "j",
        schedule="* * * * * *",
        misfire_policy="catch_up",
        catch_up_limit=5,
        misfire_grace_sec=0,
    )
    sim.jump(3 * 86_400 * SEC)  # three days of per-second slots
    # five caught up, plus the slot of this very second (on time with a grace of 0)
    assert len(sim.of_type(ev.RunMaterialised)) == 6
    (skipped,) = sim.of_type(ev.RunSkipped)
    assert skipped.count is None or skipped.count > 10_000


# -- overlap ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["allow", "skip", "buffer_one", "cancel_other"])
def test_overlap_policies(policy: str) -> None:
    sim = Sim(T0)
    put(sim, "j", overlap_policy=policy, lease_sec=600)
    sim.advance(MIN)
    (first,) = start_ready(sim)
    sim.advance(2 * MIN)  # slots 2 and 3 arrive while run 1 is running
    mats = sim.of_type(ev.RunMaterialised)
    skipped = sim.of_type(ev.RunSkipped)
    if policy == "allow":
        assert len(mats) == 3 and not skipped
    elif policy == "skip":
        assert len(mats) == 1 and [s.reason for s in skipped] == ["overlap", "overlap"]
    elif policy == "buffer_one":
        assert [m.blocked for m in mats] == [False, True, False] or [m.blocked for m in mats] == [
            False,
            True,
        ]
        assert [s.reason for s in skipped] == ["overlap"]
        assert not sim.ready  # the buffered run waits
        complete(sim, first)
        (released,) = sim.of_type(ev.RunReleased)
        assert released.scheduled_for == T0 + 2 * MIN and list(sim.ready) == [released.run_id]
    else:
        cancelled = sim.of_type(ev.RunCancelled)
        assert [c.reason for c in cancelled] == ["overlap", "overlap"]
        assert cancelled[0].was_running and cancelled[0].run_id == first.run_id
        with pytest.raises(LeaseLost, match="cancelled"):
            sim.do(HeartbeatRun(run_id=first.run_id, fencing_token=first.fencing_token))


# -- pause, resume, cancel -----------------------------------------------------------------


def test_pause_stops_firing_and_resume_records_what_was_skipped() -> None:
    sim = Sim(T0)
    put(sim, "j")
    sim.advance(MIN)
    (paused,) = sim.do(PauseJob(job_id="j", tenant="team-a"))
    assert isinstance(paused, ev.JobPaused)
    assert sim.do(PauseJob(job_id="j", tenant="team-a")) == []
    sim.advance(10 * MIN)
    assert len(sim.of_type(ev.RunMaterialised)) == 1
    skipped, resumed = sim.do(ResumeJob(job_id="j", tenant="team-a"))
    assert isinstance(skipped, ev.RunSkipped) and skipped.reason == "paused"
    assert skipped.count == 10 and isinstance(resumed, ev.JobResumed)
    assert resumed.next_slot == T0 + 12 * MIN
    sim.advance(MIN)
    assert len(sim.of_type(ev.RunMaterialised)) == 2


def test_cancel_running_run_reaches_worker_on_next_heartbeat() -> None:
    sim = Sim(T0)
    put(sim, "j", target=PullTarget(pool="p"), schedule=None, run_at=T0, lease_sec=30)
    (lease,) = sim.do(ClaimRuns(tenant="team-a", pool="p", worker_id="w"))
    (cancel,) = sim.do(CancelRun(run_id=lease.run_id, tenant="team-a"))
    assert isinstance(cancel, ev.RunCancelled) and cancel.was_running
    with pytest.raises(LeaseLost, match="cancelled"):
        sim.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token))
    with pytest.raises(LeaseLost):
        complete(sim, lease)
    sim.advance(31 * SEC)
    assert sim.state.runs == {}
    assert sim.of_type(ev.RetryScheduled) == []


def test_cancel_job_cancels_live_runs_and_refuses_reuse() -> None:
    sim = Sim(T0)
    put(sim, "j", overlap_policy="allow")
    sim.advance(2 * MIN)
    events = sim.do(CancelJob(job_id="j", tenant="team-a"))
    assert isinstance(events[0], ev.JobCancelled)
    assert [e.reason for e in events[1:]] == ["job_cancelled", "job_cancelled"]
    sim.advance(10 * MIN)
    assert len(sim.of_type(ev.RunMaterialised)) == 2
    with pytest.raises(Conflict):
        sim.do(PutJob(job_id="j", spec=spec(name="again")))


# -- manual runs and dependencies --------------------------------------------------------------


def test_manual_trigger_is_idempotent_by_key_and_by_slot() -> None:
    sim = Sim(T0)
    put(sim, "j", schedule="0 0 1 1 *")
    (run,) = sim.do(TriggerRun(job_id="j", tenant="team-a", idempotency_key="k1"))
    assert run.trigger == "manual"  # type: ignore[union-attr]
    assert sim.do(TriggerRun(job_id="j", tenant="team-a", idempotency_key="k1")) == []
    slot = T0 - 86_400 * SEC
    assert len(sim.do(TriggerRun(job_id="j", tenant="team-a", scheduled_for=slot))) == 1
    assert sim.do(TriggerRun(job_id="j", tenant="team-a", scheduled_for=slot)) == []


def test_dependency_triggers_when_every_upstream_succeeded() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="load", spec=spec(schedule=None, depends_on=("a", "b"))))
    assert sim.state.jobs["load"].next_slot is None
    slot = T0 - MIN
    (rec,) = sim.do(UpstreamSucceeded(job_id="load", upstream_job_id="a", scheduled_for=slot))
    assert isinstance(rec, ev.UpstreamRecorded)
    rec, run = sim.do(UpstreamSucceeded(job_id="load", upstream_job_id="b", scheduled_for=slot))
    assert isinstance(run, ev.RunMaterialised) and run.trigger == "dependency"
    assert run.run_id == run_id_of("load", slot) and sim.state.jobs["load"].upstream == {}


# -- ageing ------------------------------------------------------------------------------------


def test_low_priority_ages_past_fresh_high_priority_work() -> None:
    sim = Sim(T0)
    pull = PullTarget(pool="p")
    put(sim, "low", target=pull, priority=0, schedule=None, run_at=T0)
    sim.advance(10 * MIN)  # "low" has waited ten minutes
    put(sim, "high", target=pull, priority=9, schedule=None, run_at=sim.now)
    (first,) = sim.do(ClaimRuns(tenant=None, pool="p", worker_id="w"))
    assert first.job_id == "low"  # 10 minutes of waiting outrank 9 levels


def test_an_outcome_sent_again_is_refused_and_records_nothing_twice() -> None:
    # A worker whose answer was lost sends its outcome again. The partition records an outcome
    # once: the repeat is refused (the token's lease is over) and decides nothing, whichever
    # outcome it says. What it is answered (as the first was, when it repeats the outcome
    # recorded) is the API's, from the run's history: api/repeats.py.
    sim = Sim(T0)
    pull = PullTarget(pool="p")
    put(sim, "ok", target=pull, schedule=None, run_at=T0)
    put(sim, "flaky", target=pull, schedule=None, run_at=T0)
    leases = sim.do(ClaimRuns(tenant=None, pool="p", worker_id="w", limit=2))
    ok, flaky = sorted(leases, key=lambda e: e.job_id)
    assert isinstance(ok, ev.LeaseGranted) and isinstance(flaky, ev.LeaseGranted)
    complete(sim, ok)
    complete(sim, flaky, Outcome.FAILED, error="upstream 500")
    before = sim.state.snapshot()
    for lease, outcome in [
        (ok, Outcome.SUCCEEDED),
        (ok, Outcome.FAILED),
        (flaky, Outcome.FAILED),
        (flaky, Outcome.SUCCEEDED),
    ]:
        again = CompleteRun(run_id=lease.run_id, fencing_token=lease.fencing_token, outcome=outcome)
        with pytest.raises(LeaseLost):
            decide(sim.state, again, sim.now)
    assert sim.state.snapshot() == before


def test_decide_does_not_change_state() -> None:
    sim = Sim(T0)
    put(sim, "j", target=PullTarget(pool="p"))
    sim.advance(3 * MIN)
    before = sim.state.snapshot()
    decide(sim.state, ClaimRuns(tenant=None, pool="p", worker_id="w", limit=5), sim.now)
    decide(sim.state, CancelJob(job_id="j", tenant="team-a"), sim.now)
    assert sim.state.snapshot() == before


def test_a_manual_run_of_the_current_slot_is_the_scheduled_run() -> None:
    sim = Sim(T0)
    put(sim, "j")
    sim.clock.set(T0 + MIN)  # the slot's instant, before its timer has been handled
    (manual,) = sim.do(TriggerRun(job_id="j", tenant="team-a", scheduled_for=T0 + MIN))
    sim.advance(1)
    assert [e.run_id for e in sim.of_type(ev.RunMaterialised)] == [manual.run_id]  # type: ignore[union-attr]
    (skip,) = sim.of_type(ev.RunSkipped)
    assert skip.scheduled_for == T0 + MIN and skip.reason == "overlap"
    assert sim.state.jobs["j"].next_slot == T0 + 2 * MIN
    with pytest.raises(InvalidDefinition) as err:
        sim.do(TriggerRun(job_id="j", tenant="team-a", scheduled_for=T0 + 10 * MIN))
    assert err.value.field == "scheduled_for"


def test_a_repeated_upstream_success_does_not_trigger_again() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="load", spec=spec(schedule=None, depends_on=("a", "b"))))
    for upstream in ("a", "b"):
        sim.do(UpstreamSucceeded(job_id="load", upstream_job_id=upstream, scheduled_for=T0))
    assert len(sim.of_type(ev.RunMaterialised)) == 1
    # The relay that delivers successes is at-least-once: a repeat of "a" must not count as a
    # new success that, with the next "b", would trigger a run "a" never succeeded for.
    assert sim.do(UpstreamSucceeded(job_id="load", upstream_job_id="a", scheduled_for=T0)) == []
    sim.do(UpstreamSucceeded(job_id="load", upstream_job_id="b", scheduled_for=T0 + MIN))
    assert len(sim.of_type(ev.RunMaterialised)) == 1
    sim.do(UpstreamSucceeded(job_id="load", upstream_job_id="a", scheduled_for=T0 + MIN))
    assert [r.scheduled_for for r in sim.of_type(ev.RunMaterialised)] == [T0, T0 + MIN]


def test_pending_runs_follow_their_job_to_a_new_target() -> None:
    # A run waits where its job's target says. Moving the job from an HTTP target to a pool
    # must hand its pending run to the pool's workers (before, its executor start stayed armed
    # and the executors, finding a pull target, dead-lettered it), and back again.
    sim = Sim(T0)
    put(sim, "j", schedule=None, run_at=T0 + 2 * MIN)
    put(sim, "j", schedule=None, run_at=T0 + 2 * MIN, overlap_policy="allow")
    sim.do(TriggerRun(job_id="j", tenant="team-a", idempotency_key="k"))
    [run_id] = list(sim.state.runs)
    sim.ready.clear()  # the executors have not looked yet
    put(sim, "j", schedule=None, run_at=T0 + 2 * MIN, target=PullTarget(pool="p"))
    assert ("ready", run_id) not in sim.partition.wheel
    sim.advance(SEC)
    assert not sim.ready  # nothing for the executors
    [lease] = sim.do(ClaimRuns(tenant="team-a", pool="p", worker_id="w"))
    assert isinstance(lease, ev.LeaseGranted) and lease.run_id == run_id
    # ... and a pool's pending run moves to the executors when its job goes to HTTP.
    put(sim, "q", schedule=None, run_at=T0 + 9 * MIN, target=PullTarget(pool="p"))
    [made] = sim.do(TriggerRun(job_id="q", tenant="team-a", idempotency_key="k"))
    put(sim, "q", schedule=None, run_at=T0 + 9 * MIN)
    sim.advance(SEC)
    assert made.run_id in sim.ready
    assert sim.do(ClaimRuns(tenant="team-a", pool="p", worker_id="w")) == []


def test_an_outcome_after_the_lease_deadline_counts_until_the_expiry_is_decided() -> None:
    # The log stalled past the lease's deadline, so the partition has not decided the expiry
    # yet: no other lease exists, and the holder's outcome is the truth (for a critical job,
    # refusing it would dead-letter a success as outcome_unknown).
    sim = Sim(T0)
    put(sim, "pay", schedule=None, run_at=T0 + SEC, critical=True, lease_sec=5)
    sim.advance(SEC)
    [lease] = start_ready(sim)
    late = lease.lease_expires_at + 3 * SEC
    sim.clock.set(late)  # no timer has run: the expiry is still undecided
    [done] = sim.do(
        CompleteRun(
            run_id=lease.run_id, fencing_token=lease.fencing_token, outcome=Outcome.SUCCEEDED
        )
    )
    assert isinstance(done, ev.RunCompleted)
    assert not sim.of_type(ev.LeaseExpired) and not sim.of_type(ev.RunDeadLettered)
    # Once the expiry is decided, the old token is refused as before.
    put(sim, "pay2", schedule=None, run_at=late + SEC, critical=True, lease_sec=5)
    sim.advance(SEC)
    [second] = start_ready(sim)
    sim.advance(6 * SEC)
    assert sim.of_type(ev.LeaseExpired)
    with pytest.raises(LeaseLost):
        sim.do(
            CompleteRun(
                run_id=second.run_id, fencing_token=second.fencing_token, outcome=Outcome.SUCCEEDED
            )
        )
