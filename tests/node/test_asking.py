"""A node on the embedded log asking a guarded target what became of a critical run's attempt
(core.asking), with real time: the target is the SDK's guard in front of a slow handler, served
on loopback, and the call takes effect after cronlog gave up on it (its timeout, or its lease
that ran out). The run ends completed by the guard's answer, its work done once; with an
unguarded target it ends ``outcome_unknown``, as before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cronlog_client import CronlogTargetMiddleware, RunGuard, bearer_token
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.commands import PutJob
from core.jobs import Backoff, HttpTarget, JobSpec
from eventlog.embedded import EmbeddedLog
from node.executors import Executors
from node.node import Node
from projections.views import RunView
from tests.node.targets import LOOPBACK_ALLOWED
from tests.sdk.conftest import Loopback

pytestmark = pytest.mark.slow

SECRET = "s3cret"


class Payments:
    """A guarded service whose handler takes ``delay_s`` to do its work."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.done: list[int] = []  # the fencing tokens whose work was done
        self.asks = 0

        async def pay(request: Request) -> JSONResponse:
            await asyncio.sleep(self.delay_s)  # cronlog gives up on the call meanwhile
            self.done.append(int(request.headers["x-cronlog-fencing-token"]))
            return JSONResponse({"paid": True}, status_code=201)

        guard = RunGuard()
        answer = guard.answer

        def counted(headers: dict[str, str]) -> object:
            self.asks += 1
            return answer(headers)

        guard.answer = counted  # type: ignore[method-assign]
        app = Starlette(routes=[Route("/pay", pay, methods=["POST"])])
        self.server = Loopback(
            CronlogTargetMiddleware(
                app, guard, status_path="/cronlog/status", authorize=bearer_token(SECRET)
            )
        )

    def target(self, guarded: bool) -> HttpTarget:
        return HttpTarget(
            url=f"{self.server.url}/pay",
            headers={"Authorization": f"Bearer {SECRET}"},
            status_url=f"{self.server.url}/cronlog/status" if guarded else None,
        )


@pytest.fixture
def payments() -> Iterator[Payments]:
    service = Payments(delay_s=2.5)
    yield service
    service.server.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    log = EmbeddedLog.open(tmp_path / "log", 2)
    n = Node(
        log, tmp_path / "node", node_id="n1", executors=Executors("n1", egress=LOOPBACK_ALLOWED)
    )
    n.start()
    assert n.wait_ready(10)
    yield n
    n.stop()
    log.close()


def pay(node: Node, job_id: str, target: HttpTarget, **kw: object) -> str:
    """A critical one-shot payment due now; its run's id."""
    slot = time.time_ns() // 1_000_000 + 200
    fields: dict[str, object] = dict(
        name="pay",
        tenant="team-a",
        target=target,
        run_at=slot,
        critical=True,
        backoff=Backoff(base_sec=0.2, factor=2, cap_sec=5, jitter=False),
    )
    fields.update(kw)
    asyncio.run(node.execute(PutJob(job_id=job_id, spec=JobSpec(**fields))))  # type: ignore[arg-type]
    return f"{job_id}.{slot}"


def ended(node: Node, run_id: str, timeout_s: float = 20) -> RunView:
    def done() -> bool:
        view = node.history.run("team-a", run_id)
        return view is not None and view.state in ("succeeded", "dead")

    assert node.history.wait_until(done, timeout_s), node.history.run("team-a", run_id)
    view = node.history.run("team-a", run_id)
    assert view is not None
    return view


def test_a_call_that_timed_out_but_took_effect_completes_by_the_guards_answer(
    node: Node, payments: Payments
) -> None:
    run_id = pay(node, "timed-out", payments.target(guarded=True), timeout_sec=1.0)
    view = ended(node, run_id)
    assert view.state == "succeeded" and view.dead_reason is None
    assert len(payments.done) == 1  # the work was done once, by the call cronlog gave up on
    answers = [a.answer for a in view.asks]
    assert answers[-1] == "succeeded" and view.asks[-1].status == 201
    assert set(answers[:-1]) <= {"in_progress"}  # asked while the handler still ran
    assert all(a.fencing_token == payments.done[0] for a in view.asks)
    (attempt,) = view.attempts
    assert attempt.outcome == "succeeded" and "timed out" in attempt.error


def test_a_lease_lost_mid_call_completes_by_the_guards_answer(
    node: Node, payments: Payments, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node's heartbeats do not get through (a long pause): the lease runs out mid-call,
    # and the call's own success, arriving after that, is refused.
    monkeypatch.setattr("node.executors.first_beat_s", lambda *args: 3600.0)
    run_id = pay(node, "lease-lost", payments.target(guarded=True), lease_sec=1.0)
    view = ended(node, run_id)
    assert view.state == "succeeded" and len(payments.done) == 1
    (attempt,) = view.attempts
    assert attempt.outcome == "succeeded"  # closed as lease_expired, then answered
    assert view.asks[-1].answer == "succeeded" and payments.asks == len(view.asks)


def test_an_unguarded_target_keeps_todays_rule(node: Node, payments: Payments) -> None:
    run_id = pay(node, "unguarded", payments.target(guarded=False), timeout_sec=1.0)
    view = ended(node, run_id)
    assert view.state == "dead" and view.dead_reason == "outcome_unknown"
    assert view.asks == [] and payments.asks == 0


def test_only_a_guards_status_answer_says_anything() -> None:
    from core.events import OutcomeAnswer
    from node.caller import read_answer

    assert read_answer(200, b'{"outcome": "succeeded", "status": 201}').status == 201
    assert read_answer(200, b'{"outcome": "never_seen"}').answer is OutcomeAnswer.NEVER_SEEN
    for status, body in (
        (404, b'{"outcome": "succeeded"}'),  # not a guard's answer: an app's route, or none
        (200, b"<html>ok</html>"),
        (200, b'{"outcome": "no_answer"}'),  # the caller's own word, never the target's
        (200, b'{"outcome": "done"}'),
    ):
        assert read_answer(status, body).answer is OutcomeAnswer.NO_ANSWER
