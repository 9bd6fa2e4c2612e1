"""The lead time: runs materialised ahead of their slot, so that at the slot only the start is
left. What a user sees must not change: a paused job's slot does not run, an updated schedule
does not run the old slot, a cancelled job's run is cancelled, misfire and DST rules and the
lateness are measured from the slot, and a new owner starts the run at its slot."""

from __future__ import annotations

import datetime as dt

from core import events as ev
from core.commands import (
    CancelJob,
    ClaimRuns,
    CompleteRun,
    Outcome,
    PauseJob,
    PutJob,
    ResumeJob,
    SlotDue,
    StartRun,
    TriggerRun,
)
from core.decide import decide, run_id_of
from core.jobs import HttpTarget, PullTarget
from core.partition import Partition
from tests.core.harness import Sim, spec

T0 = int(dt.datetime(2026, 3, 2, tzinfo=dt.UTC).timestamp() * 1000)  # a Monday, 00:00 UTC
SEC = 1000
MIN = 60 * SEC
LEAD = 5 * SEC
HTTP = HttpTarget(url="http://127.0.0.1:9/hook")


def put(sim: Sim, job_id: str, **kw: object) -> list[ev.AnyEvent]:
    return sim.do(PutJob(job_id=job_id, spec=spec(**kw)))


def start_ready(sim: Sim) -> list[ev.LeaseGranted]:
    granted = []
    while sim.ready:
        for e in sim.do(StartRun(run_id=sim.ready.popleft(), worker_id="node")):
            assert isinstance(e, ev.LeaseGranted)
            granted.append(e)
    return granted


def punctual(sim: Sim, until: int) -> list[ev.LeaseGranted]:
    """Run to ``until`` as a punctual node with prompt targets: every push run starts the moment
    it may, every pull run is claimed then, and each succeeds at once."""
    leases: list[ev.LeaseGranted] = []
    while True:
        got = start_ready(sim) + [
            e
            for e in sim.do(ClaimRuns(tenant=None, pool="p", worker_id="w", limit=100))
            if isinstance(e, ev.LeaseGranted)
        ]
        for lease in got:
            sim.do(
                CompleteRun(
                    run_id=lease.run_id,
                    fencing_token=lease.fencing_token,
                    outcome=Outcome.SUCCEEDED,
                )
            )
        leases += got
        deadline = sim.partition.next_deadline()
        if got:
            continue
        if deadline is None or deadline > until:
            break
        sim.advance(max(deadline, sim.now) - sim.now)
    sim.advance(until - sim.now)
    return leases


def materialised(sim: Sim) -> list[ev.RunMaterialised]:
    return [e for e in sim.events() if isinstance(e, ev.RunMaterialised)]


def test_a_run_is_materialised_a_lead_ahead_and_starts_at_its_slot() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j")
    sim.advance(MIN - 30 * SEC - LEAD - 1)
    assert materialised(sim) == []
    sim.advance(1)
    (run,) = materialised(sim)
    assert (run.at, run.scheduled_for, run.available_at) == (T0 + MIN - LEAD, T0 + MIN, T0 + MIN)
    assert sim.state.runs[run.run_id].status == "pending"
    assert sim.state.jobs["j"].next_slot == T0 + 2 * MIN
    sim.advance(LEAD - 1)
    assert not sim.ready  # not before its slot
    sim.advance(1)
    (lease,) = start_ready(sim)
    assert lease.lateness_ms == 0 and lease.at == T0 + MIN  # measured from the slot


def test_every_slot_of_a_recurring_job_is_materialised_ahead() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j")
    leases = punctual(sim, T0 + 5 * MIN)
    assert [(e.scheduled_for - e.at) for e in materialised(sim)] == [LEAD] * 5
    assert [lease.lateness_ms for lease in leases] == [0] * 5
    assert sim.replayed() == sim.state.snapshot()


def test_without_a_lead_the_slot_is_decided_at_the_slot() -> None:
    sim = Sim(T0 + 30 * SEC)
    put(sim, "j")
    punctual(sim, T0 + 3 * MIN)
    assert [e.at - e.scheduled_for for e in materialised(sim)] == [0, 0, 0]


def test_a_live_run_keeps_the_next_slot_for_the_overlap_policy_at_the_slot() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j", overlap_policy="skip")
    sim.advance(30 * SEC)
    start_ready(sim)  # running, never completing
    sim.advance(MIN - 1)
    assert len(materialised(sim)) == 1 and sim.of_type(ev.RunSkipped) == []
    sim.advance(1)
    (skip,) = sim.of_type(ev.RunSkipped)
    assert isinstance(skip, ev.RunSkipped)
    assert skip.reason == "overlap" and skip.at == skip.scheduled_for == T0 + 2 * MIN


def test_under_allow_a_live_run_leaves_the_next_slot_materialised_ahead_one_at_a_time() -> None:
    """Under ``allow`` the slot runs whatever is live, so a run still open at the next slot's
    lead time (a call slower than the gap between slots, or its outcome recorded late) no longer
    turns every later slot into one decided at the slot: the next one is materialised ahead once
    the latest live run's start has come, and never more than one is ahead of its slot."""
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j", schedule=None, interval_sec=2, target=HTTP)  # its first slot: now
    for _ in range(5):  # each slot's run starts at its slot, and its call never ends
        (lease,) = start_ready(sim)
        assert lease.lateness_ms == 0
        sim.advance(2 * SEC)
        live = sim.state.jobs["j"].live
        assert len([r for r in live if sim.state.runs[r].scheduled_for > sim.now]) == 1
    runs = materialised(sim)
    # the first at its slot (due as it was registered); each later one a slot ahead, as the
    # run before it came to its start
    assert [e.scheduled_for - e.at for e in runs] == [0] + [2 * SEC] * (len(runs) - 1)
    assert len(runs) == 7  # five started, one at its slot now, one ahead: never more
    assert sim.replayed() == sim.state.snapshot()


def test_a_pause_before_the_slot_withdraws_the_run_and_the_slot_is_skipped_on_resume() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j")
    sim.advance(30 * SEC - 2 * SEC)  # the run of T0 + 1 min is materialised, not yet due
    (run,) = materialised(sim)
    withdrawn, paused = sim.do(PauseJob(job_id="j", tenant="team-a"))
    assert isinstance(withdrawn, ev.RunCancelled) and isinstance(paused, ev.JobPaused)
    assert withdrawn.reason == "withdrawn" and withdrawn.next_slot == T0 + MIN
    assert sim.state.runs == {} and sim.state.jobs["j"].live == ()
    assert sim.state.jobs["j"].next_slot == T0 + MIN  # the withdrawn slot is still the next
    sim.advance(3 * MIN)
    assert sim.of_type(ev.LeaseGranted) == [] and not sim.ready
    skipped, _ = sim.do(ResumeJob(job_id="j", tenant="team-a"))
    assert isinstance(skipped, ev.RunSkipped) and skipped.reason == "paused"
    assert skipped.scheduled_for == run.scheduled_for == T0 + MIN and skipped.count == 3
    assert sim.replayed() == sim.state.snapshot()


def test_a_pause_and_resume_before_the_slot_runs_the_slot_on_time() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j")
    sim.advance(28 * SEC)
    sim.do(PauseJob(job_id="j", tenant="team-a"))
    sim.advance(SEC)
    assert sim.do(ResumeJob(job_id="j", tenant="team-a"))[-1].next_slot == T0 + MIN  # type: ignore[union-attr]
    sim.advance(SEC)
    (lease,) = start_ready(sim)
    assert lease.scheduled_for == T0 + MIN and lease.lateness_ms == 0
    assert [e.scheduled_for for e in materialised(sim)] == [T0 + MIN, T0 + MIN]


def test_a_schedule_change_before_the_slot_does_not_run_the_old_slot() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j")
    sim.advance(28 * SEC)
    (old,) = materialised(sim)
    withdrawn, updated = put(sim, "j", schedule="*/2 * * * *")
    assert isinstance(withdrawn, ev.RunCancelled) and withdrawn.reason == "withdrawn"
    assert isinstance(updated, ev.JobUpdated) and updated.next_slot == T0 + 2 * MIN
    leases = punctual(sim, T0 + 5 * MIN)
    assert old.run_id not in {lease.run_id for lease in leases}
    assert [lease.scheduled_for for lease in leases] == [T0 + 2 * MIN, T0 + 4 * MIN]
    assert sim.replayed() == sim.state.snapshot()


def test_another_change_keeps_the_run_materialised_ahead() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j")
    sim.advance(28 * SEC)
    (updated,) = put(sim, "j", payload={"v": 2})
    assert isinstance(updated, ev.JobUpdated)
    sim.advance(2 * SEC)
    (lease,) = start_ready(sim)
    assert lease.scheduled_for == T0 + MIN


def test_a_cancelled_jobs_run_materialised_ahead_is_cancelled() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j")
    sim.advance(28 * SEC)
    (run,) = materialised(sim)
    cancelled, cancel = sim.do(CancelJob(job_id="j", tenant="team-a"))
    assert isinstance(cancel, ev.RunCancelled) and cancel.run_id == run.run_id
    assert cancel.reason == "job_cancelled" and isinstance(cancelled, ev.JobCancelled)
    sim.advance(5 * MIN)
    assert sim.of_type(ev.LeaseGranted) == [] and not sim.ready


def test_a_one_shot_is_materialised_ahead_and_runs_at_run_at() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    put(sim, "once", schedule=None, run_at=T0 + MIN)
    leases = punctual(sim, T0 + 2 * MIN)
    (run,) = materialised(sim)
    assert run.at == T0 + MIN - LEAD and run.next_slot is None
    assert [(lease.scheduled_for, lease.lateness_ms) for lease in leases] == [(T0 + MIN, 0)]


def test_a_paused_one_shot_runs_when_resumed_as_before() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    put(sim, "once", schedule=None, run_at=T0 + MIN)
    sim.advance(MIN - 2 * SEC)
    sim.do(PauseJob(job_id="once", tenant="team-a"))
    sim.advance(MIN)
    assert sim.of_type(ev.LeaseGranted) == []
    sim.do(ResumeJob(job_id="once", tenant="team-a"))
    (lease,) = punctual(sim, sim.now + SEC)
    assert lease.scheduled_for == T0 + MIN and lease.lateness_ms == MIN - 2 * SEC  # from run_at


def test_misfires_after_an_outage_are_decided_from_the_slot_as_without_a_lead() -> None:
    def outcome(lead_ms: int) -> list[tuple[str, int, str]]:
        sim = Sim(T0 + 30 * SEC, lead_ms=lead_ms)
        put(sim, "j", misfire_policy="skip", misfire_grace_sec=10)
        sim.jump(10 * MIN)  # down from before the first slot's lead time
        punctual(sim, sim.now + 3 * MIN)
        return [
            (type(e).__name__, e.scheduled_for, getattr(e, "reason", ""))
            for e in sim.events()
            if isinstance(e, ev.RunMaterialised | ev.RunSkipped | ev.LeaseGranted)
        ]

    assert outcome(LEAD) == outcome(0)
    assert outcome(LEAD)[0] == ("RunSkipped", T0 + MIN, "misfire")


def test_dst_repeats_are_skipped_as_without_a_lead() -> None:
    def utc(text: str) -> int:
        return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()) * SEC

    def outcome(lead_ms: int) -> list[tuple[str, int, str]]:
        sim = Sim(utc("2024-11-02T20:00"), lead_ms=lead_ms)
        put(sim, "j", schedule="*/20 1 * * *", timezone="America/New_York")
        punctual(sim, utc("2024-11-04T12:00"))
        return [
            (type(e).__name__, e.scheduled_for, getattr(e, "reason", ""))
            for e in sim.events()
            if isinstance(e, ev.RunMaterialised | ev.RunSkipped)
        ]

    with_lead = outcome(LEAD)
    assert with_lead == outcome(0)
    assert [s for kind, s, why in with_lead if why == "dst"] == [
        utc("2024-11-03T06:00"),
        utc("2024-11-03T06:20"),
        utc("2024-11-03T06:40"),
    ]


def test_a_new_owner_starts_a_run_materialised_ahead_at_its_slot() -> None:
    for target in (HTTP, PullTarget(pool="p")):
        sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
        put(sim, "j", target=target)
        sim.advance(28 * SEC)  # materialised; then the owner dies
        (run,) = materialised(sim)
        owner = Partition.restore(sim.partition.snapshot(), sim.now, lead_ms=LEAD)
        assert owner.state.runs[run.run_id].status == "pending"
        now = sim.now
        owner.advance(T0 + MIN - 1)
        assert owner.next_due() is None
        early = owner.handle(ClaimRuns(tenant=None, pool="p", worker_id="w", limit=10), now)
        assert early == []  # not claimable before its slot
        owner.advance(T0 + MIN)
        if target is HTTP:
            assert owner.next_due() == ("ready", run.run_id)
            (lease,) = owner.handle(StartRun(run_id=run.run_id, worker_id="n2"), T0 + MIN)
        else:
            (lease,) = owner.handle(
                ClaimRuns(tenant=None, pool="p", worker_id="w", limit=10), T0 + MIN
            )
        assert isinstance(lease, ev.LeaseGranted)
        assert lease.run_id == run.run_id and lease.lateness_ms == 0


def test_the_horizon_comes_from_the_command() -> None:
    sim = Sim(T0 + 30 * SEC)
    put(sim, "j")
    now = T0 + 50 * SEC
    assert decide(sim.state, SlotDue(job_id="j"), now) == []
    assert decide(sim.state, SlotDue(job_id="j", through=T0 + 59 * SEC), now) == []
    (run,) = decide(sim.state, SlotDue(job_id="j", through=T0 + MIN), now)
    assert isinstance(run, ev.RunMaterialised) and run.run_id == run_id_of("j", T0 + MIN)
    assert run.at == now and run.next_slot == T0 + 2 * MIN


def test_a_critical_run_materialised_ahead_is_still_never_run_twice() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j", critical=True, lease_sec=10)
    sim.advance(30 * SEC)
    (lease,) = start_ready(sim)
    sim.advance(11 * SEC)  # the worker went silent: the outcome is unknown
    (dead,) = sim.of_type(ev.RunDeadLettered)
    assert isinstance(dead, ev.RunDeadLettered) and dead.reason == "outcome_unknown"
    assert dead.run_id == lease.run_id and sim.of_type(ev.RetryScheduled) == []


def test_a_new_owner_that_comes_past_the_grace_skips_a_run_materialised_ahead_under_skip() -> None:
    # As without a lead: had the slot been decided by the late owner, it would be a misfire.
    for target in (HTTP, PullTarget(pool="p")):
        sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
        put(sim, "j", target=target, misfire_policy="skip", misfire_grace_sec=10)
        sim.advance(28 * SEC)  # materialised ahead; then the owner dies
        (run,) = materialised(sim)
        owner = Partition.restore(sim.partition.snapshot(), sim.now, lead_ms=LEAD)
        late = T0 + MIN + 11 * SEC
        owner.advance(late)
        if target is HTTP:
            events = owner.handle(StartRun(run_id=run.run_id, worker_id="n2"), late)
        else:
            events = owner.handle(ClaimRuns(tenant=None, pool="p", worker_id="w", limit=10), late)
        assert not any(isinstance(e, ev.LeaseGranted) for e in events)
        withdrawn, skipped = events
        assert isinstance(withdrawn, ev.RunCancelled) and withdrawn.reason == "withdrawn"
        assert isinstance(skipped, ev.RunSkipped) and skipped.reason == "misfire"
        assert skipped.scheduled_for == run.scheduled_for and skipped.count == 1
        assert owner.state.runs == {} and owner.state.jobs["j"].next_slot == T0 + 2 * MIN


def test_a_late_start_within_the_grace_or_under_fire_once_still_runs() -> None:
    for policy, late in (("skip", 10 * SEC), ("fire_once", 11 * SEC)):
        sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
        put(sim, "j", misfire_policy=policy, misfire_grace_sec=10)
        sim.advance(28 * SEC)
        (run,) = materialised(sim)
        owner = Partition.restore(sim.partition.snapshot(), sim.now, lead_ms=LEAD)
        owner.advance(T0 + MIN + late)
        (lease,) = owner.handle(StartRun(run_id=run.run_id, worker_id="n2"), T0 + MIN + late)
        assert isinstance(lease, ev.LeaseGranted) and lease.lateness_ms == late


def test_a_manual_run_beside_a_run_ahead_leaves_the_slot_to_the_overlap_policy() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j", overlap_policy="skip")
    sim.advance(28 * SEC)  # the run of T0 + 1 min is materialised ahead
    (ahead,) = materialised(sim)
    withdrawn, manual = sim.do(TriggerRun(job_id="j", tenant="team-a"))
    assert isinstance(withdrawn, ev.RunCancelled) and withdrawn.reason == "withdrawn"
    assert withdrawn.run_id == ahead.run_id and withdrawn.next_slot == T0 + MIN
    assert isinstance(manual, ev.RunMaterialised) and manual.trigger == "manual"
    start_ready(sim)  # the manual run starts and is still running at the slot
    sim.advance(T0 + MIN - sim.now)
    (skip,) = sim.of_type(ev.RunSkipped)
    assert isinstance(skip, ev.RunSkipped) and skip.reason == "overlap"
    assert skip.scheduled_for == T0 + MIN and not sim.ready
    assert sim.replayed() == sim.state.snapshot()


def test_a_manual_run_under_allow_leaves_the_run_ahead_in_place() -> None:
    sim = Sim(T0 + 30 * SEC, lead_ms=LEAD)
    put(sim, "j")
    sim.advance(28 * SEC)
    (ahead,) = materialised(sim)
    (manual,) = sim.do(TriggerRun(job_id="j", tenant="team-a"))
    assert isinstance(manual, ev.RunMaterialised) and ahead.run_id in sim.state.runs
