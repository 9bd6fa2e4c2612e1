"""Asking a critical run's target what became of an attempt of unknown outcome (core.asking),
on a fake clock: every answer, the bound on asks, the deadline timer, and a new owner."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core import events as ev
from core.asking import ASK_LIMIT, ASK_WAIT_MS, ask_delay_ms
from core.commands import AnswerOutcome, CancelRun, CompleteRun, Outcome, PutJob, StartRun
from core.errors import Conflict, InvalidDefinition, LeaseLost
from core.events import DeadReason, OutcomeAnswer
from core.jobs import HttpTarget, validate
from core.partition import SNAPSHOT_FORMAT, Partition
from core.state import RunStatus
from core.timers import all_timers
from tests.core.harness import Sim, spec

T0 = int(datetime(2026, 3, 2, tzinfo=UTC).timestamp() * 1000)
SEC = 1000
GUARDED = HttpTarget(url="http://127.0.0.1:9/hook", status_url="http://127.0.0.1:9/status")


def _pay(sim: Sim, job_id: str = "pay", **kw: object) -> ev.LeaseGranted:
    """A critical one-shot job due now whose target can answer, its run leased."""
    fields: dict[str, object] = dict(
        schedule=None, run_at=sim.now, critical=True, lease_sec=10, target=GUARDED
    )
    fields.update(kw)
    sim.do(PutJob(job_id=job_id, spec=spec(**fields)))
    leases = []
    while sim.ready:
        for e in sim.do(StartRun(run_id=sim.ready.popleft(), worker_id="node-1")):
            assert isinstance(e, ev.LeaseGranted)
            leases.append(e)
    (lease,) = leases
    return lease


def _timed_out(sim: Sim, lease: ev.LeaseGranted) -> list[ev.AnyEvent]:
    return sim.do(
        CompleteRun(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            outcome=Outcome.FAILED,
            error="timed out after 5.0 s",
            ambiguous=True,
        )
    )


def _answer(
    sim: Sim, lease: ev.LeaseGranted, answer: OutcomeAnswer, ask: int = 1, status: int | None = None
) -> list[ev.AnyEvent]:
    assert sim.asks.popleft() == lease.run_id  # the executors were told to ask
    return sim.do(
        AnswerOutcome(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            ask=ask,
            answer=answer,
            status=status,
        )
    )


def test_an_unknown_outcome_is_asked_about_not_set_aside() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    out = _timed_out(sim, lease)
    assert [type(e) for e in out] == [ev.RunFailed, ev.RunOutcomeAsked]
    asked = out[-1]
    assert isinstance(asked, ev.RunOutcomeAsked)
    assert (asked.ask, asked.ask_at, asked.answer_by) == (1, T0, T0 + ASK_WAIT_MS)
    assert asked.fencing_token == lease.fencing_token
    run = sim.state.runs[lease.run_id]
    assert run.status is RunStatus.ASKING and list(sim.asks) == [lease.run_id]
    assert not sim.of_type(ev.RunDeadLettered)
    # The abandoned call's late outcome is refused: the run holds no lease.
    with pytest.raises(LeaseLost):
        sim.do(
            CompleteRun(
                run_id=lease.run_id, fencing_token=lease.fencing_token, outcome=Outcome.SUCCEEDED
            )
        )


def test_succeeded_completes_the_run_by_asking() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    _timed_out(sim, lease)
    sim.advance(200)
    out = _answer(sim, lease, OutcomeAnswer.SUCCEEDED, status=201)
    answered, done = out
    assert isinstance(answered, ev.RunOutcomeAnswered)
    assert (answered.answer, answered.status, answered.ask) == ("succeeded", 201, 1)
    assert isinstance(done, ev.RunCompleted) and done.by_asking
    assert done.started_at == lease.at
    assert lease.run_id not in sim.state.runs  # completed runs leave the state
    assert sim.wheel.next_deadline() is None or ("answer", lease.run_id) not in sim.wheel
    assert sim.replayed() == sim.state.snapshot()


@pytest.mark.parametrize("answer", [OutcomeAnswer.FAILED, OutcomeAnswer.NEVER_SEEN])
def test_failed_or_never_seen_is_retried_with_a_new_token(answer: OutcomeAnswer) -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    _timed_out(sim, lease)
    out = _answer(sim, lease, answer)
    assert [type(e) for e in out] == [ev.RunOutcomeAnswered, ev.RetryScheduled]
    retry = out[-1]
    assert isinstance(retry, ev.RetryScheduled) and retry.attempt == 2
    sim.advance(retry.delay_ms)
    (second,) = [
        e
        for e in sim.do(StartRun(run_id=sim.ready.popleft(), worker_id="node-1"))
        if isinstance(e, ev.LeaseGranted)
    ]
    # The retry's token is newer than the one the target fenced.
    assert second.fencing_token > lease.fencing_token and second.attempt == 2
    assert sim.replayed() == sim.state.snapshot()


def test_failed_after_the_last_attempt_is_dead_as_exhausted() -> None:
    sim = Sim(T0)
    lease = _pay(sim, max_attempts=1)
    _timed_out(sim, lease)
    out = _answer(sim, lease, OutcomeAnswer.NEVER_SEEN)
    dead = out[-1]
    assert isinstance(dead, ev.RunDeadLettered) and dead.reason is DeadReason.ATTEMPTS_EXHAUSTED


def test_unknown_is_set_aside_at_once() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    _timed_out(sim, lease)
    out = _answer(sim, lease, OutcomeAnswer.UNKNOWN)
    dead = out[-1]
    assert isinstance(dead, ev.RunDeadLettered) and dead.reason is DeadReason.OUTCOME_UNKNOWN
    assert sim.state.runs[lease.run_id].status is RunStatus.DEAD


def test_in_progress_is_asked_again_with_backoff_up_to_the_bound() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    _timed_out(sim, lease)
    for ask in range(1, ASK_LIMIT):
        out = _answer(sim, lease, OutcomeAnswer.IN_PROGRESS, ask=ask)
        again = out[-1]
        assert isinstance(again, ev.RunOutcomeAsked) and again.ask == ask + 1
        assert again.ask_at == sim.now + ask_delay_ms(ask)
        assert not sim.asks  # not before its time
        sim.advance(ask_delay_ms(ask))
    out = _answer(sim, lease, OutcomeAnswer.NO_ANSWER, ask=ASK_LIMIT)
    dead = out[-1]
    assert isinstance(dead, ev.RunDeadLettered) and dead.reason is DeadReason.OUTCOME_UNKNOWN
    assert f"asked {ASK_LIMIT} times" in dead.error
    assert len(sim.of_type(ev.RunOutcomeAsked)) == ASK_LIMIT
    assert sim.replayed() == sim.state.snapshot()


def test_the_backoff_doubles_to_a_cap() -> None:
    assert [ask_delay_ms(n) for n in (1, 2, 3, 7, 8, 30)] == [
        1_000,
        2_000,
        4_000,
        60_000,
        60_000,
        60_000,
    ]


def test_an_ask_unanswered_by_its_deadline_counts_as_no_answer() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    _timed_out(sim, lease)
    sim.asks.clear()  # the executors were told, and never answered (hung, or died)
    sim.advance(ASK_WAIT_MS)
    (answered,) = sim.of_type(ev.RunOutcomeAnswered)
    assert isinstance(answered, ev.RunOutcomeAnswered)
    assert answered.answer is OutcomeAnswer.NO_ANSWER and answered.at == T0 + ASK_WAIT_MS
    again = sim.of_type(ev.RunOutcomeAsked)[-1]
    assert isinstance(again, ev.RunOutcomeAsked) and again.ask == 2
    # The late answer of the first ask that says nothing new decides nothing ...
    assert (
        sim.do(
            AnswerOutcome(
                run_id=lease.run_id,
                fencing_token=lease.fencing_token,
                ask=1,
                answer=OutcomeAnswer.IN_PROGRESS,
            )
        )
        == []
    )
    # ... a definite one still counts: it is about the same attempt.
    out = sim.do(
        AnswerOutcome(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            ask=1,
            answer=OutcomeAnswer.SUCCEEDED,
            status=200,
        )
    )
    assert isinstance(out[-1], ev.RunCompleted) and out[-1].by_asking


def test_every_ask_unanswered_ends_outcome_unknown_as_before() -> None:
    # A driver with no executors to ask (or a target that never answers): the deadlines answer.
    sim = Sim(T0)
    lease = _pay(sim)
    _timed_out(sim, lease)
    sim.advance(ASK_LIMIT * (ASK_WAIT_MS + 60 * SEC))
    (dead,) = sim.of_type(ev.RunDeadLettered)
    assert isinstance(dead, ev.RunDeadLettered) and dead.reason is DeadReason.OUTCOME_UNKNOWN
    assert len(sim.of_type(ev.RunOutcomeAnswered)) == ASK_LIMIT


def test_a_lost_lease_is_asked_about_too() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    sim.advance(10 * SEC)  # the worker vanished mid-call
    (expired,) = sim.of_type(ev.LeaseExpired)
    (asked,) = sim.of_type(ev.RunOutcomeAsked)
    assert expired.fencing_token == asked.fencing_token == lease.fencing_token
    out = _answer(sim, lease, OutcomeAnswer.SUCCEEDED, status=200)
    assert isinstance(out[-1], ev.RunCompleted)


def test_an_answer_for_another_token_or_a_run_not_asking_is_refused() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    with pytest.raises(Conflict):  # running, not asking
        sim.do(
            AnswerOutcome(
                run_id=lease.run_id,
                fencing_token=lease.fencing_token,
                ask=1,
                answer=OutcomeAnswer.SUCCEEDED,
            )
        )
    _timed_out(sim, lease)
    with pytest.raises(Conflict):
        sim.do(
            AnswerOutcome(
                run_id=lease.run_id,
                fencing_token=lease.fencing_token + 1,
                ask=1,
                answer=OutcomeAnswer.SUCCEEDED,
            )
        )


def test_a_run_cancelled_while_asking_leaves_no_timer() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    _timed_out(sim, lease)
    sim.do(CancelRun(run_id=lease.run_id, tenant="team-a"))
    assert ("answer", lease.run_id) not in sim.wheel and ("ask", lease.run_id) not in sim.wheel
    assert lease.run_id not in sim.state.runs


def test_unguarded_and_non_critical_targets_keep_todays_rule() -> None:
    sim = Sim(T0)
    lease = _pay(sim, "plain", target=HttpTarget(url="http://127.0.0.1:9/hook"))
    dead = _timed_out(sim, lease)[-1]
    assert isinstance(dead, ev.RunDeadLettered) and dead.reason is DeadReason.OUTCOME_UNKNOWN
    lease = _pay(sim, "lax", critical=False)
    assert isinstance(_timed_out(sim, lease)[-1], ev.RetryScheduled)
    assert not sim.of_type(ev.RunOutcomeAsked)


def test_a_new_owner_asks_at_once_what_was_being_asked() -> None:
    sim = Sim(T0)
    lease = _pay(sim)
    _timed_out(sim, lease)
    sim.advance(5 * SEC)  # the owner died before it could ask
    owner = Partition.restore(bytes([SNAPSHOT_FORMAT]) + sim.replayed(), sim.now)
    owner.advance(sim.now)
    due = [owner.next_due() for _ in range(owner.due_count())]
    assert ("ask", lease.run_id) in due
    assert ("answer", lease.run_id, T0 + ASK_WAIT_MS) in [
        (*key, deadline) for key, deadline in all_timers(owner.state)
    ]


def test_status_url_is_checked_like_the_url() -> None:
    def bad(status: str) -> str:
        target = HttpTarget(url="http://127.0.0.1:9/hook", status_url=status)
        with pytest.raises(InvalidDefinition) as err:
            validate(spec(target=target))
        return err.value.field

    assert bad("ftp://x/status") == "target.status_url"
    assert bad("http://127.0.0.1:9/hook") == "target.status_url"  # never the job's own URL
    validate(spec(target=GUARDED))
