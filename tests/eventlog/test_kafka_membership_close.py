"""Closing a member never hangs on librdkafka: a group consumer that stays inside its close after
the revocation callback returned (its own unassign waiting for an answer that never came, which
hung a CI run) is left behind, said, and the member's partitions are given up; a callback still
running, this node's own work, is waited for."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from eventlog import kafka
from eventlog.kafka import KafkaMembership


class Writer:
    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Listener:
    def __init__(self, revoking: threading.Event | None = None) -> None:
        self.revoked_: list[int] = []
        self._revoking = revoking  # held while set-up says so: the callback's own work

    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        if self._revoking is not None:
            self._revoking.wait(10)
        self.revoked_.extend(partitions)


class StuckConsumer:
    """Serves the revocation callback of partitions 0 and 1, then never returns from close."""

    def __init__(self, member: KafkaMembership) -> None:
        self._member = member
        self.release = threading.Event()
        self.left_inside = threading.Event()

    def close(self) -> None:
        self._member._on_revoke(self, [TopicPartition("t.commands", 0)])  # type: ignore[arg-type]
        self.left_inside.set()
        self.release.wait(30)


def member(listener: Listener, partitions: list[int]) -> Any:
    m: Any = KafkaMembership.__new__(KafkaMembership)
    m._listener = listener
    m._lock = threading.Lock()
    m._writers = {p: Writer(p) for p in partitions}
    m._closed = False
    m._in_callback = threading.Event()
    return m


def test_a_close_stuck_in_librdkafka_is_left_behind_and_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kafka, "CLOSE_STUCK_S", 0.3)
    listener = Listener()
    m = member(listener, [0, 1])
    consumer = StuckConsumer(m)
    m._consumer = consumer
    try:
        with caplog.at_level(logging.ERROR, logger="eventlog.kafka"):
            m.close()  # returns: the test would hang here without the bound
        assert consumer.left_inside.is_set() and not consumer.release.is_set()
        # the callback gave partition 0 up; the close gave up what was left
        assert sorted(listener.revoked_) == [0, 1]
        assert all(w.closed for w in [*m._writers.values()]) and m._writers == {}
        assert any("did not close within" in r.getMessage() for r in caplog.records)
    finally:
        consumer.release.set()


def test_a_revocation_callback_that_runs_long_is_waited_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kafka, "CLOSE_STUCK_S", 0.3)
    revoking = threading.Event()
    listener = Listener(revoking)
    m = member(listener, [0])
    consumer = StuckConsumer(m)
    consumer.release.set()  # close returns once the callback has
    m._consumer = consumer
    # The callback's work takes three times the bound, then ends: close waits for it.
    threading.Timer(0.9, revoking.set).start()
    with caplog.at_level(logging.ERROR, logger="eventlog.kafka"):
        m.close()
    assert listener.revoked_ == [0]
    assert not any("did not close within" in r.getMessage() for r in caplog.records)
