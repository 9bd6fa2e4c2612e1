"""The decision log's queue: bounded, never waited for, and nothing dropped unsaid."""

from __future__ import annotations

import logging

import pytest

from core import events as ev
from node.decisions import DecisionLog


def fired(i: int) -> ev.RunMaterialised:
    return ev.RunMaterialised(
        at=1, job_id=f"team-a/j{i}", tenant="team-a", run_id=f"team-a/j{i}.60000",
        scheduled_for=60_000, available_at=60_000, priority=5,
    )  # fmt: skip


def test_batches_beyond_the_bound_are_dropped_counted_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dropped: list[int] = []
    decisions = DecisionLog(on_dropped=dropped.append, max_pending=3)
    with caplog.at_level(logging.INFO, logger="cronlog.decisions"):
        decisions.appended(0, [fired(0), fired(1)])  # queued: the thread has not started
        decisions.appended(1, [fired(2), fired(3)])  # 4 > 3: dropped
        decisions.appended(1, [fired(4), fired(5)])  # dropped again, said once
        assert dropped == [2, 2]
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "dropped" in warnings[0].getMessage()
        decisions.start()
        decisions.close()  # writes what was queued
    lines = [r.getMessage() for r in caplog.records if getattr(r, "decision", None) == "fired"]
    assert lines == [
        "fired run j0.60000 of job j0 (team-a, partition 0): schedule",
        "fired run j1.60000 of job j1 (team-a, partition 0): schedule",
    ]


def test_a_failing_handler_does_not_end_the_thread(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[int] = []

    class Broken(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "run_id", None) == "j0.60000":
                raise RuntimeError("the disk is full")

        def handleError(self, record: logging.LogRecord) -> None:
            raise  # as a handler that does not swallow its errors would

    broken = Broken()
    logger = logging.getLogger("cronlog.decisions")
    logger.addHandler(broken)
    decisions = DecisionLog(on_failed=lambda: failures.append(1))
    decisions.start()
    try:
        with caplog.at_level(logging.INFO, logger="cronlog.decisions"):
            decisions.appended(0, [fired(0)])
            decisions.appended(0, [fired(1)])
            decisions.close()
    finally:
        logger.removeHandler(broken)
    assert failures == [1]
    said = [r.getMessage() for r in caplog.records]
    assert "partition 0: writing decision lines failed" in said
    assert "fired run j1.60000 of job j1 (team-a, partition 0): schedule" in said
