"""The snapshot port on Kafka: a compacted topic, one key per partition.

Layout, for prefix ``cronlog`` and N partitions::

    cronlog.snapshots   N partitions, cleanup.policy=compact; partition p holds the key b"p<p>"
                        only, written by transactional.id cronlog.snapshots.p<p>

This is the changelog of Kafka Streams reduced to one key: a changelog keeps every key of a
store and a restoring task reads it whole; cronlog's state store is already rebuilt from the
events topic, so what must survive an owner is one consistent image of it at an offset. A
compacted topic keeps the newest value of each key forever and drops the older ones, so
partition p of the topic converges on one record, the newest snapshot, whatever the log's age.

**One record, not chunks.** A snapshot is compressed (``projections.snapshot``: about 20 bytes
a job for the synthetic benchmark's jobs, a few hundred for jobs with long payloads) and
written as one record, so it is atomic without any reassembly rule. The topic's
``max.message.bytes`` is raised to :data:`MAX_RECORD_BYTES` (64 MiB and a margin), as are the
producer's ``message.max.bytes`` and the reader's ``receive.message.max.bytes``; a broker
sends a record larger than a fetch's size limit anyway (KIP-74), so nothing else changes. At
64 MiB the snapshotter refuses to write (``node.snapshotter.MAX_SNAPSHOT_BYTES``), logs and
counts it: past that, chunking (one transaction of chunk records and a manifest) is the next
step, and more partitions are the better one.

**Fencing.** Each partition's snapshots are written in a transaction by a producer with
``transactional.id=<prefix>.snapshots.p<p>``, opened by the owner at its first snapshot: its
``init_transactions()`` fences every earlier owner's snapshot producer of that partition, so a
zombie cannot overwrite a newer snapshot with an older one once the new owner has written, and
the recovery floor (invariant 4) never moves back. Readers are ``read_committed``.

**Reading the newest.** Compaction runs in the background, so the tail of a partition may
still hold older snapshots and aborted records. ``latest`` reads backwards from the end in
growing steps (2, 8, 32, ... records) until it finds a committed snapshot, so a restore reads
one record, not the partition's history.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from core.errors import CronlogError, Fenced
from eventlog.kafka import _ensure_topics, _retrying, _watermarks
from eventlog.snapshots import StoredSnapshot

if TYPE_CHECKING:
    from eventlog.snapshots import SnapshotStore

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = 64 * 1024 * 1024 + 1024 * 1024
SEGMENT_MS = 3_600_000  # roll hourly, so compaction can reach old snapshots within the hour
_STEPS = (2, 8, 32, 128, 512, 2048)


OFFSET_HEADER = "cronlog-offset"  # the event offset the snapshot reflects, u64 big-endian
_U64 = struct.Struct(">Q")


def _key(partition: int) -> bytes:
    return b"p%d" % partition


class KafkaSnapshots:
    def __init__(
        self,
        bootstrap_servers: str,
        num_partitions: int,
        *,
        prefix: str,
        client_config: dict[str, Any],
        timeout_s: float,
    ) -> None:
        self.topic = f"{prefix}.snapshots"
        self._prefix = prefix
        self._num_partitions = num_partitions
        self._base = {"bootstrap.servers": bootstrap_servers, **client_config}
        self._timeout_s = timeout_s
        self._producers: dict[int, Producer] = {}
        self._newest: dict[int, int] = {}  # offset of the newest snapshot written or read
        self._lock = threading.Lock()
        self._reader = Consumer(
            {
                **self._base,
                "group.id": f"{prefix}.snapshot-reader",  # required; never joined or committed
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "receive.message.max.bytes": MAX_RECORD_BYTES + 1024 * 1024,
                "fetch.wait.max.ms": 100,
            }
        )
        self._reading = threading.Lock()

    @classmethod
    def open(
        cls,
        bootstrap_servers: str,
        num_partitions: int,
        *,
        prefix: str = "cronlog",
        replication_factor: int = 3,
        min_insync_replicas: int | None = 2,
        client_config: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> KafkaSnapshots:
        """Create (or check) the snapshots topic and return the store."""
        config = {
            "cleanup.policy": "compact",
            "max.message.bytes": str(MAX_RECORD_BYTES),
            "segment.ms": str(SEGMENT_MS),
            "unclean.leader.election.enable": "false",
        }
        if min_insync_replicas is not None:
            config["min.insync.replicas"] = str(min_insync_replicas)
        admin = AdminClient({"bootstrap.servers": bootstrap_servers, **(client_config or {})})
        _ensure_topics(
            admin, [f"{prefix}.snapshots"], num_partitions, replication_factor, config, timeout_s
        )
        return cls(
            bootstrap_servers,
            num_partitions,
            prefix=prefix,
            client_config=client_config or {},
            timeout_s=timeout_s,
        )

    def write(self, partition: int, offset: int, data: bytes) -> bool:
        self._check_partition(partition)
        with self._lock:
            producer = self._producers.get(partition)
        if producer is None:
            producer = self._open_producer(partition)
        newest = self._newest.get(partition)
        if newest is None:
            held = self.latest(partition)
            newest = held.offset if held is not None else -1
        if newest >= offset:
            return False
        try:
            producer.begin_transaction()
            producer.produce(
                self.topic,
                data,
                key=_key(partition),
                headers=[(OFFSET_HEADER, _U64.pack(offset))],
                partition=partition,
            )
            # The commit flushes, and fails if the record was not delivered (or was fenced).
            _retrying(producer.commit_transaction, time.monotonic() + self._timeout_s)
        except KafkaException as e:
            err = e.args[0]
            self._drop_producer(partition, producer)
            if err.fatal():
                raise Fenced(
                    f"snapshot writer of partition {partition} was fenced (another node owns"
                    f" it now): {err}"
                ) from e
            with _suppressed():
                producer.abort_transaction(self._timeout_s)
            raise CronlogError(f"snapshot of partition {partition} not written: {err}") from e
        with self._lock:
            self._newest[partition] = offset
        return True

    def latest(self, partition: int) -> StoredSnapshot | None:
        self._check_partition(partition)
        tp = TopicPartition(self.topic, partition)
        with self._reading:
            low, high = _watermarks(self._reader, tp, self._timeout_s)
            for step in _STEPS:
                start = max(low, high - step)
                found = self._last_record(partition, start)
                if found is not None:
                    with self._lock:
                        self._newest[partition] = max(found.offset, self._newest.get(partition, -1))
                    return found
                if start == low:
                    return None
            # Thousands of aborted writes at the tail: read the whole partition.
            return self._last_record(partition, low)

    def older(self, partition: int, below: int) -> StoredSnapshot | None:
        return None  # compaction keeps the newest only

    def floor(self, partition: int) -> int:
        newest = self.latest(partition)
        return 0 if newest is None else newest.offset

    def release(self, partition: int) -> None:
        """Drop the partition's transactional producer (its threads and broker connections
        go with it), so a node does not keep one for every partition it ever owned. A write
        in progress on another thread keeps its reference and ends as it would have; the
        next owner's ``init_transactions`` fences it either way."""
        with self._lock:
            producer = self._producers.pop(partition, None)
            self._newest.pop(partition, None)
        if producer is not None:
            with _suppressed():
                producer.flush(1.0)

    def writers(self) -> list[int]:
        """The partitions whose producer is open (for metrics and tests)."""
        with self._lock:
            return sorted(self._producers)

    def close(self) -> None:
        with self._lock:
            producers = list(self._producers.values())
            self._producers.clear()
        for producer in producers:
            with _suppressed():
                producer.flush(1.0)
        with self._reading:
            self._reader.close()

    def _open_producer(self, partition: int) -> Producer:
        producer = Producer(
            {
                **self._base,
                "transactional.id": f"{self._prefix}.snapshots.p{partition}",
                "acks": "all",
                "linger.ms": 0,
                "compression.type": "none",  # the snapshot is compressed already
                "message.max.bytes": MAX_RECORD_BYTES,
                "transaction.timeout.ms": max(60000, int(self._timeout_s * 2000)),
            }
        )
        _retrying(producer.init_transactions, time.monotonic() + self._timeout_s)
        with self._lock:
            self._producers[partition] = producer
            self._newest.pop(partition, None)  # read again: a predecessor may have written since
        return producer

    def _drop_producer(self, partition: int, producer: Producer) -> None:
        with self._lock:
            if self._producers.get(partition) is producer:
                del self._producers[partition]
            self._newest.pop(partition, None)

    def _last_record(self, partition: int, start: int) -> StoredSnapshot | None:
        """The last committed snapshot record of the partition from ``start`` to its end."""
        self._reader.assign([TopicPartition(self.topic, partition, start)])
        found: StoredSnapshot | None = None
        deadline = time.monotonic() + self._timeout_s
        try:
            while time.monotonic() < deadline:
                msg = self._reader.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return found
                    raise CronlogError(f"reading {self.topic}[{partition}]: {err}")
                value = msg.value()
                offset = _offset_header(msg.headers())
                if msg.key() != _key(partition) or not value or offset is None:
                    # A tombstone, or a record cronlog did not write: not a snapshot.
                    log.warning(
                        "%s[%d] at %s is not a snapshot", self.topic, partition, msg.offset()
                    )
                    continue
                if found is None or offset >= found.offset:
                    found = StoredSnapshot(partition, offset, value)
            raise CronlogError(f"no end of {self.topic}[{partition}] from the broker in time")
        finally:
            self._reader.unassign()

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self._num_partitions:
            raise ValueError(f"partition {partition} is out of range 0..{self._num_partitions - 1}")


def _suppressed() -> contextlib.suppress:
    """Ignore a Kafka error while cleaning up after another one."""
    return contextlib.suppress(KafkaException)


def _offset_header(headers: object) -> int | None:
    pairs = headers.items() if isinstance(headers, dict) else headers or []
    for name, value in pairs:  # type: ignore[attr-defined]
        if name == OFFSET_HEADER and isinstance(value, bytes) and len(value) == _U64.size:
            return int(_U64.unpack(value)[0])
    return None


if TYPE_CHECKING:

    def _implements_the_port(store: KafkaSnapshots) -> SnapshotStore:
        return store
