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

import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import msgspec
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from core.events import AnyEvent, JobRegistered, RunEvent, RunMaterialised, decode
from core.state import JobState, PartitionState, RunState, evolve, rebuild_index
from eventlog.port import EventLog

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

    def save(self, state: PartitionState, events: Sequence[tuple[int, AnyEvent]]) -> None:
        """Record ``state`` as it stands after ``events`` (offset, event), oldest first, all of
        them already folded in with ``evolve``. Atomic; a no-op for no events."""

    def dump(self) -> list[tuple[bytes, bytes]]:
        """Every stored key and value in key order: equal histories give equal dumps."""

    def close(self) -> None: ...


def changes(state: PartitionState, events: Sequence[tuple[int, AnyEvent]]) -> Changes:
    """What saving ``events`` writes: each named job and run as it stands now, and the meta keys."""
    out: Changes = {}
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
    out[OFFSET] = _U64.pack(events[-1][0] + 1)
    return out


def build(partition: int, items: Sequence[tuple[bytes, bytes]]) -> tuple[PartitionState, int]:
    """The state and next offset from a store's key/values (any order)."""
    state = PartitionState(partition)
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
            offset = _U64.unpack(value)[0]
        elif key == TOKEN:
            state.last_token = _U64.unpack(value)[0]
    jobs = sorted(job_values, key=job_order.__getitem__)
    runs = sorted(run_values, key=run_order.__getitem__)
    for key in jobs:
        job = _job_decoder.decode(job_values[key])
        state.jobs[job.job_id] = job
    for key in runs:
        run = _run_decoder.decode(run_values[key])
        state.runs[run.run_id] = run
    rebuild_index(state)
    return state, offset


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

    def save(self, state: PartitionState, events: Sequence[tuple[int, AnyEvent]]) -> None:
        if not events:
            return
        for key, value in changes(state, events).items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value

    def dump(self) -> list[tuple[bytes, bytes]]:
        return sorted(self._data.items())

    def close(self) -> None:
        pass


class RocksStateStore:
    """A partition's state in its own RocksDB (rocksdict, raw mode). Single-threaded use."""

    def __init__(self, path: str | Path, partition: int) -> None:
        self._partition = partition
        self._path = Path(path)
        self._path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(self._path), options=options)
        self._write = WriteOptions()
        self._write.sync = False  # see the module docstring: the log re-supplies a lost tail

    @classmethod
    def open(cls, data_dir: str | Path, partition: int) -> RocksStateStore:
        """The store of ``partition`` under a node's data directory: ``<data>/state/p<N>``."""
        return cls(Path(data_dir) / "state" / f"p{partition}", partition)

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> tuple[PartitionState, int]:
        return build(self._partition, self.dump())

    def save(self, state: PartitionState, events: Sequence[tuple[int, AnyEvent]]) -> None:
        if not events:
            return
        batch = WriteBatch(raw_mode=True)
        for key, value in changes(state, events).items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch, self._write)

    def dump(self) -> list[tuple[bytes, bytes]]:
        items: Iterable[tuple[bytes, bytes]] = self._db.items()  # type: ignore[assignment]
        return list(items)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RocksStateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def catch_up(
    store: StateStore, log: EventLog, partition: int, batch_size: int = 1000
) -> PartitionState:
    """Load the partition's state and fold in every event the store has not seen yet.

    A new owner runs this before deciding anything: it reads from the stored offset to the end
    of the partition's events, ``evolve``s each batch and saves it with its offsets.
    """
    if store.partition != partition:
        raise ValueError(f"store of partition {store.partition} asked to catch up {partition}")
    state, offset = store.load()
    while True:
        records = log.read_events(partition, offset, batch_size)
        if not records:
            return state
        batch = [(record.offset, decode(record.value)) for record in records]
        for _, event in batch:
            evolve(state, event)
        store.save(state, batch)
        offset = records[-1].offset + 1
