"""A partition runner on the in-memory log and a fake clock."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import pytest

from core import events as ev
from core.clock import FakeClock
from core.commands import PutJob
from core.errors import CronlogError
from core.jobs import JobSpec, PullTarget
from core.state import RunState
from eventlog.memory import MemoryLog
from node.runner import Decided, Dispatcher, PartitionRunner, Request
from projections.state_store import MemoryStateStore

START = 1_796_000_000_000


class NoExecutors(Dispatcher):
    worker_id = "n1/executor"

    def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
        return False

    def release(self, tenant: str) -> None:
        pass

    def dispatch(self, runner: PartitionRunner, lease: ev.LeaseGranted) -> None:
        pass


class Owner:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def test_a_failing_observer_does_not_strand_the_batch(caplog: pytest.LogCaptureFixture) -> None:
    log = MemoryLog(1)
    member = log.join(Owner())
    member.poll(0)  # takes the partition

    def observer(partition: int, offsets: list[int], events: list[ev.AnyEvent]) -> None:
        raise RuntimeError("the observer broke")

    runner = PartitionRunner(
        0, log, member.writer(0), MemoryStateStore(0), FakeClock(START), NoExecutors(),
        on_appended=observer,
    )  # fmt: skip
    runner.start()
    try:
        answer: Future[Decided | CronlogError] = Future()
        job = JobSpec(
            name="later", tenant="team-a", target=PullTarget(pool="p"), run_at=START + 60_000
        )
        runner.submit(Request(PutJob(job_id="later", spec=job), reply=answer.set_result))
        decided = answer.result(timeout=10)
        assert isinstance(decided, Decided)
        assert [type(e).__name__ for e in decided.events] == ["JobRegistered"]
        assert log.end_offset("events", 0) == 1  # durable
    finally:
        runner.stop()
    assert "on_appended failed" in caplog.text
    assert any(r.levelno == logging.ERROR for r in caplog.records)
