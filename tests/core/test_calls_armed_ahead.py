"""Calls armed ahead: a push run's lease is granted its arming time before its start, counting
from the start, and the executor makes the call then (node/executors.py); a pause or a
schedule change withdraws the armed call while its start is at least ``ARM_GUARD_MS`` away
(never a critical job's), a cancel cancels it (the node's executors drop it), and a node that
dies between the arming and the start leaves a lease that runs out from the start."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core import events as ev
from core.commands import (
    CancelJob,
    CompleteRun,
    Outcome,
    PauseJob,
    PutJob,
    StartRun,
)
from core.decide import ARM_GUARD_MS, MAX_HORIZON_MS
from core.errors import Conflict, InvalidDefinition
from core.jobs import HttpTarget, PullTarget
from core.partition import Partition
from core.state import RunStatus
from tests.core.harness import Sim, spec

T0 = int(datetime(2026, 3, 2, tzinfo=UTC).timestamp() * 1000)
SEC = 1000
LEAD = 30 * SEC
ARM = 2 * SEC
HOOK = HttpTarget(url="https://hooks.example.com/x")


def one_shot(sim: Sim, job_id: str, at: int, target: object = HOOK, **kw: object) -> None:
    sim.do(
        PutJob(job_id=f"team-a/{job_id}", spec=spec(schedule=None, run_at=at, target=target, **kw))
    )


def start(sim: Sim, run_id: str, horizon_ms: int = ARM) -> list[ev.AnyEvent]:
    return sim.do(StartRun(run_id=run_id, worker_id="n1/executor", horizon_ms=horizon_ms))


def test_a_push_run_comes_ready_its_arming_time_early_and_is_leased_from_its_start() -> None:
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    slot = T0 + 60 * SEC
    one_shot(sim, "a", slot)
    sim.advance(slot - ARM - 1 - sim.now)
    assert not sim.ready  # not yet armed
    sim.advance(1)
    [run_id] = sim.ready  # armed now, two seconds before its slot
    [lease] = [e for e in start(sim, run_id) if isinstance(e, ev.LeaseGranted)]
    assert lease.at == slot - ARM and lease.start_at == slot
    assert lease.lease_expires_at == slot + 30 * SEC and lease.lateness_ms == 0


def test_a_start_beyond_the_horizon_is_refused_and_the_horizon_is_bounded() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = T0 + 60 * SEC
    one_shot(sim, "a", slot)
    sim.advance(slot - 5 * SEC - sim.now)
    [run_id] = list(sim.state.runs)
    with pytest.raises(Conflict):
        start(sim, run_id, horizon_ms=4 * SEC)
    with pytest.raises(InvalidDefinition):
        start(sim, run_id, horizon_ms=MAX_HORIZON_MS + 1)
    with pytest.raises(ValueError):
        Partition(0, T0, arm_ms=MAX_HORIZON_MS + 1)


def test_the_armed_start_is_recorded_with_the_outcome() -> None:
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    slot = T0 + 60 * SEC
    one_shot(sim, "a", slot)
    sim.advance(slot - ARM - sim.now)
    [lease] = [e for e in start(sim, sim.ready.popleft()) if isinstance(e, ev.LeaseGranted)]
    sim.advance(ARM + 300)
    done = sim.do(
        CompleteRun(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            outcome=Outcome.SUCCEEDED,
            started_late_ms=12,
        )
    )
    started = [e for e in done if isinstance(e, ev.RunStarted)]
    assert [e.started_at for e in started] == [slot + 12]
    assert isinstance(done[-1], ev.RunCompleted)


def test_a_pause_withdraws_an_armed_call_only_while_its_start_is_far_enough() -> None:
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    slot = T0 + 60 * SEC
    for name in ("early", "late", "critical"):
        one_shot(sim, name, slot, critical=name == "critical")
    sim.advance(slot - ARM - sim.now)
    while sim.ready:
        start(sim, sim.ready.popleft())

    def pause(name: str) -> list[ev.RunCancelled]:
        events = sim.do(PauseJob(job_id=f"team-a/{name}", tenant="team-a"))
        return [e for e in events if isinstance(e, ev.RunCancelled)]

    sim.advance(ARM - ARM_GUARD_MS)  # exactly the guard before the start: still withdrawn
    [withdrawn] = pause("early")
    assert withdrawn.reason is ev.CancelReason.WITHDRAWN and withdrawn.next_slot == slot
    assert pause("critical") == []  # a critical job's armed call goes ahead
    sim.advance(1)  # inside the guard: the call goes ahead, the pause holds from the next slot
    assert pause("late") == []


def test_a_cancelled_job_cancels_its_armed_run() -> None:
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    slot = T0 + 60 * SEC
    one_shot(sim, "a", slot)
    sim.advance(slot - ARM - sim.now)
    [lease] = [e for e in start(sim, sim.ready.popleft()) if isinstance(e, ev.LeaseGranted)]
    cancelled = sim.do(CancelJob(job_id="team-a/a", tenant="team-a"))
    assert [e.run_id for e in cancelled if isinstance(e, ev.RunCancelled)] == [lease.run_id]


def test_a_lease_armed_and_never_started_runs_out_from_its_start() -> None:
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    slot = T0 + 60 * SEC
    one_shot(sim, "a", slot, lease_sec=10)
    sim.advance(slot - ARM - sim.now)
    [lease] = [e for e in start(sim, sim.ready.popleft()) if isinstance(e, ev.LeaseGranted)]
    assert lease.lease_expires_at == slot + 10 * SEC
    sim.advance(ARM + 10 * SEC - 1)
    assert not sim.of_type(ev.LeaseExpired)  # not counted from the arming
    sim.advance(1)
    assert [e.run_id for e in sim.of_type(ev.LeaseExpired)] == [lease.run_id]


def every_second(sim: Sim, job_id: str, **kw: object) -> None:
    sim.do(PutJob(job_id=f"team-a/{job_id}", spec=spec(schedule="* * * * * *", **kw)))


def run_steadily(sim: Sim, until: int, step_ms: int = 250) -> list[ev.LeaseGranted]:
    """Drive the partition as its node would: start each run whose call comes due (its
    arming time early), and complete each call 100 ms after its start; the leases granted."""
    leases: list[ev.LeaseGranted] = []
    open_calls: list[ev.LeaseGranted] = []
    while sim.now < until:
        while sim.ready:
            granted = [e for e in start(sim, sim.ready.popleft()) if isinstance(e, ev.LeaseGranted)]
            leases += granted
            open_calls += granted
        for lease in [c for c in open_calls if (c.start_at or c.at) + 100 <= sim.now]:
            open_calls.remove(lease)
            sim.do(
                CompleteRun(
                    run_id=lease.run_id,
                    fencing_token=lease.fencing_token,
                    outcome=Outcome.SUCCEEDED,
                    started_late_ms=0,
                )
            )
        sim.advance(step_ms)
    return leases


def armed_slots(sim: Sim, job_id: str) -> list[int]:
    """The slots of the job's runs leased ahead of their start: calls armed, not made yet."""
    return sorted(
        run.scheduled_for
        for run in sim.state.runs.values()
        if run.job_id == f"team-a/{job_id}" and run.start_at is not None and run.start_at > sim.now
    )


def test_a_job_due_more_often_than_the_arming_time_keeps_its_calls_armed_that_far_ahead() -> None:
    """An every-second job under ``allow`` keeps runs materialised, and their calls armed, its
    arming time ahead of now (one slot after another, never more than the slots within it and
    one more): a node that stops deciding its partition at any instant has already armed every
    call due within the arming time, so a hand-over shorter than that leaves no slot late."""
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    every_second(sim, "tick")
    leases = run_steadily(sim, T0 + 40 * SEC)
    assert leases and all(lease.lateness_ms == 0 for lease in leases)
    assert all(lease.start_at == lease.scheduled_for for lease in leases)
    for _ in range(12):  # at instants within the second, and across it
        sim_slots = armed_slots(sim, "tick")
        due_within = [s for s in range(sim.now - sim.now % SEC + SEC, sim.now + ARM, SEC)]
        assert set(due_within) <= set(sim_slots), (sim.now, sim_slots)
        ahead = [r for r in sim.state.runs.values() if r.scheduled_for > sim.now]
        assert len(ahead) <= ARM // SEC + 1
        run_steadily(sim, sim.now + 250)
    assert sim.replayed() == sim.state.snapshot()


def test_without_an_arming_time_or_for_a_pull_job_one_run_at_most_is_ahead() -> None:
    pull = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    pull.do(
        PutJob(
            job_id="team-a/pulled",
            spec=spec(schedule="* * * * * *", target=PullTarget(pool="p")),
        )
    )
    unarmed = Sim(T0, lead_ms=LEAD)
    every_second(unarmed, "tick")
    for sim in (pull, unarmed):
        for _ in range(40):
            run_steadily(sim, sim.now + 250)
            ahead = [r for r in sim.state.runs.values() if r.scheduled_for > sim.now]
            assert len([r for r in ahead if r.status is RunStatus.PENDING]) <= 1


def test_a_pause_withdraws_every_armed_run_far_enough_from_its_start() -> None:
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    every_second(sim, "tick")
    run_steadily(sim, T0 + 40 * SEC + 300)  # 0.7 s before a slot: the next two are armed
    assert armed_slots(sim, "tick") == [T0 + 41 * SEC, T0 + 42 * SEC]
    ahead = {r.scheduled_for for r in sim.state.runs.values() if r.scheduled_for > sim.now}
    assert ahead == {T0 + 41 * SEC, T0 + 42 * SEC, T0 + 43 * SEC}  # the last not armed yet
    events = sim.do(PauseJob(job_id="team-a/tick", tenant="team-a"))
    withdrawn = [e for e in events if isinstance(e, ev.RunCancelled)]
    assert {e.scheduled_for for e in withdrawn} == ahead
    assert all(e.next_slot == T0 + 41 * SEC for e in withdrawn)
    assert sim.state.jobs["team-a/tick"].next_slot == T0 + 41 * SEC
    assert armed_slots(sim, "tick") == []
    assert sim.replayed() == sim.state.snapshot()


def test_a_critical_job_keeps_one_call_armed_ahead_at_most() -> None:
    """A node killed before its armed starts leaves each such lease ambiguous, and a critical
    run's ambiguity is asked about or set aside: so a critical job does not reach ahead."""
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    every_second(sim, "pay", critical=True)
    for _ in range(40):
        run_steadily(sim, sim.now + 250)
        assert len(armed_slots(sim, "pay")) <= 1
        ahead = [r for r in sim.state.runs.values() if r.scheduled_for > sim.now]
        assert len(ahead) <= 1


def test_a_hand_over_s_last_batch_arms_a_critical_job_s_calls_through_the_arming_time() -> None:
    """A node that hands its partitions over, and then drains, makes the calls it armed: its
    last batch (``Partition.arm_ahead``) arms a critical job's next calls through the arming
    time, as every other push job's always are, so a hand-over longer than a second leaves
    none of its slots late. Other jobs are left as they were."""
    sim = Sim(T0, lead_ms=LEAD, arm_ms=ARM)
    every_second(sim, "pay", critical=True)
    every_second(sim, "tick")
    sim.do(
        PutJob(
            job_id="team-a/pulled",
            spec=spec(schedule="* * * * * *", target=PullTarget(pool="p")),
        )
    )
    run_steadily(sim, T0 + 40 * SEC + 150)  # a hand-over begins 150 ms into a second

    def runs_of(job: str) -> list[int]:
        return sorted(r.scheduled_for for r in sim.state.runs.values() if r.job_id == job)

    assert armed_slots(sim, "pay") == [T0 + 41 * SEC]  # one armed, as always
    tick, pulled = armed_slots(sim, "tick"), runs_of("team-a/pulled")
    events = sim.partition.arm_ahead(sim.now)
    assert {e.job_id for e in events} == {"team-a/pay"}
    sim.log.extend(ev.encode(e) for e in events)
    sim.advance(0)  # their calls' ready timers came due with the events
    while sim.ready:
        start(sim, sim.ready.popleft())
    assert armed_slots(sim, "pay") == [T0 + 41 * SEC, T0 + 42 * SEC]
    assert armed_slots(sim, "tick") == tick and runs_of("team-a/pulled") == pulled
    assert sim.partition.arm_ahead(sim.now) == []  # armed through the arming time already
    assert sim.replayed() == sim.state.snapshot()
    unarmed = Sim(T0, lead_ms=LEAD)
    every_second(unarmed, "pay", critical=True)
    run_steadily(unarmed, T0 + 40 * SEC + 150)
    assert unarmed.partition.arm_ahead(unarmed.now) == []  # no arming time, nothing armed


def test_a_hand_over_s_last_batch_reaches_as_far_as_a_longer_arming_time() -> None:
    """The last batch applies the reach of every other push job to the critical one: with a
    5 s arming time, each of its next five calls is armed, not only the next one after those
    already leased."""
    arm = 5 * SEC
    sim = Sim(T0, lead_ms=LEAD, arm_ms=arm)
    every_second(sim, "pay", critical=True)
    run_steadily(sim, T0 + 40 * SEC + 150)
    events = sim.partition.arm_ahead(sim.now)
    sim.log.extend(ev.encode(e) for e in events)
    sim.advance(0)
    while sim.ready:
        start(sim, sim.ready.popleft(), horizon_ms=arm)
    assert armed_slots(sim, "pay") == [T0 + s * SEC for s in range(41, 46)]
    assert sim.replayed() == sim.state.snapshot()
