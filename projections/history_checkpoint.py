"""Read-model checkpoints in the object store, so that no node folds history from the first event.

Every node keeps folding every partition's tail into its read model (at the seeds' load a few
hundred events a second); a node that has no read model (its first start, or one set aside as
damaged) restores the newest checkpoint and folds only the events after the positions the
checkpoint holds. The checkpoint is written by one node of the cluster
(:class:`node.history_checkpointer.HistoryCheckpointer` decides who and when).

**What one is.** A RocksDB checkpoint of the model (:meth:`ReadModel.checkpoint`: a consistent
point-in-time copy; its ``m/pos/<p>`` positions were written in the same batches as the changes
they cover, so the copy says itself where its tail starts), shipped through the archive's
object-store port (``archive.store.ObjectStore``) as one object per file plus a manifest::

    history/files/<sha256>                        a file of a checkpoint, by its content
    history/checkpoints/<taken_at:013d>-<node>.json   the manifest (newest sorts last)

The manifest is JSON: ``format`` (:data:`HISTORY_FORMAT`), ``read_model_format`` (the read
model's key layout, :data:`READ_MODEL_FORMAT`; another build's checkpoint is passed over), when
and by whom it was taken, the positions, and each file's name, size and SHA-256. Files are
stored by content: RocksDB's table files never change once written, so a checkpoint uploads only
the tables written since the previous one (a month of history is not shipped again every hour),
and the checkpoints kept share the rest. The last ``keep`` manifests are kept; a manifest
dropped takes with it the files no kept manifest names.

**Restoring.** :func:`restore` tries the manifests newest first: one that does not decode, is of
another format, or names a file that is missing or whose bytes do not match its SHA-256 is
reported (logged, counted) and the next older one tried. The files are written to a directory
beside the model and renamed into place only once all of them are verified, so a crash midway
leaves no half model. The model then opens as any other and its runner folds from its
positions, through the archive and the log.

Worked example: a checkpoint taken at positions {0: 9_000_000, 1: 8_700_000}, the log now at
{0: 9_050_000, 1: 8_720_000}: a joining node restores it and folds 70,000 events, not 17.77M.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import msgspec

from archive.store import ArchiveMissing, ObjectStore
from core.errors import CronlogError
from projections.read_model import ReadModel

log = logging.getLogger(__name__)

HISTORY_FORMAT = 1  # this manifest's layout
# The read model's key layout (projections.read_model): a build whose model stores other keys
# bumps it, and restores no checkpoint of another layout (it folds from zero instead).
READ_MODEL_FORMAT = 1
CHECKPOINTS = "history/checkpoints/"
FILES = "history/files/"
DEFAULT_EVERY_S = 120.0
DEFAULT_KEEP = 3
# A local model this many events behind the newest checkpoint is replaced by it: folding a
# million events takes 10-20 s on a core, copying a checkpoint a fraction of that.
REPLACE_BEHIND_EVENTS = 1_000_000
_CHUNK = 1 << 20
_NODE_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_FILE_NAME = re.compile(r"[A-Za-z0-9._-]+")


class CheckpointUnusable(CronlogError):
    """A checkpoint that cannot be restored: names what is wrong with it."""


class FileEntry(msgspec.Struct, frozen=True):
    name: str
    size: int
    sha256: str


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    read_model_format: int
    taken_at_ms: int
    node_id: str
    positions: dict[int, int]
    files: list[FileEntry]

    @property
    def events(self) -> int:
        """Events the checkpoint holds (the sum of its positions)."""
        return sum(self.positions.values())


_manifest_decoder = msgspec.json.Decoder(Manifest)


class HistoryMetrics(Protocol):
    """What checkpoints report (``node.metrics.NodeMetrics`` implements it)."""

    def history_checkpoint_written(self, taken: Taken) -> None: ...

    def history_checkpoint_failed(self) -> None: ...

    def history_checkpoint_unusable(self) -> None: ...


class Unmeasured:
    def history_checkpoint_written(self, taken: Taken) -> None:
        pass

    def history_checkpoint_failed(self) -> None:
        pass

    def history_checkpoint_unusable(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Taken:
    """One checkpoint written: its key, positions, size, what was uploaded, and what it cost
    (``pause_s``: how long folds waited; ``seconds``: the whole write, off the fold)."""

    key: str
    positions: dict[int, int]
    size: int
    uploaded: int
    files: int
    pause_s: float
    seconds: float


@dataclass(frozen=True, slots=True)
class Restored:
    key: str
    manifest: Manifest
    size: int
    seconds: float


def manifests(store: ObjectStore) -> list[str]:
    """The checkpoints' manifest keys, oldest first."""
    return [k for k in store.list(CHECKPOINTS) if k.endswith(".json")]


def newest(store: ObjectStore) -> Manifest | None:
    """The newest manifest that decodes (None if there is none)."""
    for key in reversed(manifests(store)):
        try:
            return _manifest(store, key)
        except CheckpointUnusable:
            continue
    return None


def take(
    model: ReadModel,
    store: ObjectStore,
    work_dir: Path,
    *,
    node_id: str,
    now_ms: int,
    keep: int = DEFAULT_KEEP,
    digests: dict[tuple[int, int, int], str] | None = None,
) -> Taken:
    """Write a checkpoint of ``model`` to ``store`` and keep only the newest ``keep``.
    ``work_dir`` (on the model's file system, so the copy is hard links) holds the local copy
    while it is shipped. ``digests``, kept by the caller from one checkpoint to the next, spares
    hashing a table file again: RocksDB never changes one once written, and the checkpoint's
    copy is a hard link to it, so (inode, size, mtime) names its content; it is left holding
    this checkpoint's tables only."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    started = time.perf_counter()
    local = work_dir / "history-checkpoint.tmp"
    shutil.rmtree(local, ignore_errors=True)
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        positions = model.checkpoint(local)
        pause = time.perf_counter() - started
        present = set(store.list(FILES))
        entries: list[FileEntry] = []
        uploaded = 0
        known = {} if digests is None else digests
        tables: dict[tuple[int, int, int], str] = {}
        for path in sorted(local.iterdir()):
            if path.suffix == ".sst":
                stat = path.stat()
                identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                digest = known.get(identity) or _sha256(path)[0]
                size = stat.st_size
                tables[identity] = digest
            else:
                digest, size = _sha256(path)
            entries.append(FileEntry(path.name, size, digest))
            if FILES + digest not in present:
                store.put(FILES + digest, path.read_bytes())
                present.add(FILES + digest)
                uploaded += size
    finally:
        shutil.rmtree(local, ignore_errors=True)
    if digests is not None:
        digests.clear()
        digests.update(tables)
    manifest = Manifest(
        format=HISTORY_FORMAT,
        read_model_format=READ_MODEL_FORMAT,
        taken_at_ms=now_ms,
        node_id=node_id,
        positions=positions,
        files=entries,
    )
    key = f"{CHECKPOINTS}{now_ms:013d}-{_NODE_SAFE.sub('_', node_id) or 'node'}.json"
    # The files first, the manifest last: a manifest never names a file not yet stored.
    store.put(key, msgspec.json.encode(manifest))
    prune(store, keep)
    return Taken(
        key=key,
        positions=positions,
        size=sum(e.size for e in entries),
        uploaded=uploaded,
        files=len(entries),
        pause_s=pause,
        seconds=time.perf_counter() - started,
    )


def prune(store: ObjectStore, keep: int) -> int:
    """Delete all but the newest ``keep`` manifests, and the files only they named; returns how
    many manifests went. Only files of a dropped manifest are candidates, so a file another
    writer uploaded for a manifest it has not written yet is never taken for garbage."""
    keys = manifests(store)
    dropped, kept = keys[: max(0, len(keys) - keep)], keys[max(0, len(keys) - keep) :]
    if not dropped:
        return 0
    named: set[str] = set()
    for key in kept:
        try:
            named |= {e.sha256 for e in _manifest(store, key).files}
        except CheckpointUnusable:
            continue
    candidates: set[str] = set()
    for key in dropped:
        with contextlib.suppress(CheckpointUnusable):  # unreadable: it names nothing to free
            candidates |= {e.sha256 for e in _manifest(store, key).files}
        store.delete(key)
    for digest in candidates - named:
        store.delete(FILES + digest)
    return len(dropped)


def restore(
    store: ObjectStore, path: Path, metrics: HistoryMetrics | None = None
) -> Restored | None:
    """Restore the newest usable checkpoint as the model at ``path`` (which must not exist);
    None if there is none usable. Each unusable one is logged and counted, and the next older
    tried."""
    if path.exists():
        raise CronlogError(f"{path} exists: a checkpoint restores only where no model is")
    metrics = metrics or Unmeasured()
    for key in reversed(manifests(store)):
        started = time.perf_counter()
        try:
            manifest = _manifest(store, key)
            size = _unpack(store, manifest, path)
        except CheckpointUnusable as unusable:
            log.error("history checkpoint %s is unusable, trying an older one: %s", key, unusable)
            metrics.history_checkpoint_unusable()
            continue
        return Restored(key, manifest, size, time.perf_counter() - started)
    return None


def open_model(
    data_dir: Path, store: ObjectStore | None, metrics: HistoryMetrics | None = None
) -> tuple[ReadModel, Restored | None]:
    """The read model of a node's data directory (``ReadModel.open``), restored from the
    newest usable checkpoint in ``store`` first when there is no model, when the one there had
    to be set aside as damaged, or when it is more than ``REPLACE_BEHIND_EVENTS`` behind the
    checkpoint on every partition (a node back after days away); with it, the checkpoint
    restored (None: the model is the one found, or an empty one that folds from the first
    event)."""
    path = Path(data_dir) / "read_model"
    restored = None
    if store is not None and not path.exists():
        restored = restore(store, path, metrics)
    model = ReadModel.open(data_dir)
    if store is None or restored is not None:
        return model, restored
    if model.set_asides:
        # The damaged model was set aside and an empty one started: a checkpoint is better.
        model.close()
        shutil.rmtree(path)
        restored = restore(store, path, metrics)
        model = ReadModel.open(data_dir)
        model.set_asides = 1
        return model, restored
    newest_ = newest(store)
    if newest_ is None or not _far_behind(model.positions(), newest_.positions):
        return model, None
    local = model.positions()
    model.close()
    staging = path.with_name(path.name + ".replacing")
    shutil.rmtree(staging, ignore_errors=True)
    restored = restore(store, staging, metrics)
    if restored is not None and _far_behind(local, restored.manifest.positions):
        shutil.rmtree(path)
        os.replace(staging, path)
        _fsync_dir(path.parent)
        log.info(
            "read model %d events behind the newest history checkpoint: replaced by it",
            restored.manifest.events - sum(local.values()),
        )
    else:  # the newest usable one is not far enough ahead: folding the local tail is quicker
        shutil.rmtree(staging, ignore_errors=True)
        restored = None
    return ReadModel.open(data_dir), restored


def _far_behind(local: dict[int, int], checkpoint: dict[int, int]) -> bool:
    """Whether a model at ``local`` is behind ``checkpoint`` on every partition and by more
    than ``REPLACE_BEHIND_EVENTS`` in all: copying the checkpoint is then quicker than
    folding the difference."""
    if any(at > checkpoint.get(p, 0) for p, at in local.items()):
        return False
    return sum(checkpoint.values()) - sum(local.values()) > REPLACE_BEHIND_EVENTS


def _manifest(store: ObjectStore, key: str) -> Manifest:
    try:
        manifest = _manifest_decoder.decode(store.get(key))
    except ArchiveMissing as exc:
        raise CheckpointUnusable(f"{key} is gone") from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CheckpointUnusable(f"{key} does not decode: {exc}") from exc
    if manifest.format != HISTORY_FORMAT or manifest.read_model_format != READ_MODEL_FORMAT:
        raise CheckpointUnusable(
            f"{key} is of format {manifest.format}/{manifest.read_model_format}; this build"
            f" reads {HISTORY_FORMAT}/{READ_MODEL_FORMAT}"
        )
    for entry in manifest.files:
        if not _FILE_NAME.fullmatch(entry.name) or entry.name in (".", ".."):
            raise CheckpointUnusable(f"{key} names a file {entry.name!r}")
    return manifest


def _unpack(store: ObjectStore, manifest: Manifest, path: Path) -> int:
    """Fetch and verify every file into a directory beside ``path``, then rename it into place."""
    staging = path.with_name(path.name + ".restoring")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700, parents=True)
    size = 0
    try:
        for entry in manifest.files:
            try:
                data = store.get(FILES + entry.sha256)
            except ArchiveMissing as exc:
                raise CheckpointUnusable(f"its file {entry.name} is missing") from exc
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                raise CheckpointUnusable(f"its file {entry.name} does not match its SHA-256")
            with (staging / entry.name).open("wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            size += len(data)
        _fsync_dir(staging)
        os.replace(staging, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return size


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        for chunk in _chunks(f):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while chunk := f.read(_CHUNK):
        yield chunk


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
