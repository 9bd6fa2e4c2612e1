"""The read model: every partition's events folded into queryable history, in RocksDB.

The partition state keeps only what deciding needs (finished runs leave it); the read model keeps
every job, run, attempt and skipped slot, and the indexes the API lists them by.

It is one RocksDB store, in parts that each have a module of their own:

- :mod:`projections.model_keys`: the key layout, every key's helper, and cursors;
- :mod:`projections.model_store`: the handle and locks the parts share, and checked reads;
- :mod:`projections.model_fold`: ``process(event, partition, offset)``, batches, positions;
- :mod:`projections.model_queries`: jobs, runs, pages, counts and figures;
- :mod:`projections.model_forget`: the hot window's forgetting;
- this module: the store's life (open, set aside on damage, refill from a checkpoint, close,
  the migrations of an older layout), and :class:`ReadModel`, which is all of them;
- :mod:`projections.read_model_runner`: following the log into the fold.

**Records and damage.** Records of the events stream that are not events are reported through
an ``EventDecoder`` (``projections.decoding``) and passed over: the partition's position moves
past them. The model is derived, so damage to it is repaired by rebuilding, never served: a
RocksDB checksum that fails, a value that does not decode, an index pointing at nothing raise
:class:`core.errors.StoreDamaged`. :meth:`ReadModel.open` sets a model RocksDB will not open
aside (renamed ``read_model.damaged-<time>``, kept for whoever looks into why) and starts an
empty one; damage found later, by a fold or a query, sets it aside the same way
(:meth:`ReadModel.set_aside`), the query answering ``Unavailable``, and
:class:`ReadModelRunner` folds every partition again from offset 0. With a source of
checkpoints (:meth:`ReadModel.refill_with`: ``projections.history_checkpoint`` gives the
newest usable one of the shared store), a thread of the set-aside restores the newest
checkpoint beside the model meanwhile and swaps it in, so the runner folds only the tail
after it; only when there is none, or it is no further on than the fold from 0 has come, does
that fold go on. Until it has caught up with what it held (and, from the node's start, with the
log's end as it was then: ``hold_until``), :meth:`refilling` names the partitions it is behind
on, and the API answers their history with 503 (``HistoryRefilling``) rather than with what
it has folded so far; the lag metric says how far it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from core.errors import StoreDamaged
from eventlog.rocks import bounded, close_store, is_damage, open_store
from projections.aside import set_aside
from projections.model_fold import ModelFold, Observer, ReadyRun
from projections.model_forget import FORGETTABLE, Forgot, ModelForget
from projections.model_keys import (
    JOB_COUNTS,
    STATUSES,
    UNLISTED_CANCELLED,
    decode_cursor,
    encode_cursor,
    job_count_key,
    job_decoder,
    job_key,
    run_key,
    status_entry,
    tag_key,
    tenant_job_key,
    u64,
)
from projections.model_queries import MAX_LIMIT, ModelQueries
from projections.read_model_runner import DEFER_FOR_S, ReadModelRunner

# What other packages import from here, wherever it is defined now.
__all__ = [
    "DEFER_FOR_S",
    "FORGETTABLE",
    "MAX_LIMIT",
    "Forgot",
    "Observer",
    "ReadModel",
    "ReadModelRunner",
    "ReadyRun",
    "decode_cursor",
    "encode_cursor",
    "run_key",
]

log = logging.getLogger(__name__)

REFILL_JOIN_S = 30.0  # how long closing waits for a refill still restoring a checkpoint


class ReadModel(ModelFold, ModelQueries, ModelForget):
    """History queries over every partition's events; ``ReadModel.open(data_dir)``.

    One thread at a time writes (batches hold a lock); any number query. The fold, the queries
    and forgetting are the parts it inherits; this class opens, sets aside, refills and closes
    the store they share.
    """

    def __init__(self, path: str | Path) -> None:
        """Open (creating) the model at ``path``; StoreDamaged if it cannot be read back."""
        self._path = Path(path)
        self._write_options = WriteOptions()
        self._write_options.sync = False  # the log re-supplies a lost tail: see model_fold
        self._write_lock = threading.RLock()  # one writer: staging and committing a batch
        self._db_lock = threading.Lock()  # a batch's write versus a query's reads
        self._pending = None
        self._positions = {}
        self._floor = {}
        self._moved = threading.Condition()
        self._generation = 0
        self.set_asides = 0
        self._restore: Callable[[Path], dict[int, int] | None] | None = None
        self._refills: list[threading.Thread] = []
        self._closed = False
        self._observers = []
        self._db = self._open_db()
        try:
            self._positions = self._stored_positions()
            with self._reading():
                self._read_marks()
                self._upgrade()
        except StoreDamaged:
            close_store(self._db)
            raise

    @classmethod
    def open(cls, data_dir: str | Path) -> ReadModel:
        """The read model of a node's data directory: ``<data>/read_model``. One that cannot
        be read back is set aside and an empty one started (the runner refills it)."""
        path = Path(data_dir) / "read_model"
        for leftover in path.parent.glob(f"{path.name}.refill-*"):  # a refill cut short
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            return cls(path)
        except StoreDamaged as damage:
            aside = set_aside(path)
            log.error("%s; set aside as %s, rebuilding it from the log", damage, aside)
            model = cls(path)
            model.set_asides = 1
            return model

    def set_aside(self, damage: StoreDamaged, generation: int | None = None) -> bool:
        """Rename the damaged model's files aside and start empty; every partition's position
        goes back to 0, so the runner folds the log again. A no-op (False) when ``generation``
        is given and the model was set aside since (by whoever found the damage first)."""
        with self._write_lock, self._db_lock:
            if generation is not None and generation != self._generation:
                return False
            try:
                close_store(self._db)
            except Exception as exc:  # a compaction met the damage first: closed all the same
                log.warning("read model %s closed with an error: %s", self._path, exc)
            aside = set_aside(self._path)
            self._db = self._open_db()
            self._upgrade()  # none yet: says the counters are kept from here on
            self._generation += 1
            self.set_asides += 1
            self._clear_marks()
            with self._moved:
                for p, at in self._positions.items():  # what it held, it must hold again
                    self._floor[p] = max(self._floor.get(p, 0), at)
                self._positions = {}
                self._moved.notify_all()
            generation_now = self._generation
        log.error("%s; set aside as %s, rebuilding it from the log", damage, aside)
        if self._restore is not None:
            refill = threading.Thread(
                target=self._refill,
                args=(self._restore, generation_now),
                name="read-model-refill",
                daemon=True,
            )
            self._refills = [t for t in self._refills if t.is_alive()] + [refill]
            refill.start()
        return True

    def refill_with(self, restore: Callable[[Path], dict[int, int] | None]) -> None:
        """From now on a model set aside (:meth:`set_aside`) is refilled by ``restore(path)``:
        it writes a model from a checkpoint at ``path`` (which does not exist) and returns the
        positions it holds, or None when there is no usable checkpoint."""
        self._restore = restore

    def _refill(self, restore: Callable[[Path], dict[int, int] | None], generation: int) -> None:
        """Restore a checkpoint beside the emptied model, off every lock (folds and queries go
        on meanwhile), then swap it in if the model was not set aside again since and the
        checkpoint is further on than the fold from 0 has come."""
        # One directory per set-aside: a refill overtaken by another must not share its copy.
        staging = self._path.with_name(f"{self._path.name}.refill-{generation}")
        try:
            shutil.rmtree(staging, ignore_errors=True)
            positions = restore(staging)
            if positions is None:
                log.warning(
                    "read model %s: no usable history checkpoint; folding every partition"
                    " from offset 0",
                    self._path,
                )
                return
            with self._write_lock, self._db_lock:
                if self._closed or generation != self._generation:
                    return  # closed, or set aside again: that set-aside refills
                if sum(positions.values()) <= sum(self._positions.values()):
                    log.info("read model %s: folded past the checkpoint already", self._path)
                    return
                close_store(self._db)
                shutil.rmtree(self._path)
                os.replace(staging, self._path)
                self._generation += 1  # a fold read before the swap must not land after it
                try:
                    self._db = self._open_db()
                    stored = self._stored_positions()
                    with self._reading():
                        self._read_marks()
                        self._upgrade()
                except StoreDamaged as damage:  # verified when restored: the disk, again
                    with contextlib.suppress(Exception):
                        close_store(self._db)
                    log.error("%s; set aside as %s", damage, set_aside(self._path))
                    self._db = self._open_db()
                    self._upgrade()
                    self._clear_marks()
                    stored = {}
                with self._moved:
                    self._positions = stored
                    self._moved.notify_all()
            log.warning(
                "read model %s refilled from a history checkpoint at %d events; folding the"
                " tail after it",
                self._path,
                sum(stored.values()),
            )
            for observer in self._observers:
                try:
                    observer.folded(dict(stored), [])
                except Exception:
                    log.exception("a read model observer failed")
        except Exception:
            log.exception(
                "read model %s: refilling from a history checkpoint failed; folding every"
                " partition from offset 0",
                self._path,
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _open_db(self) -> Rdict:
        self._path.mkdir(mode=0o700, parents=True, exist_ok=True)
        options = bounded(Options(raw_mode=True), point_lookups=True)
        options.create_if_missing(True)
        options.set_paranoid_checks(True)
        try:
            return open_store(self, self._path, options=options)
        except Exception as exc:
            if is_damage(exc):
                raise StoreDamaged(f"read model {self._path}: {exc}") from exc
            raise

    def durable_positions(self) -> dict[int, int]:
        """Each partition's next event offset as the model would reopen after a crash, made
        so now (the WAL is synced first): retention may prune the log below it, never above."""
        with self._db_lock:
            self._db.flush_wal(True)
            return self._stored_positions()

    def checkpoint(self, path: str | Path) -> dict[int, int]:
        """A consistent copy of the model at ``path`` (a RocksDB checkpoint: hard links to its
        files where it can, so it costs a memtable flush, not a copy), and the positions it
        holds. Folds wait for it (it holds the write lock, so the copy and the positions are
        of the same batch); queries do not. ``projections.history_checkpoint`` ships it."""
        from rocksdict import Checkpoint

        with self._write_lock:
            Checkpoint(self._db).create_checkpoint(str(path))
            return self.positions()

    def close(self) -> None:
        with self._write_lock, self._db_lock:
            self._closed = True
            close_store(self._db)
        for refill in self._refills:  # a restore under way stops at the swap, undone
            refill.join(REFILL_JOIN_S)
            if refill.is_alive():
                log.warning("read model %s closed with a refill still restoring", self._path)

    def observe(self, observer: Observer) -> None:
        """Tell ``observer`` of every batch written from now on."""
        self._observers.append(observer)

    def __enter__(self) -> ReadModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def dump(self) -> list[tuple[bytes, bytes]]:
        """Every stored key and value in key order (for tests and tools)."""
        with self._db_lock, self._reading():
            return [(bytes(k), bytes(v)) for k, v in self._scan(b"")]

    # -- migrations: a model written by an earlier version ----------------------------------

    def _upgrade(self) -> None:
        """Bring a model written by an earlier version up to this one's layout, once."""
        if self._db.get(JOB_COUNTS) is None:
            self._count_jobs_once()
        if self._db.get(UNLISTED_CANCELLED) is None:
            self._unlist_cancelled_once()

    def _unlist_cancelled_once(self) -> None:
        """Take the deleted jobs of a model written before they left the listings out of
        ``tj/`` and ``tt/``, in one batch with the marker that says it is done."""
        wb = WriteBatch(raw_mode=True)
        for key, _ in self._scan(STATUSES):
            tenant, status, job_id = status_entry(key)
            if status != "cancelled":
                continue
            wb.delete(tenant_job_key(tenant, job_id))
            stored = self._db.get(job_key(job_id))
            if stored is not None:
                for tag in job_decoder.decode(stored).view.spec.tags:
                    wb.delete(tag_key(tenant, tag, job_id))
        wb.put(UNLISTED_CANCELLED, b"")
        self._db.write(wb, self._write_options)

    def _count_jobs_once(self) -> None:
        """Fill the ``cj/`` counters of a model written before they were kept, from the
        jobs-by-status index, in one batch with the marker that says they are kept."""
        counts: dict[str, int] = {}
        for key, _ in self._scan(STATUSES):
            tenant, status, _job_id = status_entry(key)
            if status != "cancelled":
                counts[tenant] = counts.get(tenant, 0) + 1
        wb = WriteBatch(raw_mode=True)
        for tenant, count in counts.items():
            wb.put(job_count_key(tenant), u64(count))
        wb.put(JOB_COUNTS, b"")
        self._db.write(wb, self._write_options)
