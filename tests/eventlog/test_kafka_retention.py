"""Retention on Kafka, against a real broker: the topics carry the nodes' retention settings
(and follow a change of them), reading below a partition's start is an error rather than a jump
to its end, the archiver keeps what the brokers' retention deletes, saying how close it is
to losing any, and the commands topic is trimmed to the committed command position, so that a
takeover after a trim still decides every acknowledged command."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from prometheus_client import CollectorRegistry

from archive.archive import Archive
from archive.archiver import Archiver
from archive.reading import ArchivedLog
from archive.store import DirectoryStore
from core.errors import Fenced, Pruned
from eventlog.kafka import KafkaLog, KafkaMembership, KafkaPartitionWriter, topic_configs
from eventlog.port import Record
from eventlog.retention import Retention
from node.retention import KafkaRetention, RetentionMetrics, gap_counter
from tests.projections.histories import Writers
from tools.replay.records import events

pytestmark = pytest.mark.kafka
DAY = 86_400_000
HOUR = 3_600_000


def _open(bootstrap: str, prefix: str, retention: Retention | None) -> KafkaLog:
    return KafkaLog.open(
        bootstrap,
        2,
        prefix=prefix,
        replication_factor=-1,
        min_insync_replicas=None,
        retention=retention,
    )


def _retention(admin: AdminClient, topic: str) -> tuple[str, str]:
    configs = topic_configs(admin, topic, 30)
    return configs["retention.ms"], configs["retention.bytes"]


def test_the_topics_take_the_retention_settings_and_follow_a_change(kafka_bootstrap: str) -> None:
    prefix = f"retention-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    _open(kafka_bootstrap, prefix, Retention()).close()  # the defaults
    assert _retention(admin, f"{prefix}.events") == (str(30 * DAY), "-1")
    assert _retention(admin, f"{prefix}.commands") == (str(7 * DAY), "-1")

    changed = Retention(retention_ms=2 * DAY, retention_bytes=2**30, command_retention_ms=DAY)
    _open(kafka_bootstrap, prefix, changed).close()  # a node restarted with other flags
    assert _retention(admin, f"{prefix}.events") == (str(2 * DAY), str(2**30))
    assert _retention(admin, f"{prefix}.commands") == (str(DAY), "-1")

    _open(kafka_bootstrap, prefix, None).close()  # the tools open topics without settings
    assert _retention(admin, f"{prefix}.events") == (str(2 * DAY), str(2**30))


def test_the_archive_keeps_what_the_brokers_deleted_and_the_lag_is_measured(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    prefix = f"retention-{uuid.uuid4().hex[:12]}"
    log = _open(kafka_bootstrap, prefix, Retention(retention_ms=DAY))
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    now = time.time_ns() // 1_000_000
    values = [b'{"type":"x","at":%d,"n":%d}' % (now - 12 * HOUR + i, i) for i in range(30)]
    writers = Writers(log)
    writers.append(0, values, chunk=7)  # several transactions: markers between them
    archive = Archive(DirectoryStore(tmp_path / "archive"))
    metrics = RetentionMetrics(CollectorRegistry())
    archiver = Archiver(log, archive, on_gap=gap_counter(metrics))
    loop = KafkaRetention(
        log, lambda: [0, 1], metrics, archiver=archiver, retention_ms=DAY, max_delay_ms=HOUR
    )
    try:
        loop.run_once(now)  # the events wait for their hour (or 100k of them): not yet
        assert archive.archived_through(0) == 0
        assert metrics.lag.offsets[0] == log.end_offset("events", 0)
        assert metrics.lag.age_s[0] == pytest.approx(12 * 3600, abs=1)  # half the retention
        used = _sample(metrics, "cronlog_archive_retention_used_ratio", "0")
        assert used == pytest.approx(0.5, abs=0.001)

        loop.run_once(now + HOUR)
        end = log.end_offset("events", 0)
        assert archive.archived_through(0) >= end - 1  # all but, at most, the last marker
        assert metrics.lag.age_s.get(0) is None and metrics.archived_records._value.get() == 30

        # What the brokers' retention does: the partition's start moves past all it archived
        # (the last transaction's commit marker stays in the log, as in an active segment).
        through = archive.archived_through(0)
        _delete_records(admin, f"{prefix}.events", 0, through)
        with pytest.raises(Pruned) as pruned:  # an error, never a jump to the end
            log.read_events(0, 0, 10)
        assert pruned.value.start == through
        assert log.read_events(0, end + 10, 10, timeout_s=0.1) == []  # past the end: nothing yet
        assert [r.value for r in events(ArchivedLog(log, archive), 0)] == values

        # Retention outran the archiver: the loss is recorded and counted, not skipped.
        more = [b'{"type":"x","at":%d}' % now] * 5
        writers.append(0, more)
        after = log.end_offset("events", 0)
        _delete_records(admin, f"{prefix}.events", 0, after)
        writers.append(0, [b'{"type":"x","at":%d}' % now])
        loop.run_once(now + 2 * HOUR)
        gap = archive.files(0)[-2]
        assert gap.gap and gap.end_offset == after
        assert metrics.gaps._value.get() == gap.end_offset - gap.from_offset > 0
        with pytest.raises(Pruned, match="neither the archive"):
            list(events(ArchivedLog(log, archive), 0))
    finally:
        writers.close()
        log.close()


def _delete_records(admin: AdminClient, topic: str, partition: int, before: int) -> None:
    [future] = admin.delete_records([TopicPartition(topic, partition, before)]).values()
    future.result(30)


def _sample(metrics: RetentionMetrics, name: str, partition: str) -> float:
    for family in metrics.lag_collector.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels.get("partition") == partition:
                return float(sample.value)
    raise AssertionError(f"no {name} for partition {partition}")


def test_commands_deleted_before_any_owner_decided_them_are_reported(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"retention-{uuid.uuid4().hex[:12]}"
    log = _open(kafka_bootstrap, prefix, Retention())
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    try:
        for i in range(3):
            log.submit(1, b"command %d" % i)
        _delete_records(admin, f"{prefix}.commands", 1, 2)
        with caplog.at_level("ERROR", logger="eventlog.kafka"):
            writers = Writers(log)  # an owner takes the partition over from position 0
            member: Any = writers._member
            for check in member.checks:  # the check runs beside the assignment
                check.join(60.0)
            writers.close()
        assert f"{prefix}.commands[1]: commands 0..1 were deleted" in caplog.text
        assert "before any owner decided them (they are lost" in caplog.text
    finally:
        log.close()


class _Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def _owner(log: KafkaLog, wanted: int) -> tuple[KafkaMembership, list[Record]]:
    """A member that owns every partition, and the commands of partition 0 it has consumed
    once it has ``wanted`` of them."""
    member = log.join(_Quiet())
    consumed: list[Record] = []
    deadline = time.monotonic() + 60
    while len(member.owned()) < log.num_partitions or len(consumed) < wanted:
        assert time.monotonic() < deadline, f"owns {member.owned()}, consumed {len(consumed)}"
        consumed += [r for r in member.poll(0.2) if r.partition == 0]
    return member, consumed


def _decide(member: KafkaMembership, commands: list[Record]) -> None:
    """What an owner does with commands: their events and the position, in one transaction."""
    for i in range(0, len(commands), 5):
        chunk = commands[i : i + 5]
        member.writer(0).append(
            [b"decided " + r.value for r in chunk], commands_through=chunk[-1].offset + 1
        )


def _eventually(check: Callable[[], bool], what: str) -> None:
    # The broker materialises a transaction's offsets a moment after its commit returns.
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_commands_below_the_committed_position_are_trimmed_and_a_takeover_decides_the_rest(
    kafka_bootstrap: str,
) -> None:
    prefix = f"retention-{uuid.uuid4().hex[:12]}"
    log = _open(kafka_bootstrap, prefix, Retention())
    metrics = RetentionMetrics(CollectorRegistry())
    values = [b"command %02d" % i for i in range(40)]
    acknowledged = [log.submit(0, value) for value in values]
    try:
        first, consumed = _owner(log, wanted=40)
        assert [r.value for r in consumed] == values  # fetched all, in memory
        _decide(first, consumed[:25])
        committed = consumed[24].offset + 1
        _eventually(lambda: log.command_position(0) == committed, "position never committed")

        loop = KafkaRetention(log, first.owned, metrics, archiver=None, retention_ms=None)
        loop.run_once(0)
        # Trimmed to the position the broker holds, not to what the owner has fetched.
        assert log.start_offset("commands", 0) == committed < log.end_offset("commands", 0)
        assert metrics.pruned_records.labels("commands")._value.get() == committed
        with pytest.raises(Pruned):
            log.read_commands(0, 0, 10)
        loop.run_once(0)  # nothing more to trim: a no-op, not an error
        assert metrics.failures._value.get() == 0

        # A newer writer fences the owner: the zombie, which still thinks it owns the
        # partition, can move the position no further, and its trims stay below it.
        zombie = first.writer(0)
        fencer = KafkaPartitionWriter.open(log, 0)
        with pytest.raises(Fenced):
            zombie.append([b"decided too late"], commands_through=consumed[-1].offset + 1)
        loop.run_once(0)
        assert log.start_offset("commands", 0) == committed == log.command_position(0)
        fencer.close()
        first.close()  # the owner goes with 15 commands fetched but not decided

        second, rest = _owner(log, wanted=len(values) - 25)
        assert [r.offset for r in rest] == acknowledged[25:]
        _decide(second, rest)
        decided = [r.value for r in log.read_events(0, 0, 1000)]
        assert decided == [b"decided " + v for v in values]  # every one, once, in order
        _eventually(lambda: log.command_position(0) == acknowledged[-1] + 1, "not committed")
        KafkaRetention(log, second.owned, metrics, archiver=None, retention_ms=None).run_once(0)
        assert log.start_offset("commands", 0) == log.end_offset("commands", 0)
        second.close()
    finally:
        log.close()


def test_the_command_position_is_read_without_the_admin_api_that_crashes_the_process(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # librdkafka's admin ListConsumerGroupOffsets crashed every node of a chaos run once a
    # broker restart moved the group's coordinator (NOT_COORDINATOR handed to a consumer group
    # an admin client does not have: librdkafka issue 5040). The position is read as an owner
    # reads it, through a consumer of the group's id.
    def crashes(*args: object, **kwargs: object) -> None:
        raise AssertionError("ListConsumerGroupOffsets: segfaults on NOT_COORDINATOR")

    monkeypatch.setattr(AdminClient, "list_consumer_group_offsets", crashes)
    prefix = f"retention-{uuid.uuid4().hex[:12]}"
    log = _open(kafka_bootstrap, prefix, Retention())
    try:
        values = [b"command %02d" % i for i in range(6)]
        for value in values:
            log.submit(0, value)
        assert log.command_position(0) == 0  # nothing committed yet
        member, consumed = _owner(log, wanted=len(values))
        _decide(member, consumed[:4])
        _eventually(lambda: log.command_position(0) == consumed[3].offset + 1, "not committed")
        member.close()
    finally:
        log.close()
