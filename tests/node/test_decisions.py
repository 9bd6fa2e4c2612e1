"""The decision log's queue: bounded, never waited for, and nothing dropped unsaid."""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import threading
from collections.abc import Callable, Iterator

import pytest

from core import events as ev
from node import decisions
from node.decisions import FIRED_LINES_PER_BATCH, DecisionLog, write


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
        decisions.stop()  # writes what was queued
    lines = [r.getMessage() for r in caplog.records if getattr(r, "decision", None) == "fired"]
    assert lines == [
        "fired run j0.60000 of job j0 (team-a, partition 0): schedule",
        "fired run j1.60000 of job j1 (team-a, partition 0): schedule",
    ]


@contextlib.contextmanager
def failing_handler(emit: Callable[[logging.LogRecord], object]) -> Iterator[None]:
    """A handler on the decisions' logger whose ``emit`` may raise, and which does not swallow
    what it raises (as ``logging.Handler.handleError`` would)."""

    class Failing(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            emit(record)

        def handleError(self, record: logging.LogRecord) -> None:
            raise  # as a handler that does not swallow its errors would

    handler = Failing()
    logger = logging.getLogger("cronlog.decisions")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def test_a_failing_handler_does_not_end_the_thread(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[int] = []

    def fails(record: logging.LogRecord) -> bool:
        if getattr(record, "run_id", None) == "j0.60000":
            raise RuntimeError("the disk is full")
        return False

    decisions = DecisionLog(on_failed=lambda: failures.append(1))
    decisions.start()
    with failing_handler(fails), caplog.at_level(logging.INFO, logger="cronlog.decisions"):
        decisions.appended(0, [fired(0)])
        decisions.appended(0, [fired(1)])
        decisions.stop()
    assert failures == [1]
    said = [r.getMessage() for r in caplog.records]
    assert "partition 0: writing a decision line failed" in said
    assert "fired run j1.60000 of job j1 (team-a, partition 0): schedule" in said


def _fired_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "decision", None) == "fired"]


def test_a_herd_of_one_team_s_runs_is_one_line_naming_every_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    herd = [fired(i) for i in range(FIRED_LINES_PER_BATCH + 1)]
    other = ev.RunMaterialised(
        at=1, job_id="team-b/x", tenant="team-b", run_id="team-b/x.60000",
        scheduled_for=60_000, available_at=60_000, priority=5,
    )  # fmt: skip
    late = ev.RunMaterialised(
        at=1, job_id="team-a/late", tenant="team-a", run_id="team-a/late.120000",
        scheduled_for=120_000, available_at=120_000, priority=5,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="cronlog.decisions"):
        write(3, [*herd[:5], other, *herd[5:], late])
    together, alone = _fired_lines(caplog)
    run_ids = [f"j{i}.60000" for i in range(FIRED_LINES_PER_BATCH + 1)] + ["late.120000"]
    assert together.__dict__["run_ids"] == run_ids
    assert together.__dict__["count"] == len(run_ids)
    assert (together.__dict__["scheduled_for"], together.__dict__["last_scheduled_for"]) == (
        60_000,
        120_000,
    )
    assert (together.__dict__["tenant"], together.__dict__["partition"]) == ("team-a", 3)
    message = together.getMessage()
    assert message.startswith(f"fired {len(run_ids)} runs of team-a (partition 3): schedule: ")
    assert all(run_id in message.split() for run_id in run_ids)  # a run id finds its line
    # another team's run, alone in the batch, keeps its line of its own
    assert alone.getMessage() == "fired run x.60000 of job x (team-b, partition 3): schedule"


def test_up_to_the_bound_each_run_keeps_its_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cronlog.decisions"):
        write(0, [fired(i) for i in range(FIRED_LINES_PER_BATCH)])
    lines = _fired_lines(caplog)
    assert [r.__dict__["run_id"] for r in lines] == [
        f"j{i}.60000" for i in range(FIRED_LINES_PER_BATCH)
    ]


def test_the_batches_appended_within_the_linger_share_their_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A steady rate appends a run or two per batch: a line each cost the node 7% of its
    interpreter at 2,000 runs a second. The batches of a partition that come within the linger
    are written together, so a team's many runs there are one line."""
    decisions = DecisionLog(linger_s=60)  # only the stop below ends the gathering
    half = FIRED_LINES_PER_BATCH // 2 + 1
    with caplog.at_level(logging.INFO, logger="cronlog.decisions"):
        decisions.appended(0, [fired(i) for i in range(half)])
        decisions.appended(1, [fired(100)])
        decisions.appended(0, [fired(i) for i in range(half, 2 * half)])
        decisions.start()
        decisions.stop()  # queued behind the batches: they are gathered, then written
    lines = _fired_lines(caplog)
    counts = [(r.__dict__["partition"], r.__dict__.get("count", 1)) for r in lines]
    assert counts == [(0, 2 * half), (1, 1)]
    assert lines[0].__dict__["run_ids"] == [f"j{i}.60000" for i in range(2 * half)]


def test_a_line_is_written_once_the_linger_ends_without_a_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    written = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.set()

    seen = Seen()
    logger = logging.getLogger("cronlog.decisions")
    logger.addHandler(seen)
    decisions = DecisionLog(linger_s=0.01)
    decisions.start()
    try:
        with caplog.at_level(logging.INFO, logger="cronlog.decisions"):
            decisions.appended(2, [fired(7)])
            assert written.wait(10)
            assert [r.getMessage() for r in _fired_lines(caplog)] == [
                "fired run j7.60000 of job j7 (team-a, partition 2): schedule"
            ]
    finally:
        decisions.stop()
        logger.removeHandler(seen)


def test_a_handler_failing_every_line_says_so_once_a_writing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Lines are written a gathering at a time: a handler that fails them all (a full disk)
    was told once a line, a traceback each, thousands a second at a steady rate."""
    failures: list[int] = []
    tried: list[str] = []

    def fails(record: logging.LogRecord) -> bool:
        if getattr(record, "decision", None) == "fired":
            tried.append(record.__dict__["run_id"])
            raise OSError("no space left on device")
        return False

    decisions = DecisionLog(on_failed=lambda: failures.append(1), linger_s=60)
    with failing_handler(fails), caplog.at_level(logging.INFO, logger="cronlog.decisions"):
        decisions.appended(0, [fired(0), fired(1)])
        decisions.appended(0, [fired(2)])
        decisions.start()
        decisions.stop()
    assert tried == ["j0.60000", "j1.60000", "j2.60000"]  # every line was tried
    assert failures == [1]
    [said] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert said.getMessage() == (
        "partition 0: writing a decision line failed (and 2 more of its lines in this writing)"
    )


def test_a_lease_given_back_is_a_line_naming_the_run_and_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    returned = ev.LeaseReturned(
        at=61_500, job_id="team-a/j", tenant="team-a", run_id="team-a/j.60000",
        scheduled_for=60_000, attempt=1, fencing_token=42,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="cronlog.decisions"):
        write(2, [returned])
    [line] = [r for r in caplog.records if r.__dict__.get("decision") == "lease-returned"]
    assert line.getMessage() == (
        "lease-returned run j.60000 of job j (team-a, partition 2): lease 42 reached no worker:"
        " given back, the run is pending"
    )
    assert (line.__dict__["run_id"], line.__dict__["fencing_token"]) == ("j.60000", 42)


def test_every_event_a_line_is_written_for_passes_the_first_sieve() -> None:
    """``write`` passes over, by type, the events ``_line`` writes nothing for: a case added to
    ``_line`` must be one of ``_DECISIONS`` too, or its line would never be written."""
    cases = set(re.findall(r"case ev\.(\w+)\(", inspect.getsource(decisions._line)))
    assert cases == {kind.__name__ for kind in decisions._DECISIONS}
