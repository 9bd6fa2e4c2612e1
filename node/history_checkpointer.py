"""Writing read-model checkpoints on a schedule, from one node of the cluster.

Every ``every_s`` seconds (``--history-checkpoint-every``, default 2 minutes) the node that owns
partition 0 writes a checkpoint of its read model (``projections.history_checkpoint``) if the
model is caught up (at most ``CAUGHT_UP_EVENTS`` behind the log) and holds something the newest
checkpoint does not. Why partition 0's owner: the group already elects exactly one, so N nodes
do not write N copies and nothing new has to be agreed; every node's model folds every
partition, so any one of them is as good as another. During a rebalance two nodes may both
believe they own it for a moment: both write, under distinct keys, and the older is pruned
like any other, so the worst case is one extra copy; neither collects a file the other is
uploading (its lease says so: ``projections.history_checkpoint``, "Collecting files").

Each pass of the writer also collects the files nothing needs any more (those of dropped
checkpoints once the grace period is over, and those a writer that died left), even when it
has nothing new to write.

The fold and the queries go on meanwhile: folds wait only while RocksDB makes the checkpoint
(a memtable flush and hard links; ``cronlog_history_checkpoint_pause_seconds``); hashing and
uploading happen on this thread. A checkpoint that fails is logged and counted, and the next
one is tried at the next due time; the thread never ends on a failure.

A checkpoint is of a model known whole: its copy's every block is read with its checksum before
anything is uploaded (``checkpoints.take``). One that fails is refused (logged, counted in
``cronlog_history_checkpoints_refused``), and since the copy's tables are the model's own, the
model is damaged: it is set aside then and there, and refilled from the newest good checkpoint
and the tail (``ReadModel.set_aside``), rather than served until a query happens on the block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from archive.store import ObjectStore
from core.clock import Clock
from core.errors import StoreDamaged
from node.worker import PeriodicWorker
from projections import history_checkpoint as checkpoints
from projections.history_checkpoint import CheckpointRefused, HistoryMetrics, Taken, Unmeasured
from projections.read_model import ReadModel

log = logging.getLogger(__name__)

# A model this far behind the log (events, over every partition) is still catching up: a
# checkpoint of it would be older than it need be.
CAUGHT_UP_EVENTS = 10_000


class HistoryCheckpointer(PeriodicWorker):
    def __init__(
        self,
        model: ReadModel,
        store: ObjectStore,
        work_dir: Path,
        *,
        node_id: str,
        clock: Clock,
        writes: Callable[[], bool],
        lag: Callable[[], int],
        every_s: float = checkpoints.DEFAULT_EVERY_S,
        keep: int = checkpoints.DEFAULT_KEEP,
        grace_ms: int = checkpoints.DEFAULT_GRACE_MS,
        metrics: HistoryMetrics | None = None,
    ) -> None:
        """``writes()``: whether this node is the one that writes now; ``lag()``: how many
        events the model is behind the log."""
        if not every_s > 0:
            raise ValueError(f"every_s must be positive, got {every_s}")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        if grace_ms <= 0:
            raise ValueError(f"grace_ms must be positive, got {grace_ms}")
        self._model = model
        self._store = store
        self._work_dir = work_dir
        self._node_id = node_id
        self._clock = clock
        self._writes = writes
        self._lag = lag
        self.every_s = every_s
        self.keep = keep
        self.grace_ms = grace_ms
        self.metrics: HistoryMetrics = metrics or Unmeasured()
        self.last: Taken | None = None
        self._digests: dict[tuple[int, int, int], str] = {}  # the last checkpoint's tables

    _thread_name = "history-checkpoints"
    _wait_first = True
    _stop_timeout_s = 60.0

    def _pass(self) -> Taken | None:
        return self.tick()

    def _interval_s(self) -> float:
        return self.every_s

    def _failed(self) -> None:
        log.exception("history checkpoint failed; the next is due in %.0f s", self.every_s)
        self.metrics.history_checkpoint_failed()

    def tick(self) -> Taken | None:
        """Write a checkpoint now if this node writes them, its model is caught up and holds
        events the newest checkpoint does not; the checkpoint written, else None. The writer
        collects unneeded files either way."""
        if not self._writes():
            return None
        lag = self._lag()
        positions = self._model.positions()
        newest = checkpoints.newest(self._store)
        if lag > CAUGHT_UP_EVENTS or (
            newest is not None
            and all(at <= newest.positions.get(p, 0) for p, at in positions.items())
        ):
            if lag > CAUGHT_UP_EVENTS:
                log.info("history checkpoint skipped: the read model is %d events behind", lag)
            collected = checkpoints.collect(
                self._store, now_ms=self._clock.now_ms(), grace_ms=self.grace_ms
            )
            self.metrics.history_checkpoint_collected(collected)
            return None
        generation = self._model.generation
        try:
            taken = checkpoints.take(
                self._model,
                self._store,
                self._work_dir,
                node_id=self._node_id,
                now_ms=self._clock.now_ms(),
                keep=self.keep,
                digests=self._digests,
                grace_ms=self.grace_ms,
                clock=self._clock.now_ms,
            )
        except CheckpointRefused as refused:
            log.error("history checkpoint refused: %s; nothing uploaded", refused)
            self.metrics.history_checkpoint_refused()
            self._model.set_aside(StoreDamaged(str(refused)), generation)
            return None
        self.last = taken
        self.metrics.history_checkpoint_written(taken)
        if taken.collected is not None:
            self.metrics.history_checkpoint_collected(taken.collected)
        log.info(
            "history checkpoint %s written: %d events, %d files, %.1f MB (%.1f MB new) in"
            " %.2f s; folds waited %.1f ms",
            taken.key,
            sum(taken.positions.values()),
            taken.files,
            taken.size / 1e6,
            taken.uploaded / 1e6,
            taken.seconds,
            taken.pause_s * 1000,
        )
        return taken
