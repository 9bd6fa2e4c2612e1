"""The snapshot port's invariants (``eventlog/snapshots.py``), over every adapter: memory, files
(embedded) and Kafka (a real broker)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eventlog.kafka_snapshots import KafkaSnapshots
from eventlog.snapshots import FileSnapshots, MemorySnapshots, SnapshotStore

Reopen = Callable[[], SnapshotStore]


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> Reopen:
    store = MemorySnapshots()
    return lambda: store  # nothing to reopen: the same store is the "restarted" one


def _files(request: pytest.FixtureRequest, tmp_path: Path) -> Reopen:
    return lambda: FileSnapshots(tmp_path / "snapshots")


def _kafka(request: pytest.FixtureRequest, tmp_path: Path) -> Reopen:
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    prefix = f"snap-{uuid.uuid4().hex[:12]}"
    return lambda: KafkaSnapshots.open(
        bootstrap, 3, prefix=prefix, replication_factor=-1, min_insync_replicas=None
    )


@pytest.fixture(
    params=[
        pytest.param(_memory, id="memory"),
        pytest.param(_files, id="files"),
        pytest.param(_kafka, id="kafka", marks=pytest.mark.kafka),
    ]
)
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Reopen]:
    opened: list[SnapshotStore] = []
    maker = request.param(request, tmp_path)

    def again() -> SnapshotStore:
        store: SnapshotStore = maker()
        opened.append(store)
        return store

    yield again
    for store in opened:
        store.close()


def test_nothing_written_means_no_snapshot_and_a_floor_of_zero(reopen: Reopen) -> None:
    store = reopen()
    assert store.latest(0) is None
    assert store.floor(0) == 0


def test_the_newest_snapshot_wins_and_survives_a_restart(reopen: Reopen) -> None:
    store = reopen()
    assert store.write(1, 100, b"at 100")
    assert store.write(1, 250, b"at 250")
    assert store.write(2, 7, b"two")
    newest = store.latest(1)
    assert newest is not None and (newest.offset, newest.data) == (250, b"at 250")
    # The floor is the oldest snapshot a recovery may fall back to: the one before the newest
    # where the store keeps it, else the newest.
    kept = store.older(1, below=250)
    assert kept is None or (kept.offset, kept.data) == (100, b"at 100")
    assert store.floor(1) == (250 if kept is None else 100)
    assert store.floor(2) == 7 and store.floor(0) == 0
    again = reopen()
    found = again.latest(1)
    assert found is not None and (found.partition, found.offset, found.data) == (1, 250, b"at 250")
    assert again.floor(1) == store.floor(1)


def test_an_older_snapshot_never_replaces_a_newer_one(reopen: Reopen) -> None:
    store = reopen()
    assert store.write(0, 500, b"new")
    assert not store.write(0, 400, b"old")
    assert not store.write(0, 500, b"same offset")
    newest = reopen().latest(0)
    assert newest is not None and newest.data == b"new"
    assert store.floor(0) == 500  # the recovery floor never moves back
    assert store.write(0, 600, b"newer")
    assert store.write(0, 700, b"newest")
    assert store.floor(0) in (600, 700)  # the floor moves on with the snapshots kept


def test_a_large_snapshot_is_stored_whole(reopen: Reopen) -> None:
    blob = bytes(range(256)) * 12_000  # 3 MB: above Kafka's default record limit of 1 MB
    store = reopen()
    assert store.write(0, 1, blob)
    found = reopen().latest(0)
    assert found is not None and found.data == blob


def test_a_write_cut_short_leaves_the_previous_snapshot(tmp_path: Path) -> None:
    store = FileSnapshots(tmp_path / "s")
    store.write(0, 10, b"whole")
    (tmp_path / "s" / "p0" / f"{20:020d}.snap.tmp").write_bytes(b"half")  # a crash mid-write
    again = FileSnapshots(tmp_path / "s")
    found = again.latest(0)
    assert found is not None and (found.offset, found.data) == (10, b"whole")
    assert not (tmp_path / "s" / "p0" / f"{20:020d}.snap.tmp").exists()


def test_files_keep_the_newest_few_for_falling_back(tmp_path: Path) -> None:
    store = FileSnapshots(tmp_path / "s", keep=2)
    for offset in (10, 20, 30):
        store.write(0, offset, b"%d" % offset)
    assert sorted(p.name for p in (tmp_path / "s" / "p0").iterdir()) == [
        f"{20:020d}.snap",
        f"{30:020d}.snap",
    ]
    older = store.older(0, below=30)
    assert older is not None and older.offset == 20


def test_a_released_writer_is_let_go_and_opened_again_by_the_next_write(reopen: Reopen) -> None:
    store = reopen()
    assert store.write(0, 10, b"ten")
    store.release(0)
    if isinstance(store, KafkaSnapshots):
        assert store.writers() == []  # its producer is closed
    newest = store.latest(0)  # reading is unaffected
    assert newest is not None and newest.offset == 10
    assert store.write(0, 20, b"twenty")
    newest = store.latest(0)
    assert newest is not None and newest.offset == 20
    store.release(1)  # a partition it never wrote: nothing to let go of
