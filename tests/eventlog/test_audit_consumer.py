"""The events topic as an outside audit consumer reads it, with a client that shares no code
with the writer: kafka-python (pure Python) against what confluent-kafka (librdkafka) wrote.

An aborted transaction's records are physically in the topic; a ``read_committed`` reader must
never see them, and must see every committed event once, in order, decodable with the public
event codec alone.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition

from core import events as ev
from eventlog.kafka import KafkaLog, KafkaMembership

pytestmark = pytest.mark.kafka


class _Owner:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


@pytest.fixture
def owned(kafka_bootstrap: str) -> Iterator[tuple[KafkaLog, KafkaMembership]]:
    prefix = f"audit-{uuid.uuid4().hex[:8]}"
    log = KafkaLog.open(
        kafka_bootstrap, 1, prefix=prefix, replication_factor=-1, min_insync_replicas=None
    )
    membership = log.join(_Owner())
    deadline = time.monotonic() + 60
    while not membership.owned() and time.monotonic() < deadline:
        membership.poll(0.2)  # group join: the assignment arrives inside poll
    assert membership.owned() == {0}
    yield log, membership
    membership.close()
    log.close()


def _read(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        return [record.value for record in consumer]
    finally:
        consumer.close()


def test_read_committed_audit_consumer_sees_committed_events_only(
    kafka_bootstrap: str, owned: tuple[KafkaLog, KafkaMembership]
) -> None:
    log, membership = owned
    writer = membership.writer(0)
    first = [ev.JobPaused(at=i, job_id="j", tenant="t", version=i) for i in range(1, 4)]
    writer.append([ev.encode(e) for e in first])

    rogue = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{log.prefix}.rogue"}
    )
    rogue.init_transactions()
    rogue.begin_transaction()
    for _ in range(2):
        rogue.produce(log.topics["events"], value=b'{"type":"aborted"}', partition=0)
    rogue.flush()
    rogue.abort_transaction()

    last = ev.JobResumed(at=9, job_id="j", tenant="t", version=9, next_slot=60_000)
    writer.append([ev.encode(last)])

    committed = _read(kafka_bootstrap, log.topics["events"], "read_committed")
    assert [ev.decode(raw) for raw in committed] == [*first, last]
    uncommitted = _read(kafka_bootstrap, log.topics["events"], "read_uncommitted")
    assert uncommitted.count(b'{"type":"aborted"}') == 2  # they were written, and hidden
