"""The RocksDB handle the read model's parts share, the positions it holds, its checked reads.

:class:`ModelStore` is the base of each part of :class:`projections.read_model.ReadModel` (the
fold, the queries, forgetting): it names the handle, the locks and the generation that
:mod:`projections.read_model` opens, sets aside and closes; it keeps each partition's position
(moved by the fold's batches, reset by a set-aside, set by a refill, waited on by readers); and
it reads the handle so that a damaged model raises :class:`core.errors.StoreDamaged` and
nothing else. :func:`query` makes a method a query: one that finds the model damaged sets it
aside and answers ``Unavailable``.

A query and a batch's write exclude each other (a lock held only for the ``write`` call and
the query's reads), so an index and the records it points at always agree. Not a RocksDB
snapshot: in rocksdict 0.3.29 a snapshot's ``get`` honours it but its ``iter``/``items`` see
later writes. There is no in-memory adapter: tests open the model in a temporary directory.
"""

from __future__ import annotations

import contextlib
import functools
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec
from rocksdict import Rdict, WriteOptions

from core.errors import StoreDamaged, Unavailable
from eventlog.port import EventLog
from eventlog.rocks import checked_reads, is_damage, iterator_error
from projections.model_keys import (
    DEPENDANTS,
    POSITIONS,
    UNSCOPED,
    from_u64,
    partition_of,
    prefix_end,
)


class ModelStore:
    """The handle and locks every part of the read model reads and writes through.

    One thread at a time writes (``_write_lock``: staging and committing a batch, a pass of
    forgetting, a set-aside); ``_db_lock`` is held only for a batch's write and a query's
    reads. ``_db`` is replaced when the model is set aside or refilled (under both locks), so
    a part reads it afresh each time and never keeps it.
    """

    _path: Path
    _db: Rdict
    _write_options: WriteOptions
    _write_lock: threading.RLock
    _db_lock: threading.Lock
    _generation: int  # grows each time the model is set aside and started again
    set_asides: int  # how many times it was (a runner stops rebuilding after a few)
    _positions: dict[int, int]  # each partition's next offset, as the last batch wrote it
    _moved: threading.Condition  # notified when positions move (a batch, a set-aside, a refill)
    _floor: dict[int, int]  # per partition, what it must reach before it answers for it
    _closed = False  # closed: a node that kept one partition's history lost the partition
    # What the store holds, kept in memory (read at open and at a refill, set by the folds):
    # a job id from before ids were scoped; any job indexed as a dependant (without one, a
    # lookup of an upstream's dependants, one a success the relay sees, reads nothing).
    _unscoped = False
    _dependants = True

    def _read_marks(self) -> None:
        """Read what the store holds of those (a get and a seek; under ``_reading``)."""
        self._unscoped = self._db.get(UNSCOPED) is not None
        self._dependants = next(iter(self._scan(DEPENDANTS, limit=1)), None) is not None

    def _clear_marks(self) -> None:
        """An empty store holds neither."""
        self._unscoped = self._dependants = False

    @property
    def path(self) -> Path:
        return self._path

    @property
    def generation(self) -> int:
        """Grows each time the model is set aside: a fold read before must not land after."""
        return self._generation

    def _forget_kept(self, *, jobs: Sequence[str] = (), runs: Sequence[str] = ()) -> None:
        """Job and run records deleted other than by a fold's batch (under ``_write_lock``):
        the fold keeps no decoded copy of them any more (:class:`~projections.model_fold.ModelFold`
        keeps them; a store without a fold keeps none)."""

    def set_aside(self, damage: StoreDamaged, generation: int | None = None) -> bool:
        """Set the damaged model aside and start empty (the store's life:
        :meth:`projections.read_model.ReadModel.set_aside`)."""
        raise NotImplementedError

    # -- positions: how far the model has folded each partition ---------------------------

    def position(self, partition: int) -> int:
        """The next event offset of ``partition`` to fold in (0 before any)."""
        with self._moved:
            return self._positions.get(partition, 0)

    def positions(self) -> dict[int, int]:
        with self._moved:
            return dict(self._positions)

    def hold_until(self, positions: dict[int, int]) -> None:
        """Until the model has folded each partition up to ``positions`` (those known to be in
        the log: its end when the node started), :meth:`refilling` names it. Only raises."""
        with self._moved:
            for p, at in positions.items():
                self._floor[p] = max(self._floor.get(p, 0), at)

    def reached_the_end(self, partition: int, at: int, generation: int) -> None:
        """A read of ``partition`` from ``at`` found nothing to read: the offsets the hold
        names past it take no record (Kafka's transaction markers take offsets: the end it
        reports is past the last event), so the hold ends there. Unless the model was set
        aside since the read (``generation``)."""
        with self._moved:
            if generation == self._generation and self._floor.get(partition, 0) > at:
                self._floor[partition] = at
                self._moved.notify_all()  # a wait for the refill to end (wait_until) is over

    def refilling(self) -> dict[int, tuple[int, int]]:
        """The partitions whose history is incomplete as far as the node knows: each with how
        far the model has folded it and how far it must (:meth:`hold_until`; a set-aside holds
        it until it is back where it was). An answer from one of them could miss what exists."""
        with self._moved:
            return {
                p: (self._positions.get(p, 0), floor)
                for p, floor in self._floor.items()
                if self._positions.get(p, 0) < floor
            }

    def lag(self, log: EventLog) -> dict[int, int]:
        """Per partition, how far the model is behind the log's end (end offset - position)."""
        return {
            p: max(0, log.end_offset("events", p) - self.position(p))
            for p in range(log.num_partitions)
        }

    def wait_for(self, partition: int, offset: int, timeout_s: float) -> bool:
        """Block until the event at ``offset`` of ``partition`` is queryable; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._moved:
            while self._positions.get(partition, 0) <= offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._moved.wait(remaining)
            return True

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Block until ``predicate()`` holds, re-checking after every batch the model writes."""
        deadline = time.monotonic() + timeout_s
        with self._moved:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._moved.wait(remaining)
            return True

    def _stored_positions(self) -> dict[int, int]:
        """The positions as the store holds them (``m/pos/``), for :meth:`positions` to start
        from when the store is opened or swapped."""
        with self._reading():
            return {partition_of(key): from_u64(value) for key, value in self._scan(POSITIONS)}

    # -- reading ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Turn what a damaged model raises into StoreDamaged."""
        try:
            yield
        except StoreDamaged:
            raise
        except (msgspec.DecodeError, msgspec.ValidationError, struct.error) as exc:
            raise StoreDamaged(f"read model {self._path}: {exc}") from exc
        except Exception as exc:
            if is_damage(exc):
                raise StoreDamaged(f"read model {self._path}: {exc}") from exc
            raise

    def _indexed(self, key: bytes) -> bytes:
        """A record an index points at: written in the same batch, so it is there."""
        value = self._db.get(key)
        if value is None:
            raise StoreDamaged(f"read model {self._path}: an index points at missing {key!r}")
        return bytes(value)

    def _stored_count(self, key: bytes) -> int:
        """A u64 counter as stored (0 where there is none)."""
        stored = self._db.get(key)
        return 0 if stored is None else from_u64(stored)

    def _scan(
        self, prefix: bytes, start: bytes | None = b"", limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key after ``prefix``, value) from ``start`` (a suffix) on, in key order; every
        block's checksum verified (StoreDamaged where one fails)."""
        options = checked_reads()
        if prefix:
            options.set_iterate_upper_bound(prefix_end(prefix))
        it: Any = self._db.iter(options)
        it.seek(prefix + (start or b""))
        n = 0
        while it.valid() and (limit is None or n < limit):
            yield it.key()[len(prefix) :], it.value()
            n += 1
            it.next()
        error = iterator_error(it)
        del it  # a live iterator keeps the model's LOCK
        if error is not None:
            raise StoreDamaged(f"read model {self._path}: {error}")


P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound=ModelStore)


def query(method: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], T]:
    """A query that finds the model damaged sets it aside and answers Unavailable; so does
    one on a model closed before or under it (its partition moved to another node)."""

    @functools.wraps(method)
    def query(model: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        generation = model.generation
        try:
            if model._closed:
                raise Unavailable(f"read model {model._path} is closed (its partition moved)")
            with model._reading():
                return method(model, *args, **kwargs)
        except StoreDamaged as damage:
            model.set_aside(damage, generation)
            raise Unavailable(
                "the history store was damaged and is being rebuilt from the log; try again"
            ) from None
        except Exception:
            if model._closed:  # closed under it
                raise Unavailable(
                    f"read model {model._path} was closed (its partition moved); try again"
                ) from None
            raise

    return query
