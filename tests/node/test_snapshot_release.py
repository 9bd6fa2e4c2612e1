"""A revoked partition's snapshot writer is let go (on Kafka, its transactional producer with
its threads and connections): at once, or once the snapshot being written is done."""

from __future__ import annotations

import threading
from pathlib import Path

from eventlog.embedded import EmbeddedLog
from eventlog.snapshots import MemorySnapshots
from node.node import Node
from node.snapshotter import SnapshotPolicy, Snapshotter


class Gated(MemorySnapshots):
    """Writes wait for ``gate``; releases are noted in order, with the writes done by then."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.writing = threading.Event()
        self.released: list[tuple[int, int]] = []  # (partition, writes done when released)
        self.was_released = threading.Event()

    def write(self, partition: int, offset: int, data: bytes) -> bool:
        self.writing.set()
        assert self.gate.wait(10)
        return super().write(partition, offset, data)

    def release(self, partition: int) -> None:
        self.released.append((partition, self.writes))
        self.was_released.set()


class View:
    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.closed = False

    def items(self) -> list[tuple[bytes, bytes]]:
        return [(b"m/offset", self.offset.to_bytes(8, "big"))]

    def close(self) -> None:
        self.closed = True


def test_revoked_while_its_snapshot_is_written_it_is_released_after_the_write() -> None:
    store = Gated()
    snapshotter = Snapshotter(store)
    snapshotter.start()
    try:
        assert snapshotter.take(0, View(5), 0)  # type: ignore[arg-type]
        assert store.writing.wait(10)
        snapshotter.release(0)  # does not wait for the write
        assert store.released == []
        store.gate.set()
        assert store.was_released.wait(10)
        assert store.released == [(0, 1)]  # after the write, which went through
        assert store.latest(0) is not None
    finally:
        store.gate.set()
        snapshotter.stop()


def test_a_queued_snapshot_of_a_revoked_partition_is_dropped_and_released_at_once() -> None:
    store = Gated()
    snapshotter = Snapshotter(store)
    snapshotter.start()
    try:
        assert snapshotter.take(1, View(5), 0)  # type: ignore[arg-type]
        assert store.writing.wait(10)  # partition 1's write holds the thread
        queued = View(7)
        assert snapshotter.take(0, queued, 0)  # type: ignore[arg-type]
        snapshotter.release(0)
        assert store.released == [(0, 0)] and queued.closed
        assert not snapshotter.busy(0)
        store.gate.set()
        assert snapshotter.wait_idle(1, 10)
        assert store.latest(0) is None  # never written
        assert store.latest(1) is not None
    finally:
        store.gate.set()
        snapshotter.stop()


def test_a_node_releases_the_snapshot_writers_of_partitions_revoked_from_it(
    tmp_path: Path,
) -> None:
    store = Gated()
    store.gate.set()
    with EmbeddedLog.open(tmp_path / "log", 2) as log:
        node = Node(
            log, tmp_path / "node", snapshots=store,
            snapshot_policy=SnapshotPolicy(every_events=1, every_s=3600),
        )  # fmt: skip
        node.start()
        try:
            assert node.wait_ready(30)
            node.revoked([1])
            assert store.was_released.wait(10)
            assert [p for p, _ in store.released] == [1]
        finally:
            node.stop()
