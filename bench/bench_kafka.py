"""Throughput of the Kafka log adapter, against the raw producer rate of the same broker.

    python -m bench.bench_kafka        # KAFKA_BOOTSTRAP_SERVERS, or a 1-node broker of its own

Scenarios, each for a fixed time on a fresh log of 4 partitions, 100-byte values:

* append: transactional appends through partition writers, each carrying a command position
  (as the node's appends do); 1 or 100 events per append, from 1 thread and from 4 threads
  (one writer each). An append returns once its events are readable.
* submit: commands through ``submit`` (one acknowledged record each) from 1 and 16 threads.
* raw produce: confluent-kafka with acks=all and idempotence, no transactions, fire and flush
  in batches of 10,000: what the broker takes when nobody waits per record.

Appends one JSON line to bench/results/kafka.jsonl and prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from confluent_kafka import Producer

from eventlog.kafka import KafkaLog
from eventlog.port import Membership
from tools.kafka import broker

PARTITIONS = 4
VALUE = b"v" * 100
SECONDS = 2.5
RAW_BATCH = 10_000
RESULTS = Path(__file__).parent / "results" / "kafka.jsonl"


class _Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def _own_all(log: KafkaLog) -> Membership:
    member = log.join(_Quiet())
    deadline = time.monotonic() + 60
    while member.owned() != frozenset(range(PARTITIONS)):
        if time.monotonic() > deadline:
            raise RuntimeError("the bench member never owned every partition")
        member.poll(0.1)
    return member


def _run(threads: int, work: Callable[[int], int]) -> dict[str, float]:
    """Run ``work(thread_index)`` repeatedly on each thread for SECONDS; it returns records."""
    writes = [0] * threads
    records = [0] * threads
    stop = threading.Event()

    def loop(i: int) -> None:
        while not stop.is_set():
            records[i] += work(i)
            writes[i] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    stop.wait(SECONDS)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - began
    return {
        "threads": threads,
        "writes_per_s": round(sum(writes) / elapsed, 1),
        "records_per_s": round(sum(records) / elapsed, 1),
        "mean_latency_ms": round(1000 * elapsed * threads / max(1, sum(writes)), 2),
    }


def _appends(log: KafkaLog, member: Membership, batch: int, threads: int) -> dict[str, float]:
    member.poll(0)  # a member that stops polling leaves the group (max.poll.interval.ms)
    events = [VALUE] * batch
    writers = [member.writer(p) for p in range(threads)]
    positions = [w.command_position() for w in writers]

    def append(i: int) -> int:
        writers[i].append(events, commands_through=positions[i])
        return batch

    return _run(threads, append)


def _submits(log: KafkaLog, threads: int) -> dict[str, float]:
    def submit(i: int) -> int:
        log.submit(i % PARTITIONS, VALUE)
        return 1

    return _run(threads, submit)


def _raw_produce(bootstrap: str, topic: str) -> dict[str, float]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    sent, began = 0, time.perf_counter()
    while time.perf_counter() - began < SECONDS:
        for i in range(RAW_BATCH):
            while True:
                try:
                    producer.produce(topic, VALUE, partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(60)
        sent += RAW_BATCH
    elapsed = time.perf_counter() - began
    return {"records_per_s": round(sent / elapsed, 1), "batch": RAW_BATCH}


def measure(bootstrap: str) -> dict[str, dict[str, float]]:
    log = KafkaLog.open(
        bootstrap,
        PARTITIONS,
        prefix=f"bench-{uuid.uuid4().hex[:8]}",
        replication_factor=-1,
        min_insync_replicas=None,
    )
    try:
        member = _own_all(log)
        for _ in range(20):  # warm the broker and the clients up
            member.writer(0).append([VALUE], commands_through=0)
            log.submit(0, VALUE)
        figures = {}
        for batch in (1, 100):
            for threads in (1, PARTITIONS):
                figures[f"append {batch}/batch x{threads}"] = _appends(log, member, batch, threads)
        for threads in (1, 16):
            figures[f"submit x{threads}"] = _submits(log, threads)
        figures["raw produce"] = _raw_produce(bootstrap, log.topics["commands"])
        member.close()
    finally:
        log.close()
    return figures


def main() -> None:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    cluster = None
    if external is None:
        cluster = broker.start(1, Path(tempfile.mkdtemp(prefix="bench-kafka-")))
    try:
        figures = measure(external or cluster.bootstrap_servers)  # type: ignore[union-attr]
    finally:
        if cluster is not None:
            cluster.stop()
    line = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "confluent_kafka": version("confluent-kafka"),
        "broker": "external" if external else f"kafka {broker.kafka_version()}, 1 node, local",
        "partitions": PARTITIONS,
        "value_bytes": len(VALUE),
        "figures": figures,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(line) + "\n")
    print(f"{'scenario':<22} {'writes/s':>10} {'records/s':>12} {'latency ms':>11}")
    for name, f in figures.items():
        print(
            f"{name:<22} {f.get('writes_per_s', ''):>10} {f['records_per_s']:>12} "
            f"{f.get('mean_latency_ms', ''):>11}"
        )


if __name__ == "__main__":
    main()
