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

With history kept with its partition (``--history-on owner``), each partition's model has
checkpoints of its own, in the same layout under ``partition-<N>/`` (:func:`partition_store`),
written by the partition's owner: its files, manifests and leases are that partition's alone.

The manifest is JSON: ``format`` (:data:`HISTORY_FORMAT`), ``read_model_format`` (the read
model's key layout, :data:`READ_MODEL_FORMAT`; another build's checkpoint is passed over), when
and by whom it was taken, the positions, and each file's name, size and SHA-256. Files are
stored by content: RocksDB's table files never change once written, so a checkpoint uploads only
the tables written since the previous one (a month of history is not shipped again every hour),
and the checkpoints kept share the rest. The last ``keep`` manifests are kept.

**Collecting files.** Nothing deletes a file the moment it looks unused: a writer may be
uploading files for a manifest it has not written yet (two writers do, for a moment, during a
rebalance in Kafka mode, both on the shared ``--archive-dir``), and a reader may be fetching
the files of a manifest just dropped. So two more kinds of object say who still needs what::

    history/leases/<started_at:013d>-<node>-<nonce>.json   a writer's: the files it will name
    history/dropped/<manifest name>                        a manifest dropped: when, its files

A writer puts its lease (every file of the checkpoint it is taking) before it looks at which
files are stored, renews it every quarter of the grace period while it uploads, writes its
manifest, then checks that every file it named is still there (putting back any that is not:
it still has the copy) and deletes its lease. Dropping a manifest (:func:`prune`) writes its
tombstone first and deletes the manifest after. :func:`collect` (run by the writer after each
checkpoint, and on each of its passes) deletes every file that no manifest, no lease renewed
within the grace period and no tombstone younger than it names; then the leases and
tombstones older than it. A lease left by a writer that crashed before its manifest goes stale
after the grace period, and with it the files only it named: that is how a crashed upload is
collected. Any manifest that decodes as JSON with files protects them, whatever its format
(a newer build's checkpoints are not another build's garbage).

What this assumes, and why it holds: the grace period (``--history-checkpoint-grace``,
default :data:`DEFAULT_GRACE_MS`) is longer than the clocks of two nodes disagree, longer than
a writer takes to renew its lease, and longer than a reader takes to fetch a checkpoint after
it was dropped (it was the newest when the reader chose it, and is dropped only ``keep``
checkpoints later). The collector looks at the leases again just before it deletes, and the
writer checks its files after its manifest, so the one interleaving left is a collector that
stalls between that second look and a delete for longer than a writer takes from its lease
to its check; its cost is a checkpoint a reader refuses for the one before it (below), and
the next checkpoint uploads the file again.

**Restoring.** :func:`restore` tries the manifests newest first: one that does not decode, is of
another format, or names a file that is missing or whose bytes do not match its SHA-256 is
reported (logged, counted) and the next older one tried. The files are written to a directory
beside the model and renamed into place only once all of them are verified, so a crash midway
leaves no half model. Verified twice: each file against its SHA-256 (it is what was uploaded),
then every table read whole with RocksDB's own checksums (what was uploaded was a whole model);
one that fails the second was taken of a damaged model, never becomes usable, and is dropped
from the store (:func:`restore`). :func:`take` reads every table its previous checkpoint did not
check the same way before it uploads anything, and refuses a model that fails
(:class:`CheckpointRefused`), so that no checkpoint of a damaged model is written to begin with.
The model then opens as any other and its runner folds from its positions, through the archive
and the log.

The same restore refills a model found damaged while it runs (by a fold or a query): it is set
aside, the newest usable checkpoint restored beside it and swapped in, and only the tail after
it folded (``ReadModel.refill_with``); from offset 0 only when there is no usable checkpoint.

Worked example: a checkpoint taken at positions {0: 9_000_000, 1: 8_700_000}, the log now at
{0: 9_050_000, 1: 8_720_000}: a joining node restores it and folds 70,000 events, not 17.77M.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

import msgspec

from archive.store import ArchiveMissing, ObjectStore, PrefixedStore
from core.errors import CronlogError
from eventlog.rocks import unreadable_tables
from projections.read_model import ReadModel

log = logging.getLogger(__name__)

HISTORY_FORMAT = 1  # this manifest's layout
# The read model's key layout (projections.model_keys): a build whose model stores other keys
# bumps it, and restores no checkpoint of another layout (it folds from zero instead).
READ_MODEL_FORMAT = 1
CHECKPOINTS = "history/checkpoints/"
FILES = "history/files/"
LEASES = "history/leases/"
DROPPED = "history/dropped/"
DEFAULT_EVERY_S = 120.0
DEFAULT_KEEP = 3
# How long a lease that is not renewed, or a dropped manifest, still protects its files (see
# "Collecting files"): many times a lease's renewal and a checkpoint's fetch, and clock skew.
DEFAULT_GRACE_MS = 15 * 60 * 1000
# A local model this many events behind the newest checkpoint is replaced by it: folding a
# million events takes 10-20 s on a core, copying a checkpoint a fraction of that.
REPLACE_BEHIND_EVENTS = 1_000_000
_CHUNK = 1 << 20
T = TypeVar("T")
_NODE_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_FILE_NAME = re.compile(r"[A-Za-z0-9._-]+")


class CheckpointUnusable(CronlogError):
    """A checkpoint that cannot be restored: names what is wrong with it."""


class CheckpointDamaged(CheckpointUnusable):
    """A checkpoint whose files are as they were uploaded, but whose tables fail RocksDB's own
    checksums: the model was damaged when it was taken. It never becomes usable, so it is
    dropped from the store (:func:`restore`)."""


class CheckpointRefused(CronlogError):
    """A checkpoint not written because the model's copy failed RocksDB's checksums: the
    model itself is damaged (:func:`take`)."""


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


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """A writer's claim on the files of the checkpoint it is uploading (by SHA-256)."""

    node_id: str
    started_at_ms: int
    renewed_at_ms: int
    files: list[str]


class Dropped(msgspec.Struct, frozen=True, kw_only=True):
    """A manifest :func:`prune` dropped: its files stay for the grace period after."""

    dropped_at_ms: int
    files: list[str]


class _Named(msgspec.Struct):
    sha256: str


class _Names(msgspec.Struct):
    """Only the files of a manifest, of any format: what collection must not delete."""

    files: list[_Named]


_lease_decoder = msgspec.json.Decoder(Lease)
_dropped_decoder = msgspec.json.Decoder(Dropped)
_names_decoder = msgspec.json.Decoder(_Names)


class HistoryMetrics(Protocol):
    """What checkpoints report (``node.metrics.NodeMetrics`` implements it)."""

    def history_checkpoint_written(self, taken: Taken) -> None: ...

    def history_checkpoint_failed(self) -> None: ...

    def history_checkpoint_unusable(self) -> None: ...

    def history_checkpoint_refused(self) -> None: ...

    def history_checkpoint_collected(self, collected: Collected) -> None: ...


class Unmeasured:
    def history_checkpoint_written(self, taken: Taken) -> None:
        pass

    def history_checkpoint_failed(self) -> None:
        pass

    def history_checkpoint_unusable(self) -> None:
        pass

    def history_checkpoint_refused(self) -> None:
        pass

    def history_checkpoint_collected(self, collected: Collected) -> None:
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
    reuploaded: int = 0  # files found missing after the manifest was written, put back
    collected: Collected | None = None


@dataclass(frozen=True, slots=True)
class Collected:
    """What one :func:`collect` deleted: files, and stale leases and tombstones."""

    files: int = 0
    leases: int = 0
    dropped: int = 0
    kept_for_grace: int = 0  # files only a live lease or a recent tombstone still names


@dataclass(frozen=True, slots=True)
class Restored:
    key: str
    manifest: Manifest
    size: int
    seconds: float


def partition_store(store: ObjectStore, partition: int) -> ObjectStore:
    """Where one partition's own checkpoints are kept (history kept with its partition,
    ``node.owned_history``): the same layout, under ``partition-<N>/``."""
    return PrefixedStore(store, f"partition-{partition}/")


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
    grace_ms: int = DEFAULT_GRACE_MS,
    clock: Callable[[], int] | None = None,
) -> Taken:
    """Write a checkpoint of ``model`` to ``store``, keep only the newest ``keep`` and collect
    the files nothing needs any more (:func:`collect`). ``work_dir`` (on the model's file
    system, so the copy is hard links) holds the local copy while it is shipped. ``digests``,
    kept by the caller from one checkpoint to the next, spares hashing a table file again:
    RocksDB never changes one once written, and the checkpoint's copy is a hard link to it, so
    (inode, size, mtime) names its content; it is left holding this checkpoint's tables only.
    ``clock`` (milliseconds; default: ``now_ms`` throughout) times the lease's renewals and
    the collection."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    if grace_ms <= 0:
        raise ValueError(f"grace_ms must be positive, got {grace_ms}")
    now = clock or (lambda: now_ms)
    started = time.perf_counter()
    local = work_dir / "history-checkpoint.tmp"
    shutil.rmtree(local, ignore_errors=True)
    local.parent.mkdir(parents=True, exist_ok=True)
    node = _NODE_SAFE.sub("_", node_id) or "node"
    key = f"{CHECKPOINTS}{now_ms:013d}-{node}.json"
    lease_key = f"{LEASES}{now_ms:013d}-{node}-{secrets.token_hex(4)}.json"
    try:
        positions = model.checkpoint(local)
        pause = time.perf_counter() - started
        known = {} if digests is None else digests
        # The copy's tables are the model's own (hard links): a block damaged in the model is
        # damaged here, and hashing it would only vouch for the damage. So every table not
        # checked by the previous checkpoint (a table never changes: its identity says it is
        # the one checked) is read whole, with its checksums, before anything is uploaded.
        unchecked = [path for path in sorted(local.glob("*.sst")) if _identity(path) not in known]
        damaged = unreadable_tables(unchecked, work_dir / "history-checkpoint.check")
        if damaged:
            raise CheckpointRefused(
                f"read model {model.path} is damaged: "
                + "; ".join(f"{name}: {said}" for name, said in sorted(damaged.items()))
            )
        tables: dict[tuple[int, int, int], str] = {}
        entries: list[FileEntry] = []
        paths: dict[str, Path] = {}
        for path in sorted(local.iterdir()):
            if path.suffix == ".sst":
                identity = _identity(path)
                digest = known.get(identity) or _sha256(path)[0]
                size = identity[1]
                tables[identity] = digest
            else:
                digest, size = _sha256(path)
            entries.append(FileEntry(path.name, size, digest))
            paths[digest] = path
        lease = Lease(
            node_id=node_id,
            started_at_ms=now_ms,
            renewed_at_ms=now(),
            files=sorted(paths),
        )
        # The lease before the listing: a collector that lists the leases after this point
        # leaves these files alone, so one seen stored now is not deleted under us.
        store.put(lease_key, msgspec.json.encode(lease))
        uploaded = 0
        gone: set[str] = set()
        try:
            present = set(store.list(FILES))
            for digest, path in paths.items():
                if now() - lease.renewed_at_ms >= max(1, grace_ms // 4):
                    lease = msgspec.structs.replace(lease, renewed_at_ms=now())
                    store.put(lease_key, msgspec.json.encode(lease))
                if FILES + digest not in present:
                    store.put(FILES + digest, path.read_bytes())
                    present.add(FILES + digest)
                    uploaded += path.stat().st_size
            manifest = Manifest(
                format=HISTORY_FORMAT,
                read_model_format=READ_MODEL_FORMAT,
                taken_at_ms=now_ms,
                node_id=node_id,
                positions=positions,
                files=entries,
            )
            # The files first, the manifest last: a manifest never names a file not yet stored.
            store.put(key, msgspec.json.encode(manifest))
            # A file deleted between the listing and the manifest (by a collector that stalled
            # past the lease) is put back: the manifest now protects it.
            gone = set(paths) - {k[len(FILES) :] for k in store.list(FILES)}
            for digest in sorted(gone):
                log.warning(
                    "history checkpoint %s: file %s was deleted while it was written; put back",
                    key,
                    digest,
                )
                store.put(FILES + digest, paths[digest].read_bytes())
        finally:
            store.delete(lease_key)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    if digests is not None:
        digests.clear()
        digests.update(tables)
    prune(store, keep, now_ms=now())
    collected = collect(store, now_ms=now(), grace_ms=grace_ms)
    return Taken(
        key=key,
        positions=positions,
        size=sum(e.size for e in entries),
        uploaded=uploaded,
        files=len(entries),
        pause_s=pause,
        seconds=time.perf_counter() - started,
        reuploaded=len(gone),
        collected=collected,
    )


def prune(store: ObjectStore, keep: int, *, now_ms: int) -> int:
    """Drop all but the newest ``keep`` manifests; returns how many went. Each leaves a
    tombstone naming its files, written before the manifest is deleted, so a reader fetching
    it has the grace period to finish; :func:`collect` deletes the files afterwards."""
    keys = manifests(store)
    dropped = keys[: max(0, len(keys) - keep)]
    for key in dropped:
        _drop(store, key, now_ms=now_ms)
    return len(dropped)


def _drop(store: ObjectStore, key: str, *, now_ms: int) -> None:
    """Drop one manifest: its tombstone first, so a reader fetching it has the grace period."""
    try:
        files = sorted(_names(store.get(key)))
    except ArchiveMissing:
        return  # another writer dropped it first
    except CheckpointUnusable as unusable:  # restores nothing, and names nothing known
        log.error("history manifest %s dropped: %s", key, unusable)
        files = []
    tombstone = Dropped(dropped_at_ms=now_ms, files=files)
    store.put(DROPPED + key[len(CHECKPOINTS) :], msgspec.json.encode(tombstone))
    store.delete(key)


def collect(store: ObjectStore, *, now_ms: int, grace_ms: int = DEFAULT_GRACE_MS) -> Collected:
    """Delete the files that no manifest names, nor a lease renewed after ``now_ms -
    grace_ms``, nor a tombstone written after it; then the leases and tombstones older than
    that. See "Collecting files" for why this never deletes what a writer or a reader uses."""
    cutoff = now_ms - grace_ms
    needed: set[str] = set()
    for_grace: set[str] = set()
    stale: list[str] = []
    leases = store.list(LEASES)
    for key in leases:
        lease = _record(store, key, _lease_decoder)
        if isinstance(lease, Lease):
            if lease.renewed_at_ms > cutoff:
                for_grace.update(lease.files)
            else:
                stale.append(key)
        elif lease is _UNREADABLE:
            # What it protects is unknown: nothing goes until it is old enough by its name.
            if _stamp(key) > cutoff:
                log.error("history lease %s does not decode: collecting nothing", key)
                return Collected()
            stale.append(key)
    for key in store.list(DROPPED):
        tombstone = _record(store, key, _dropped_decoder)
        if isinstance(tombstone, Dropped):
            if tombstone.dropped_at_ms > cutoff:
                for_grace.update(tombstone.files)
            else:
                stale.append(key)
        elif tombstone is _UNREADABLE:
            if _stamp(key) > cutoff:  # named by when its manifest was taken, before the drop
                log.error("history tombstone %s does not decode: collecting nothing", key)
                return Collected()
            stale.append(key)
    for key in manifests(store):
        try:
            needed |= _names(store.get(key))
        except ArchiveMissing:
            continue
        except CheckpointUnusable as unusable:
            # Until it is pruned (it restores nothing), what it names is unknown.
            log.error("history manifest %s: %s; collecting nothing", key, unusable)
            return Collected()
    stored = {k[len(FILES) :] for k in store.list(FILES)}
    garbage = stored - needed - for_grace
    if garbage:
        # Look at the leases once more, just before deleting: a writer that began since the
        # first look may have seen these files and be about to name them, and one whose lease
        # looked stale may only have been slow and renewed it.
        for key in sorted(set(store.list(LEASES)) - (set(leases) - set(stale))):
            lease = _record(store, key, _lease_decoder)
            if lease is None:
                continue
            if not isinstance(lease, Lease):
                return Collected()  # unknown claims: try again on the next pass
            if key not in stale or lease.renewed_at_ms > cutoff:
                garbage -= set(lease.files)
                if key in stale:
                    stale.remove(key)
    for digest in sorted(garbage):
        store.delete(FILES + digest)
    for key in stale:
        store.delete(key)
    leases_gone = sum(1 for k in stale if k.startswith(LEASES))
    collected = Collected(
        files=len(garbage),
        leases=leases_gone,
        dropped=len(stale) - leases_gone,
        kept_for_grace=len((stored & for_grace) - needed),
    )
    if garbage or stale:
        log.info(
            "history checkpoints: collected %d files, %d stale leases, %d tombstones; %d files"
            " kept for the grace period",
            collected.files,
            collected.leases,
            collected.dropped,
            collected.kept_for_grace,
        )
    return collected


_UNREADABLE = object()


def _record(store: ObjectStore, key: str, decoder: msgspec.json.Decoder[T]) -> T | object | None:
    """A lease's or tombstone's record; None if it is gone, ``_UNREADABLE`` if it does not
    decode (logged)."""
    try:
        return decoder.decode(store.get(key))
    except ArchiveMissing:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.error("history record %s does not decode: %s", key, exc)
        return _UNREADABLE


def _stamp(key: str) -> int:
    """The milliseconds a lease's key starts with (0 if it does not)."""
    head = key.rpartition("/")[2].partition("-")[0]
    return int(head) if head.isdigit() else 0


def _names(data: bytes) -> set[str]:
    """The SHA-256 of every file a manifest names, of whatever format; CheckpointUnusable if
    it does not say."""
    try:
        return {f.sha256 for f in _names_decoder.decode(data).files}
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CheckpointUnusable(f"it does not list its files: {exc}") from exc


def restore(
    store: ObjectStore,
    path: Path,
    metrics: HistoryMetrics | None = None,
    clock: Callable[[], int] | None = None,
) -> Restored | None:
    """Restore the newest usable checkpoint as the model at ``path`` (which must not exist);
    None if there is none usable. Each unusable one is logged and counted, and the next older
    tried; one whose tables fail RocksDB's checksums (a damaged model was copied) is dropped
    from the store too, so no later restore fetches it again. ``clock``: milliseconds, for
    the tombstone of one dropped (default: the wall clock)."""
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
            if isinstance(unusable, CheckpointDamaged):
                _drop(store, key, now_ms=clock() if clock else _wall_ms())
                log.error("history checkpoint %s dropped: it holds a damaged model", key)
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
    event). With a ``store``, a model found damaged later, by a fold or a query, is refilled
    from the newest usable checkpoint the same way (``ReadModel.refill_with``)."""
    path = Path(data_dir) / "read_model"
    restored = None
    if store is not None and not path.exists():
        restored = restore(store, path, metrics)
    model = ReadModel.open(data_dir)
    if store is None:
        return model, restored
    model.refill_with(_refiller(store, metrics))
    if restored is not None:
        return model, restored
    if model.set_asides:
        # The damaged model was set aside and an empty one started: a checkpoint is better.
        model.close()
        shutil.rmtree(path)
        restored = restore(store, path, metrics)
        model = ReadModel.open(data_dir)
        model.set_asides = 1
        model.refill_with(_refiller(store, metrics))
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
    model = ReadModel.open(data_dir)
    model.refill_with(_refiller(store, metrics))
    return model, restored


def _refiller(
    store: ObjectStore, metrics: HistoryMetrics | None
) -> Callable[[Path], dict[int, int] | None]:
    """What a model found damaged while it runs is refilled by (``ReadModel.refill_with``):
    the newest usable checkpoint, restored at the path given; its positions."""

    def refill(path: Path) -> dict[int, int] | None:
        restored = restore(store, path, metrics)
        if restored is None:
            return None
        log.info(
            "history checkpoint %s restored for a damaged read model (%d events, %.1f MB)",
            restored.key,
            restored.manifest.events,
            restored.size / 1e6,
        )
        return dict(restored.manifest.positions)

    return refill


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
        # Whole as uploaded is not whole as a model: one taken before checkpoints were checked
        # may hold a damaged table, byte for byte.
        damaged = unreadable_tables(
            sorted(staging.glob("*.sst")), path.with_name(path.name + ".checking")
        )
        if damaged:
            raise CheckpointDamaged(
                "its tables fail RocksDB's checksums: "
                + "; ".join(f"{name}: {said}" for name, said in sorted(damaged.items()))
            )
        os.replace(staging, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return size


def _identity(path: Path) -> tuple[int, int, int]:
    """What names a table file's content: RocksDB never rewrites one (the digests' key)."""
    stat = path.stat()
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


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
