"""Writing partitions' snapshots on a thread of their own, so deciding never waits for one.

A partition's runner asks :meth:`Snapshotter.due` after every batch it saved; when a snapshot
is due (``every_events`` events or ``every_s`` seconds since the last one, whichever comes
first, and at least one event since), it opens a point-in-time view of its state store — a
RocksDB snapshot, which takes microseconds: that is the whole pause the runner pays, measured
in ``cronlog_snapshot_pause_seconds`` — and hands the view over with :meth:`take`. This
thread then reads the view, encodes and compresses it (``projections.snapshot``), writes it
to the snapshot store and lets the view go.

One snapshot per partition is in hand at a time: a runner does not open another view while its
partition's last one is still being written (``busy``). A snapshot that fails is logged and
counted (``cronlog_snapshot_failures``), and the next one is tried at the next due point; the
thread itself never ends on a failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from core.clock import Millis
from eventlog.snapshots import DEFAULT_EVERY_EVENTS, DEFAULT_EVERY_S, SnapshotStore
from node.worker import SupervisedWorker
from projections import snapshot
from projections.state_store import StoreView

log = logging.getLogger(__name__)

# Larger snapshots are refused rather than written: a Kafka record this size already strains
# the brokers (``eventlog.kafka_snapshots``); recovery then replays from the previous one.
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    every_events: int = DEFAULT_EVERY_EVENTS
    every_s: float = DEFAULT_EVERY_S

    def __post_init__(self) -> None:
        if self.every_events < 1:
            raise ValueError(f"every_events must be at least 1, got {self.every_events}")
        if not self.every_s > 0:
            raise ValueError(f"every_s must be positive, got {self.every_s}")

    def due(self, events_since: int, seconds_since: float) -> bool:
        return events_since >= self.every_events or (
            events_since > 0 and seconds_since >= self.every_s
        )


@dataclass(slots=True)
class _Job:
    partition: int
    view: StoreView
    taken_at: Millis


@dataclass(slots=True)
class Written:
    """What one snapshot cost; ``metrics`` (when given) is told each one."""

    partition: int
    offset: int
    size: int
    items: int
    seconds: float


class SnapshotMetrics(Protocol):
    """What the snapshotter and recovery report (``node.metrics.NodeMetrics`` implements it)."""

    def snapshot_paused(self, seconds: float) -> None: ...

    def snapshot_written(self, written: Written) -> None: ...

    def snapshot_failed(self) -> None: ...

    def snapshot_restored(self) -> None: ...

    def snapshot_unusable(self) -> None: ...


class _Unmeasured:
    def snapshot_paused(self, seconds: float) -> None:
        pass

    def snapshot_written(self, written: Written) -> None:
        pass

    def snapshot_failed(self) -> None:
        pass

    def snapshot_restored(self) -> None:
        pass

    def snapshot_unusable(self) -> None:
        pass


class Snapshotter(SupervisedWorker):
    _thread_name = "snapshots"

    def __init__(
        self,
        store: SnapshotStore,
        policy: SnapshotPolicy | None = None,
        metrics: SnapshotMetrics | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or SnapshotPolicy()
        self.metrics: SnapshotMetrics = metrics or _Unmeasured()
        self._queue: deque[_Job] = deque()
        self._busy: set[int] = set()
        self._release_after: set[int] = set()  # revoked while their snapshot was being written
        self._cv = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.written = 0
        self.failures = 0
        self.last: Written | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the snapshot being written, drop the queued ones (their views let go)."""
        with self._cv:
            self._stopped = True
            dropped = list(self._queue)
            self._queue.clear()
            for job in dropped:
                self._busy.discard(job.partition)
            self._cv.notify_all()
        for job in dropped:
            job.view.close()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _stopped_flag(self) -> bool:
        return self._stopped

    def busy(self, partition: int) -> bool:
        with self._cv:
            return partition in self._busy

    def take(self, partition: int, view: StoreView, taken_at: Millis) -> bool:
        """Write a snapshot of ``view`` (this thread closes it). False, with the view closed,
        when one of the partition's is still in hand or the snapshotter has stopped."""
        with self._cv:
            if not self._stopped and partition not in self._busy:
                self._busy.add(partition)
                self._queue.append(_Job(partition, view, taken_at))
                self._cv.notify_all()
                return True
        view.close()
        return False

    def release(self, partition: int) -> None:
        """(When ``partition`` is revoked.) Drop its queued snapshot and let the store let go
        of its writer: now, or after the snapshot being written, on the snapshotter's thread
        (the revoking thread never waits for a write)."""
        with self._cv:
            dropped = [job for job in self._queue if job.partition == partition]
            for job in dropped:
                self._queue.remove(job)
            writing = partition in self._busy and not dropped
            if dropped:
                self._busy.discard(partition)
            if writing:
                self._release_after.add(partition)
            self._cv.notify_all()
        for job in dropped:
            job.view.close()
        if not writing:
            self._release_store(partition)

    def _release_store(self, partition: int) -> None:
        try:
            self.store.release(partition)
        except Exception:
            self.failures += 1
            log.exception("partition %d: letting go of the snapshot writer failed", partition)
            self.metrics.snapshot_failed()

    def wait_idle(self, partition: int, timeout_s: float) -> bool:
        """Wait until no snapshot of ``partition`` is in hand (tests, benchmarks, shutdown)."""
        with self._cv:
            return self._cv.wait_for(lambda: partition not in self._busy, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._stopped)
                if self._stopped and not self._queue:
                    return
                job = self._queue.popleft()
            try:
                self._write(job)
            except Exception:
                self.failures += 1
                log.exception("partition %d: snapshot failed", job.partition)
                self.metrics.snapshot_failed()
            finally:
                job.view.close()
                with self._cv:
                    self._busy.discard(job.partition)
                    release = job.partition in self._release_after
                    self._release_after.discard(job.partition)
                    self._cv.notify_all()
                if release:
                    self._release_store(job.partition)

    def _write(self, job: _Job) -> None:
        start = time.perf_counter()
        items = job.view.items()
        job.view.close()  # the store may close (or its runner recover) from here on
        offset = job.view.offset
        data = snapshot.encode(job.partition, offset, job.taken_at, items)
        if len(data) > MAX_SNAPSHOT_BYTES:
            raise ValueError(
                f"snapshot at offset {offset} is {len(data)} bytes, more than the "
                f"{MAX_SNAPSHOT_BYTES} a snapshot may take; not written"
            )
        if not self.store.write(job.partition, offset, data):
            log.debug("partition %d: a snapshot at %d or later is stored", job.partition, offset)
            return
        written = Written(job.partition, offset, len(data), len(items), time.perf_counter() - start)
        self.written += 1
        self.last = written
        self.metrics.snapshot_written(written)
        log.info(
            "partition %d: snapshot at offset %d written (%d bytes, %.2f s)",
            job.partition,
            offset,
            len(data),
            written.seconds,
        )
