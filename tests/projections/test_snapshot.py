"""Snapshots against folding from zero, over a real log: a new owner with no local store that
restores the newest snapshot and replays the tail holds exactly the state (and the store bytes)
that folding the whole log gives; a snapshot it cannot use is passed over, never trusted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import events as ev
from core.state import PartitionState, evolve
from eventlog.embedded import EmbeddedLog
from eventlog.snapshots import FileSnapshots, MemorySnapshots
from projections import snapshot
from projections.snapshot import SnapshotUnusable
from projections.state_store import MemoryStateStore, RocksStateStore, catch_up
from tests.projections.histories import Writers, busy_partition

STEPS = 300


@pytest.fixture(scope="module")
def history(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[EmbeddedLog, list[bytes]]]:
    """One partition's history in a real embedded log (partition 1 of 2)."""
    sim = busy_partition(7, steps=STEPS, partition=1)
    with EmbeddedLog.open(tmp_path_factory.mktemp("log") / "log", 2) as log:
        writers = Writers(log)
        writers.append(1, sim.log, chunk=37)
        writers.close()
        yield log, sim.log


def folded_from_zero(log_records: list[bytes], upto: int | None = None) -> PartitionState:
    state = PartitionState(1)
    for raw in log_records[:upto]:
        evolve(state, ev.decode(raw))
    return state


def snapshot_at(log: EmbeddedLog, cut: int, tmp: Path) -> bytes:
    """What the owner writes having caught up to event ``cut``: its store's view, encoded."""
    store = RocksStateStore.open(tmp / "owner", 1)
    try:
        offset = 0
        state = PartitionState(1)
        while offset < cut:
            records = log.read_events(1, offset, min(50, cut - offset))
            batch = [(r.offset, ev.decode(r.value)) for r in records]
            for _, event in batch:
                evolve(state, event)
            offset = records[-1].offset + 1
            store.save(state, batch)
        view = store.view()
        try:
            items = view.items()
        finally:
            view.close()
        assert view.offset == cut
        return snapshot.encode(1, view.offset, 123, items)
    finally:
        store.close()


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_snapshot_and_tail_equal_folding_from_zero(
    history: tuple[EmbeddedLog, list[bytes]],
    tmp_path_factory: pytest.TempPathFactory,
    data: st.DataObject,
) -> None:
    log, records = history
    cut = data.draw(st.integers(1, len(records)), label="snapshot offset")
    tmp = tmp_path_factory.mktemp("cut")
    snapshots = FileSnapshots(tmp / "snapshots")
    assert snapshots.write(1, cut, snapshot_at(log, cut, tmp))
    # Restored as of the cut, before any tail: the state folded to the cut.
    restored = snapshot.decode(snapshots.latest(1).data, 1)  # type: ignore[union-attr]
    seeded = MemoryStateStore(1)
    seeded.replace(restored.items)
    assert seeded.load()[0].snapshot() == folded_from_zero(records, cut).snapshot()

    read: list[int] = []
    restored_at: list[int] = []
    with RocksStateStore.open(tmp / "new-owner", 1) as fresh:  # no local store
        state = catch_up(
            fresh, log, 1, batch_size=40, snapshots=snapshots,
            on_batch=read.append, on_restored=restored_at.append,
        )  # fmt: skip
        new_owner_dump = fresh.dump()
    with RocksStateStore.open(tmp / "from-zero", 1) as zero:
        assert catch_up(zero, log, 1, batch_size=40).snapshot() == state.snapshot()
        assert zero.dump() == new_owner_dump  # byte for byte, order keys included
    assert state.snapshot() == folded_from_zero(records).snapshot()
    assert restored_at == [cut]
    assert sum(read) == len(records) - cut  # only the tail was read


def test_a_damaged_snapshot_is_passed_over_to_the_log(
    history: tuple[EmbeddedLog, list[bytes]], tmp_path: Path
) -> None:
    log, records = history
    blob = bytearray(snapshot_at(log, len(records) // 2, tmp_path))
    blob[-10] ^= 0xFF  # one flipped bit in the payload
    snapshots = MemorySnapshots()
    snapshots.write(1, len(records) // 2, bytes(blob))
    unusable: list[Exception] = []
    restored: list[int] = []
    state = catch_up(
        MemoryStateStore(1), log, 1, snapshots=snapshots,
        on_unusable=unusable.append, on_restored=restored.append,
    )  # fmt: skip
    assert state.snapshot() == folded_from_zero(records).snapshot()
    assert restored == []
    assert len(unusable) == 1 and "checksum" in str(unusable[0])


def test_a_damaged_newest_snapshot_falls_back_to_the_one_before(
    history: tuple[EmbeddedLog, list[bytes]], tmp_path: Path
) -> None:
    log, records = history
    snapshots = FileSnapshots(tmp_path / "snapshots")
    snapshots.write(1, 30, snapshot_at(log, 30, tmp_path / "a"))
    late = bytearray(snapshot_at(log, 60, tmp_path / "b"))
    late[-3] ^= 0x01
    snapshots.write(1, 60, bytes(late))
    assert snapshots.floor(1) == 30  # retention keeps what the fallback needs
    unusable: list[Exception] = []
    restored: list[int] = []
    state = catch_up(
        MemoryStateStore(1), log, 1, snapshots=snapshots,
        on_unusable=unusable.append, on_restored=restored.append,
    )  # fmt: skip
    assert restored == [30] and len(unusable) == 1
    assert state.snapshot() == folded_from_zero(records).snapshot()


def test_a_store_newer_than_the_snapshot_keeps_its_state(
    history: tuple[EmbeddedLog, list[bytes]], tmp_path: Path
) -> None:
    log, records = history
    snapshots = MemorySnapshots()
    snapshots.write(1, 10, snapshot_at(log, 10, tmp_path))
    store = MemoryStateStore(1)
    catch_up(store, log, 1)  # the local store is up to date
    restored: list[int] = []
    state = catch_up(store, log, 1, snapshots=snapshots, on_restored=restored.append)
    assert restored == []
    assert state.snapshot() == folded_from_zero(records).snapshot()


def test_a_snapshot_of_another_state_format_or_partition_is_refused(tmp_path: Path) -> None:
    blob = snapshot.encode(1, 5, 0, [(b"m/offset", (5).to_bytes(8, "big"))])
    assert snapshot.decode(blob, 1).offset == 5
    with pytest.raises(SnapshotUnusable, match="partition 1 found where 2"):
        snapshot.decode(blob, 2)
    # The header's first field is the state format (msgpack array: 0x97 then a fixint).
    at = blob.index(b"\x97", 9)
    other = blob[: at + 1] + bytes([blob[at + 1] + 1]) + blob[at + 2 :]
    with pytest.raises(SnapshotUnusable, match="state format"):
        snapshot.decode(other, 1)
    with pytest.raises(SnapshotUnusable, match="format 9"):
        snapshot.decode(blob[:4] + b"\x09" + blob[5:], 1)
