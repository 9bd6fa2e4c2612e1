"""A lease no worker received, given back (``ReturnLease`` -> ``LeaseReturned``): the node that
claimed it for a worker stopped waiting before the owner answered, so nobody holds the token.
The run is pending again with the attempt it had, claimed again under a new token, and the
token given back is refused like any lost lease; a critical run is never set aside for it."""

from __future__ import annotations

import pytest

from core import events as ev
from core.commands import CompleteRun, HeartbeatRun, Outcome, ReturnLease
from core.errors import LeaseLost
from tests.core.harness import Sim
from tests.core.test_lease_ahead import LEAD, SEC, T0, claim, herd


def one_shot(sim: Sim, *, critical: bool = False) -> int:
    """A one-shot pull job of team-a (a 10 s lease) due a minute from now; its slot."""
    return herd(sim, "a", lease_sec=10, critical=critical)


def give_back(sim: Sim, lease: ev.LeaseGranted) -> list[ev.AnyEvent]:
    return sim.do(ReturnLease(run_id=lease.run_id, fencing_token=lease.fencing_token))


def test_a_lease_given_back_leaves_the_run_pending_and_it_is_claimed_again_under_a_new_token() -> (
    None
):
    sim = Sim(T0, lead_ms=LEAD)
    slot = one_shot(sim, critical=True)
    sim.advance(slot - sim.now)
    [lost] = claim(sim)
    sim.advance(2 * SEC)
    [returned] = give_back(sim, lost)
    assert isinstance(returned, ev.LeaseReturned)
    assert (returned.run_id, returned.fencing_token, returned.attempt) == (lost.run_id, 1, 1)
    run = sim.state.runs[lost.run_id]
    assert run.status.value == "pending" and run.worker_id is None
    assert run.lease_expires_at is None and run.started_at is None
    # the token given back holds nothing
    with pytest.raises(LeaseLost):
        sim.do(HeartbeatRun(run_id=lost.run_id, fencing_token=lost.fencing_token))
    # claimed again at once, attempt unchanged, under a new token
    [again] = claim(sim)
    assert again.run_id == lost.run_id and again.attempt == 1
    assert again.fencing_token > lost.fencing_token
    # the first lease's expiry passes: nothing is decided for it (its timer went with it)
    sim.advance(lost.lease_expires_at - sim.now + 1)
    assert sim.of_type(ev.LeaseExpired) == [] and sim.of_type(ev.RunDeadLettered) == []
    done = sim.do(
        CompleteRun(
            run_id=again.run_id, fencing_token=again.fencing_token, outcome=Outcome.SUCCEEDED
        )
    )
    assert [type(e) for e in done] == [ev.RunCompleted]
    assert sim.replayed() == sim.state.snapshot()


def test_a_critical_run_whose_lease_is_not_given_back_is_set_aside_as_before() -> None:
    """What the return spares: the same lease left to run out sets a critical run aside."""
    sim = Sim(T0, lead_ms=LEAD)
    slot = one_shot(sim, critical=True)
    sim.advance(slot - sim.now)
    [lease] = claim(sim)
    sim.advance(lease.lease_expires_at - sim.now)
    [dead] = sim.of_type(ev.RunDeadLettered)
    assert dead.reason is ev.DeadReason.OUTCOME_UNKNOWN


def test_a_return_of_a_lease_that_ended_or_of_another_token_decides_nothing() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = one_shot(sim)
    sim.advance(slot - sim.now)
    [lease] = claim(sim)
    stale = ReturnLease(run_id=lease.run_id, fencing_token=lease.fencing_token + 7)
    assert sim.do(stale) == []
    sim.advance(lease.lease_expires_at - sim.now)  # it ran out: a retry is scheduled
    assert len(sim.of_type(ev.LeaseExpired)) == 1
    assert give_back(sim, lease) == []
    assert sim.do(ReturnLease(run_id="team-a/nothing.1", fencing_token=1)) == []


def test_a_lease_granted_ahead_and_given_back_waits_for_its_start_again() -> None:
    sim = Sim(T0, lead_ms=LEAD)
    slot = one_shot(sim)
    sim.advance(slot - 5 * SEC - sim.now)
    [ahead] = claim(sim, horizon_ms=5 * SEC)
    assert ahead.start_at == slot
    [returned] = give_back(sim, ahead)
    assert isinstance(returned, ev.LeaseReturned)
    assert claim(sim) == []  # not ready before its slot
    [again] = claim(sim, horizon_ms=5 * SEC)
    assert again.start_at == slot and again.fencing_token > ahead.fencing_token
    assert sim.replayed() == sim.state.snapshot()
