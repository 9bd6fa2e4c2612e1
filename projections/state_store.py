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

Durability: writes are not synced (``sync=False``, the WAL stays on). The log is the source of
truth; a power loss may drop the store's newest batches, but never splits one, so the offset
drops with them and :func:`catch_up` reads those events from the log again.

Layout (raw mode, one store directory per partition, ``<data>/state/p<N>``)::

    j/<job_id>    -> msgpack JobState
    r/<run_id>    -> msgpack RunState            deleted when the run leaves the state
    oj/<job_id>   -> u64 offset of the event that put the job in ``jobs``
    or/<run_id>   -> u64 offset of the event that put the run in ``runs``
    m/offset      -> u64 next event offset to read
    m/token       -> u64 last fencing token granted

The ``o`` keys record insertion order: a dict keeps keys in the order they were first added,
so loading sorts jobs and runs by the offset of the event that added them. That offset is a
fact of the history, not of how it was batched, which keeps invariant 4.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from core.errors import StoreDamaged
from core.events import AnyEvent, JobRegistered, RunEvent, RunMaterialised
from core.state import JobState, PartitionState, RunState, evolve, rebuild_index
from eventlog.port import EventLog
from eventlog.rocks import checked_reads, is_damage, iterator_error
from projections.aside import set_aside
from projections.decoding import EventDecoder

log = logging.getLogger(__name__)

_U64 = struct.Struct(">Q")
JOB = b"j/"
RUN = b"r/"
JOB_ORDER = b"oj/"
RUN_ORDER = b"or/"
OFFSET = b"m/offset"
TOKEN = b"m/token"

_encoder = msgspec.msgpack.Encoder()
_job_decoder = msgspec.msgpack.Decoder(JobState)
_run_decoder = msgspec.msgpack.Decoder(RunState)

Changes = dict[bytes, bytes | None]  # key -> new value, None to delete


class StateStore(Protocol):
    """One partition's canonical state and the next event offset it reflects."""

    @property
    def partition(self) -> int: ...

    def load(self) -> tuple[PartitionState, int]:
        """The stored state (``ready`` rebuilt) and the next event offset (0 when fresh)."""

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
    for job_id in jobs:
        job = state.jobs.get(job_id)
        if job is not None:  # jobs never leave the state; an unknown id changed nothing
            out[JOB + job_id.encode()] = _encoder.encode(job)
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


def build(partition: int, items: Sequence[tuple[bytes, bytes]]) -> tuple[PartitionState, int]:
    """The state and next offset from a store's key/values (any order).

    Raises StoreDamaged when the items are not what :func:`changes` writes."""
    try:
        return _build(partition, items)
    except (msgspec.DecodeError, msgspec.ValidationError, struct.error, UnicodeError) as exc:
        raise StoreDamaged(f"state store of partition {partition}: {exc}") from exc


def _build(partition: int, items: Sequence[tuple[bytes, bytes]]) -> tuple[PartitionState, int]:
    state = PartitionState(partition)
    has_offset = False
    offset = 0
    job_order: dict[bytes, int] = {}
    run_order: dict[bytes, int] = {}
    job_values: dict[bytes, bytes] = {}
    run_values: dict[bytes, bytes] = {}
    for key, value in items:
        if key.startswith(JOB):
            job_values[key[len(JOB) :]] = value
        elif key.startswith(RUN):
            run_values[key[len(RUN) :]] = value
        elif key.startswith(JOB_ORDER):
            job_order[key[len(JOB_ORDER) :]] = _U64.unpack(value)[0]
        elif key.startswith(RUN_ORDER):
            run_order[key[len(RUN_ORDER) :]] = _U64.unpack(value)[0]
        elif key == OFFSET:
            offset, has_offset = _U64.unpack(value)[0], True
        elif key == TOKEN:
            state.last_token = _U64.unpack(value)[0]
        else:
            raise StoreDamaged(f"state store of partition {partition}: unknown key {key!r}")
    _check_paired(partition, "job", job_values, job_order)
    _check_paired(partition, "run", run_values, run_order)
    if items and not has_offset:
        raise StoreDamaged(f"state store of partition {partition}: no offset among its keys")
    jobs = sorted(job_values, key=job_order.__getitem__)
    runs = sorted(run_values, key=run_order.__getitem__)
    for key in jobs:
        job = _job_decoder.decode(job_values[key])
        if job.job_id != key.decode():
            raise StoreDamaged(f"state store of partition {partition}: job {key!r} holds another")
        state.jobs[job.job_id] = job
    for key in runs:
        run = _run_decoder.decode(run_values[key])
        if run.run_id != key.decode():
            raise StoreDamaged(f"state store of partition {partition}: run {key!r} holds another")
        state.runs[run.run_id] = run
    rebuild_index(state)
    return state, offset


def _check_paired(
    partition: int, kind: str, values: dict[bytes, bytes], order: dict[bytes, int]
) -> None:
    """Every job (run) has its order key and every order key its job (run): written together."""
    if values.keys() != order.keys():
        odd = sorted(values.keys() ^ order.keys())
        raise StoreDamaged(
            f"state store of partition {partition}: {len(odd)} {kind}s without their value or "
            f"order key (first {odd[0]!r})"
        )


class MemoryStateStore:
    """The reference adapter: the same keys and values as RocksDB, in a dict."""

    def __init__(self, partition: int = 0) -> None:
        self._partition = partition
        self._data: dict[bytes, bytes] = {}

    @property
    def partition(self) -> int:
        return self._partition

    def load(self) -> tuple[PartitionState, int]:
        return build(self._partition, list(self._data.items()))

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
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_paranoid_checks(True)
        try:
            return Rdict(str(self._path), options=options)
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
        return build(self._partition, self.dump())

    def durable_offset(self) -> int:
        # Saves are not synced (module docstring): sync the WAL, so what is read here
        # survives a power loss too.
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
        it: Any = self._db.iter(checked_reads())
        it.seek_to_first()
        items: list[tuple[bytes, bytes]] = []
        while it.valid():
            items.append((it.key(), it.value()))
            it.next()
        error = iterator_error(it)
        del it  # a live iterator keeps the store's LOCK
        if error is not None:
            raise StoreDamaged(
                f"state store of partition {self._partition} ({self._path}): {error}"
            )
        return items

    def set_aside(self) -> str:
        self._db.close()
        aside = set_aside(self._path)
        self._db = self._open_db()
        return str(aside)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RocksStateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def catch_up(
    store: StateStore,
    log_: EventLog,
    partition: int,
    batch_size: int = 1000,
    decoder: EventDecoder | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> PartitionState:
    """Load the partition's state and fold in every event the store has not seen yet.

    A new owner runs this before deciding anything: it reads from the stored offset to the end
    of the partition's events, ``evolve``s each batch and saves it with its offsets. Records
    that are not events are reported through ``decoder`` and passed over (the stored offset
    moves past them). A damaged store is set aside and rebuilt from offset 0. ``on_batch`` is
    told how many records each batch read (a tool's progress).
    """
    if store.partition != partition:
        raise ValueError(f"store of partition {store.partition} asked to catch up {partition}")
    decoder = decoder or EventDecoder("recovery")
    try:
        state, offset = store.load()
    except StoreDamaged as damage:
        aside = store.set_aside()
        log.error("%s; set aside as %s, rebuilding it from the log", damage, aside)
        state, offset = store.load()
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
