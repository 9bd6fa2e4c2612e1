"""The snapshot port: where a partition's owner leaves its state, so the next owner need not
fold the whole log.

A snapshot is opaque bytes (``projections.snapshot`` writes and reads them) tagged with the
partition and the **offset** it reflects: every event below ``offset`` is in it, none at or
above. A new owner restores the newest snapshot and reads the events from ``offset`` on.

Invariants every adapter keeps (``tests/eventlog/test_snapshot_contract.py`` checks them):

1. **Atomic.** A reader sees a whole snapshot or none of it; a crash mid-write leaves the
   previous snapshot readable.
2. **Durable on return.** ``write`` returns once the snapshot survives a crash of the process.
3. **Newest wins.** ``latest`` gives the snapshot with the highest offset written and not since
   superseded; a write whose offset is not above the newest is ignored, so the recovery floor
   never moves back.
4. **The recovery floor.** :meth:`SnapshotStore.floor` is the offset of the oldest durable
   snapshot a recovery may fall back to (files keep a few, so the oldest kept; Kafka and
   memory keep the newest only), 0 when there is none: the oldest event a recovery may still
   need. Events below it can leave the hot log (retention) without any recovery falling back
   to them. It is read from what the store holds, not from what a writer meant to write, and
   it never moves back (invariant 3).
5. **Released writers.** :meth:`SnapshotStore.release` lets go of whatever the store holds to
   write a partition (Kafka: its transactional producer, with its threads and connections);
   a node calls it when the partition is revoked. Reading is unaffected, and a later ``write``
   of that partition opens what it needs again.

Adapters: :class:`MemorySnapshots` (the reference), :class:`FileSnapshots` (embedded: one file a
snapshot, written to a temporary name, fsynced, renamed, directory fsynced) and
``eventlog.kafka_snapshots.KafkaSnapshots`` (a compacted topic, one key per partition).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

# How often an owner snapshots by default (``cronlog serve --snapshot-every-*``): a new owner
# then replays at most this many events (under a second at the measured replay rates), and a
# partition where events only trickle is snapshotted at its first event after this long.
DEFAULT_EVERY_EVENTS = 100_000
DEFAULT_EVERY_S = 300.0


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    partition: int
    offset: int  # the next event offset to read after restoring it
    data: bytes


class SnapshotStore(Protocol):
    def write(self, partition: int, offset: int, data: bytes) -> bool:
        """Store ``data`` as ``partition``'s state as of ``offset``, atomically and durably.
        False (and nothing written) when a snapshot at ``offset`` or later is already stored."""

    def latest(self, partition: int) -> StoredSnapshot | None:
        """The newest snapshot of ``partition``, or None."""

    def older(self, partition: int, below: int) -> StoredSnapshot | None:
        """The newest snapshot with an offset below ``below``, where the store keeps older ones
        (a fallback when the newer one cannot be restored; time travel); None otherwise."""

    def floor(self, partition: int) -> int:
        """The offset of the oldest snapshot of ``partition`` a recovery may fall back to (the
        newest, where only it is kept), 0 when there is none: events from here on are what a
        recovery still needs."""

    def release(self, partition: int) -> None:
        """Let go of what is held to write ``partition`` (invariant 5); nothing when none is."""

    def close(self) -> None: ...


class MemorySnapshots:
    """The reference adapter: the newest snapshot of each partition, in a dict."""

    def __init__(self) -> None:
        self._newest: dict[int, StoredSnapshot] = {}
        self._lock = threading.Lock()
        self.writes = 0

    def write(self, partition: int, offset: int, data: bytes) -> bool:
        with self._lock:
            held = self._newest.get(partition)
            if held is not None and held.offset >= offset:
                return False
            self._newest[partition] = StoredSnapshot(partition, offset, data)
            self.writes += 1
            return True

    def latest(self, partition: int) -> StoredSnapshot | None:
        with self._lock:
            return self._newest.get(partition)

    def older(self, partition: int, below: int) -> StoredSnapshot | None:
        return None  # only the newest is kept

    def floor(self, partition: int) -> int:
        newest = self.latest(partition)
        return 0 if newest is None else newest.offset

    def release(self, partition: int) -> None:
        pass  # a dict holds nothing per writer

    def close(self) -> None:
        pass


_NAME = re.compile(r"^(\d{20})\.snap$")


class FileSnapshots:
    """Snapshots as files: ``<dir>/p<N>/<offset:020d>.snap``.

    A write goes to ``.tmp`` beside its final name, is fsynced, renamed into place (atomic on
    POSIX) and the directory fsynced, so the name appears only for a whole, durable file.
    ``keep`` snapshots stay per partition (the older ones serve time travel and a fallback when
    the newest turns out damaged: ``older``); leftover ``.tmp`` files of a crash are removed.
    """

    def __init__(self, directory: str | Path, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self._dir = Path(directory)
        self._keep = keep
        self._lock = threading.Lock()

    @property
    def directory(self) -> Path:
        return self._dir

    def write(self, partition: int, offset: int, data: bytes) -> bool:
        folder = self._folder(partition)
        with self._lock:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            held = self._offsets(partition)
            if held and held[-1] >= offset:
                return False
            final = folder / f"{offset:020d}.snap"
            tmp = folder / f"{offset:020d}.snap.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            _fsync_dir(folder)
            for old in held[: max(0, len(held) + 1 - self._keep)]:
                (folder / f"{old:020d}.snap").unlink(missing_ok=True)
            return True

    def latest(self, partition: int) -> StoredSnapshot | None:
        for _ in range(3):  # a newer snapshot may replace the one listed before it is read
            offsets = self._offsets(partition)
            if not offsets:
                return None
            found = self._read(partition, offsets[-1])
            if found is not None:
                return found
        return None

    def older(self, partition: int, below: int) -> StoredSnapshot | None:
        """The newest snapshot with an offset below ``below`` (a fallback, or time travel)."""
        offsets = [o for o in self._offsets(partition) if o < below]
        return self._read(partition, offsets[-1]) if offsets else None

    def floor(self, partition: int) -> int:
        offsets = self._offsets(partition)  # the oldest kept: recovery falls back to it
        return offsets[0] if offsets else 0

    def release(self, partition: int) -> None:
        pass  # each write opens and closes its own file

    def close(self) -> None:
        pass

    def _folder(self, partition: int) -> Path:
        return self._dir / f"p{partition}"

    def _offsets(self, partition: int) -> list[int]:
        folder = self._folder(partition)
        if not folder.is_dir():
            return []
        offsets = []
        for entry in folder.iterdir():
            found = _NAME.match(entry.name)
            if found:
                offsets.append(int(found.group(1)))
            elif entry.name.endswith(".tmp"):  # a write a crash cut short
                entry.unlink(missing_ok=True)
        return sorted(offsets)

    def _read(self, partition: int, offset: int) -> StoredSnapshot | None:
        try:
            data = (self._folder(partition) / f"{offset:020d}.snap").read_bytes()
        except FileNotFoundError:  # replaced by a newer one between listing and reading
            return None
        return StoredSnapshot(partition, offset, data)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
