"""The scheduler group's session on a real broker: a session the brokers refuse is widened to
Kafka's stock floor, once and loudly, and the member still gets its partitions; the default
session outlasts the move of the group's coordinator when its broker dies."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from eventlog.kafka import STOCK_MIN_SESSION_TIMEOUT_MS, KafkaLog
from tools.kafka import broker

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


class Moves(Owned):
    """:class:`Owned`, counting every revocation (a lost assignment is one too)."""

    def __init__(self) -> None:
        super().__init__()
        self.revocations: list[list[int]] = []

    def revoked(self, partitions: list[int]) -> None:
        self.revocations.append(list(partitions))
        super().revoked(partitions)


def _coordinator(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result(15)
    return int(described.coordinator.id)


def test_a_member_keeps_its_partitions_while_its_coordinator_s_broker_dies(
    kafka_cluster3: broker.KafkaCluster,
) -> None:
    """The default session outlasts a coordinator's move: the broker hosting the group's
    coordinator is killed, and the member keeps its partitions throughout, with no rebalance
    (a shorter session made every member give every partition up and join again cold,
    docs/reliability.md). Its appends go on once the brokers have fenced the dead one."""
    bootstrap = kafka_cluster3.bootstrap_servers
    log = KafkaLog.open(bootstrap, 2, prefix=f"session-{uuid.uuid4().hex[:12]}")
    moves = Moves()
    killed: int | None = None
    try:
        member = log.join(moves)
        deadline = time.monotonic() + 60
        while moves.partitions != {0, 1}:
            assert time.monotonic() < deadline, "the member never owned its partitions"
            member.poll(0.1)
        member.writer(0).append([b"before"])
        killed = _coordinator(bootstrap, log.group)
        kafka_cluster3.kill(killed)
        # The coordinator moves once the controller fences the dead broker (2 s here, and a
        # controller election first when it was the active one): poll past the old 3 s
        # session and the move, appending, as a node would.
        until = time.monotonic() + 12
        while time.monotonic() < until:
            member.poll(0.2)
        assert _coordinator(bootstrap, log.group) != killed
        member.writer(0).append([b"after"])
        member.poll(0.5)
        assert moves.revocations == [], "the member gave its partitions up"
        assert member.owned() == {0, 1}
    finally:
        log.close()
        if killed is not None:
            kafka_cluster3.restart(killed)  # the cluster is shared by the session
