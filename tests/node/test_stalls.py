"""Stalls that explain themselves (node.stalls): late starts with their cause, a partition
behind its timers, a process that stood still."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from core import events as ev
from core.clock import FakeClock
from core.commands import ClaimRuns, HeartbeatRun, PutJob
from core.errors import CronlogError
from core.jobs import HttpTarget, JobSpec, PullTarget
from core.state import RunState
from eventlog.memory import MemoryLog
from node.runner import Decided, Dispatcher, PartitionRunner, Request
from node.stalls import LateStarts, LoopTimes, StallMetrics, StallWatch, ThreadClocks, where
from projections.state_store import MemoryStateStore
from tests.node.test_runner import Owner

START = 1_796_000_000_000


class NoRoom(Dispatcher):
    """Executors with no room: every push run waits, to be granted by the test."""

    worker_id = "n1/executor"

    def __init__(self) -> None:
        self.asked = threading.Event()

    def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
        self.asked.set()
        return False

    def release(self, tenant: str) -> None:
        pass

    def dispatch(self, runner: PartitionRunner, lease: ev.LeaseGranted) -> None:
        pass


class Told:
    """What a runner told of late starts, with an event per report."""

    def __init__(self) -> None:
        self.late: list[tuple[int, str, int, str]] = []
        self.any = threading.Event()

    def __call__(self, partition: int, kind: str, late_ms: int, cause: str) -> None:
        self.late.append((partition, kind, late_ms, cause))
        self.any.set()


def runner_on(
    clock: FakeClock, dispatcher: Dispatcher, told: Told, lead_ms: int = 0
) -> PartitionRunner:
    log = MemoryLog(1)
    member = log.join(Owner())
    member.poll(0)
    runner = PartitionRunner(
        0,
        log,
        member.writer(0),
        lambda: MemoryStateStore(0),
        clock,
        dispatcher,
        on_late=told,
        lead_ms=lead_ms,
    )
    runner.start()
    return runner


def decide(runner: PartitionRunner, command: Any) -> Decided:
    answer: Future[Decided | CronlogError] = Future()
    runner.submit(Request(command, reply=answer.set_result))
    result = answer.result(timeout=10)
    assert isinstance(result, Decided), result
    return result


def test_a_push_run_that_waited_for_room_is_told_late_with_why() -> None:
    clock = FakeClock(START)
    room = NoRoom()
    told = Told()
    runner = runner_on(clock, room, told)
    try:
        spec = JobSpec(
            name="j", tenant="team-a", target=HttpTarget(url="http://x/"), run_at=START + 1000
        )
        decide(runner, PutJob(job_id="j", spec=spec))
        clock.advance(1000)
        assert room.asked.wait(10)  # due: asked for room, refused, waiting
        [run_id] = runner.state.runs
        clock.advance(3000)
        assert runner.grant("team-a", run_id, (3.0, "the node's room was full"))
        assert told.any.wait(10)
    finally:
        runner.stop()
    [(partition, kind, late_ms, cause)] = told.late
    assert (partition, kind, late_ms) == (0, "room", 3000)
    assert cause == "waited 3.0 s for call room: the node's room was full"


def test_a_push_run_started_on_time_is_not_told() -> None:
    clock = FakeClock(START)
    room = NoRoom()
    told = Told()
    runner = runner_on(clock, room, told)
    try:
        spec = JobSpec(
            name="j", tenant="team-a", target=HttpTarget(url="http://x/"), run_at=START + 1000
        )
        decide(runner, PutJob(job_id="j", spec=spec))
        clock.advance(1000)
        assert room.asked.wait(10)
        [run_id] = runner.state.runs
        clock.advance(900)
        assert runner.grant("team-a", run_id, (0.9, "the node's room was full"))
        # the grant is decided and appended before this put, in the same loop
        decide(runner, PutJob(job_id="k", spec=spec))
    finally:
        runner.stop()
    assert told.late == []


def test_a_pull_run_nobody_claimed_in_time_is_told_as_the_claims() -> None:
    clock = FakeClock(START)
    told = Told()
    runner = runner_on(clock, NoRoom(), told)
    try:
        spec = JobSpec(name="p", tenant="team-a", target=PullTarget(pool="q"), run_at=START + 1)
        decide(runner, PutJob(job_id="p", spec=spec))
        clock.advance(5000)
        # the slot's timer is decided after this request, in its batch: the run is then pending
        decide(runner, PutJob(job_id="other", spec=spec))
        leases = decide(runner, ClaimRuns(tenant="team-a", pool="q", worker_id="w", limit=1))
        assert [type(e) for e in leases.events] == [ev.LeaseGranted]
        assert told.any.wait(10)
    finally:
        runner.stop()
    [(_, kind, late_ms, cause)] = told.late
    assert (kind, late_ms) == ("claim", 4999)
    assert "no claim of its pool reached the partition sooner" in cause


def test_a_run_leased_ahead_in_time_but_started_late_is_told_where_it_ran() -> None:
    clock = FakeClock(START)
    told = Told()
    runner = runner_on(clock, NoRoom(), told, lead_ms=30_000)  # materialised ahead
    try:
        spec = JobSpec(name="p", tenant="team-a", target=PullTarget(pool="q"), run_at=START + 5000)
        decide(runner, PutJob(job_id="p", spec=spec))
        claim = ClaimRuns(tenant="team-a", pool="q", worker_id="w", limit=1, horizon_ms=5000)
        [lease] = decide(runner, claim).events
        assert isinstance(lease, ev.LeaseGranted) and lease.start_at == START + 5000
        clock.advance(9000)  # the worker started it 4 s after its start, and says so
        beat = HeartbeatRun(
            run_id=lease.run_id, fencing_token=lease.fencing_token, started_late_ms=4000
        )
        assert ev.RunStarted in [type(e) for e in decide(runner, beat).events]
        assert told.any.wait(10)
    finally:
        runner.stop()
    [(_, kind, late_ms, cause)] = told.late  # the grant, in time, is not told
    assert (kind, late_ms) == ("start", 4000)
    assert "started late where it runs" in cause


def test_late_starts_are_one_line_per_partition_and_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(0)
    metrics = StallMetrics(CollectorRegistry())
    late = LateStarts(metrics, clock=lambda: clock.now_ms() / 1000)
    for ms in (1500, 3000, 2000):
        late.add(2, "room", ms, f"waited {ms} for room")
    late.add(5, "claim", 1200, "no claim")
    with caplog.at_level(logging.WARNING, logger="node.stalls"):
        late.report()
        late.add(2, "room", 4000, "waited again")
        late.report()  # within the period: gathered, not said yet
        clock.advance(10_000)
        late.report()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "partition 2: 3 runs started 1.5-3.0 s after they were due: waited 3000 for room",
        "partition 5: a run started 1.2 s after they were due: no claim",
        "partition 2: a run started 4.0 s after they were due: waited again",
    ]
    assert metrics.late_starts.labels("room")._value.get() == 4


class FakeRunner:
    def __init__(self) -> None:
        self.behind = 0.0

    def behind_s(self) -> float:
        return self.behind

    def stall_cause(self) -> str:
        return "appending to the log for 2.0 s"


def test_a_partition_behind_its_timers_is_told_once_with_its_cause_and_when_it_caught_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = StallMetrics(CollectorRegistry())
    runner = FakeRunner()
    watch = StallWatch(lambda: {3: runner}, metrics, LateStarts(metrics))  # type: ignore[dict-item]
    with caplog.at_level(logging.WARNING, logger="node.stalls"):
        watch._pass()
        runner.behind = 2.0
        watch._pass()
        runner.behind = 3.5
        watch._pass()  # the same stall: not told again
        assert metrics.behind._value.get() == 3.5
        runner.behind = 0.0
        watch._pass()
    assert [r.getMessage() for r in caplog.records] == [
        "partition 3: 2.0 s behind its timers: appending to the log for 2.0 s",
        "partition 3: caught up with its timers (it was up to 3.5 s behind)",
    ]
    assert metrics.stalls.labels("partition")._value.get() == 1
    assert metrics.behind._value.get() == 0


def test_a_pass_that_comes_late_while_nothing_ran_says_nothing_ran(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The clock jumps 3 s between two passes and no thread used the processor meanwhile: the
    process was stopped (SIGSTOP) or not scheduled, and the warning says so."""
    now = [100.0]
    metrics = StallMetrics(CollectorRegistry())
    watch = StallWatch(dict, metrics, LateStarts(metrics), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="node.stalls"):
        watch._pass()
        now[0] += 0.25
        watch._pass()  # on time
        now[0] += 3.25
        watch._pass()
    watch.stop()
    [record] = caplog.records
    assert record.getMessage().startswith(
        "the node's process stood still for 3.0 s: no thread of it ran"
    )
    assert metrics.stalls.labels("process")._value.get() == 1


def test_the_watch_never_arms_the_fault_handlers_timed_dump(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fault handler's timed dump reads every thread's frames from a thread of its own,
    without the interpreter lock: armed before each pass, it fired at the end of every stall
    and read the frames of threads running again, and killed nodes with signal 11. A stall is
    told from the threads' processor times instead."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the timed dump was armed")

    monkeypatch.setattr("faulthandler.dump_traceback_later", refused)
    now = [100.0]
    metrics = StallMetrics(CollectorRegistry())
    watch = StallWatch(
        dict, metrics, LateStarts(metrics), dump_path=tmp_path / "stalls.txt", clock=lambda: now[0]
    )
    watch.start()
    try:
        for _ in range(3):
            watch._pass()
            now[0] += 2.0
    finally:
        watch.stop()
    assert metrics.stalls.labels("process")._value.get() >= 2
    assert "Thread MainThread" in (tmp_path / "stalls.txt").read_text()


def test_a_thread_is_told_by_its_innermost_two_frames() -> None:
    stop = threading.Event()
    waiter = threading.Thread(target=stop.wait, name="idle")
    waiter.start()
    try:
        frames = sys._current_frames()
        assert waiter.ident is not None
        assert where(frames[waiter.ident]).startswith("wait (threading.py:")
        ours = frames[threading.get_ident()]
        name = "test_a_thread_is_told_by_its_innermost_two_frames"
        assert where(ours).startswith(f"{name} (test_stalls.py:")
        assert where(ours).count(" < ") == 1
    finally:
        stop.set()
        waiter.join()


def test_the_processor_time_of_a_busy_thread_is_read_and_an_ended_ones_file_closed() -> None:
    clocks = ThreadClocks()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        first = clocks.read()
        deadline = time.monotonic() + 5
        assert spinner.ident in first
        while clocks.read()[spinner.ident] - first[spinner.ident] < 0.05:
            assert time.monotonic() < deadline, "the spinning thread's time never grew"
            time.sleep(0.01)
    finally:
        stop.set()
        spinner.join()
    assert spinner.ident not in clocks.read()
    assert spinner.native_id not in clocks._files
    clocks.close()


def test_the_cause_of_a_slow_batch_is_its_largest_part() -> None:
    times = LoopTimes(append_s=2.5, save_s=0.1, decide_s=0.4, requests=3, timers=500)
    assert times.cause() == "appending to the log took 2.5 s"
    times = LoopTimes(decide_s=1.5, requests=2000, timers=0)
    assert times.cause() == "deciding a batch of 2000 requests and 0 timers took 1.5 s"


@pytest.mark.slow
def test_the_interpreter_held_by_one_call_is_told_with_that_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A regular expression that backtracks for seconds holds the interpreter lock throughout,
    as a native call into a store can: the watch's thread cannot run, and the warning that
    follows names the thread that used the processor meanwhile, and where it is."""
    metrics = StallMetrics(CollectorRegistry())
    watch = StallWatch(dict, metrics, LateStarts(metrics), dump_path=tmp_path / "stalls.txt")
    watch.start()
    try:
        time.sleep(0.6)  # a few passes: the threads' times are read
        with caplog.at_level(logging.WARNING, logger="node.stalls"):
            started = time.monotonic()
            re.match(r"(a+)+b", "a" * 26)  # 2^26 ways to fail: seconds, the lock held
            held = time.monotonic() - started
            deadline = time.monotonic() + 5
            while metrics.stalls.labels("process")._value.get() == 0:
                assert time.monotonic() < deadline, f"no stall told after {held:.1f} s held"
                time.sleep(0.05)  # the watch's next pass, in real time
    finally:
        watch.stop()
    assert held > 1.3, "the match was too quick to hold the lock past the threshold"
    [record] = [r for r in caplog.records if "stood still" in r.getMessage()]
    name = threading.current_thread().name
    assert f"its thread {name} held it" in record.getMessage()
    assert "test_the_interpreter_held_by_one_call_is_told_with_that_call" in record.getMessage()
    kept = (tmp_path / "stalls.txt").read_text()
    assert kept.index(f"Thread {name}:") < kept.index("Thread stall-watch:")  # the busiest first
    assert "in test_the_interpreter_held" in kept


def test_a_watch_started_before_its_directory_is_made_still_keeps_its_stacks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker process's stall watch starts before anything made the worker's directory."""
    now = [100.0]
    metrics = StallMetrics(CollectorRegistry())
    dump = tmp_path / "node-1" / "stalls.txt"
    watch = StallWatch(dict, metrics, LateStarts(metrics), dump_path=dump, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="node.stalls"):
        watch._pass()
        now[0] += 2.0
        watch._pass()
    watch.stop()
    assert not [r for r in caplog.records if "could not be kept" in r.getMessage()]
    assert "stood still for 1.8 s" in dump.read_text()
    assert dump.parent.stat().st_mode & 0o077 == 0
