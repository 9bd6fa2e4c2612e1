"""Leases granted ahead of the start: a claim that reaches ahead, the check before the start,
the start reported afterwards, and what a pause or a cancel does meanwhile (on a fake clock)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core import events as ev
from core.commands import ClaimRuns, CompleteRun, HeartbeatRun, Outcome, PauseJob, PutJob
from core.decide import CHECK_GUARD_MS
from core.errors import InvalidDefinition, LeaseLost
from core.jobs import PullTarget
from tests.core.harness import Sim, spec

T0 = int(datetime(2026, 3, 2, tzinfo=UTC).timestamp() * 1000)  # a Monday, 00:00 UTC
SEC = 1000
LEAD = 30 * SEC


def herd(sim: Sim, *job_ids: str, lease_sec: float = 30, **more: object) -> int:
    """One-shot pull jobs due a minute from now, materialised ahead (the lead); their slot.
    ``more``: other fields of their spec."""
    slot = T0 + 60 * SEC
    for job_id in job_ids:
        sim.do(
            PutJob(
                job_id=f"team-a/{job_id}",
                spec=spec(
                    schedule=None,
                    run_at=slot,
                    target=PullTarget(pool="p"),
                    lease_sec=lease_sec,
                    **more,
                ),
            )
        )
    sim.advance(slot - LEAD - sim.now)  # the lead begins: pending, not yet ready
    assert len(sim.of_type(ev.RunMaterialised)) == len(job_ids)
    return slot


def claim(sim: Sim, horizon_ms: int = 0, limit: int = 10) -> list[ev.LeaseGranted]:
    events = sim.do(
        ClaimRuns(tenant="team-a", pool="p", worker_id="w", limit=limit, horizon_ms=horizon_ms)
    )
    return [e for e in events if isinstance(e, ev.LeaseGranted)]


def test_a_claim_reaching_ahead_leases_runs_due_within_it_from_their_start() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = herd(sim, "a", "b")
    assert claim(sim) == []  # not ready yet: a claim that does not reach ahead gets nothing
    sim.advance(slot - 5 * SEC - sim.now)
    assert claim(sim, horizon_ms=4 * SEC) == []  # the slot is 5 s away: beyond the horizon
    leases = claim(sim, horizon_ms=5 * SEC)
    assert len(leases) == 2
    for lease in leases:
        assert lease.at == slot - 5 * SEC and lease.start_at == slot
        assert lease.lease_expires_at == slot + 30 * SEC  # the lease counts from the start
        assert lease.lateness_ms == 0
    # At the slot there is nothing left to decide: no timer fires for these runs.
    before = len(sim.log)
    sim.advance(5 * SEC)
    assert len(sim.log) == before


def test_a_run_leased_now_has_no_start_ahead() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = herd(sim, "a")
    sim.advance(slot - sim.now)
    [lease] = claim(sim, horizon_ms=5 * SEC)
    assert lease.start_at is None and lease.lease_expires_at == slot + 30 * SEC


def test_the_check_before_the_start_decides_nothing_and_a_pause_withdraws_the_run() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = herd(sim, "a", "b")
    sim.advance(slot - 5 * SEC - sim.now)
    a, b = sorted(claim(sim, horizon_ms=5 * SEC), key=lambda e: e.job_id)
    sim.advance(3 * SEC)
    check = HeartbeatRun(run_id=a.run_id, fencing_token=a.fencing_token, check=True)
    assert sim.do(check) == []  # the lease holds: the worker may start
    paused = sim.do(PauseJob(job_id="team-a/b", tenant="team-a"))
    withdrawn = [e for e in paused if isinstance(e, ev.RunCancelled)]
    assert [(e.run_id, e.reason) for e in withdrawn] == [(b.run_id, ev.CancelReason.WITHDRAWN)]
    with pytest.raises(LeaseLost):  # the worker's check: b is not to start
        sim.do(HeartbeatRun(run_id=b.run_id, fencing_token=b.fencing_token, check=True))
    assert sim.state.jobs["team-a/b"].next_slot == slot  # the slot is still to run or skip


def test_the_start_is_reported_once_by_the_first_beat_and_the_lease_never_shrinks() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = herd(sim, "a")
    sim.advance(slot - 5 * SEC - sim.now)
    [lease] = claim(sim, horizon_ms=5 * SEC)
    early = sim.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token))
    assert [type(e) for e in early] == [ev.Heartbeat]
    assert early[0].lease_expires_at == slot + 30 * SEC  # not now + 30 s
    sim.advance(5 * SEC + 10 * SEC)
    first = sim.do(
        HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token, started_late_ms=40)
    )
    assert [type(e) for e in first] == [ev.RunStarted, ev.Heartbeat]
    assert first[0].started_at == slot + 40
    assert sim.state.runs[lease.run_id].started_at == slot + 40
    again = sim.do(
        HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token, started_late_ms=40)
    )
    assert [type(e) for e in again] == [ev.Heartbeat]


def test_a_quick_run_reports_its_start_with_its_outcome() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = herd(sim, "a")
    sim.advance(slot - 2 * SEC - sim.now)
    [lease] = claim(sim, horizon_ms=5 * SEC)
    sim.advance(2 * SEC + 100)
    done = sim.do(
        CompleteRun(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            outcome=Outcome.SUCCEEDED,
            started_late_ms=7,
        )
    )
    assert [type(e) for e in done[:2]] == [ev.RunStarted, ev.RunCompleted]
    assert done[0].started_at == done[1].started_at == slot + 7


def test_a_worker_that_never_starts_lets_the_lease_run_out_from_the_start() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = herd(sim, "a", lease_sec=10)
    sim.advance(slot - 5 * SEC - sim.now)
    [lease] = claim(sim, horizon_ms=5 * SEC)
    sim.advance(5 * SEC + 10 * SEC - 1)
    assert sim.of_type(ev.LeaseExpired) == []
    sim.advance(1)
    assert [e.run_id for e in sim.of_type(ev.LeaseExpired)] == [lease.run_id]


def test_a_horizon_past_the_longest_lead_is_refused() -> None:
    sim = Sim(T0)
    with pytest.raises(InvalidDefinition) as refused:
        sim.do(ClaimRuns(tenant="team-a", pool="p", worker_id="w", horizon_ms=301 * SEC))
    assert refused.value.field == "ahead_sec"


def test_a_pause_closer_than_the_check_guard_lets_the_leased_run_start() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = herd(sim, "a", "b")
    sim.advance(slot - 5 * SEC - sim.now)
    a, b = sorted(claim(sim, horizon_ms=5 * SEC), key=lambda e: e.job_id)
    sim.advance(5 * SEC - CHECK_GUARD_MS)  # exactly the guard before the start: withdrawn
    paused = sim.do(PauseJob(job_id="team-a/a", tenant="team-a"))
    assert [e.run_id for e in paused if isinstance(e, ev.RunCancelled)] == [a.run_id]
    sim.advance(1)  # closer: its worker may have checked already, so the run starts
    paused = sim.do(PauseJob(job_id="team-a/b", tenant="team-a"))
    assert [e for e in paused if isinstance(e, ev.RunCancelled)] == []
    sim.do(HeartbeatRun(run_id=b.run_id, fencing_token=b.fencing_token, check=True))  # holds
