"""The scheduler group's session on a real broker: a session the brokers refuse is widened to
Kafka's stock floor, once and loudly, and the member still gets its partitions."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from eventlog.kafka import STOCK_MIN_SESSION_TIMEOUT_MS, KafkaLog

pytestmark = pytest.mark.kafka


class Owned:
    def __init__(self) -> None:
        self.partitions: set[int] = set()

    def assigned(self, partitions: list[int]) -> None:
        self.partitions |= set(partitions)

    def revoked(self, partitions: list[int]) -> None:
        self.partitions -= set(partitions)


def test_a_session_below_the_brokers_floor_joins_with_the_stock_floor_and_says_so(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    # tools/kafka's brokers allow 1 s and Kafka's defaults 6 s: 500 ms is refused by either.
    log = KafkaLog.open(
        kafka_bootstrap, 2, prefix=f"session-{uuid.uuid4().hex[:12]}",
        replication_factor=-1, min_insync_replicas=None, session_timeout_ms=500,
    )  # fmt: skip
    owned = Owned()
    try:
        with caplog.at_level(logging.WARNING, logger="eventlog.kafka"):
            member = log.join(owned)
            deadline = time.monotonic() + 60
            while owned.partitions != {0, 1}:
                assert time.monotonic() < deadline, "the member never owned its partitions"
                member.poll(0.1)
        assert member.owned() == {0, 1}
        refused = [r for r in caplog.records if "refuse a group session of 500 ms" in r.message]
        assert len(refused) == 1, [r.message for r in caplog.records]
        assert f"joining with {STOCK_MIN_SESSION_TIMEOUT_MS} ms" in refused[0].message
        member.writer(0).append([b"after the widened join"])
    finally:
        log.close()
