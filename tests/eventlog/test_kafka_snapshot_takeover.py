"""A takeover with no local store on a real broker: the owner's runner snapshots to the
compacted snapshots topic as it decides, and the next owner, with an empty data directory,
restores the newest snapshot and replays only the tail; a zombie's snapshot writer is fenced."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from core import events as ev
from core.clock import FakeClock
from core.errors import Fenced
from core.state import PartitionState, evolve
from eventlog.kafka import KafkaLog
from eventlog.kafka_snapshots import KafkaSnapshots
from node.runner import PartitionRunner
from node.snapshotter import SnapshotPolicy, Snapshotter
from projections.state_store import RocksStateStore
from tests.node.test_runner import START, NoExecutors, put
from tests.node.test_snapshots import Seen
from tests.projections.histories import Writers

pytestmark = pytest.mark.kafka


def folded(log: KafkaLog, partition: int) -> PartitionState:
    state = PartitionState(partition)
    offset = 0
    while records := log.read_events(partition, offset, 1000):
        for record in records:
            evolve(state, ev.decode(record.value))
        offset = records[-1].offset + 1
    return state


def test_a_new_owner_without_a_store_restores_the_snapshot_and_replays_the_tail(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    prefix = f"takeover-{uuid.uuid4().hex[:12]}"
    opened = dict(prefix=prefix, replication_factor=-1, min_insync_replicas=None)
    log = KafkaLog.open(kafka_bootstrap, 1, **opened)  # type: ignore[arg-type]
    snapshots = KafkaSnapshots.open(kafka_bootstrap, 1, **opened)  # type: ignore[arg-type]
    seen = Seen()
    snapshotter = Snapshotter(snapshots, SnapshotPolicy(every_events=8, every_s=3600), seen)
    snapshotter.start()
    try:
        first = Writers(log)
        owner = PartitionRunner(
            0, log, first.writer(0), lambda: RocksStateStore.open(tmp_path / "old", 0),
            FakeClock(START), NoExecutors(), snapshotter=snapshotter,
        )  # fmt: skip
        owner.start()
        try:
            for i in range(20):
                assert not isinstance(put(owner, f"job-{i}").result(timeout=30), Exception)
                assert snapshotter.wait_idle(0, 30)
        finally:
            owner.stop()
        first.close()
        assert [w.offset for w in seen.written] and seen.failed == 0
        newest = snapshots.latest(0)
        assert newest is not None and newest.offset == seen.written[-1].offset
        assert snapshots.floor(0) == newest.offset

        second = Writers(log)  # a new member: the partition moves, its writer fenced
        new_owner = PartitionRunner(
            0, log, second.writer(0), lambda: RocksStateStore.open(tmp_path / "new", 0),
            FakeClock(START), NoExecutors(), snapshotter=snapshotter,
        )  # fmt: skip
        new_owner.start()
        try:
            assert new_owner.deciding.wait(30)
            assert new_owner.restored_from == newest.offset
            tail = log.read_events(0, newest.offset, 1000)
            assert 0 < len(tail) < 20  # the events after the snapshot, not the history
            assert new_owner.state.snapshot() == folded(log, 0).snapshot()
        finally:
            new_owner.stop()
            second.close()
    finally:
        snapshotter.stop()
        snapshots.close()
        log.close()


def test_a_zombie_snapshot_writer_is_fenced_by_the_next_owners(kafka_bootstrap: str) -> None:
    prefix = f"zombie-{uuid.uuid4().hex[:12]}"
    opened = dict(prefix=prefix, replication_factor=-1, min_insync_replicas=None)
    zombie = KafkaSnapshots.open(kafka_bootstrap, 2, **opened)  # type: ignore[arg-type]
    owner = KafkaSnapshots.open(kafka_bootstrap, 2, **opened)  # type: ignore[arg-type]
    try:
        assert zombie.write(1, 100, b"old owner at 100")
        assert owner.write(1, 200, b"new owner at 200")
        with pytest.raises(Fenced):
            zombie.write(1, 300, b"a zombie's late write")
        newest = owner.latest(1)
        assert newest is not None and (newest.offset, newest.data) == (200, b"new owner at 200")
    finally:
        zombie.close()
        owner.close()
