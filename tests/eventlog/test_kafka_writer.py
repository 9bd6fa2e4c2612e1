"""The Kafka partition writer against a producer that stands in for a broker that stopped
answering: an append is bounded as a whole, and closing never waits for it.

No broker: these are the failure modes a real one shows only under faults (a commit that times
out again and again after a broker restart), driven here by a scripted producer and a fake
monotonic clock that a blocked call advances by the timeout it was given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import eventlog.kafka as kafka
from core.errors import Fenced
from eventlog.kafka import KafkaPartitionWriter

TIMEOUT_S = 30.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeLog:
    _timeout_s: float = TIMEOUT_S
    _readable_appends: bool = False
    prefix: str = "t"
    topics: dict[str, str] = field(
        default_factory=lambda: {
            "events": "t.events",
            "commands": "t.commands",
            "positions": "t.positions",
        }
    )


class FakeMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


class ScriptedProducer:
    """Records the transactional calls; ``commit`` decides what each commit does."""

    def __init__(self, commit: Callable[[float], None]) -> None:
        self._commit = commit
        self.pending: list[Callable[..., None]] = []
        self.produced: list[tuple[str, bytes, int]] = []  # (topic, value, partition) in order
        self.next_offset = 0
        self.commit_timeouts: list[float] = []
        self.closed = 0

    def begin_transaction(self) -> None:
        self.pending = []

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Any = None,
    ) -> None:
        self.produced.append((topic, value, partition))
        if on_delivery is not None:
            self.pending.append(on_delivery)

    def commit_transaction(self, timeout: float) -> None:
        self.commit_timeouts.append(timeout)
        self._commit(timeout)
        for report in self.pending:
            report(None, FakeMessage(self.next_offset))
            self.next_offset += 1

    def abort_transaction(self, timeout: float) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 0

    def purge(self) -> None:
        pass

    def close(self) -> bool:
        self.closed += 1
        return True


def timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(kafka.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(kafka.time, "sleep", fake.sleep)
    return fake


def writer_of(producer: ScriptedProducer) -> KafkaPartitionWriter:
    return KafkaPartitionWriter(FakeLog(), 0, producer)  # type: ignore[arg-type]


def test_an_append_whose_commit_keeps_timing_out_gives_up_within_the_logs_timeout(
    clock: FakeClock,
) -> None:
    def never_answers(timeout: float) -> None:
        clock.now += timeout  # blocked for all it was given
        raise timed_out()

    producer = ScriptedProducer(never_answers)
    writer = writer_of(producer)
    started = clock.now

    with pytest.raises(Fenced):
        writer.append([b"e"])

    # One deadline for the whole append, not a full timeout for each of several attempts.
    assert clock.now - started <= TIMEOUT_S + kafka.MIN_CALL_S
    assert sum(producer.commit_timeouts) <= TIMEOUT_S + kafka.MIN_CALL_S
    assert producer.closed == 1  # the writer closed: its runner recovers with a new one
    with pytest.raises(Fenced):
        writer.append([b"next"])


def test_an_error_that_comes_back_at_once_is_asked_again_with_backoff_until_it_passes(
    clock: FakeClock,
) -> None:
    failures = iter([timed_out(), timed_out()])

    def fails_twice(timeout: float) -> None:
        error = next(failures, None)
        if error is not None:
            raise error

    producer = ScriptedProducer(fails_twice)
    started = clock.now

    assert writer_of(producer).append([b"a", b"b"]) == [0, 1]
    assert len(producer.commit_timeouts) == 3
    assert clock.now - started == pytest.approx(kafka.RETRY_BACKOFF_S * 3)  # 0.05 + 0.1
    assert producer.commit_timeouts[0] == TIMEOUT_S  # each attempt given what is left
    assert producer.closed == 0


class BlockedCommit:
    """A commit that blocks until the test lets it go, then succeeds or fails."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.error: KafkaException | None = None

    def __call__(self, timeout: float) -> None:
        self.entered.set()
        assert self.release.wait(10), "the test never released the commit"
        if self.error is not None:
            raise self.error


def append_in_thread(writer: KafkaPartitionWriter) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(writer.append([b"e"], commands_through=None))
        except Exception as err:
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def close_in_thread(writer: KafkaPartitionWriter) -> threading.Thread:
    thread = threading.Thread(target=writer.close, daemon=True)
    thread.start()
    return thread


def closed_during_commit(
    commit: BlockedCommit,
) -> tuple[ScriptedProducer, KafkaPartitionWriter, list[object]]:
    """Close the writer while an append's commit is blocked; return once the append ended."""
    producer = ScriptedProducer(commit)
    writer = writer_of(producer)
    appending, outcome = append_in_thread(writer)
    assert commit.entered.wait(10)

    closing = close_in_thread(writer)
    closing.join(5)
    assert not closing.is_alive(), "close waited for the transaction in flight"
    assert producer.closed == 0  # not under the transaction: the append closes it

    commit.release.set()
    appending.join(10)
    assert not appending.is_alive()
    return producer, writer, outcome


def test_closing_returns_at_once_while_an_append_is_in_flight_and_its_commit_still_counts() -> None:
    producer, writer, outcome = closed_during_commit(BlockedCommit())

    assert outcome == [[0]]  # it committed: its events are in the log, and its caller hears so
    assert producer.closed == 1
    with pytest.raises(Fenced):
        writer.append([b"next"])


def test_an_append_that_fails_after_its_writer_was_closed_raises_fenced() -> None:
    commit = BlockedCommit()
    commit.error = KafkaException(
        KafkaError(KafkaError._FENCED, "fenced by the next owner", fatal=True)
    )
    producer, _, outcome = closed_during_commit(commit)

    [error] = outcome
    assert isinstance(error, Fenced)
    assert producer.closed == 1


def test_the_command_position_is_a_record_of_the_appends_own_transaction() -> None:
    """The position goes to ``positions[p]`` beside the events, committed with them or not at
    all: no offset commit to the group's coordinator (the producer has no
    ``send_offsets_to_transaction``: a call to it would fail this test)."""
    producer = ScriptedProducer(lambda timeout: None)
    writer = writer_of(producer)

    assert writer.append([b"a", b"b"], commands_through=7) == [0, 1]
    assert producer.produced == [
        ("t.events", b"a", 0),
        ("t.events", b"b", 0),
        ("t.positions", b"7", 0),
    ]
    assert writer.command_position() == 7

    producer.produced.clear()
    assert writer.append([], commands_through=9) == []  # decided commands, no events
    assert producer.produced == [("t.positions", b"9", 0)]
    assert len(producer.commit_timeouts) == 2
    assert writer.command_position() == 9

    producer.produced.clear()
    writer.append([b"c"])  # no position: nothing of it is written
    assert producer.produced == [("t.events", b"c", 0)]
    assert writer.command_position() == 9
