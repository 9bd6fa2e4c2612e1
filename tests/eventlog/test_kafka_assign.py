"""The group's rebalance callback asks nothing of the group's own consumer but the assignment.

Some of that consumer's blocking calls made inside its own callback (``list_topics`` in
confluent-kafka 2.16, reproduced on a real broker) clear its per-thread call state, and the
next callback of the same poll aborts the process: ``CallState_get: Assertion 'cs != NULL'
failed``. CI's chaos run died so during a broker kill, when the callback's watermark query
timed out against the dead leader and its retry asked the consumer for the topic's metadata.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from eventlog import kafka
from eventlog.kafka import KafkaMembership
from tests.eventlog.test_kafka_end_offset import DeadLeader

COMMANDS = "P.commands"


class GroupConsumer:
    """The group's consumer, as the callback is handed it: it records every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.assigned: list[TopicPartition] = []

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("incremental_assign")
        self.assigned = partitions

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise AssertionError(f"{name} asked of the group's consumer inside its callback")

        return call


class Log:
    """What the callback needs of the log: command positions (3 of partition 0, none of 1)
    and readers whose metadata names a leader that died."""

    _timeout_s = 30.0

    def __init__(self) -> None:
        self.readers: list[DeadLeader] = []
        self._closed = threading.Event()

    def _found_positions(self, partitions: list[int]) -> dict[int, int | None]:
        positions = {0: 3, 1: None}
        return {p: positions[p] for p in partitions}

    @contextlib.contextmanager
    def _reader(self) -> Iterator[DeadLeader]:
        reader = DeadLeader()
        self.readers.append(reader)
        yield reader


class Writer:
    def __init__(self, partition: int) -> None:
        self.partition = partition
        self._position = -1


class Listener:
    def __init__(self) -> None:
        self.owned: list[int] = []

    def assigned(self, partitions: list[int]) -> None:
        self.owned = partitions


def test_the_callback_asks_the_group_consumer_for_nothing_but_the_assignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        kafka, "_open_writers", lambda log, partitions: {p: Writer(p) for p in partitions}
    )
    log = Log()
    listener = Listener()
    membership: Any = KafkaMembership.__new__(KafkaMembership)
    membership._log = log
    membership._listener = listener
    membership._commands = COMMANDS
    membership._lock = threading.Lock()
    membership._writers = {}
    membership._closed = False
    membership.checks = []
    consumer = GroupConsumer()

    membership._on_assign(consumer, [TopicPartition(COMMANDS, 0), TopicPartition(COMMANDS, 1)])
    for check in membership.checks:  # the check for deleted commands runs beside it
        check.join(10.0)

    assert consumer.calls == ["incremental_assign"]
    # Each start was asked of a reader, whose retry after the dead leader's timeout asked
    # that reader, not the group's consumer, for the topic's metadata.
    assert len(log.readers) == 2 and all(r.refreshed for r in log.readers)
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [
        (0, 3),
        (1, OFFSET_BEGINNING),
    ]
    assert {p: w._position for p, w in membership._writers.items()} == {0: 3, 1: 0}
    assert listener.owned == [0, 1]
