"""A call's outcome for a partition this node runs goes straight to the partition's runner and
is answered on the runner's thread (``Executors.submit_local``): the call's room comes back with
the answer. A partition that cannot take it (it stopped or moved meanwhile) has it asked again
through the node, and one that never answers has it asked again after ``LOCAL_TIMEOUT_S``:
never a room held for good, never an outcome given up silently."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from core import events as ev
from core.commands import AnyCommand, CompleteRun, Outcome
from core.errors import Unavailable
from core.jobs import HttpTarget, JobSpec
from node import executors as executors_module
from node.admission import Ticket
from node.executors import Executors
from node.runner import Decided, Reply
from tests.node.targets import LOOPBACK_ALLOWED, Target

pytestmark = pytest.mark.slow

LEASE = ev.LeaseGranted(
    at=1_000,
    job_id="team-a/report",
    tenant="team-a",
    run_id="team-a/report.60000",
    scheduled_for=60_000,
    attempt=1,
    fencing_token=7,
    worker_id="n1/executor",
    lease_expires_at=2**52,  # far ahead: the call is made
    lateness_ms=0,
)


class Owner:
    """The node's two ways to a partition, recorded: ``submit_local`` (answered by ``answer``,
    from a thread of its own as a runner would, or kept unanswered when it is None) and
    ``route``."""

    def __init__(self, answer: Decided | Unavailable | None) -> None:
        self.answer = answer
        self.here: list[AnyCommand] = []
        self.routed: list[AnyCommand] = []
        self.kept: list[Reply] = []
        self.done = threading.Event()

    def submit_local(self, command: AnyCommand, reply: Reply) -> bool:
        self.here.append(command)
        answer = self.answer
        if answer is None:
            self.kept.append(reply)
        else:
            threading.Thread(target=reply, args=(answer,)).start()
            if isinstance(answer, Decided):
                self.done.set()
        return True

    async def route(self, command: AnyCommand) -> list[ev.AnyEvent]:
        self.routed.append(command)
        self.done.set()
        return []


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target().start()
    yield t
    t.stop()


def run_one(owner: Owner, target: Target) -> Executors:
    """One call to ``target`` through executors wired to ``owner``; returns them, started."""
    ex = Executors("n1", egress=LOOPBACK_ALLOWED)
    ex.route = owner.route
    ex.submit_local = owner.submit_local
    ex.start()
    spec = JobSpec(name="report", tenant="team-a", target=HttpTarget(url=target.url), run_at=60_000)
    assert ex._admission.reserve(Ticket(None, LEASE.run_id, LEASE.tenant, 0))
    ex._handed[LEASE.run_id] = LEASE.fencing_token
    ex._loop.call_soon_threadsafe(ex._spawn, None, LEASE, spec)  # type: ignore[arg-type]
    return ex


def test_an_outcome_here_is_answered_by_its_runner_with_no_round_trip(target: Target) -> None:
    owner = Owner(Decided([], []))
    ex = run_one(owner, target)
    try:
        assert owner.done.wait(10)
        assert ex.wait_idle(10)  # the room came back with the runner's answer
        [command] = owner.here
        assert isinstance(command, CompleteRun) and command.outcome is Outcome.SUCCEEDED
        assert command.fencing_token == LEASE.fencing_token
        assert owner.routed == []
        assert len(target.calls) == 1
    finally:
        ex.stop()


def test_an_outcome_its_partition_could_not_take_is_asked_again_through_the_node(
    target: Target,
) -> None:
    owner = Owner(Unavailable("partition 3 is not running here"))
    ex = run_one(owner, target)
    try:
        assert owner.done.wait(10)
        assert ex.wait_idle(10)
        assert [type(c) for c in owner.here] == [CompleteRun]
        assert owner.routed == owner.here  # the same outcome, asked again where it runs now
    finally:
        ex.stop()


def test_an_outcome_never_answered_is_asked_again_and_its_room_comes_back_once(
    target: Target, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(executors_module, "LOCAL_TIMEOUT_S", 0.3)
    monkeypatch.setattr(executors_module, "SWEEP_S", 0.05)
    owner = Owner(None)
    ex = run_one(owner, target)
    try:
        assert owner.done.wait(10)
        assert ex.wait_idle(10)
        assert owner.routed == owner.here
        assert "had no answer from its partition" in caplog.text
        # The runner's answer, arriving after all, changes nothing: the room is not given twice.
        [late] = owner.kept
        late(Decided([], []))
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), ex._loop).result(5)
        assert ex.in_flight == 0
    finally:
        ex.stop()


def test_an_answer_that_cannot_give_the_room_back_is_said(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner logs a reply's failure at debug only (a caller that went away); an outcome's
    is a room that may not come back, so the executors say it."""
    owner = Owner(Decided([], []))
    said: list[str] = []
    told = threading.Event()

    def exception(message: str, *args: object, **kwargs: object) -> None:
        said.append(message % args)
        told.set()

    def release(self: Executors, tenant: str) -> None:
        raise RuntimeError("admission broke")

    monkeypatch.setattr(executors_module.log, "exception", exception)
    monkeypatch.setattr(Executors, "release", release)
    ex = run_one(owner, target)
    try:
        assert told.wait(10)
        assert said == [f"run {LEASE.run_id}: the answer to its outcome succeeded was lost"]
    finally:
        monkeypatch.undo()
        ex.stop()
