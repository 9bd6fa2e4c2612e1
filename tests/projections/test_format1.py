"""A node upgraded in place reads what the build before snapshot format 2 wrote: its state
store (each job's definition a map in place), its snapshots and its core partition snapshot.
``data/format1.bin`` was written by that build (``data/make_format1.py``). Each is read as the
state this build folds from the same history, and a store is rewritten so that it holds, byte
for byte, what this build would have stored."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from core import events as ev
from core.partition import Partition
from core.state import JobStateV1, PartitionState, RunState, evolve
from eventlog.embedded import EmbeddedLog
from eventlog.snapshots import MemorySnapshots
from projections import snapshot, state_store
from projections.state_store import MemoryStateStore, RocksStateStore, catch_up
from tests.projections.histories import Writers

PARTITION = 1
FIXTURE = Path(__file__).parent / "data" / "format1.bin"


@pytest.fixture(scope="module")
def written() -> dict[str, Any]:
    data: dict[str, Any] = msgspec.msgpack.decode(zlib.decompress(FIXTURE.read_bytes()))
    return data


def folded(records: list[bytes]) -> PartitionState:
    state = PartitionState(PARTITION)
    for raw in records:
        evolve(state, ev.decode(raw))
    return state


def stored_now(records: list[bytes]) -> list[tuple[bytes, bytes]]:
    """What this build's store holds after saving the history."""
    store = MemoryStateStore(PARTITION)
    state = PartitionState(PARTITION)
    numbered = list(enumerate(ev.decode(raw) for raw in records))
    for start in range(0, len(numbered), 40):
        batch = numbered[start : start + 40]
        for _, event in batch:
            evolve(state, event)
        store.save(state, batch)
    return store.dump()


def runs_decoded(dump: list[tuple[bytes, bytes]]) -> list[tuple[bytes, object]]:
    """A store's records with its runs decoded: a run record of format 1 is read as it is (it
    lacks ``ahead``, which reads as False: no run of format 1 was materialised ahead of its
    slot), so only the jobs' records are compared byte for byte."""
    return [
        (key, _run_decoder.decode(value) if key.startswith(b"r/") else value) for key, value in dump
    ]


_run_decoder = msgspec.msgpack.Decoder(RunState)


def items(written: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    return [(key, value) for key, value in written["store"]]


def test_the_fixture_is_of_the_earlier_format(written: dict[str, Any]) -> None:
    jobs = [value for key, value in items(written) if key.startswith(b"j/")]
    assert len(jobs) == 9
    for value in jobs:  # every job decodes as the earlier format does
        msgspec.msgpack.decode(value, type=JobStateV1)
    assert written["partition"][0] == 1
    assert items(written) != stored_now(written["events"])


@pytest.mark.parametrize("kind", ["memory", "rocks"])
def test_a_store_of_the_earlier_format_loads_and_is_rewritten(
    written: dict[str, Any], tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_store, "REWRITE_BATCH", 4)  # the 9 jobs in three writes
    store = MemoryStateStore(PARTITION) if kind == "memory" else RocksStateStore.open(tmp_path, 1)
    try:
        store.replace(items(written))
        state, offset = store.load()
        assert offset == len(written["events"])
        assert state.snapshot() == folded(written["events"]).snapshot()
        assert (
            state.jobs["t1/rich"].spec.target
            == folded(written["events"]).jobs["t1/rich"].spec.target
        )
        # as if this build had written it
        assert runs_decoded(store.dump()) == runs_decoded(stored_now(written["events"]))
        again, _ = store.load()
        assert again.snapshot() == state.snapshot()
    finally:
        store.close()


def test_a_snapshot_of_the_earlier_format_restores(written: dict[str, Any], tmp_path: Path) -> None:
    log = EmbeddedLog.open(tmp_path / "log", 2)
    writers = Writers(log)
    writers.append(PARTITION, written["events"])
    writers.close()
    snapshots = MemorySnapshots()
    assert snapshot.decode(written["snapshot"], PARTITION).offset == len(written["events"])
    snapshots.write(PARTITION, len(written["events"]), written["snapshot"])
    restored: list[int] = []
    unusable: list[Exception] = []
    store = MemoryStateStore(PARTITION)
    state = catch_up(
        store, log, PARTITION, snapshots=snapshots,
        on_restored=restored.append, on_unusable=unusable.append,
    )  # fmt: skip
    log.close()
    assert restored == [len(written["events"])] and unusable == []
    assert state.snapshot() == folded(written["events"]).snapshot()
    assert runs_decoded(store.dump()) == runs_decoded(stored_now(written["events"]))


def test_a_core_partition_snapshot_of_format_1_restores(written: dict[str, Any]) -> None:
    now = written["now"]
    old = Partition.restore(written["partition"], now)
    new = Partition(PARTITION, now, folded(written["events"]))
    assert old.snapshot() == new.snapshot()
    assert old.parked() == new.parked()
    assert old.next_deadline() == new.next_deadline()
