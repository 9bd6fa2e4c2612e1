"""The test broker answers, carries records, and fences transactional producers as cronlog needs.

The fencing tests pin down the librdkafka behaviour the Kafka log adapter is built on: a second
producer with the same ``transactional.id`` fences the first at ``init_transactions()``, the
first's next transactional call fails fatally with ``_FENCED``, and a ``read_committed`` reader
never sees what the first tried to write after that (nor its transaction left open).
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tools.kafka import broker

pytestmark = pytest.mark.kafka


def _topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication_factor=-1)], operation_timeout=10
    )
    futures[name].result(timeout=30)
    return name


def _committed_values(bootstrap: str, topic: str, partition: int = 0) -> list[bytes]:
    """Every committed value of the partition, read from the start up to its stable end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",  # required by the client; nothing joins or commits
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        values: list[bytes] = []
        for _ in range(300):
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                return values
            if err is not None:
                raise KafkaException(err)
            values.append(msg.value() or b"")
        raise AssertionError(f"no end of {topic}[{partition}] within 30s; read {values}")
    finally:
        consumer.close()


def _transactional(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "acks": "all",
        }
    )
    producer.init_transactions(30)
    return producer


def test_broker_answers_metadata(kafka_bootstrap: str) -> None:
    metadata = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10)
    assert len(metadata.brokers) >= 1


def test_produce_consume_round_trip(kafka_bootstrap: str) -> None:
    topic = _topic(kafka_bootstrap)
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "acks": "all", "enable.idempotence": True}
    )
    delivered: list[int] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        assert err is None, err
        delivered.append(msg.offset())  # type: ignore[attr-defined]

    sent = [f"record-{i}".encode() for i in range(100)]
    for value in sent:
        producer.produce(topic, value, partition=0, on_delivery=on_delivery)
    assert producer.flush(30) == 0

    assert delivered == sorted(delivered) and len(delivered) == len(sent)
    assert _committed_values(kafka_bootstrap, topic) == sent


@pytest.mark.parametrize("with_offsets", [False, True], ids=["events-only", "with-offsets"])
@pytest.mark.parametrize("open_at_fence", [False, True], ids=["idle", "mid-transaction"])
def test_second_producer_fences_the_first(
    kafka_bootstrap: str, with_offsets: bool, open_at_fence: bool
) -> None:
    topic = _topic(kafka_bootstrap)
    tid = f"fence-{uuid.uuid4().hex[:8]}"
    group = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{tid}.group"})

    def begin(producer: Producer, value: bytes) -> None:
        producer.begin_transaction()
        producer.produce(topic, value, partition=0)
        if with_offsets:
            producer.send_offsets_to_transaction(
                [TopicPartition(topic, 0, 1)], group.consumer_group_metadata(), 10
            )

    old = _transactional(kafka_bootstrap, tid)
    begin(old, b"old-committed")
    old.commit_transaction(30)
    if open_at_fence:
        begin(old, b"old-open-at-fence")
        assert old.flush(10) == 0  # in the log, awaiting its transaction's outcome

    new = _transactional(kafka_bootstrap, tid)  # bumps the epoch; aborts old's open transaction

    with pytest.raises(KafkaException) as fenced:
        # Which call fails depends on when librdkafka hears of the fence: produce, offsets or
        # commit. Whichever it is, nothing of this transaction may ever be read.
        if not open_at_fence:
            old.begin_transaction()
        old.produce(topic, b"old-after-fence", partition=0)
        if with_offsets:
            old.send_offsets_to_transaction(
                [TopicPartition(topic, 0, 2)], group.consumer_group_metadata(), 10
            )
        old.commit_transaction(30)
    error = fenced.value.args[0]
    assert error.fatal(), error
    assert error.code() == KafkaError._FENCED, error
    old.purge()  # drop what it could never deliver

    begin(new, b"new-committed")
    new.commit_transaction(30)
    assert _committed_values(kafka_bootstrap, topic) == [b"old-committed", b"new-committed"]
    group.close()


def test_three_nodes_keep_accepting_writes_with_one_killed(
    kafka_cluster3: broker.KafkaCluster,
) -> None:
    bootstrap = kafka_cluster3.bootstrap_servers
    assert len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers) == 3
    topic = _topic(bootstrap)  # the cluster's defaults: replication factor 3, min ISR 2
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})

    producer.produce(topic, b"before", partition=0)
    assert producer.flush(30) == 0
    kafka_cluster3.kill(3)
    try:
        assert not kafka_cluster3.node(3).alive()
        producer.produce(topic, b"after", partition=0)
        assert producer.flush(60) == 0
    finally:
        kafka_cluster3.restart(3)  # the cluster is shared by the session

    assert _committed_values(bootstrap, topic) == [b"before", b"after"]
