"""A partition's state on local disk, and the catch-up a new partition owner runs.

The port, :class:`StateStore`, keeps one partition's canonical state (``jobs``, ``runs``,
``last_token``) together with the next event offset it reflects. Invariants every adapter keeps:

1. **State and offset agree.** ``save`` writes the changed jobs and runs, ``last_token`` and the
   next offset in one atomic unit (RocksDB: one ``WriteBatch``), so after a crash the store holds
   the state of exactly the events before its offset.
2. **Incremental.** An event changes at most its job and its run, so ``save`` rewrites only the
   jobs and runs the saved events name; a batch costs what it touched, not the partition's size.
3. **Loading is the live state.** ``load()`` gives a state whose :meth:`PartitionState.snapshot`
   equals the live owner's, in the same dict order (``decide`` and the timers iterate ``runs``).
4. **Batching does not show.** Saving the same events in any batches stores the same bytes, so a
   store rebuilt from offset 0 is byte-identical to one saved along the way (:meth:`dump`).
5. **Damage is found, never served.** ``load`` and ``dump`` raise
   :class:`core.errors.StoreDamaged` for anything the store did not write as it stands: a
   RocksDB checksum that fails, a value that does not decode, a job or run without its order
   key, keys without an offset. :func:`catch_up` then sets the store aside
   (:meth:`StateStore.set_aside`: renamed, never deleted, for whoever looks into why) and
   rebuilds it from offset 0 of the log, saying so in the log. A store RocksDB refuses to open
   is set aside the same way by :meth:`RocksStateStore.open`.
6. **Earlier formats are read, and rewritten.** A job stored by a build before snapshot format 2
   (its definition a map in place: ``core.state.JobStateV1``) loads as the same job; ``load``
   rewrites it as this build stores it (its definition held encoded: ``core.state.hold_spec``),
   so an upgraded store holds what a store rebuilt from the log holds (invariant 4), and later
   loads take the fast path. A snapshot of the earlier format is converted as it is restored.

Durability: writes are not synced (``sync=False``, the WAL stays on). The log is the source of
truth; a power loss may drop the store's newest batches, but never splits one, so the offset
drops with them and :func:`catch_up` reads those events from the log again.

Layout (raw mode, one store directory per partition, ``<data>/state/p<N>``)::

    j/<job_id>    -> msgpack JobState (its definition a bin: core.state.hold_spec)
    r/<run_id>    -> msgpack RunState            deleted when the run leaves the state
                                                 (j/ and oj/ too, when the job does)
    oj/<job_id>   -> u64 offset of the event that put the job in ``jobs``
    or/<run_id>   -> u64 offset of the event that put the run in ``runs``
    m/offset      -> u64 next event offset to read
    m/token       -> u64 last fencing token granted

The ``o`` keys record insertion order: a dict keeps keys in the order they were first added,
so loading sorts jobs and runs by the offset of the event that added them. That offset is a
fact of the history, not of how it was batched, which keeps invariant 4.
"""

from __future__ import annotations

import itertools
import logging
import operator
import struct
import threading
import traceback
from array import array
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from core.errors import StoreDamaged
from core.events import AnyEvent, JobForgotten, JobRegistered, RunEvent, RunMaterialised
from core.state import (
    JobState,
    JobStateV1,
    PartitionState,
    RunState,
    compact_job,
    evolve,
    rebuild_index,
    upgrade_job,
)
from eventlog.port import EventLog
from eventlog.rocks import (
    bounded,
    checked_reads,
    close_store,
    is_damage,
    iterator_error,
    open_store,
    scan_reads,
)
from eventlog.snapshots import SnapshotStore, StoredSnapshot
from projections.aside import set_aside
from projections.decoding import EventDecoder
from projections.snapshot import SnapshotUnusable, decode

log = logging.getLogger(__name__)

_U64 = struct.Struct(">Q")
KEPT_SNAPSHOTS_TRIED = 8  # a store keeps a few; the bound only guards the loop
VIEW_WAIT_S = 60.0  # how long closing a store waits for a snapshot's read of it
REWRITE_BATCH = 10_000  # jobs of an earlier format rewritten per write at a load
JOB = b"j/"
RUN = b"r/"
JOB_ORDER = b"oj/"
RUN_ORDER = b"or/"
OFFSET = b"m/offset"
TOKEN = b"m/token"

_encoder = msgspec.msgpack.Encoder()
_job_decoder = msgspec.msgpack.Decoder(JobState)
_job_v1_decoder = msgspec.msgpack.Decoder(JobStateV1)
_run_decoder = msgspec.msgpack.Decoder(RunState)

Changes = dict[bytes, bytes | None]  # key -> new value, None to delete


class StateStore(Protocol):
    """One partition's canonical state and the next event offset it reflects."""

    @property
    def partition(self) -> int: ...

    def load(self) -> tuple[PartitionState, int]:
        """The stored state (``ready`` rebuilt) and the next event offset (0 when fresh). Jobs
        an earlier build stored in its format are rewritten in this build's (invariant 6)."""

    def save(
        self,
        state: PartitionState,
        events: Sequence[tuple[int, AnyEvent]],
        *,
        through: int | None = None,
    ) -> None:
        """Record ``state`` as it stands after ``events`` (offset, event), oldest first, all of
        them already folded in with ``evolve``. Atomic; a no-op for no events and no
        ``through``. ``through``, when past the last event, is the next offset to read (the
        records between were foreign: ``projections.decoding``)."""

    def dump(self) -> list[tuple[bytes, bytes]]:
        """Every stored key and value in key order: equal histories give equal dumps."""

    def offset(self) -> int:
        """The next event offset the store reflects (0 when fresh), without loading it."""

    def view(self) -> StoreView:
        """A point-in-time view of every key and value, to be read on another thread while
        this one goes on saving. Cheap to take; :meth:`close` waits for open views."""

    def replace(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Make the store hold exactly ``items`` (a snapshot's, as :meth:`view` gave them):
        atomic, so a crash leaves the old contents or the new."""

    def durable_offset(self) -> int:
        """The next event offset the store would load after a crash, made so now (what it
        holds is forced to disk first): retention may prune the log below it, never above.
        Safe to call from another thread than the one saving."""

    def set_aside(self) -> str:
        """Put the stored data out of the way (a damaged store) and start empty; returns where
        the old data went."""

    def close(self) -> None: ...


def changes(
    state: PartitionState, events: Sequence[tuple[int, AnyEvent]], through: int | None = None
) -> Changes:
    """What saving ``events`` writes: each named job and run as it stands now, and the meta keys."""
    out: Changes = {}
    if not events:
        if through is not None:
            out[OFFSET] = _U64.pack(through)
        return out
    jobs: set[str] = set()
    runs: set[str] = set()
    for offset, event in events:
        jobs.add(event.job_id)
        if isinstance(event, JobRegistered):
            out[JOB_ORDER + event.job_id.encode()] = _U64.pack(offset)
        if isinstance(event, RunEvent):
            runs.add(event.run_id)
            if isinstance(event, RunMaterialised):
                out[RUN_ORDER + event.run_id.encode()] = _U64.pack(offset)
        elif isinstance(event, JobForgotten):
            runs.update(event.runs)
    for job_id in jobs:
        job = state.jobs.get(job_id)
        key = job_id.encode()
        if job is None:  # forgotten (an event names only jobs the state held)
            out[JOB + key] = None
            out[JOB_ORDER + key] = None
        else:
            out[JOB + key] = _encoder.encode(job)
    for run_id in runs:
        run = state.runs.get(run_id)
        key = run_id.encode()
        if run is None:
            out[RUN + key] = None
            out[RUN_ORDER + key] = None
        else:
            out[RUN + key] = _encoder.encode(run)
    out[TOKEN] = _U64.pack(state.last_token)
    out[OFFSET] = _U64.pack(max(events[-1][0] + 1, through or 0))
    return out


def build(
    partition: int,
    items: Iterable[tuple[bytes, bytes]],
    upgraded: Callable[[bytes, bytes], None] | None = None,
) -> tuple[PartitionState, int]:
    """The state and next offset from a store's key/values, in key order (as a store's scan, a
    view and a snapshot give them).

    ``items`` may be a stream: each job and run is decoded as it comes, so no more than one
    stored value is held as bytes at a time (a recovery's peak memory is the state's, not
    twice it). A job stored as a build before snapshot format 2 stored it
    (``core.state.JobStateV1``) is converted, and ``upgraded``, when given, is told its key and
    value as this build writes them. Raises StoreDamaged when the items are not what
    :func:`changes` writes (or an earlier build wrote), or not in key order."""
    state, offset, _ = _built(partition, items, upgraded)
    return state, offset


def _built(
    partition: int,
    items: Iterable[tuple[bytes, bytes]],
    upgraded: Callable[[bytes, bytes], None] | None,
) -> tuple[PartitionState, int, bytes | None]:
    """:func:`build`'s state and offset, and the last key of ``items`` (None if none)."""
    try:
        return _build(partition, items, upgraded)
    except (msgspec.DecodeError, msgspec.ValidationError, struct.error, UnicodeError) as exc:
        raise StoreDamaged(f"state store of partition {partition}: {exc}") from exc


def _build(
    partition: int,
    items: Iterable[tuple[bytes, bytes]],
    upgraded: Callable[[bytes, bytes], None] | None,
) -> tuple[PartitionState, int, bytes | None]:
    # In key order a job's order key ("oj/<id>") comes after every job ("j/<id>"), and the
    # order keys come in the same order of ids as the jobs: the n-th order key is the n-th
    # job's. So the jobs are paired with their order by position, and nothing per job is held
    # beside the jobs themselves until they are sorted (a million keys and offsets held to the
    # end would be allocated between the jobs' own objects, and keep their memory from being
    # given back). Runs ("or/" before "r/") are few: paired by id.
    #
    # Run once per key of a recovery, two million times for a million jobs: the jobs (the
    # first keys) and their order keys (after the two meta keys) each have a loop of their own
    # that asks one question a key, the decoders and methods are locals, and the loops' own
    # variable ``key`` is the last key read when they end (a store's scan checks it stopped at
    # the end of its data, not at a damaged block: :meth:`RocksStateStore.load`).
    state = PartitionState(partition)
    has_offset = False
    offset = 0
    jobs: list[JobState] = []
    job_order = array("q")
    run_order: dict[bytes, int] = {}
    runs: dict[bytes, RunState] = {}
    key: bytes | None = None
    decode_job, unpack, add_job = _job_decoder.decode, _U64.unpack, jobs.append
    add_order = job_order.append
    pairs = iter(items)
    pending: tuple[bytes, bytes] | None = None
    for key, value in pairs:
        if not key.startswith(JOB):
            pending = key, value
            break
        try:
            job = compact_job(decode_job(value))
        except msgspec.ValidationError:  # stored by an earlier build, or damaged
            job = _upgraded(key, value, upgraded)
        if job.job_id.encode() != key[2:]:  # len(JOB)
            raise StoreDamaged(f"state store of partition {partition}: job {key!r} holds another")
        add_job(job)
    while pending is not None:
        first, pending = pending, None
        key, value = first
        if key.startswith(JOB_ORDER):
            n = len(job_order)
            count = len(jobs)
            for key, value in itertools.chain((first,), pairs):
                if not key.startswith(JOB_ORDER):
                    pending = key, value
                    break
                if n == count or jobs[n].job_id.encode() != key[3:]:  # len(JOB_ORDER)
                    raise StoreDamaged(
                        f"state store of partition {partition}: jobs without their value or"
                        f" order key (order key {key!r} is not the next job's)"
                    )
                add_order(unpack(value)[0])
                n += 1
            continue
        if key.startswith(JOB):  # the jobs' keys sort first: the first loop read them all
            raise StoreDamaged(
                f"state store of partition {partition}: job {key!r} out of key order"
            )
        if key.startswith(RUN):
            run = _run_decoder.decode(value)
            if run.run_id.encode() != key[len(RUN) :]:
                raise StoreDamaged(
                    f"state store of partition {partition}: run {key!r} holds another"
                )
            runs[key[len(RUN) :]] = run
        elif key.startswith(RUN_ORDER):
            run_order[key[len(RUN_ORDER) :]] = unpack(value)[0]
        elif key == OFFSET:
            offset, has_offset = unpack(value)[0], True
        elif key == TOKEN:
            state.last_token = unpack(value)[0]
        else:
            raise StoreDamaged(f"state store of partition {partition}: unknown key {key!r}")
        pending = next(pairs, None)
    if len(job_order) != len(jobs):
        raise StoreDamaged(
            f"state store of partition {partition}: {len(jobs) - len(job_order)} jobs without"
            f" their value or order key (first {jobs[len(job_order)].job_id!r})"
        )
    _check_paired(partition, "run", runs, run_order)
    if key is not None and not has_offset:
        raise StoreDamaged(f"state store of partition {partition}: no offset among its keys")
    state.jobs = {job.job_id: job for job in map(jobs.__getitem__, _order(job_order))}
    del jobs, job_order
    for run_key in sorted(runs, key=run_order.__getitem__):
        run = runs[run_key]
        state.runs[run.run_id] = run
    rebuild_index(state)
    return state, offset, key


def _upgraded(
    key: bytes, value: bytes, upgraded: Callable[[bytes, bytes], None] | None
) -> JobState:
    """A job an earlier build stored (``core.state.JobStateV1``), as this build holds it;
    ``upgraded`` is told its key and value as this build writes them."""
    job = upgrade_job(_job_v1_decoder.decode(value))
    if upgraded is not None:
        upgraded(key, _encoder.encode(job))
    return job


def _order(offsets: array[int]) -> Iterable[int]:
    """The positions of ``offsets`` in the order of their values: the order the jobs were
    added to the partition in. Most often it is their key order already (ids registered in
    order), which is checked in C and costs no sort."""
    n = len(offsets)
    if n < 2 or all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
        return range(n)
    return sorted(range(n), key=offsets.__getitem__)


def _check_paired(
    partition: int, kind: str, values: dict[bytes, Any], order: dict[bytes, int]
) -> None:
    """Every run has its order key and every order key its run: written together."""
    if values.keys() != order.keys():
        odd = sorted(values.keys() ^ order.keys())
        raise StoreDamaged(
            f"state store of partition {partition}: {len(odd)} {kind}s without their value or "
            f"order key (first {odd[0]!r})"
        )


class StoreView(Protocol):
    @property
    def offset(self) -> int:
        """The next event offset the viewed state reflects."""

    def items(self) -> list[tuple[bytes, bytes]]:
        """Every key and value as of the view, in key order; StoreDamaged if unreadable."""

    def close(self) -> None:
        """Let the view go (a RocksDB snapshot holds the store open until then)."""


class _ListView:
    def __init__(self, items: list[tuple[bytes, bytes]]) -> None:
        self._items = items
        self.offset = next((_U64.unpack(v)[0] for k, v in items if k == OFFSET), 0)

    def items(self) -> list[tuple[bytes, bytes]]:
        return self._items

    def close(self) -> None:
        pass


class MemoryStateStore:
    """The reference adapter: the same keys and values as RocksDB, in a dict."""

    def __init__(self, partition: int = 0) -> None:
        self._partition = partition
        self._data: dict[bytes, bytes] = {}

    @property
    def partition(self) -> int:
        return self._partition

    def load(self) -> tuple[PartitionState, int]:
        return build(self._partition, sorted(self._data.items()), self._data.__setitem__)

    def save(
        self,
        state: PartitionState,
        events: Sequence[tuple[int, AnyEvent]],
        *,
        through: int | None = None,
    ) -> None:
        for key, value in changes(state, events, through).items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value

    def dump(self) -> list[tuple[bytes, bytes]]:
        return sorted(self._data.items())

    def offset(self) -> int:
        stored = self._data.get(OFFSET)
        return 0 if stored is None else _U64.unpack(stored)[0]

    def view(self) -> StoreView:
        return _ListView(self.dump())

    def replace(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        self._data = dict(items)

    def durable_offset(self) -> int:
        stored = self._data.get(OFFSET)
        return 0 if stored is None else int(_U64.unpack(stored)[0])

    def set_aside(self) -> str:
        self.aside = dict(self._data)  # what a test may look at
        self._data = {}
        return "memory"

    def close(self) -> None:
        pass


class RocksStateStore:
    """A partition's state in its own RocksDB (rocksdict, raw mode). Single-threaded use."""

    def __init__(self, path: str | Path, partition: int) -> None:
        """Open (creating) the store at ``path``; StoreDamaged if RocksDB finds it damaged."""
        self._partition = partition
        self._path = Path(path)
        self._write = WriteOptions()
        self._write.sync = False  # see the module docstring: the log re-supplies a lost tail
        self._db = self._open_db()
        self._views = 0  # open RocksDB snapshots: each keeps the store's LOCK while it lives
        self._views_closed = threading.Condition()
        # durable_offset is asked from another thread (retention's); closing the store under it
        # was refused by rocksdict ("Already borrowed": its WAL sync holds the database) and
        # left the store open. One waits for the other.
        self._closing = threading.Lock()

    @classmethod
    def open(cls, data_dir: str | Path, partition: int) -> RocksStateStore:
        """The store of ``partition`` under a node's data directory: ``<data>/state/p<N>``.

        A store RocksDB refuses to open as damaged is set aside and a new one started; the
        partition's runner rebuilds it from the log (``catch_up``)."""
        path = Path(data_dir) / "state" / f"p{partition}"
        try:
            return cls(path, partition)
        except StoreDamaged as damage:
            aside = set_aside(path)
            log.error("%s; set aside as %s, rebuilding it from the log", damage, aside)
            return cls(path, partition)

    def _open_db(self) -> Rdict:
        self._path.mkdir(mode=0o700, parents=True, exist_ok=True)
        options = bounded(Options(raw_mode=True))
        options.create_if_missing(True)
        options.set_paranoid_checks(True)
        try:
            return open_store(self, self._path, options=options)
        except Exception as exc:
            if is_damage(exc):
                raise StoreDamaged(
                    f"state store of partition {self._partition} ({self._path}): {exc}"
                ) from exc
            raise

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> tuple[PartitionState, int]:
        rewriting = _Rewrite(self._db, self._write)
        # rocksdict's own pairs, read straight by the build (no generator between: a tenth of
        # a recovery), and checked after it as :meth:`_scan` checks them.
        pairs: Any = self._db.items(read_opt=scan_reads())
        try:
            state, offset, last = _built(self._partition, pairs, rewriting.put)
        except BaseException as exc:
            # A live iterator keeps the store's LOCK (set aside next), and the failed build's
            # frames hold this one: let them go.
            pairs = None
            _clear_frames(exc)
            if isinstance(exc, StoreDamaged):
                for _ in self._scan(scan_reads()):  # a damaged block says so first
                    pass
            raise
        pairs = None
        self._check_scan_ended(last)
        if rewriting.flush():
            log.info(
                "state store of partition %d: %d jobs stored by an earlier build rewritten",
                self._partition,
                rewriting.count,
            )
        return state, offset

    def durable_offset(self) -> int:
        # Saves are not synced (module docstring): sync the WAL, so what is read here
        # survives a power loss too.
        with self._closing:
            self._db.flush_wal(True)
            stored = self._db.get(OFFSET)
        return 0 if stored is None else int(_U64.unpack(stored)[0])

    def save(
        self,
        state: PartitionState,
        events: Sequence[tuple[int, AnyEvent]],
        *,
        through: int | None = None,
    ) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in changes(state, events, through).items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if not batch.is_empty():
            self._db.write(batch, self._write)

    def dump(self) -> list[tuple[bytes, bytes]]:
        """Every key and value, each block's checksum verified; StoreDamaged if one fails
        (rocksdict's own ``items()`` would just stop there, as if the store ended)."""
        return list(self._scan(checked_reads()))

    def _scan(self, options: Any) -> Generator[tuple[bytes, bytes], None, None]:
        """Every key and value in key order; StoreDamaged at the end if a block failed.

        The pairs come from rocksdict's own ``items()`` (its loop runs in Rust: a fifth of a
        scan's time less than four Python calls a key), which ends where its iterator stops,
        at the end of the data or at a block that failed its checksum, without saying which.
        So an iterator placed just past the last key it gave tells: at the end of the data it
        is not valid and has no error."""
        last: bytes | None = None
        pairs: Any = self._db.items(read_opt=options)
        try:
            for last, value in pairs:
                yield last, value
        finally:
            del pairs  # a live iterator keeps the store's LOCK
        self._check_scan_ended(last, options)

    def _check_scan_ended(self, last: bytes | None, options: Any = None) -> None:
        """StoreDamaged unless a scan that gave ``last`` as its last key (None: no key) ended at
        the end of the data, rather than at a block that failed its checksum."""
        it: Any = self._db.iter(options if options is not None else scan_reads())
        try:
            if last is None:
                it.seek_to_first()
            else:
                it.seek(last)
                if it.valid() and it.key() == last:
                    it.next()
            error = iterator_error(it)
            if error is None and it.valid():
                error = RuntimeError(f"the scan stopped before {it.key()!r}")
        finally:
            del it
        if error is not None:
            raise StoreDamaged(
                f"state store of partition {self._partition} ({self._path}): {error}"
            )

    def offset(self) -> int:
        stored = self._db.get(OFFSET)
        return 0 if stored is None else _U64.unpack(stored)[0]

    def view(self) -> StoreView:
        with self._views_closed:
            self._views += 1
        try:
            return _RocksView(self, self._db.snapshot())
        except BaseException:
            self._view_closed()
            raise

    def replace(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(b"\x00", b"\xff")  # every key the layout has starts below 0xff
        for key, value in items:
            batch.put(key, value)
        self._db.write(batch, self._write)

    def _view_closed(self) -> None:
        with self._views_closed:
            self._views -= 1
            self._views_closed.notify_all()

    def set_aside(self) -> str:
        self._wait_for_views()
        with self._closing:
            close_store(self._db)
            aside = set_aside(self._path)
            self._db = self._open_db()
        return str(aside)

    def close(self) -> None:
        self._wait_for_views()
        with self._closing:
            close_store(self._db)

    def _wait_for_views(self) -> None:
        with self._views_closed:
            if not self._views_closed.wait_for(lambda: self._views == 0, VIEW_WAIT_S):
                log.error(
                    "state store of partition %d: %d views still open after %.0f s; closing"
                    " anyway (the store stays locked until they end)",
                    self._partition,
                    self._views,
                    VIEW_WAIT_S,
                )

    def __enter__(self) -> RocksStateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _clear_frames(exc: BaseException | None) -> None:
    """Let the finished frames of ``exc``'s traceback, and of its causes', drop their locals."""
    while exc is not None:
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


class _Rewrite:
    """Jobs an earlier build stored, written again as this build stores them, a batch of
    ``REWRITE_BATCH`` at a time (an upgrade of a million jobs holds one batch, not all). Each is
    the same job at the same offset, so any of them written without the rest is consistent."""

    def __init__(self, db: Rdict, write: WriteOptions) -> None:
        self._db, self._write = db, write
        self._batch = WriteBatch(raw_mode=True)
        self.count = 0

    def put(self, key: bytes, value: bytes) -> None:
        self._batch.put(key, value)
        self.count += 1
        if self.count % REWRITE_BATCH == 0:
            self.flush()

    def flush(self) -> int:
        """Write what is pending; how many were rewritten in all."""
        if not self._batch.is_empty():
            self._db.write(self._batch, self._write)
            self._batch = WriteBatch(raw_mode=True)
        return self.count


class _RocksView:
    """A RocksDB snapshot of a state store, read once on another thread."""

    def __init__(self, store: RocksStateStore, snapshot: Any) -> None:
        self._store: RocksStateStore | None = store
        self._snapshot: Any = snapshot
        self.offset = 0  # known once read

    def items(self) -> list[tuple[bytes, bytes]]:
        if self._snapshot is None:
            raise ValueError("the view is closed")
        it: Any = self._snapshot.iter(checked_reads())
        it.seek_to_first()
        items: list[tuple[bytes, bytes]] = []
        while it.valid():
            items.append((it.key(), it.value()))
            it.next()
        error = iterator_error(it)
        del it
        if error is not None:
            partition = self._store.partition if self._store is not None else -1
            raise StoreDamaged(f"state store of partition {partition}: {error}")
        for key, value in items:
            if key == OFFSET:
                self.offset = _U64.unpack(value)[0]
        return items

    def close(self) -> None:
        store, self._store = self._store, None
        self._snapshot = None  # the last reference: RocksDB releases the snapshot
        if store is not None:
            store._view_closed()


def catch_up(
    store: StateStore,
    log_: EventLog,
    partition: int,
    batch_size: int = 1000,
    decoder: EventDecoder | None = None,
    on_batch: Callable[[int], None] | None = None,
    snapshots: SnapshotStore | None = None,
    on_restored: Callable[[int], None] | None = None,
    on_unusable: Callable[[Exception], None] | None = None,
    loaded: tuple[PartitionState, int] | None = None,
) -> PartitionState:
    """Load the partition's state and fold in every event the store has not seen yet.

    A new owner runs this before deciding anything. With ``snapshots``, a snapshot newer than
    the store (a store that is empty, or older) is restored first: its key/values replace the
    store's and only the events from its offset on are read (``on_restored`` is told that
    offset). A snapshot that cannot be restored is logged, reported to ``on_unusable`` and
    passed over: the store and the log still hold everything. Then it reads from the stored
    offset to the end of the partition's events, ``evolve``s each batch and saves it with its
    offsets. Records that are not events are reported through ``decoder`` and passed over (the
    stored offset moves past them). A damaged store is set aside and rebuilt (from the newest
    snapshot, or offset 0). ``on_batch`` is told how many records each batch read (a tool's
    progress). ``loaded`` is the store's state and offset when the caller holds them already
    (a warm standby's): nothing is loaded or restored then, only the events after it are read.
    """
    if store.partition != partition:
        raise ValueError(f"store of partition {store.partition} asked to catch up {partition}")
    decoder = decoder or EventDecoder("recovery")
    restored = loaded or _restore_newer(store, partition, snapshots, on_unusable)
    if loaded is not None:
        state, offset = loaded
    elif restored is not None:
        state, offset = restored
        if on_restored is not None:
            on_restored(offset)
    else:
        try:
            state, offset = store.load()
        except StoreDamaged as damage:
            aside = store.set_aside()
            log.error("%s; set aside as %s, rebuilding it from the log", damage, aside)
            restored = _restore_newer(store, partition, snapshots, on_unusable)
            state, offset = restored if restored is not None else store.load()
    while True:
        records = log_.read_events(partition, offset, batch_size)
        if not records:
            return state
        batch = decoder.decode_all(records)
        for _, event in batch:
            evolve(state, event)
        offset = records[-1].offset + 1
        store.save(state, batch, through=offset)
        if on_batch is not None:
            on_batch(len(records))


def _restore_newer(
    store: StateStore,
    partition: int,
    snapshots: SnapshotStore | None,
    on_unusable: Callable[[Exception], None] | None,
) -> tuple[PartitionState, int] | None:
    """The newest restorable snapshot's state and offset, written into ``store``, if it is
    newer than what the store holds; None otherwise (nothing changed). A snapshot that cannot
    be restored is reported, and the one before it (where the store keeps one) tried next."""
    if snapshots is None:
        return None
    try:
        local = store.offset()
    except Exception as exc:  # the store's own damage is found by load, after this
        log.warning("state store of partition %d: offset unreadable: %r", partition, exc)
        local = -1
    stored = _newest(snapshots, partition, on_unusable)
    for _ in range(KEPT_SNAPSHOTS_TRIED):
        if stored is None or stored.offset <= local:
            return None
        upgraded: dict[bytes, bytes] = {}
        try:
            snapshot = decode(stored.data, partition)
            state, offset = build(partition, snapshot.items, upgraded.__setitem__)
            if offset != snapshot.offset or offset != stored.offset:
                raise SnapshotUnusable(
                    f"snapshot of partition {partition} stored at offset {stored.offset} holds"
                    f" a state at offset {offset}"
                )
        except Exception as exc:
            log.error(
                "partition %d: the snapshot at offset %d cannot be restored (%s); trying an"
                " older one, else the state store and the log",
                partition,
                stored.offset,
                exc,
            )
            if on_unusable is not None:
                on_unusable(exc)
            stored = _older(snapshots, partition, stored.offset, on_unusable)
            continue
        items = snapshot.items
        if upgraded:  # an earlier build's: its jobs as this build stores them
            items = [(key, upgraded.get(key, value)) for key, value in items]
        store.replace(items)
        log.info(
            "partition %d: restored the snapshot at offset %d (%d jobs, %d runs); the store"
            " was at %d",
            partition,
            offset,
            len(state.jobs),
            len(state.runs),
            local,
        )
        return state, offset
    return None


def _newest(
    snapshots: SnapshotStore, partition: int, on_unusable: Callable[[Exception], None] | None
) -> StoredSnapshot | None:
    try:
        return snapshots.latest(partition)
    except Exception as exc:  # the snapshots cannot be read: the store and the log still can
        log.error("partition %d: snapshots unreadable (%s)", partition, exc)
        if on_unusable is not None:
            on_unusable(exc)
        return None


def _older(
    snapshots: SnapshotStore,
    partition: int,
    below: int,
    on_unusable: Callable[[Exception], None] | None,
) -> StoredSnapshot | None:
    try:
        return snapshots.older(partition, below)
    except Exception as exc:
        log.error("partition %d: older snapshots unreadable (%s)", partition, exc)
        if on_unusable is not None:
            on_unusable(exc)
        return None
