"""On a real Kafka: a record produced into ``<prefix>.events`` by something other than the
partition's writer (a plain producer, as a job's ``kafka://`` target once did) is passed over,
reported once, by recovery, the read model and ``verify``."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from eventlog.kafka import KafkaLog
from projections.decoding import EventDecoder, ForeignRecord
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import MemoryStateStore, catch_up
from tests.projections.histories import Writers, busy_partition
from tools.replay.cli import main

pytestmark = pytest.mark.kafka

FOREIGN = b'{"job_id": "p0rollup", "run_id": "p0rollup.1", "payload": {"from": "a target"}}'


def produce_foreign(bootstrap: str, topic: str, partition: int) -> int:
    """Produce one record as any client with write access could; its offset."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    offsets: list[int] = []
    done = threading.Event()

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        offsets.append(msg.offset() or 0)
        done.set()

    producer.produce(topic, FOREIGN, partition=partition, on_delivery=delivered)
    producer.flush(30)
    assert done.is_set(), "the foreign record was not acknowledged"
    return offsets[0]


def test_readers_pass_over_a_record_another_producer_wrote_into_the_events_topic(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"foreign-{uuid.uuid4().hex[:12]}"
    sim = busy_partition(41, steps=80, partition=0, prefix="p0")
    log = KafkaLog.open(
        kafka_bootstrap, 1, prefix=prefix, replication_factor=-1, min_insync_replicas=None
    )
    try:
        writers = Writers(log)
        half = len(sim.log) // 2
        writers.append(0, sim.log[:half], chunk=100)
        foreign = produce_foreign(kafka_bootstrap, log.topics["events"], 0)
        last = writers.append(0, sim.log[half:], chunk=100)[-1]
        writers.close()

        seen: list[ForeignRecord] = []
        state = catch_up(
            MemoryStateStore(0),
            log,
            0,
            batch_size=50,
            decoder=EventDecoder("recovery", seen.append),
        )
        assert state.snapshot() == sim.state.snapshot()
        assert [(f.reader, f.offset, f.size) for f in seen] == [("recovery", foreign, len(FOREIGN))]

        with ReadModel.open(tmp_path / "node") as model:
            ReadModelRunner(log, model, decoder=EventDecoder("read_model", seen.append)).run_once()
            assert model.position(0) == last + 1
            assert model.job("t1", "p0rollup") is not None
        assert [f.reader for f in seen] == ["recovery", "read_model"]
    finally:
        log.close()

    argv = ["verify", "--kafka", kafka_bootstrap, "--topic-prefix", prefix, "--partitions", "1"]
    code = main([*argv, "--data-dir", str(tmp_path / "empty")])
    out = capsys.readouterr().out
    assert code == 4, out
    assert f"FOREIGN partition 0 offset {foreign}: not an event" in out
