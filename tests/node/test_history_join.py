"""A node that joins with no read model restores the newest history checkpoint and reads the
log only after it; the owner of partition 0 is the one that writes checkpoints."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from archive.store import DirectoryStore
from core.clock import Millis
from eventlog.embedded import EmbeddedLog
from eventlog.port import EventLog, Record
from node.history_checkpointer import CAUGHT_UP_EVENTS, HistoryCheckpointer
from node.node import Node
from projections import history_checkpoint as hc
from projections.read_model import ReadModel, ReadModelRunner
from tests.projections.histories import Writers, busy_partition

pytestmark = pytest.mark.slow

PARTITIONS = 2


class ReadsRecorded:
    """The log, recording where each thread of the read model started a read."""

    def __init__(self, log: EventLog) -> None:
        self._log = log
        self.reads: list[tuple[int, int]] = []  # (partition, from offset) of the read model
        self._lock = threading.Lock()

    def read_events(self, partition: int, from_offset: int, *args: Any, **kw: Any) -> list[Record]:
        if threading.current_thread().name.startswith("read-model:"):
            with self._lock:
                self.reads.append((partition, from_offset))
        return self._log.read_events(partition, from_offset, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


class FixedClock:
    def now_ms(self) -> Millis:
        return 1_000


def history_log(path: Path) -> tuple[EmbeddedLog, list[int]]:
    log = EmbeddedLog.open(path, PARTITIONS)
    writers = Writers(log)
    ends = []
    for p in range(PARTITIONS):
        sim = busy_partition(11 + p, steps=300, partition=p, prefix=f"p{p}-")
        writers.append(p, sim.log, chunk=50)
        ends.append(len(sim.log))
    writers.close()
    return log, ends


def history_of(model: ReadModel) -> list[tuple[bytes, bytes]]:
    """The model's keys but the teams' per-minute figures: those are kept for a window behind
    the newest minute folded so far, so which old minutes survive depends on the order the
    partitions were folded in, not on where the fold started."""
    return [kv for kv in model.dump() if not kv[0].startswith((b"tf/", b"tfp/"))]


def test_a_node_without_a_read_model_reads_the_log_only_after_the_checkpoint(
    tmp_path: Path,
) -> None:
    log, ends = history_log(tmp_path / "log")
    store = DirectoryStore(tmp_path / "archive")
    # What the cluster left: a checkpoint of a model that had folded most of the log.
    with ReadModel.open(tmp_path / "writer") as model:
        for p in range(PARTITIONS):
            cut = ends[p] * 2 // 3
            model.process_records(p, log.read_events(p, 0, cut))
        taken = hc.take(model, store, tmp_path / "writer", node_id="n0", now_ms=1)
    assert all(0 < taken.positions[p] < ends[p] for p in range(PARTITIONS))

    recorded = ReadsRecorded(log)
    # The history is months old: no hot window, so the model keeps every run to compare.
    node = Node(
        recorded,  # type: ignore[arg-type]
        tmp_path / "joining",
        node_id="n1",
        history_store=store,
        history_window_ms=None,
    )
    # Until it has folded the log as it ended at the start, its history says it is refilling.
    assert node.history.refilling() == {p: (taken.positions[p], ends[p]) for p in range(PARTITIONS)}
    node.start()
    try:
        assert node.history.wait_until(
            lambda: all(node.history.position(p) >= ends[p] for p in range(PARTITIONS)), 30
        )
        assert node.history.refilling() == {}
        assert node.metrics.history_restores._value.get() == 1
        assert node.metrics.history_start_fold._value.get() == sum(ends) - sum(
            taken.positions.values()
        )
        # Owning partition 0 (on the embedded log it owns them all), it writes the next one.
        assert node.wait_owned(lambda owned: 0 in owned, 10)
        assert node.history_checkpointer is not None
        written = node.history_checkpointer.tick()
        assert written is not None and hc.manifests(store) == [taken.key, written.key]
    finally:
        node.stop(drain_s=0)
    assert recorded.reads, "the read model read the log"
    for partition, offset in recorded.reads:
        assert offset >= taken.positions[partition], (partition, offset)
    # Restored and caught up, it is the model folded from zero (over the log as it is now: the
    # node went on deciding after it joined).
    with ReadModel.open(tmp_path / "joining") as joined, ReadModel.open(tmp_path / "zero") as zero:
        ReadModelRunner(log, joined).run_once()
        ReadModelRunner(log, zero).run_once()
        assert history_of(joined) == history_of(zero)
    log.close()


def test_only_the_owner_of_partition_0_writes_and_only_when_caught_up_with_news(
    tmp_path: Path,
) -> None:
    log, _ends = history_log(tmp_path / "log")
    store = DirectoryStore(tmp_path / "archive")
    owns = [False]
    lag = [0]
    with ReadModel.open(tmp_path / "n") as model:
        ReadModelRunner(log, model).run_once()
        checkpointer = HistoryCheckpointer(
            model,
            store,
            tmp_path / "n",
            node_id="n1",
            clock=FixedClock(),
            writes=lambda: owns[0],
            lag=lambda: lag[0],
        )
        assert checkpointer.tick() is None  # not the writer
        owns[0], lag[0] = True, CAUGHT_UP_EVENTS + 1
        assert checkpointer.tick() is None  # still catching up
        lag[0] = 0
        taken = checkpointer.tick()
        assert taken is not None and hc.manifests(store) == [taken.key]
        assert taken.positions == model.positions()
        assert checkpointer.tick() is None  # nothing folded since the newest checkpoint
    log.close()


def test_the_writer_collects_a_dead_writers_files_on_a_pass_with_nothing_new(
    tmp_path: Path,
) -> None:
    log, _ends = history_log(tmp_path / "log")
    store = DirectoryStore(tmp_path / "archive")
    # What a writer that died mid-upload left: a file and its lease, at 1 s.
    orphan = "ab" * 32
    store.put(hc.FILES + orphan, b"half a checkpoint")
    lease = hc.Lease(node_id="gone", started_at_ms=1_000, renewed_at_ms=1_000, files=[orphan])
    store.put(f"{hc.LEASES}{1_000:013d}-gone-0.json", msgspec.json.encode(lease))
    now = [Millis(1_000)]

    class Clock:
        def now_ms(self) -> Millis:
            return now[0]

    counted: list[hc.Collected] = []

    class Metrics(hc.Unmeasured):
        def history_checkpoint_collected(self, collected: hc.Collected) -> None:
            counted.append(collected)

    with ReadModel.open(tmp_path / "n") as model:
        ReadModelRunner(log, model).run_once()
        checkpointer = HistoryCheckpointer(
            model,
            store,
            tmp_path / "n",
            node_id="n1",
            clock=Clock(),
            writes=lambda: True,
            lag=lambda: 0,
            grace_ms=60_000,
            metrics=Metrics(),
        )
        taken = checkpointer.tick()
        assert taken is not None and hc.FILES + orphan in store.list(hc.FILES)  # in its grace
        now[0] = Millis(1_000 + 60_001)
        assert checkpointer.tick() is None  # nothing new folded: no checkpoint, but a pass
    assert hc.FILES + orphan not in store.list(hc.FILES)
    assert store.list(hc.LEASES) == []
    assert [c.files for c in counted] == [0, 1]
    log.close()
