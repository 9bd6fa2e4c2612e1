"""``kafka://`` runs produced in the events' own transaction (``node.produced``), on the
in-memory log and a fake clock: what the runner appends, and with what records.

The log here only records what each append carried (the memory log carries no records for
others); that a Kafka transaction commits them together is the Kafka test's
(tests/cluster/test_exactly_once_topics.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import msgspec
import pytest

from core import events as ev
from core.clock import FakeClock
from core.commands import PutJob
from core.egress import EgressPolicy
from core.errors import CronlogError
from core.jobs import HttpTarget, JobSpec, KafkaTarget
from core.partition import Partition
from core.state import RunState
from eventlog.kafka import AppendAborted
from eventlog.memory import MemoryLog
from eventlog.port import Outbound
from node.produced import TOPICS_EVERY_S, ProducedTargets
from node.runner import OUTBOUND_TRIES, Decided, Dispatcher, PartitionRunner, Request
from projections.state_store import MemoryStateStore

START = 1_796_000_000_000
TOPIC = "team-a.out"


class Room(Dispatcher):
    """Executors with room for everything, which note what they were handed."""

    worker_id = "n1/executor"

    def __init__(self) -> None:
        self.reserved = 0
        self.released = 0
        self.dispatched: list[str] = []
        self.full = False  # every place taken: a run asking for room waits

    def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
        if self.full:
            return False
        self.reserved += 1
        return True

    def release(self, tenant: str) -> None:
        self.released += 1

    def dispatch(self, runner: PartitionRunner, lease: ev.LeaseGranted) -> None:
        self.dispatched.append(lease.run_id)


class Carrying:
    """The partition's writer, noting the records for others each append carried; its first
    ``failing`` appends that carry any fail as an aborted Kafka transaction does."""

    def __init__(self, writer: Any, failing: int = 0) -> None:
        self._writer = writer
        self.partition = writer.partition
        self.failing = failing
        self.carried: list[tuple[list[str], list[Outbound]]] = []  # (event types, records)
        self.appended = threading.Condition()

    def append(
        self,
        events: Sequence[bytes],
        *,
        commands_through: int | None = None,
        outbound: Sequence[Outbound] = (),
    ) -> list[int]:
        if outbound and self.failing:
            self.failing -= 1
            raise AppendAborted("append to partition 0 aborted, nothing written: broker gone")
        offsets = list(self._writer.append(events, commands_through=commands_through))
        kinds = [type(ev.decode(e)).__name__ for e in events]
        with self.appended:
            self.carried.append((kinds, list(outbound)))
            self.appended.notify_all()
        return offsets

    def wait_for(self, kind: str) -> list[tuple[list[str], list[Outbound]]]:
        with self.appended:
            assert self.appended.wait_for(
                lambda: any(kind in kinds for kinds, _ in self.carried), 10
            ), self.carried
            return list(self.carried)

    def wait_until_readable(self) -> None:
        pass

    def command_position(self) -> int:
        return int(self._writer.command_position())

    def close(self) -> None:
        self._writer.close()


class Owner:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def _policy(topics: str = "team-a=team-a.") -> EgressPolicy:
    return EgressPolicy.build(topics=[topics])


def _running(
    produced: ProducedTargets | None, failing: int = 0, arm_ms: int = 0
) -> tuple[PartitionRunner, Carrying, Room]:
    log = MemoryLog(1)
    member = log.join(Owner())
    member.poll(0)
    writer = Carrying(member.writer(0), failing)
    room = Room()
    clock = FakeClock(START)
    runner = PartitionRunner(
        0, log, writer, lambda: MemoryStateStore(0), clock, room,  # type: ignore[arg-type]
        produced=produced, arm_ms=arm_ms,
    )  # fmt: skip
    runner.start()
    return runner, writer, room


def _put(runner: PartitionRunner, target: Any) -> None:
    """A one-shot job due a second on, registered; then the clock moves to its slot."""
    answer: Future[Decided | CronlogError] = Future()
    spec = JobSpec(name="out", tenant="team-a", target=target, run_at=START + 1_000)
    runner.submit(Request(PutJob(job_id="team-a/out", spec=spec), reply=answer.set_result))
    assert isinstance(answer.result(timeout=10), Decided)
    clock = runner._clock
    assert isinstance(clock, FakeClock)
    clock.advance(1_000)  # the runner looks at the clock every IDLE_WAIT_S


def _known(*names: str) -> Any:
    return lambda timeout_s: frozenset(names)


def test_a_due_kafka_run_is_leased_completed_and_produced_in_one_append() -> None:
    runner, writer, room = _running(ProducedTargets(_policy(), _known(TOPIC)))
    try:
        _put(runner, KafkaTarget(topic=TOPIC))
        carried = writer.wait_for("RunCompleted")
    finally:
        runner.stop()
    [(kinds, records)] = [(k, r) for k, r in carried if "LeaseGranted" in k]
    assert kinds[-2:] == ["LeaseGranted", "RunCompleted"]
    [record] = records
    assert record.topic == TOPIC and record.key == b"out"
    body = msgspec.json.decode(record.value)
    assert body["job_id"] == "out" and body["attempt"] == 1
    headers = dict(record.headers)
    assert headers["Idempotency-Key"] == f"team-a/out:{START + 1_000}"
    assert headers["X-Cronlog-Run-Id"] == body["run_id"]
    # decided here: nothing handed to the executors, and no call room taken for it
    assert room.dispatched == [] and room.reserved == room.released == 0


def test_a_kafka_run_needs_no_call_room_so_held_calls_do_not_delay_it() -> None:
    """Another team's calls holding every place in the executors leave a kafka:// run, which
    makes no call, to start at its slot all the same."""
    runner, writer, room = _running(ProducedTargets(_policy(), _known(TOPIC)))
    room.full = True
    try:
        _put(runner, KafkaTarget(topic=TOPIC))
        carried = writer.wait_for("RunCompleted")
    finally:
        runner.stop()
    assert [len(records) for _, records in carried if records] == [1]
    assert room.reserved == 0 and room.dispatched == []


def test_without_produced_targets_a_kafka_run_is_a_call() -> None:
    runner, writer, room = _running(None)
    try:
        _put(runner, KafkaTarget(topic=TOPIC))
        carried = writer.wait_for("LeaseGranted")
    finally:
        runner.stop()
    assert all(records == [] for _, records in carried)
    assert len(room.dispatched) == 1 and room.released == 0


def test_a_topic_not_granted_fails_for_good_and_produces_nothing() -> None:
    runner, writer, _ = _running(ProducedTargets(_policy("team-b=team-a."), _known(TOPIC)))
    try:
        _put(runner, KafkaTarget(topic=TOPIC))
        carried = writer.wait_for("RunDeadLettered")
    finally:
        runner.stop()
    assert all(records == [] for _, records in carried)
    failed = _events(runner, ev.RunFailed)
    assert failed[0].permanent and "may not produce" in failed[0].error


def test_a_topic_the_cluster_lacks_is_a_failed_attempt_retried() -> None:
    produced = ProducedTargets(_policy(), _known("team-a.other"))
    runner, writer, _ = _running(produced)
    try:
        _put(runner, KafkaTarget(topic=TOPIC))
        carried = writer.wait_for("RetryScheduled")
    finally:
        runner.stop()
    assert all(records == [] for _, records in carried)
    [failed] = _events(runner, ev.RunFailed)
    assert not failed.permanent and not failed.ambiguous
    assert f"topic {TOPIC!r} does not exist" in failed.error


@pytest.mark.parametrize("failing", [1, OUTBOUND_TRIES])
def test_an_aborted_transaction_is_tried_again_then_the_attempt_fails(failing: int) -> None:
    """An abort leaves nothing: the run is decided again from the log. Once more it carries
    its record; after ``OUTBOUND_TRIES`` aborts its attempt fails (not ambiguous: nothing was
    produced) and the job's retries take over, so a topic that always aborts never holds the
    partition."""
    runner, writer, room = _running(ProducedTargets(_policy(), _known(TOPIC)), failing=failing)
    try:
        _put(runner, KafkaTarget(topic=TOPIC))
        carried = writer.wait_for("RunCompleted" if failing < OUTBOUND_TRIES else "RunFailed")
    finally:
        runner.stop()
    produced = [records for _, records in carried if records]
    if failing < OUTBOUND_TRIES:
        assert len(produced) == 1 and _events(runner, ev.RunFailed) == []
    else:
        assert produced == []
        [failed] = _events(runner, ev.RunFailed)
        assert not failed.ambiguous and not failed.permanent
        assert f"{OUTBOUND_TRIES} transactions carrying it failed" in failed.error
        assert "broker gone" in failed.error
    assert room.dispatched == []


def test_topics_are_asked_of_the_cluster_at_most_every_few_seconds() -> None:
    asked: list[float] = []
    now = [100.0]

    def names(timeout_s: float) -> frozenset[str]:
        asked.append(now[0])
        return frozenset({TOPIC})

    produced = ProducedTargets(_policy(), names, monotonic=lambda: now[0])
    assert produced.refusal("team-a", "team-a.new") is not None
    assert produced.refusal("team-a", "team-a.new") is not None  # not asked again so soon
    assert produced.refusal("team-a", TOPIC) is None  # known from the first answer
    now[0] += TOPICS_EVERY_S
    assert produced.refusal("team-a", "team-a.new") is not None
    assert asked == [100.0, 100.0 + TOPICS_EVERY_S]


def test_a_kafka_run_is_not_armed_ahead_where_it_is_produced_at_its_slot() -> None:
    """Its lease, success and record are decided together, so at its start, not the arming
    time ahead of it; an HTTP run's call is still armed ahead."""
    for target, at_slot, ready_at in (
        (KafkaTarget(topic=TOPIC), True, START + 5_000),
        (KafkaTarget(topic=TOPIC), False, START + 4_000),
        (HttpTarget(url="https://example.com/"), True, START + 4_000),
    ):
        p = Partition(0, START, arm_ms=1_000, lead_ms=2_000, kafka_at_slot=at_slot)
        spec = JobSpec(name="j", tenant="team-a", target=target, run_at=START + 5_000)
        p.handle(PutJob(job_id="team-a/j", spec=spec), START)
        ready = None
        for now in range(START, START + 6_000, 10):
            p.advance(now)
            while (key := p.next_due()) is not None:
                if key[0] == "ready":
                    ready = now
                else:
                    p.fire(key, now)
            if ready is not None:
                break
        assert ready == ready_at, (target, at_slot)


def _events(runner: PartitionRunner, kind: type[Any]) -> list[Any]:
    records = runner._log.read_events(0, 0, 1000)
    return [e for e in (ev.decode(r.value) for r in records) if isinstance(e, kind)]


@pytest.mark.parametrize(
    ("kafka", "target_kafka", "target_config", "asked", "exactly_once"),
    [
        ("b:9092", "b:9092", None, None, True),  # the cluster's own topics, its credentials
        ("b:9092", "b:9092", None, "at-least-once", False),  # the operator says otherwise
        ("b:9092", "other:9092", None, None, False),  # the teams' topics on another Kafka
        ("b:9092", "b:9092", "targets.conf", None, False),  # credentials of their own
        (None, "t:9092", None, None, False),  # embedded
    ],
)
def test_serve_produces_kafka_runs_in_the_transaction_only_where_it_can(
    kafka: str | None,
    target_kafka: str,
    target_config: str | None,
    asked: str | None,
    exactly_once: bool,
) -> None:
    from argparse import Namespace

    from cli.serve import produced_targets

    args = Namespace(kafka=kafka, target_kafka_config=target_config, kafka_targets=asked)
    log = Namespace(topic_names=_known(TOPIC))
    produced = produced_targets(args, log, target_kafka, _policy())
    assert (produced is not None) == exactly_once


def test_serve_refuses_exactly_once_where_it_cannot_keep_it() -> None:
    from argparse import Namespace

    from cli.serve import produced_targets

    args = Namespace(kafka=None, target_kafka_config=None, kafka_targets="exactly-once")
    with pytest.raises(SystemExit, match="needs cluster mode"):
        produced_targets(args, Namespace(), "t:9092", _policy())


def test_a_runner_asking_the_cluster_does_not_hold_the_others_back() -> None:
    """One runner waits for the cluster's topics (a topic it has not seen); another deciding a
    run to a topic already known is answered meanwhile."""
    asking = threading.Event()
    answer = threading.Event()
    first = [True]

    def names(timeout_s: float) -> frozenset[str]:
        if first[0]:
            first[0] = False
            return frozenset({TOPIC})
        asking.set()
        assert answer.wait(10)
        return frozenset({TOPIC, "team-a.new"})

    now = [100.0]
    produced = ProducedTargets(_policy(), names, monotonic=lambda: now[0])
    assert produced.refusal("team-a", TOPIC) is None  # known from the first ask
    now[0] += TOPICS_EVERY_S
    waiting = threading.Thread(target=produced.refusal, args=("team-a", "team-a.new"))
    waiting.start()
    try:
        assert asking.wait(10)
        assert produced.refusal("team-a", TOPIC) is None  # not behind the ask in flight
    finally:
        answer.set()
        waiting.join(10)
    assert produced.refusal("team-a", "team-a.new") is None
