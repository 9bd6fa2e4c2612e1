"""A partition's runner snapshots as it decides, and the next owner, with no local store,
restores the newest snapshot and replays only the tail."""

from __future__ import annotations

from pathlib import Path

from core import events as ev
from core.state import PartitionState, evolve
from eventlog.memory import MemoryLog
from eventlog.snapshots import MemorySnapshots
from node.runner import Recovery
from node.snapshotter import SnapshotPolicy, Snapshotter, Written
from projections.state_store import MemoryStateStore, RocksStateStore, StoreView
from tests.node.test_runner import put, started


class Seen:
    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.written: list[Written] = []
        self.failed = 0
        self.restored = 0
        self.unusable = 0

    def snapshot_paused(self, seconds: float) -> None:
        self.pauses.append(seconds)

    def snapshot_written(self, written: Written) -> None:
        self.written.append(written)

    def snapshot_failed(self) -> None:
        self.failed += 1

    def snapshot_restored(self) -> None:
        self.restored += 1

    def snapshot_unusable(self) -> None:
        self.unusable += 1


def owner_wrote(log: MemoryLog, store_dir: Path, jobs: int) -> None:
    """An owner of partition 0 (its store in ``store_dir``) registers ``jobs`` jobs, then
    stops: one event a job in the log."""
    owner = started(log, lambda: RocksStateStore.open(store_dir, 0))
    try:
        for i in range(jobs):
            put(owner, f"job-{i}").result(timeout=10)
    finally:
        owner.stop()


def folded(log: MemoryLog) -> PartitionState:
    state = PartitionState(0)
    for record in log.read_events(0, 0, 100_000):
        evolve(state, ev.decode(record.value))
    return state


def test_the_owner_snapshots_and_a_new_owner_replays_only_the_tail(tmp_path: Path) -> None:
    log = MemoryLog(1, gaps=True)
    snapshots = MemorySnapshots()
    seen = Seen()
    snapshotter = Snapshotter(snapshots, SnapshotPolicy(every_events=10, every_s=3600), seen)
    snapshotter.start()
    try:
        owner = started(
            log, lambda: RocksStateStore.open(tmp_path / "owner", 0), snapshotter=snapshotter
        )
        try:
            for i in range(25):
                assert not isinstance(put(owner, f"job-{i}").result(timeout=10), Exception)
                snapshotter.wait_idle(0, 10)
        finally:
            owner.stop()
        # One event a job: a snapshot after the 10th and the 20th event, not the 25th.
        assert [w.items for w in seen.written] == [22, 42]  # a job and its order key, 2 meta
        newest = snapshots.latest(0)
        assert newest is not None and newest.offset == seen.written[-1].offset
        assert len(seen.pauses) == 2 and seen.failed == 0

        new_owner = started(
            log, lambda: RocksStateStore.open(tmp_path / "new-owner", 0), snapshotter=snapshotter
        )
        try:
            assert new_owner.deciding.wait(10)
            assert new_owner.restored_from == newest.offset
            assert seen.restored == 1
            assert new_owner.state.snapshot() == folded(log).snapshot()
            assert len(log.read_events(0, newest.offset, 100)) == 5  # the tail it read
            assert new_owner.last_recovery == Recovery(newest.offset, 5)
            assert not isinstance(put(new_owner, "after").result(timeout=10), Exception)
            assert new_owner.state.snapshot() == folded(log).snapshot()
        finally:
            new_owner.stop()
    finally:
        snapshotter.stop()


def test_without_snapshots_a_new_owner_folds_from_zero(tmp_path: Path) -> None:
    log = MemoryLog(1)
    owner_wrote(log, tmp_path / "owner", 5)
    new_owner = started(log, lambda: RocksStateStore.open(tmp_path / "new", 0))
    try:
        assert new_owner.deciding.wait(10)
        assert new_owner.restored_from is None
        assert new_owner.last_recovery == Recovery(None, 5)  # one event a job, from offset 0
        assert new_owner.state.snapshot() == folded(log).snapshot()
    finally:
        new_owner.stop()


class NoViewOnce(MemoryStateStore):
    """A store whose first point-in-time view fails."""

    views = 0

    def view(self) -> StoreView:
        NoViewOnce.views += 1
        if NoViewOnce.views == 1:
            raise OSError("no snapshot of the store now")
        return super().view()


def test_a_snapshot_that_cannot_be_taken_is_counted_and_deciding_goes_on() -> None:
    log = MemoryLog(1)
    snapshots = MemorySnapshots()
    seen = Seen()
    snapshotter = Snapshotter(snapshots, SnapshotPolicy(every_events=1, every_s=3600), seen)
    snapshotter.start()
    runner = started(log, lambda: NoViewOnce(0), snapshotter=snapshotter)
    try:
        # A caller is answered before its batch is saved and snapshotted; the runner decides
        # one batch at a time, so the answer to the next request comes after that.
        for job in ("a", "b", "c"):
            assert not isinstance(put(runner, job).result(timeout=10), Exception)
        assert seen.failed == 1 and runner.restarts == 0 and runner.deciding.is_set()
        assert snapshotter.wait_idle(0, 10)
        newest = snapshots.latest(0)
        assert newest is not None and newest.offset >= 2
    finally:
        runner.stop()
        snapshotter.stop()
