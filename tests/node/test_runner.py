"""A partition runner on the in-memory log and a fake clock."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from core import events as ev
from core.clock import FakeClock
from core.commands import PauseJob, PutJob, SlotDue
from core.errors import CronlogError, Unavailable
from core.jobs import HttpTarget, JobSpec, PullTarget
from core.state import PartitionState, RunState
from eventlog.memory import MemoryLog
from node import runner as runner_module
from node.runner import Decided, Dispatcher, PartitionRunner, Request
from projections.state_store import MemoryStateStore, StateStore

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
        0, log, member.writer(0), lambda: MemoryStateStore(0), FakeClock(START), NoExecutors(),
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


def started(log: MemoryLog, store: Callable[[], StateStore], **kw: Any) -> PartitionRunner:
    member = log.join(Owner())
    member.poll(0)  # takes the partition
    runner = PartitionRunner(0, log, member.writer(0), store, FakeClock(START), NoExecutors(), **kw)
    runner.start()
    return runner


def put(runner: PartitionRunner, job_id: str) -> Future[Decided | CronlogError]:
    answer: Future[Decided | CronlogError] = Future()
    job = JobSpec(name=job_id, tenant="team-a", target=PullTarget(pool="p"), run_at=START + 60_000)
    runner.submit(Request(PutJob(job_id=job_id, spec=job), reply=answer.set_result))
    return answer


def test_an_answer_nobody_waits_for_does_not_stop_the_runner() -> None:
    # An executor's heartbeat whose task was cancelled cancels the future it waited on; the
    # runner's answer to it must not be an error of the runner's.
    log = MemoryLog(1)
    runner = started(log, lambda: MemoryStateStore(0))
    try:
        gone: Future[Decided | CronlogError] = Future()
        assert gone.cancel()
        job = JobSpec(name="a", tenant="team-a", target=PullTarget(pool="p"), run_at=START + 1)
        runner.submit(Request(PutJob(job_id="a", spec=job), reply=gone.set_result))
        after = put(runner, "b").result(timeout=10)
        assert isinstance(after, Decided)
        assert runner.deciding.is_set() and runner.restarts == 0
        assert log.end_offset("events", 0) == 2
    finally:
        runner.stop()


class FailingOnce(MemoryStateStore):
    """A store whose first save fails, as a disk error would."""

    saves = 0

    def save(
        self,
        state: PartitionState,
        events: Sequence[tuple[int, ev.AnyEvent]],
        *,
        through: int | None = None,
    ) -> None:
        FailingOnce.saves += 1
        if FailingOnce.saves == 1:
            raise OSError("disk on fire")
        super().save(state, events, through=through)


def test_a_runner_that_fails_recovers_from_its_store_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = MemoryLog(1)
    failures: list[BaseException] = []
    recovered = threading.Semaphore(0)
    runner = started(
        log,
        lambda: FailingOnce(0),
        on_failed=lambda p, err: failures.append(err),
        on_recovered=lambda p: recovered.release(),
    )
    try:
        assert recovered.acquire(timeout=10)
        first = put(runner, "a").result(timeout=10)
        # Durable before the store failed: the caller has its answer, and the job survives.
        assert isinstance(first, Decided)
        assert recovered.acquire(timeout=10)  # recovered again after the failure
        assert [type(e) for e in failures] == [OSError]
        assert "a" in runner.state.jobs
        second = put(runner, "b").result(timeout=10)
        assert isinstance(second, Decided)
        assert set(runner.state.jobs) == {"a", "b"}
        assert runner.deciding.is_set() and runner.restarts == 1 and runner.alive
    finally:
        runner.stop()
    failed = [r for r in caplog.records if "runner failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR and failed[0].exc_info


def test_a_batch_that_fails_is_answered_unavailable_and_nothing_is_appended() -> None:
    log = MemoryLog(1)

    class Boom(NoExecutors):
        def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
            raise RuntimeError("a bug in admission")

    member = log.join(Owner())
    member.poll(0)
    clock = FakeClock(START)
    runner = PartitionRunner(0, log, member.writer(0), lambda: MemoryStateStore(0), clock, Boom())
    runner.start()
    try:
        job = JobSpec(
            name="now", tenant="team-a", target=HttpTarget(url="http://127.0.0.1:9/x"),
            run_at=START,
        )  # fmt: skip
        answer: Future[Decided | CronlogError] = Future()
        runner.submit(Request(PutJob(job_id="now", spec=job), reply=answer.set_result))
        # The put is decided in the same batch as the run's start, which fails: the whole batch
        # is refused, and the runner recovers to a state with nothing of it.
        assert isinstance(answer.result(timeout=10), Unavailable)
        assert log.end_offset("events", 0) == 0
    finally:
        runner.stop()


class WallClock:
    """A wall clock that, like a real one, can be stepped back (NTP, an operator)."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


def test_a_wall_clock_stepped_back_loses_no_timer() -> None:
    # The wheel keeps the latest time it was advanced to. A timer armed while the wall clock
    # read earlier than that was "already due" to the wheel, so it fired at once, decided nothing
    # (not due by the clock) and was gone: a job created then never fired.
    log = MemoryLog(1)
    member = log.join(Owner())
    member.poll(0)
    clock = WallClock(START)
    runner = PartitionRunner(
        0, log, member.writer(0), lambda: MemoryStateStore(0), clock, NoExecutors()
    )
    runner.start()

    def once(job_id: str, run_at: int) -> Decided | CronlogError:
        answer: Future[Decided | CronlogError] = Future()
        job = JobSpec(name=job_id, tenant="team-a", target=PullTarget(pool="p"), run_at=run_at)
        runner.submit(Request(PutJob(job_id=job_id, spec=job), reply=answer.set_result))
        return answer.result(timeout=10)

    try:
        once("first", START + 10_000)
        clock.now = START + 10_500
        once("far", START + 3_600_000)  # its batch advanced the wheel: "first" fired
        clock.now = START + 5_000  # the wall clock steps back 5.5 s
        assert isinstance(once("late", START + 8_000), Decided)  # due in 3 s by this clock
        clock.now = START + 20_000
        once("later", START + 3_600_000)  # the wheel's due timers are decided in this batch
        materialised = [
            e.job_id
            for e in (ev.decode(r.value) for r in log.read_events(0, 0, 100))
            if isinstance(e, ev.RunMaterialised)
        ]
        assert materialised == ["first", "late"]
    finally:
        runner.stop()


class HeldWriter:
    """A partition writer whose next append waits until ``release``, then finds the writer
    closed, as a node's own graceful stop closes it (``Fenced``, nothing written)."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self.entered = threading.Event()
        self._release = threading.Event()
        self.partition = writer.partition

    def append(
        self, events: Sequence[bytes], *, commands_through: int | None = None, outbound: Any = ()
    ) -> list[int]:
        self.entered.set()
        assert self._release.wait(10)
        self._writer.close()
        return list(self._writer.append(events, commands_through=commands_through))

    def release(self) -> None:
        self._release.set()

    def wait_until_readable(self) -> None:
        self._writer.wait_until_readable()

    def command_position(self) -> int:
        return int(self._writer.command_position())

    def close(self) -> None:
        self._writer.close()


@pytest.mark.parametrize("asked", [True, False])
def test_a_writer_closed_by_a_stop_is_not_reported_as_a_fence(
    caplog: pytest.LogCaptureFixture, asked: bool
) -> None:
    log = MemoryLog(1)
    member = log.join(Owner())
    member.poll(0)
    writer = HeldWriter(member.writer(0))
    runner = PartitionRunner(
        0, log, writer, lambda: MemoryStateStore(0), FakeClock(START), NoExecutors()
    )  # type: ignore[arg-type]
    runner.start()
    answer: Future[Decided | CronlogError] = Future()
    job = JobSpec(name="j", tenant="team-a", target=PullTarget(pool="p"), run_at=START + 60_000)
    with caplog.at_level(logging.INFO):
        runner.submit(Request(PutJob(job_id="j", spec=job), reply=answer.set_result))
        assert writer.entered.wait(10)
        if asked:  # the node's stop: asked first (not waiting for the loop), then the writer
            # closes under the append
            runner.stop(timeout_s=0, reason="the node is stopping")
        writer.release()
        assert runner.ended.wait(10)
    assert isinstance(answer.result(timeout=10), Unavailable)  # nothing was written
    said = [r.getMessage() for r in caplog.records]
    if asked:
        assert said == ["partition 0: stopped deciding: the node is stopping"]
        assert not runner.fenced
    else:  # nobody here asked: another writer took the partition
        assert said == ["partition 0: fenced, another node owns it now"]
        assert runner.fenced


class SettlingWriter:
    """A partition writer whose last append settles only when the test says so, as a Kafka
    transaction's markers are written some moments after its commit returned."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self.partition = writer.partition
        self.appends: list[int] = []  # events in each append, in order
        self.settling = threading.Event()  # the runner waits for the last append to settle
        self._settled = threading.Event()

    def append(
        self, events: Sequence[bytes], *, commands_through: int | None = None, outbound: Any = ()
    ) -> list[int]:
        self.appends.append(len(events))
        return list(self._writer.append(events, commands_through=commands_through))

    def wait_until_readable(self) -> None:
        if self.appends:
            self.settling.set()
            assert self._settled.wait(10)

    def settle(self) -> None:
        self._settled.set()

    def command_position(self) -> int:
        return int(self._writer.command_position())

    def close(self) -> None:
        self._writer.close()


def test_requests_that_arrive_while_the_last_append_settles_go_into_one_append() -> None:
    # On Kafka a transaction begun before the last one's markers are written waits 20 ms in
    # the log with nothing gathering meanwhile; the runner waits for them before it takes its
    # next batch, so what arrived in the meantime is appended together.
    log = MemoryLog(1)
    member = log.join(Owner())
    member.poll(0)
    writer = SettlingWriter(member.writer(0))
    runner = PartitionRunner(
        0, log, writer, lambda: MemoryStateStore(0), FakeClock(START), NoExecutors()
    )  # type: ignore[arg-type]
    runner.start()
    try:
        first = put(runner, "first")
        assert writer.settling.wait(10)  # appended, and waiting for it to settle
        assert isinstance(first.result(timeout=10), Decided)  # answered before it settled
        meanwhile = [put(runner, f"job-{i}") for i in range(5)]
        writer.settle()
        for answer in meanwhile:
            assert isinstance(answer.result(timeout=10), Decided)
        assert writer.appends == [1, 5]
        assert log.end_offset("events", 0) == 6
    finally:
        runner.stop()


class Starting(Dispatcher):
    """Executors with room for every run, noting each lease they are handed."""

    worker_id = "n1/executor"

    def __init__(self) -> None:
        self.leases: list[ev.LeaseGranted] = []

    def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
        return True

    def release(self, tenant: str) -> None:
        pass

    def dispatch(self, runner: PartitionRunner, lease: ev.LeaseGranted) -> None:
        self.leases.append(lease)


def decided_at(
    runner: PartitionRunner, clock: WallClock, log: MemoryLog, now: int
) -> list[ev.AnyEvent]:
    """Set the clock and let the runner decide a batch at that time (a request is the batch: no
    waiting on the runner's idle timeout); every event of the partition so far."""
    clock.now = now
    answer: Future[Decided | CronlogError] = Future()
    far = JobSpec(name="f", tenant="team-a", target=PullTarget(pool="p"), run_at=now + 3_600_000)
    runner.submit(Request(PutJob(job_id=f"far-{now}", spec=far), reply=answer.set_result))
    assert isinstance(answer.result(timeout=10), Decided)
    return [ev.decode(r.value) for r in log.read_events(0, 0, 1000)]


def test_a_run_materialised_a_lead_ahead_starts_at_its_slot_also_under_a_new_owner() -> None:
    log = MemoryLog(1)
    clock = WallClock(START)
    slot = START + 60_000

    def runner_at(now: int, dispatcher: Dispatcher) -> PartitionRunner:
        clock.now = now
        member = log.join(Owner())
        member.poll(0)  # takes the partition (fencing an earlier owner)
        runner = PartitionRunner(
            0, log, member.writer(0), lambda: MemoryStateStore(0), clock, dispatcher,
            lead_ms=5_000,
        )  # fmt: skip
        runner.start()
        return runner

    def at(runner: PartitionRunner, now: int) -> list[ev.AnyEvent]:
        return decided_at(runner, clock, log, now)

    def of(events: list[ev.AnyEvent], kind: type) -> list[Any]:
        return [e for e in events if isinstance(e, kind) and e.job_id == "j"]

    first, second = Starting(), Starting()
    runner = runner_at(START, first)
    try:
        job = JobSpec(name="j", tenant="team-a", target=HttpTarget(url="http://127.0.0.1:9/"),
                      run_at=slot)  # fmt: skip
        runner.submit(Request(PutJob(job_id="j", spec=job)))
        (made,) = of(at(runner, slot - 5_000), ev.RunMaterialised)
        assert made.at == slot - 5_000 and made.available_at == slot
        assert of(at(runner, slot - 2_000), ev.LeaseGranted) == [] and first.leases == []
    finally:
        runner.stop()  # the owner dies between the materialisation and the slot
    runner = runner_at(slot - 1_000, second)
    try:
        assert runner.deciding.wait(10)
        assert of(at(runner, slot - 1), ev.LeaseGranted) == []
        (lease,) = of(at(runner, slot), ev.LeaseGranted)
        assert lease.lateness_ms == 0 and lease.run_id == made.run_id
        assert [lease.run_id for lease in second.leases] == [made.run_id]
        assert len(of(at(runner, slot + 1), ev.RunMaterialised)) == 1  # made once only
    finally:
        runner.stop()


class StuckWriter:
    """A partition writer whose appends wait until ``release`` (a broker that stopped
    answering) and then go through, or fail the first ``fail`` times (a broker's error)."""

    def __init__(self, writer: Any, fail: int = 0) -> None:
        self._writer = writer
        self.partition = writer.partition
        self.entered = threading.Event()
        self.released = threading.Event()
        self._fail = fail

    def append(
        self, events: Sequence[bytes], *, commands_through: int | None = None, outbound: Any = ()
    ) -> list[int]:
        self.entered.set()
        assert self.released.wait(10)
        if self._fail:
            self._fail -= 1
            raise RuntimeError("NOT_ENOUGH_REPLICAS")
        return list(self._writer.append(events, commands_through=commands_through))

    def wait_until_readable(self) -> None:
        self._writer.wait_until_readable()

    def command_position(self) -> int:
        return int(self._writer.command_position())

    def close(self) -> None:
        self._writer.close()


def stuck_runner(
    log: MemoryLog, writer_of: Callable[[Any], StuckWriter]
) -> tuple[PartitionRunner, StuckWriter]:
    member = log.join(Owner())
    member.poll(0)
    writer = writer_of(member.writer(0))
    runner = PartitionRunner(
        0, log, writer, lambda: MemoryStateStore(0), FakeClock(START), NoExecutors()
    )  # type: ignore[arg-type]
    runner.start()
    assert runner.deciding.wait(10)
    return runner, writer


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_partition_held_in_an_append_is_not_deciding_until_the_append_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A Kafka append to a broker that stopped answering holds its runner up to the log's
    # timeout (30 s) while ``deciding`` stays set: readiness must say so within STUCK_S.
    monkeypatch.setattr(runner_module, "STUCK_S", 0.3)
    runner, writer = stuck_runner(MemoryLog(1), StuckWriter)
    try:
        assert runner.not_deciding_why() is None
        answer = put(runner, "a")
        assert writer.entered.wait(10)
        wait_for(lambda: (runner.not_deciding_why() or "").startswith("an append in flight for"))
        assert runner.deciding.is_set()  # what readiness read before: it said "deciding"
        writer.released.set()
        assert isinstance(answer.result(timeout=10), Decided)
        wait_for(lambda: runner.not_deciding_why() is None)
    finally:
        runner.stop()


def test_a_partition_whose_append_failed_is_not_deciding_until_one_goes_through() -> None:
    log = MemoryLog(1)
    runner, writer = stuck_runner(log, lambda w: StuckWriter(w, fail=1))
    writer.released.set()
    try:
        assert isinstance(put(runner, "a").result(timeout=10), Unavailable)
        wait_for(runner.deciding.is_set)  # recovered from the log, and deciding again...
        why = runner.not_deciding_why()  # ...but its writer has not appended since
        assert why is not None and "its last append failed" in why and "NOT_ENOUGH" in why
        assert isinstance(put(runner, "b").result(timeout=10), Decided)
        assert runner.not_deciding_why() is None
    finally:
        runner.stop()


def test_a_partition_taken_over_owing_slots_is_behind_until_its_first_batch_is_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A partition that went unowned owes every slot since; its new owner's first batch decides
    # them all (slow under load, its append held by a broker): not deciding meanwhile.
    monkeypatch.setattr(runner_module, "STUCK_S", 5.0)
    log = MemoryLog(1)
    member = log.join(Owner())
    member.poll(0)
    first = PartitionRunner(
        0, log, member.writer(0), lambda: MemoryStateStore(0), FakeClock(START), NoExecutors()
    )
    first.start()
    try:
        answer: Future[Decided | CronlogError] = Future()
        job = JobSpec(name="m", tenant="team-a", target=PullTarget(pool="p"), schedule="* * * * *")
        first.submit(Request(PutJob(job_id="m", spec=job), reply=answer.set_result))
        assert isinstance(answer.result(timeout=10), Decided)
    finally:
        first.stop()
    writer = StuckWriter(member.writer(0))
    later = PartitionRunner(
        0, log, writer, lambda: MemoryStateStore(0), FakeClock(START + 600_000), NoExecutors()
    )  # type: ignore[arg-type]
    later.start()
    try:
        assert writer.entered.wait(10)  # its first batch: the slots it owes, held in the append
        why = later.not_deciding_why()
        assert why is not None and "behind its timers" in why, why
        writer.released.set()
        wait_for(lambda: later.not_deciding_why() is None)
        # Once decided, what it owed at its recovery no longer counts, timers or none: its
        # only job paused leaves it none.
        paused: Future[Decided | CronlogError] = Future()
        later.submit(Request(PauseJob(job_id="m", tenant="team-a"), reply=paused.set_result))
        assert isinstance(paused.result(timeout=10), Decided)
        assert later.core.next_deadline() is None and later.core.overdue_since() is None
        assert later.not_deciding_why() is None and later.behind_s() == 0
    finally:
        writer.released.set()
        later.stop()


class Behind(Starting):
    """Executors handed each lease and never coming to it (a backlog): they say so when asked
    (``never_started``) only if ``tell``."""

    def __init__(self, tell: bool) -> None:
        super().__init__()
        self.tell = tell
        self.asked: list[tuple[str, int]] = []

    def never_started(self, run_id: str, fencing_token: int) -> bool:
        self.asked.append((run_id, fencing_token))
        return self.tell and any(
            lease.run_id == run_id and lease.fencing_token == fencing_token for lease in self.leases
        )


@pytest.mark.parametrize("tell", [True, False])
def test_a_critical_lease_whose_call_this_node_never_started_is_tried_again(tell: bool) -> None:
    # A node whose executors fell 12 s behind (a chaos run at load 20) let the leases of
    # critical runs run out before it came to their calls; the partition decided each expiry
    # ambiguous and set the run aside as outcome_unknown, though the target had seen nothing.
    # Asked at the expiry, executors that never started the call withdraw it, and the attempt
    # fails as not called: tried again. Where they cannot say, the expiry stays ambiguous.
    log = MemoryLog(1)
    clock = WallClock(START)
    slot = START + 10_000
    dispatcher = Behind(tell)
    member = log.join(Owner())
    member.poll(0)
    runner = PartitionRunner(
        0, log, member.writer(0), lambda: MemoryStateStore(0), clock, dispatcher
    )  # type: ignore[arg-type]
    runner.start()

    def at(now: int) -> list[ev.AnyEvent]:
        return [e for e in decided_at(runner, clock, log, now) if e.job_id == "j"]

    try:
        job = JobSpec(name="j", tenant="team-a", target=HttpTarget(url="http://127.0.0.1:9/"),
                      run_at=slot, critical=True, lease_sec=5)  # fmt: skip
        runner.submit(Request(PutJob(job_id="j", spec=job)))
        at(slot)
        (lease,) = dispatcher.leases
        events = at(lease.lease_expires_at + 1)
        assert dispatcher.asked == [(lease.run_id, lease.fencing_token)]
        kinds = [type(e).__name__ for e in events]
        if tell:
            (failed,) = [e for e in events if isinstance(e, ev.RunFailed)]
            assert "not called" in failed.error and not failed.ambiguous
            assert "RetryScheduled" in kinds and "RunDeadLettered" not in kinds
            assert "LeaseExpired" not in kinds
        else:
            (dead,) = [e for e in events if isinstance(e, ev.RunDeadLettered)]
            assert dead.reason == "outcome_unknown"
    finally:
        runner.stop()


def test_a_request_taken_as_the_runner_stops_is_answered_not_dropped() -> None:
    """A stop that wakes the loop while a request waits in its inbox: the loop takes the
    request and sees the stop. It was dropped there, unanswered, and its caller waited a
    minute (``LOCAL_TIMEOUT_S``): an executor recording a call's outcome at its partition's
    hand-over held its stop's drain to the end and never recorded it, so the lease ran out and
    the run was called again. Now it hears "unavailable" at once, and asks the new owner."""
    log = MemoryLog(1)
    runner = started(log, lambda: MemoryStateStore(0))
    assert runner.deciding.wait(10)
    try:
        with runner._cv:  # the loop waits for work; both reach it before it runs again
            answer = put(runner, "late")
            runner.request_stop()
        result = answer.result(timeout=5)
        assert isinstance(result, Unavailable)
        assert log.end_offset("events", 0) == 0  # not decided: the next owner decides it
    finally:
        runner.stop()


def test_a_hand_over_s_last_batch_arms_the_critical_jobs_next_calls_before_the_stop() -> None:
    """A node about to hand its partitions over asks each runner for a last batch
    (``Request(arms_ahead=True)``, ``Node._arm_last_batch``): a critical every-second job,
    which keeps one call armed otherwise, has its calls through the arming time leased and
    handed to the executors before the runner stops, so the node makes them as it drains."""
    log = MemoryLog(1)
    clock = WallClock(START)
    member = log.join(Owner())
    member.poll(0)
    executors = Starting()
    runner = PartitionRunner(
        0, log, member.writer(0), lambda: MemoryStateStore(0), clock, executors,
        lead_ms=30_000, arm_ms=2_000,
    )  # fmt: skip
    runner.start()
    try:
        pay = JobSpec(name="pay", tenant="team-a", target=HttpTarget(url="http://127.0.0.1:9/"),
                      schedule="* * * * * *", critical=True)  # fmt: skip
        runner.submit(Request(PutJob(job_id="team-a/pay", spec=pay)))
        for now in range(START, START + 10_150 + 1, 250):  # steadily, up to 150 ms into a second
            decided_at(runner, clock, log, now)
        armed = {lease.scheduled_for for lease in executors.leases if lease.start_at > clock.now}
        assert armed == {START + 11_000}  # one call armed ahead, as a critical job keeps
        answer: Future[Decided | CronlogError] = Future()
        runner.submit(Request(SlotDue(job_id=""), reply=answer.set_result, arms_ahead=True))
        assert isinstance(answer.result(timeout=10), Decided)
    finally:
        runner.stop()  # the hand-over: the batch in hand ends first
    armed = {lease.scheduled_for for lease in executors.leases if lease.start_at > clock.now}
    assert armed == {START + 11_000, START + 12_000}
