"""The read model: every partition's events folded into queryable history, in RocksDB.

The partition state keeps only what deciding needs (finished runs leave it); the read model keeps
every job, run, attempt and skipped slot, and the indexes the API lists them by. Every query is
scoped to a tenant: another tenant's ids are simply not found.

Feeding it: :meth:`ReadModel.process` is the one entry point, ``process(event, partition,
offset)``. Inside ``with model.batch():`` changes are staged and written, with the next offset
of every partition they came from, in one ``WriteBatch`` when the block ends; outside a batch
each call is its own batch. So a crash loses whole batches and their positions together, and
:class:`ReadModelRunner` resumes each partition from its recorded position: every event is
folded in exactly once. Writes are not synced (``sync=False``, WAL on): the log re-supplies a
lost tail.

Layout (raw mode; ``inv(t)`` is ``2**64 - 1 - t`` as a big-endian u64, so a forward scan is
newest first)::

    j/<job_id>                                -> msgpack _JobRecord (the JobView and counters)
    tj/<tenant>/<job_id>                      -> ""   jobs of a tenant, by job id (not deleted)
    tjs/<tenant>/<status>/<job_id>            -> ""   the same, by status (deleted ones too)
    tt/<tenant>/<tag>/<job_id>                -> ""   the same, by tag (a tag has no "/"; not
                                                      deleted)
    jf/<ended_at:u64><job_id>                 -> ""   jobs their partition forgot, by when they
                                                      ended: what forget_jobs looks at
    r/<run_id>                                -> msgpack RunView (with every attempt)
    jr/<job_id>/<inv(scheduled_for)><run_id>  -> ""   runs of a job, newest slot first
    jk/<job_id>/<idempotency_key>             -> run_id   the run a keyed manual trigger made
    rs/<tenant>/<state>/<inv(scheduled_for)><run_id>  -> ""  runs by state (the dead letters)
    c/<tenant>/<state>                        -> u64  runs by state the model holds (after the
                                                      history window: forget_runs)
    cj/<tenant>                               -> u64  jobs not cancelled (the jobs quota)
    sk/<job_id>/<inv(offset)>                 -> msgpack SkipView, newest first
    tf/<tenant>/<minute:u64>                  -> msgpack figures.Minute (projections/figures.py)
    tfp/<tenant>                              -> u64  figures before this minute are deleted
    m/pos/<partition:u32>                     -> u64  next event offset of the partition
    m/job-counts                              -> ""   the cj/ counters are kept (a model
                                                      written before them counts once on open)
    m/unlisted-cancelled                      -> ""   deleted jobs are out of tj/ and tt/ (a
                                                      model written before takes them out once)

**Jobs leave too.** A deleted (cancelled) job leaves the listings by id and by tag at once and
stays readable (and listed by ``status=cancelled``). Once its partition has forgotten a job
(``JobForgotten``, a retention after it ended), it ended before the history window's start,
and none of its runs or skipped-slot records is held any more (they leave with the window; a
dead run holds its job), the hot window removes the job's record and every index key naming
it (:meth:`ReadModel.forget_jobs`), so a model fed one-shots by the million holds only those
of the window.

A run materialised ahead of its slot (the lead time) shows as ``pending`` with its
``scheduled_for`` until it starts; one withdrawn before its slot (``RunCancelled``,
``reason=withdrawn``: the job was paused or its schedule changed) leaves no record.

A slot materialised again (a manual trigger after its run ended, once the partition state has
forgotten it) keeps its one record: it shows the new materialisation's state and trigger, and
keeps the earlier attempts, the first start and its lateness, as a replay does.

A page's cursor is the base64url of the last returned key after the listing's prefix (for
runs: the inverted slot and the run id), so the next page starts right after it, with no
duplicates or gaps however the listing changes in between.

A query and a batch's write exclude each other (a lock held only for the ``write`` call and
the query's reads), so an index and the records it points at always agree. Not a RocksDB
snapshot: in rocksdict 0.3.29 a snapshot's ``get`` honours it but its ``iter``/``items`` see
later writes. There is no in-memory adapter: tests open the model in a temporary directory.

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
that fold go on. Until it has caught up, history shows what it has folded so far, as on a
node's first start; the lag metric says how far it is.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, assert_never

import msgspec
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from core.errors import CronlogError, InvalidDefinition, LogCorrupted, StoreDamaged, Unavailable
from core.events import (
    AnyEvent,
    CancelReason,
    Heartbeat,
    JobCancelled,
    JobForgotten,
    JobPaused,
    JobRegistered,
    JobResumed,
    JobUpdated,
    LeaseExpired,
    LeaseGranted,
    RetryScheduled,
    RunCancelled,
    RunCompleted,
    RunDeadLettered,
    RunFailed,
    RunMaterialised,
    RunReleased,
    RunReplayed,
    RunSkipped,
    Trigger,
    UpstreamRecorded,
)
from core.ids import is_scoped, team_id
from eventlog.port import EventLog, Record
from eventlog.rocks import bounded, checked_reads, is_damage, iterator_error
from projections import run_fold
from projections.aside import set_aside
from projections.decoding import EventDecoder
from projections.figures import HOUR_MS, RETENTION_MS, Minute, minute_of, observe
from projections.views import (
    JOB_STATUSES,
    RUN_STATES,
    JobStatusName,
    JobView,
    Page,
    RunStateName,
    RunView,
    SkipView,
)

log = logging.getLogger(__name__)

RETRY_S = 0.2  # a follower that failed reads again after this, doubling with each failure
MAX_RETRY_S = 10.0
# A node starting with a read model far behind the log (a new node, a model rebuilt) folds
# that history while its partitions recover from their stores and snapshots: both want the
# one interpreter lock, and the partitions' recovery is what the first on-time fire waits for.
# So a follower more than a batch behind waits while any partition is still recovering, for at
# most this long after the runner starts, then folds whatever else goes on: history is late,
# never lost. A follower within a batch of the log's end (the live case) never waits.
DEFER_FOR_S = 30.0
DEFER_POLL_S = 0.1

MAX_LIMIT = 1000
MAX_SEARCH_SCAN = 10_000  # jobs one page of a search looks at
MAX_SET_ASIDE = 3  # rebuilds one runner starts; more means something other than the disk is wrong
REFILL_JOIN_S = 30.0  # how long closing waits for a refill still restoring a checkpoint
LIVE_STATES = frozenset({"blocked", "pending", "running", "failed", "retrying"})
LEASE_EXPIRED = run_fold.LEASE_EXPIRED

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TOP = 2**64 - 1
_POSITION = b"m/pos/"
_JOB_COUNTS = b"m/job-counts"
_UNLISTED_CANCELLED = b"m/unlisted-cancelled"
_UNSCOPED = b"m/unscoped"  # present once a job id from before ids were scoped was folded in

_encoder = msgspec.msgpack.Encoder()
_run_decoder = msgspec.msgpack.Decoder(RunView)
_skip_decoder = msgspec.msgpack.Decoder(SkipView)
_minute_decoder = msgspec.msgpack.Decoder(Minute)


# Finished for good: the states a run may leave the hot window in. A dead run stays (it can
# still be replayed, and the dead-letter list is where operators find it); live runs stay.
FORGETTABLE: tuple[RunStateName, ...] = ("succeeded", "cancelled")


@dataclass(frozen=True, slots=True)
class Forgot:
    """What one batch of forgetting removed, and how long it held the writer's lock."""

    runs: int = 0
    skips: int = 0
    jobs: int = 0
    held_s: float = 0.0
    took_s: float = 0.0
    resume: bytes | None = None


def _tag(p: _Pending, tenant: str, job_id: str, tags: Sequence[str], value: bytes | None) -> None:
    """Index (``b""``) or unindex (``None``) ``job_id`` under each of its tags."""
    for tag in tags:
        p.raw[f"tt/{tenant}/{tag}/{job_id}".encode()] = value


def _depend(
    p: _Pending, tenant: str, job_id: str, upstreams: Sequence[str], value: bytes | None
) -> None:
    """Index (``b""``) or unindex (``None``) ``job_id`` as a dependant of each upstream job."""
    for upstream in upstreams:
        p.raw[f"dp/{tenant}/{upstream}/{job_id}".encode()] = value


class _JobRecord(msgspec.Struct, kw_only=True, gc=False):
    view: JobView  # ``view.status`` is the derived status, the one the status index holds
    base: JobStatusName  # active, paused or cancelled, as the job events say
    live: int = 0  # runs blocked, pending, running, failed or retrying
    runs: int = 0  # runs ever materialised
    ended_at: int | None = None  # when it ended, once its partition forgot it (JobForgotten)


_job_decoder = msgspec.msgpack.Decoder(_JobRecord)


def _inv(t: int) -> bytes:
    return _U64.pack(_TOP - t)


def _forgotten_key(at: int, job_id: str) -> bytes:
    return b"jf/" + _U64.pack(max(0, at)) + job_id.encode()


def _key_index(job_id: str, idempotency_key: str) -> bytes:
    # A job id has no "/", so the key after it may hold any character.
    return f"jk/{job_id}/{idempotency_key}".encode()


def _status(job: _JobRecord) -> JobStatusName:
    """``finished``: nothing live and no next slot, for a one-shot or dependency job that ran,
    or a recurring job whose ``end_at`` came."""
    spec = job.view.spec
    if job.base == "active" and job.view.next_slot is None and job.live == 0:
        if spec.recurring and spec.end_at is not None:
            return "finished"
        if not spec.recurring and job.runs > 0:
            return "finished"
    return job.base


def _encode_cursor(suffix: bytes) -> str:
    return base64.urlsafe_b64encode(suffix).rstrip(b"=").decode()


def _decode_cursor(cursor: str) -> bytes:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidDefinition("cursor", "is not a cursor this listing gave out") from exc


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidDefinition("limit", f"must be between 1 and {MAX_LIMIT}")


P = ParamSpec("P")
T = TypeVar("T")


def _query(
    method: Callable[Concatenate[ReadModel, P], T],
) -> Callable[Concatenate[ReadModel, P], T]:
    """A query that finds the model damaged sets it aside and answers Unavailable."""

    @functools.wraps(method)
    def query(model: ReadModel, /, *args: P.args, **kwargs: P.kwargs) -> T:
        generation = model.generation
        try:
            with model._reading():
                return method(model, *args, **kwargs)
        except StoreDamaged as damage:
            model.set_aside(damage, generation)
            raise Unavailable(
                "the history store was damaged and is being rebuilt from the log; try again"
            ) from None

    return query


@dataclass(frozen=True, slots=True)
class ReadyRun:
    """A run of a pull pool that became pending (ready at ``available_at``), as the model folded
    it: what wakes the claims waiting for that pool (``node.wakeups``)."""

    tenant: str
    pool: str
    available_at: int
    partition: int = -1  # the partition whose events made it ready (-1: not said)


class Observer(Protocol):
    """Told after each batch the model wrote (on the writing thread: it must not block)."""

    def folded(self, positions: dict[int, int], ready: list[ReadyRun]) -> None:
        """``positions``: the next offset of every partition the batch moved; ``ready``: pull
        runs it made pending."""


@dataclass
class _Pending:
    """A batch being staged: decoded records it changed, raw keys, counters, positions."""

    jobs: dict[str, _JobRecord | None] = field(default_factory=dict)
    runs: dict[str, RunView | None] = field(default_factory=dict)
    counts: dict[bytes, int] = field(default_factory=dict)
    raw: dict[bytes, bytes | None] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    minutes: dict[bytes, Minute] = field(default_factory=dict)  # a team's figures by minute
    deleted_ranges: list[tuple[bytes, bytes]] = field(default_factory=list)
    ready: list[ReadyRun] = field(default_factory=list)
    partition: int = -1  # the partition of the event being folded


class ReadModel:
    """History queries over every partition's events; ``ReadModel.open(data_dir)``.

    One thread at a time writes (batches hold a lock); any number query.
    """

    def __init__(self, path: str | Path) -> None:
        """Open (creating) the model at ``path``; StoreDamaged if it cannot be read back."""
        self._path = Path(path)
        self._write_options = WriteOptions()
        self._write_options.sync = False  # the log re-supplies a lost tail: see the docstring
        self._write_lock = threading.RLock()  # one writer: staging and committing a batch
        self._db_lock = threading.Lock()  # a batch's write versus a query's reads
        self._pending: _Pending | None = None
        self._positions: dict[int, int] = {}
        self._moved = threading.Condition()
        self._generation = 0  # grows each time the model is set aside and started again
        self.set_asides = 0
        self._restore: Callable[[Path], dict[int, int] | None] | None = None
        self._refills: list[threading.Thread] = []
        self._closed = False
        self._observers: list[Observer] = []
        self._db = self._open_db()
        try:
            self._positions = self._stored_positions()
            with self._reading():
                self._unscoped = self._db.get(_UNSCOPED) is not None
                self._upgrade()
        except StoreDamaged:
            self._db.close()
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

    @property
    def generation(self) -> int:
        """Grows each time the model is set aside: a fold read before must not land after."""
        return self._generation

    def set_aside(self, damage: StoreDamaged, generation: int | None = None) -> bool:
        """Rename the damaged model's files aside and start empty; every partition's position
        goes back to 0, so the runner folds the log again. A no-op (False) when ``generation``
        is given and the model was set aside since (by whoever found the damage first)."""
        with self._write_lock, self._db_lock:
            if generation is not None and generation != self._generation:
                return False
            self._db.close()
            aside = set_aside(self._path)
            self._db = self._open_db()
            self._upgrade()  # none yet: says the counters are kept from here on
            self._generation += 1
            self.set_asides += 1
            self._unscoped = False
            with self._moved:
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
                self._db.close()
                shutil.rmtree(self._path)
                os.replace(staging, self._path)
                self._generation += 1  # a fold read before the swap must not land after it
                try:
                    self._db = self._open_db()
                    stored = self._stored_positions()
                    with self._reading():
                        self._unscoped = self._db.get(_UNSCOPED) is not None
                        self._upgrade()
                except StoreDamaged as damage:  # verified when restored: the disk, again
                    with contextlib.suppress(Exception):
                        self._db.close()
                    log.error("%s; set aside as %s", damage, set_aside(self._path))
                    self._db = self._open_db()
                    self._upgrade()
                    self._unscoped = False
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
        options = bounded(Options(raw_mode=True))
        options.create_if_missing(True)
        options.set_paranoid_checks(True)
        try:
            return Rdict(str(self._path), options=options)
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

    def _stored_positions(self) -> dict[int, int]:
        with self._reading():
            return {
                _U32.unpack(key)[0]: _U64.unpack(value)[0] for key, value in self._scan(_POSITION)
            }

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

    def close(self) -> None:
        with self._write_lock, self._db_lock:
            self._closed = True
            self._db.close()
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

    # -- positions --------------------------------------------------------------------------

    def position(self, partition: int) -> int:
        """The next event offset of ``partition`` to fold in (0 before any)."""
        with self._moved:
            return self._positions.get(partition, 0)

    def positions(self) -> dict[int, int]:
        with self._moved:
            return dict(self._positions)

    def has_unscoped_ids(self) -> bool:
        """Whether some job's log id is a bare team id, from before ids were scoped
        (:mod:`core.ids`): only then may a team's id name such a job."""
        return self._unscoped

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

    # -- writing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Stage every ``process`` inside the block; write them and the positions at once."""
        with self._write_lock:
            if self._pending is not None:  # nested: the outer batch writes
                yield
                return
            self._pending = _Pending()
            try:
                yield
                self._commit(self._pending)
            finally:
                self._pending = None

    def process_records(
        self,
        partition: int,
        records: Sequence[Record],
        decoder: EventDecoder | None = None,
        *,
        generation: int | None = None,
    ) -> int:
        """Fold in records read from ``partition``'s event stream, as one batch; foreign
        records are reported through ``decoder`` and passed over. Records read before the
        model was set aside (``generation`` is older) are dropped: returns 0."""
        decoder = decoder or EventDecoder("read_model")
        with self.batch():
            if generation is not None and generation != self._generation:
                return 0
            pending = self._pending
            assert pending is not None
            with self._reading():  # once for the batch: a context per event costs more
                for record in records:
                    event = decoder.decode(record)
                    if event is not None:
                        self._fold(pending, event, partition, record.offset)
                    elif record.offset >= pending.positions.get(
                        partition, self.position(partition)
                    ):
                        pending.positions[partition] = record.offset + 1
        return len(records)

    def process(self, event: AnyEvent, partition: int, offset: int) -> None:
        """Fold one event in; events before the partition's position are already in."""
        with self.batch():
            pending = self._pending
            assert pending is not None
            with self._reading():
                self._fold(pending, event, partition, offset)

    def _fold(self, pending: _Pending, event: AnyEvent, partition: int, offset: int) -> None:
        if offset < pending.positions.get(partition, self.position(partition)):
            return
        pending.partition = partition
        self._apply(pending, event, partition, offset)
        pending.positions[partition] = offset + 1

    def _commit(self, pending: _Pending) -> None:
        wb = WriteBatch(raw_mode=True)
        for job_id, job in pending.jobs.items():
            if job is not None:
                wb.put(b"j/" + job_id.encode(), _encoder.encode(job))
        for run_id, run in pending.runs.items():
            if run is not None:
                wb.put(b"r/" + run_id.encode(), _encoder.encode(run))
        for key, count in pending.counts.items():
            wb.put(key, _U64.pack(count))
        for key, value in pending.raw.items():
            if value is None:
                wb.delete(key)
            else:
                wb.put(key, value)
        for key, minute in pending.minutes.items():
            wb.put(key, _encoder.encode(minute))
        for begin, end in pending.deleted_ranges:
            wb.delete_range(begin, end)
        for partition, position in pending.positions.items():
            wb.put(_POSITION + _U32.pack(partition), _U64.pack(position))
        if not wb.is_empty():
            with self._db_lock, self._reading():
                self._db.write(wb, self._write_options)
        with self._moved:
            self._positions.update(pending.positions)
            self._unscoped = self._unscoped or _UNSCOPED in pending.raw
            self._moved.notify_all()
        for observer in self._observers:
            try:
                observer.folded(dict(pending.positions), pending.ready)
            except Exception:  # an observer's failure must not fail the fold that is written
                log.exception("a read model observer failed")

    # -- folding one event ------------------------------------------------------------------

    def _apply(self, p: _Pending, event: AnyEvent, partition: int, offset: int) -> None:
        self._tally(p, event)
        match event:
            case JobRegistered():
                if not is_scoped(event.job_id):
                    p.raw[_UNSCOPED] = b"1"
                # The id of a job the partition forgot (docs/architecture.md) registered again:
                # the new job takes the record; its runs' history stays listed under the id.
                earlier = self._job(p, event.job_id)
                if earlier is not None:
                    key = f"tjs/{earlier.view.tenant}/{earlier.view.status}/{event.job_id}"
                    p.raw[key.encode()] = None
                    if earlier.base != "cancelled":
                        self._count_key(p, f"cj/{event.tenant}".encode(), -1)
                    if earlier.ended_at is not None:
                        p.raw[_forgotten_key(earlier.ended_at, event.job_id)] = None
                self._put_job(
                    p,
                    _JobRecord(
                        view=JobView(
                            job_id=event.job_id,
                            tenant=event.tenant,
                            name=event.spec.name,
                            status="active",
                            version=event.version,
                            spec=event.spec,
                            next_slot=event.next_slot,
                            created_at=event.at,
                            updated_at=event.at,
                            partition=partition,
                        ),
                        base="active",
                    ),
                    fresh=True,
                )
                self._count_key(p, f"cj/{event.tenant}".encode(), 1)
                _depend(p, event.tenant, event.job_id, event.spec.depends_on, b"")
                _tag(p, event.tenant, event.job_id, event.spec.tags, b"")
            case JobUpdated():
                job = self._job(p, event.job_id)
                if job is not None:
                    view = job.view
                    _depend(p, view.tenant, view.job_id, view.spec.depends_on, None)
                    _depend(p, view.tenant, view.job_id, event.spec.depends_on, b"")
                    _tag(p, view.tenant, view.job_id, view.spec.tags, None)
                    if job.base != "cancelled":  # a deleted job is not listed by tag
                        _tag(p, view.tenant, view.job_id, event.spec.tags, b"")
                    moved_to = event.spec.pool if event.spec.pool != view.spec.pool else None
                    view.spec, view.name, view.version = event.spec, event.spec.name, event.version
                    view.next_slot, view.updated_at = event.next_slot, event.at
                    self._put_job(p, job)
                    if moved_to is not None and job.live and self._observers:
                        # its pending runs now wait in this pool
                        p.ready.append(ReadyRun(view.tenant, moved_to, event.at, p.partition))
            case JobPaused() | JobResumed() | JobCancelled():
                job = self._job(p, event.job_id)
                if job is not None:
                    if isinstance(event, JobCancelled) and job.base != "cancelled":
                        self._count_key(p, f"cj/{job.view.tenant}".encode(), -1)
                    job.view.version, job.view.updated_at = event.version, event.at
                    if isinstance(event, JobPaused):
                        job.base = "paused"
                    elif isinstance(event, JobResumed):
                        job.base, job.view.next_slot = "active", event.next_slot
                    else:
                        job.base, job.view.next_slot = "cancelled", None
                        job.view.ahead_slot = None
                        view = job.view
                        _depend(p, view.tenant, view.job_id, view.spec.depends_on, None)
                        # Deleted: out of the listings by id and tag; still readable by id.
                        p.raw[f"tj/{view.tenant}/{view.job_id}".encode()] = None
                        _tag(p, view.tenant, view.job_id, view.spec.tags, None)
                    self._put_job(p, job)
            case RunMaterialised():
                self._materialise(p, event)
            case RunSkipped():
                skip = SkipView(
                    job_id=event.job_id,
                    tenant=event.tenant,
                    scheduled_for=event.scheduled_for,
                    last_scheduled_for=event.last_scheduled_for,
                    count=event.count,
                    reason=str(event.reason),
                    at=event.at,
                )
                p.raw[b"sk/" + event.job_id.encode() + b"/" + _inv(offset)] = _encoder.encode(skip)
                job = self._job(p, event.job_id)
                if job is not None:
                    job.view.next_slot = event.next_slot
                    self._put_job(p, job)
            case RunCancelled(reason=CancelReason.WITHDRAWN):
                self._withdraw(p, event)
            case (
                RunReleased()
                | LeaseGranted()
                | RunCompleted()
                | RunFailed()
                | LeaseExpired()
                | RetryScheduled()
                | RunDeadLettered()
                | RunCancelled()
                | RunReplayed()
            ):
                run = self._run(p, event.run_id)
                if run is not None:
                    state = run_fold.evolve(run, event)
                    if state is not None:
                        self._move(p, run, state)
            case JobForgotten():
                # The job's history stays; the hot window removes its record once none of
                # its runs is held any more (forget_jobs).
                job = self._job(p, event.job_id)
                if job is not None and job.ended_at is None:
                    job.ended_at = event.ended_at
                    p.jobs[event.job_id] = job
                    p.raw[_forgotten_key(event.ended_at, event.job_id)] = b""
            case Heartbeat() | UpstreamRecorded():
                pass
            case _:
                assert_never(event)  # a new event must be shown here, or history misses it

    def _tally(self, p: _Pending, event: AnyEvent) -> None:
        """Count ``event`` into its team's figures of its minute (before the run it names is
        changed: whether a lease is the run's first start is read from the run as it was)."""
        first_scheduled_start = False
        if isinstance(event, LeaseGranted):
            run = self._run(p, event.run_id)
            first_scheduled_start = (
                run is not None and run.started_at is None and run.trigger == Trigger.SCHEDULE
            )
        at = minute_of(event.at)
        prefix = f"tf/{event.tenant}/".encode()
        key = prefix + _U64.pack(at)
        minute = p.minutes.get(key)
        if minute is None:
            stored = self._db.get(key)
            minute = Minute() if stored is None else _minute_decoder.decode(stored)
            if stored is None:
                self._forget_old_figures(p, event.tenant, prefix, at)
        if observe(minute, event, first_scheduled_start=first_scheduled_start):
            p.minutes[key] = minute

    def _forget_old_figures(self, p: _Pending, tenant: str, prefix: bytes, at: int) -> None:
        """Delete the team's figures older than the retention, once an hour at most."""
        cutoff = max(0, at - at % HOUR_MS - RETENTION_MS)
        marker = f"tfp/{tenant}".encode()
        done = p.raw[marker] if marker in p.raw else self._db.get(marker)
        if done is not None and _U64.unpack(bytes(done))[0] >= cutoff:
            return
        p.deleted_ranges.append((prefix + _U64.pack(0), prefix + _U64.pack(cutoff)))
        p.raw[marker] = _U64.pack(cutoff)

    def _materialise(self, p: _Pending, event: RunMaterialised) -> None:
        old = self._run(p, event.run_id)
        run = run_fold.materialised(event, old)
        if old is None:
            p.raw.pop(b"r/" + run.run_id.encode(), None)  # withdrawn earlier in this batch
            p.raw[
                b"jr/" + run.job_id.encode() + b"/" + _inv(run.scheduled_for) + run.run_id.encode()
            ] = b""
        else:  # the same slot again: one record, its history kept (see the module docstring)
            self._unindex(p, old)
        p.runs[run.run_id] = run
        if event.idempotency_key is not None:
            p.raw[_key_index(run.job_id, event.idempotency_key)] = run.run_id.encode()
        self._index(p, run)
        job = self._job(p, event.job_id)
        if job is not None:
            if old is None:
                job.runs += 1
            if event.trigger is Trigger.SCHEDULE:
                job.view.next_slot = event.next_slot
                ahead = event.scheduled_for if event.at < event.scheduled_for else None
                job.view.ahead_slot = ahead
            self._put_job(p, job)

    def _withdraw(self, p: _Pending, event: RunCancelled) -> None:
        """A run materialised ahead of its slot and taken back before the slot came (the job
        was paused, or its schedule changed): it never started, and the slot is not over (a
        pause's slot runs if resumed in time, or is recorded as skipped), so its record goes
        rather than stay as a cancelled run the user did not cancel."""
        run = self._run(p, event.run_id)
        if run is not None:
            self._unindex(p, run)
            p.runs[run.run_id] = None
            p.raw[b"r/" + run.run_id.encode()] = None
            p.raw[
                b"jr/" + run.job_id.encode() + b"/" + _inv(run.scheduled_for) + run.run_id.encode()
            ] = None
        job = self._job(p, event.job_id)
        if job is not None:
            if run is not None:
                job.runs -= 1
            job.view.next_slot, job.view.ahead_slot = event.next_slot, None
            self._put_job(p, job)

    def _move(self, p: _Pending, run: RunView, state: RunStateName) -> None:
        if run.state != state:
            self._unindex(p, run)
            run.state = state
            self._index(p, run)

    def _index(self, p: _Pending, run: RunView) -> None:
        p.raw[self._state_key(run)] = b""
        self._count(p, run.tenant, run.state, +1)
        if run.state in LIVE_STATES:
            self._live(p, run.job_id, +1)
        if run.state in ("pending", "retrying") and self._observers:
            job = self._job(p, run.job_id)
            pool = job.view.spec.pool if job is not None else None
            if pool is not None:
                p.ready.append(ReadyRun(run.tenant, pool, run.available_at, p.partition))

    def _unindex(self, p: _Pending, run: RunView) -> None:
        p.raw[self._state_key(run)] = None
        self._count(p, run.tenant, run.state, -1)
        if run.state in LIVE_STATES:
            self._live(p, run.job_id, -1)

    @staticmethod
    def _state_key(run: RunView) -> bytes:
        return (
            f"rs/{run.tenant}/{run.state}/".encode() + _inv(run.scheduled_for) + run.run_id.encode()
        )

    def _live(self, p: _Pending, job_id: str, delta: int) -> None:
        job = self._job(p, job_id)
        if job is not None:
            job.live += delta
            self._put_job(p, job)

    def _count(self, p: _Pending, tenant: str, state: str, delta: int) -> None:
        self._count_key(p, f"c/{tenant}/{state}".encode(), delta)

    def _count_key(self, p: _Pending, key: bytes, delta: int) -> None:
        if key not in p.counts:
            stored = self._db.get(key)
            p.counts[key] = 0 if stored is None else _U64.unpack(stored)[0]
        p.counts[key] += delta

    def _job(self, p: _Pending, job_id: str) -> _JobRecord | None:
        if job_id not in p.jobs:
            stored = self._db.get(b"j/" + job_id.encode())
            p.jobs[job_id] = None if stored is None else _job_decoder.decode(stored)
        return p.jobs[job_id]

    def _run(self, p: _Pending, run_id: str) -> RunView | None:
        if run_id not in p.runs:
            stored = self._db.get(b"r/" + run_id.encode())
            p.runs[run_id] = None if stored is None else _run_decoder.decode(stored)
        return p.runs[run_id]

    def _put_job(self, p: _Pending, job: _JobRecord, *, fresh: bool = False) -> None:
        view = job.view
        indexed = None if fresh else view.status
        view.status = _status(job)
        p.jobs[view.job_id] = job
        if fresh:
            p.raw[f"tj/{view.tenant}/{view.job_id}".encode()] = b""
        if indexed != view.status:
            if indexed is not None:
                p.raw[f"tjs/{view.tenant}/{indexed}/{view.job_id}".encode()] = None
            p.raw[f"tjs/{view.tenant}/{view.status}/{view.job_id}".encode()] = b""

    # -- queries ----------------------------------------------------------------------------

    @_query
    def job(self, tenant: str, job_id: str) -> JobView | None:
        with self._db_lock:
            stored = self._db.get(b"j/" + job_id.encode())
        if stored is None:
            return None
        view = _job_decoder.decode(stored).view
        return view if view.tenant == tenant else None

    @_query
    def jobs(
        self,
        tenant: str,
        status: JobStatusName | None = None,
        limit: int = 50,
        cursor: str | None = None,
        search: str | None = None,
        tag: str | None = None,
    ) -> Page[JobView]:
        """A tenant's jobs by job id, all of them or those with ``status``, or ``tag``. With
        ``search``, only those whose name or team's id holds it (any case); such a page (and
        one by tag and status) looks at up to :data:`MAX_SEARCH_SCAN` jobs, so it may hold
        fewer than ``limit`` and still have a ``next_cursor``."""
        _check_limit(limit)
        if status is not None and status not in JOB_STATUSES:
            raise InvalidDefinition("status", f"must be one of {', '.join(JOB_STATUSES)}")
        if tag is not None:
            prefix = f"tt/{tenant}/{tag}/".encode()
        elif status is None:
            prefix = f"tj/{tenant}/".encode()
        else:
            prefix = f"tjs/{tenant}/{status}/".encode()
        needle = search.casefold() if search else None
        if needle is not None or (tag is not None and status is not None):

            def wanted(view: JobView) -> bool:
                if tag is not None and status is not None and view.status != status:
                    return False
                return needle is None or (
                    needle in view.name.casefold() or needle in team_id(view.job_id).casefold()
                )

            return self._search_jobs(prefix, limit, cursor, wanted)
        with self._db_lock:
            keys = self._page_keys(prefix, limit, cursor)
            found = [self._indexed(b"j/" + k) for k in keys[:limit]]
        items = [_job_decoder.decode(v).view for v in found]
        return Page(items=items, next_cursor=_next_cursor(keys, limit))

    def _search_jobs(
        self, prefix: bytes, limit: int, cursor: str | None, wanted: Callable[[JobView], bool]
    ) -> Page[JobView]:
        after = None if cursor is None else _decode_cursor(cursor)
        items: list[JobView] = []
        last: bytes | None = None
        scanned = 0
        with self._db_lock:
            for suffix, _ in self._scan(prefix, after):
                if suffix == after:
                    continue
                if len(items) == limit or scanned == MAX_SEARCH_SCAN:
                    # More keys follow: the next page goes on after the last one looked at.
                    return Page(items=items, next_cursor=_encode_cursor(last or b""))
                scanned += 1
                last = suffix
                view = _job_decoder.decode(self._indexed(b"j/" + suffix)).view
                if wanted(view):
                    items.append(view)
        return Page(items=items)

    @_query
    def latest_run(self, tenant: str, job_id: str) -> RunView | None:
        """The run of the job's newest slot (whatever its state), or None before its first."""
        with self._db_lock:
            newest = next(iter(self._scan(f"jr/{job_id}/", limit=1)), None)
            stored = None if newest is None else self._indexed(b"r/" + newest[0][8:])
        if stored is None:
            return None
        run = _run_decoder.decode(stored)
        return run if run.tenant == tenant else None

    @_query
    def run_keys(
        self, tenant: str, state: RunStateName, cursor: str | None, limit: int
    ) -> list[tuple[str, int, str]]:
        """Up to ``limit`` of a tenant's runs in ``state`` after ``cursor``, newest slot first,
        from the index alone: (the cursor after it, its slot, its run id). For filters that
        look at many runs and read few."""
        _check_limit(limit)
        after = None if cursor is None else _decode_cursor(cursor)
        out: list[tuple[str, int, str]] = []
        with self._db_lock:
            for suffix, _ in self._scan(f"rs/{tenant}/{state}/", after, limit=limit + 1):
                if suffix == after:
                    continue
                slot = _TOP - _U64.unpack(suffix[:8])[0]
                out.append((_encode_cursor(suffix), slot, suffix[8:].decode()))
                if len(out) == limit:
                    break
        return out

    @_query
    def run(self, tenant: str, run_id: str) -> RunView | None:
        with self._db_lock:
            stored = self._db.get(b"r/" + run_id.encode())
        if stored is None:
            return None
        run = _run_decoder.decode(stored)
        return run if run.tenant == tenant else None

    @_query
    def dependants(self, tenant: str, upstream_job_id: str) -> list[str]:
        """The live jobs of ``tenant`` whose ``depends_on`` names ``upstream_job_id``."""
        with self._db_lock:
            return [key.decode() for key, _ in self._scan(f"dp/{tenant}/{upstream_job_id}/")]

    @_query
    def run_by_key(self, tenant: str, job_id: str, idempotency_key: str) -> RunView | None:
        """The run a manual trigger of ``job_id`` with ``idempotency_key`` made (the latest, if
        the key was used again after the partition forgot it); None if none is known."""
        with self._db_lock:
            run_id = self._db.get(_key_index(job_id, idempotency_key))
            stored = None if run_id is None else self._indexed(b"r/" + bytes(run_id))
        if stored is None:
            return None
        run = _run_decoder.decode(stored)
        return run if run.tenant == tenant else None

    @_query
    def runs_of(
        self, tenant: str, job_id: str, limit: int = 20, cursor: str | None = None
    ) -> Page[RunView]:
        """A job's runs, newest slot first (empty for another tenant's job)."""
        _check_limit(limit)
        if self.job(tenant, job_id) is None:
            return Page(items=[])
        return self._run_page(f"jr/{job_id}/".encode(), limit, cursor)

    @_query
    def runs(
        self, tenant: str, state: RunStateName, limit: int = 20, cursor: str | None = None
    ) -> Page[RunView]:
        """A tenant's runs in ``state``, newest slot first; ``state="dead"`` is the dead letters."""
        _check_limit(limit)
        if state not in RUN_STATES:
            raise InvalidDefinition("state", f"must be one of {', '.join(RUN_STATES)}")
        return self._run_page(f"rs/{tenant}/{state}/".encode(), limit, cursor)

    def _run_page(self, prefix: bytes, limit: int, cursor: str | None) -> Page[RunView]:
        with self._db_lock:
            keys = self._page_keys(prefix, limit, cursor)
            found = [self._indexed(b"r/" + k[8:]) for k in keys[:limit]]
        items = [_run_decoder.decode(v) for v in found]
        return Page(items=items, next_cursor=_next_cursor(keys, limit))

    @_query
    def counts(self, tenant: str) -> dict[str, int]:
        """A tenant's runs by state (every state, zeros included)."""
        with self._db_lock:
            stored = list(self._scan(f"c/{tenant}/"))
        found = {k.decode(): _U64.unpack(v)[0] for k, v in stored}
        return {state: found.get(state, 0) for state in RUN_STATES}

    @_query
    def job_count(self, tenant: str) -> int:
        """How many of ``tenant``'s jobs are not cancelled (active, paused or finished)."""
        with self._db_lock:
            stored = self._db.get(f"cj/{tenant}".encode())
        return 0 if stored is None else int(_U64.unpack(stored)[0])

    def _upgrade(self) -> None:
        """Bring a model written by an earlier version up to this one's layout, once."""
        if self._db.get(_JOB_COUNTS) is None:
            self._count_jobs_once()
        if self._db.get(_UNLISTED_CANCELLED) is None:
            self._unlist_cancelled_once()

    def _unlist_cancelled_once(self) -> None:
        """Take the deleted jobs of a model written before they left the listings out of
        ``tj/`` and ``tt/``, in one batch with the marker that says it is done."""
        wb = WriteBatch(raw_mode=True)
        for key, _ in self._scan(b"tjs/"):
            tenant, status, job_id = key.decode().split("/", 2)
            if status != "cancelled":
                continue
            wb.delete(f"tj/{tenant}/{job_id}".encode())
            stored = self._db.get(b"j/" + job_id.encode())
            if stored is not None:
                for tag in _job_decoder.decode(stored).view.spec.tags:
                    wb.delete(f"tt/{tenant}/{tag}/{job_id}".encode())
        wb.put(_UNLISTED_CANCELLED, b"")
        self._db.write(wb, self._write_options)

    def _count_jobs_once(self) -> None:
        """Fill the ``cj/`` counters of a model written before they were kept, from the
        jobs-by-status index, in one batch with the marker that says they are kept."""
        counts: dict[str, int] = {}
        for key, _ in self._scan(b"tjs/"):
            tenant, status, _job_id = key.decode().split("/", 2)
            if status != "cancelled":
                counts[tenant] = counts.get(tenant, 0) + 1
        wb = WriteBatch(raw_mode=True)
        for tenant, count in counts.items():
            wb.put(f"cj/{tenant}".encode(), _U64.pack(count))
        wb.put(_JOB_COUNTS, b"")
        self._db.write(wb, self._write_options)

    @_query
    def skipped(self, tenant: str, job_id: str, limit: int = 50) -> list[SkipView]:
        """Slots of a job that did not run, most recent record first."""
        _check_limit(limit)
        if self.job(tenant, job_id) is None:
            return []
        with self._db_lock:
            stored = list(self._scan(f"sk/{job_id}/", limit=limit))
        return [_skip_decoder.decode(v) for _, v in stored]

    @_query
    def minutes(self, tenant: str, since: int, until: int) -> list[tuple[int, Minute]]:
        """The team's figures of the minutes in ``[since, until)``, oldest first (minutes with
        nothing to count are not stored, so not listed). Figures are kept for
        :data:`~projections.figures.RETENTION_MS`: a window reaches back that far at most."""
        since = max(since, until - RETENTION_MS - HOUR_MS)
        prefix = f"tf/{tenant}/".encode()
        start = _U64.pack(minute_of(max(0, since)))
        out: list[tuple[int, Minute]] = []
        with self._db_lock:
            for suffix, value in self._scan(prefix, start):
                at = _U64.unpack(suffix)[0]
                if at >= until:
                    break
                out.append((at, _minute_decoder.decode(value)))
        return out

    # -- the hot window (projections.hot_window drives it) ------------------------------------

    def forget_runs(
        self, cutoff: int, max_runs: int, resume: dict[bytes, bytes] | None = None
    ) -> Forgot:
        """Remove up to ``max_runs`` finished runs (:data:`FORGETTABLE` states) whose slot is
        before ``cutoff``, oldest slot first, with every index key that names them (``r/``,
        ``jr/``, ``rs/``, ``jk/``) and their ``c/`` counts, in one batch. Live and dead runs
        stay; a job's own record and ``cj/`` do not change. Holds the writer's lock for this
        one batch only (``Forgot.held_s``). ``resume`` (index prefix -> the last key removed),
        kept by the caller across the batches of one cutoff, starts each scan past what earlier
        batches deleted: RocksDB would otherwise step over their tombstones again each time."""
        started = time.perf_counter()
        with self._write_lock:
            held_from = time.perf_counter()
            removed = 0
            wb = WriteBatch(raw_mode=True)
            counts: dict[bytes, int] = {}
            with self._reading():
                for tenant in self._tenants():
                    for state in FORGETTABLE:
                        prefix = f"rs/{tenant}/{state}/".encode()
                        before = None if resume is None else resume.get(prefix)
                        for suffix in self._oldest(prefix, cutoff, max_runs - removed, before):
                            run_id = suffix[8:]
                            run = _run_decoder.decode(self._indexed(b"r/" + run_id))
                            job = run.job_id.encode()
                            wb.delete(b"r/" + run_id)
                            wb.delete(prefix + suffix)
                            wb.delete(b"jr/" + job + b"/" + suffix)
                            if run.idempotency_key is not None:
                                key = _key_index(run.job_id, run.idempotency_key)
                                if self._db.get(key) == run_id:
                                    wb.delete(key)
                            count = f"c/{tenant}/{state}".encode()
                            counts[count] = counts.get(count, 0) + 1
                            removed += 1
                            if resume is not None:
                                resume[prefix] = suffix
                        if removed >= max_runs:
                            break
                    if removed >= max_runs:
                        break
                self._lower_counts_and_write(wb, counts)
            done = time.perf_counter()
        return Forgot(runs=removed, held_s=done - held_from, took_s=done - started)

    def forget_skips(self, cutoff: int, after: bytes | None, max_scan: int) -> Forgot:
        """Look at up to ``max_scan`` skipped-slot records after the key ``after`` (None: from
        the first) and remove those whose last slot is before ``cutoff``. ``Forgot.resume``
        is where the next call goes on (None: the scan reached the end)."""
        started = time.perf_counter()
        with self._write_lock:
            held_from = time.perf_counter()
            wb = WriteBatch(raw_mode=True)
            removed = scanned = 0
            resume: bytes | None = None
            with self._reading():
                for suffix, value in self._scan(b"sk/", after):
                    if suffix == after:
                        continue
                    if scanned == max_scan:
                        break
                    scanned += 1
                    resume = suffix
                    if _skip_decoder.decode(value).last_scheduled_for < cutoff:
                        wb.delete(b"sk/" + suffix)
                        removed += 1
                else:
                    resume = None
                if not wb.is_empty():
                    with self._db_lock:
                        self._db.write(wb, self._write_options)
            done = time.perf_counter()
        return Forgot(skips=removed, held_s=done - held_from, took_s=done - started, resume=resume)

    def forget_jobs(self, cutoff: int, after: bytes | None, max_scan: int) -> Forgot:
        """Look at up to ``max_scan`` jobs their partition forgot that ended before ``cutoff``,
        oldest first from after the ``jf/`` key suffix ``after`` (None: from the first), and remove
        those of which no run and no skipped-slot record is held: the record, every index key
        naming the job, its keys of manual triggers, and its count in ``cj/`` (one batch).
        ``Forgot.resume`` is where the next call goes on (None: no more before ``cutoff``)."""
        started = time.perf_counter()
        with self._write_lock:
            held_from = time.perf_counter()
            wb = WriteBatch(raw_mode=True)
            removed = scanned = 0
            resume: bytes | None = None
            counts: dict[bytes, int] = {}
            with self._reading():
                for suffix, _ in self._scan(b"jf/", after):
                    if suffix == after:
                        continue
                    if scanned == max_scan:
                        break
                    if _U64.unpack(suffix[:8])[0] >= cutoff:
                        resume = None
                        break
                    scanned += 1
                    resume = suffix
                    job_id = suffix[8:].decode()
                    if self._holds_history_of(job_id):
                        continue  # a dead run, or runs still in the window: it stays
                    job = _job_decoder.decode(self._indexed(b"j/" + suffix[8:]))
                    self._delete_job(wb, job)
                    wb.delete(b"jf/" + suffix)
                    if job.base != "cancelled":
                        key = f"cj/{job.view.tenant}".encode()
                        counts[key] = counts.get(key, 0) + 1
                    removed += 1
                else:
                    resume = None
                self._lower_counts_and_write(wb, counts)
            done = time.perf_counter()
        return Forgot(jobs=removed, held_s=done - held_from, took_s=done - started, resume=resume)

    def _lower_counts_and_write(self, wb: WriteBatch, counts: dict[bytes, int]) -> None:
        """Lower each counter by what a forgetting pass removed (never below zero) in ``wb``,
        then write the batch if it holds anything."""
        for key, gone in counts.items():
            stored = self._db.get(key)
            held = 0 if stored is None else _U64.unpack(stored)[0]
            wb.put(key, _U64.pack(max(0, held - gone)))
        if not wb.is_empty():
            with self._db_lock:
                self._db.write(wb, self._write_options)

    def _holds_history_of(self, job_id: str) -> bool:
        for prefix in (f"jr/{job_id}/", f"sk/{job_id}/"):
            if next(iter(self._scan(prefix, limit=1)), None) is not None:
                return True
        return False

    @staticmethod
    def _delete_job(wb: WriteBatch, job: _JobRecord) -> None:
        view = job.view
        tenant, job_id = view.tenant, view.job_id
        wb.delete(b"j/" + job_id.encode())
        wb.delete(f"tj/{tenant}/{job_id}".encode())
        wb.delete(f"tjs/{tenant}/{view.status}/{job_id}".encode())
        for tag in view.spec.tags:
            wb.delete(f"tt/{tenant}/{tag}/{job_id}".encode())
        for upstream in view.spec.depends_on:
            wb.delete(f"dp/{tenant}/{upstream}/{job_id}".encode())
        keys = f"jk/{job_id}/".encode()
        wb.delete_range(keys, keys[:-1] + b"0")  # "/" + 1: every key of a manual trigger

    @_query
    def oldest_forgettable(self, cutoff: int) -> int | None:
        """The oldest slot of a finished run still held that is before ``cutoff`` (None: none
        is): how far behind forgetting is."""
        oldest: int | None = None
        with self._db_lock:
            for tenant in self._tenants():
                for state in FORGETTABLE:
                    for suffix in self._oldest(f"rs/{tenant}/{state}/".encode(), cutoff, 1):
                        slot = _TOP - _U64.unpack(suffix[:8])[0]
                        oldest = slot if oldest is None else min(oldest, slot)
        return oldest

    @_query
    def job_runs_after(
        self, job_id: str, after: bytes | None, limit: int
    ) -> list[tuple[bytes, RunView]]:
        """Up to ``limit`` of the job's runs after the key ``after`` (:func:`run_key`), newest
        slot first, with their keys (the caller checked the job is its tenant's)."""
        return self.job_runs_with(job_id, after, limit, [])[0]

    @_query
    def job_runs_with(
        self, job_id: str, after: bytes | None, limit: int, run_ids: Sequence[str]
    ) -> tuple[list[tuple[bytes, RunView]], set[str]]:
        """:meth:`job_runs_after`, and which of ``run_ids`` the model holds, in one read."""
        prefix = f"jr/{job_id}/".encode()
        with self._db_lock:
            keys = [k for k, _ in self._scan(prefix, after, limit=limit + 1) if k != after]
            found = [(k, self._indexed(b"r/" + k[8:])) for k in keys[:limit]]
            held = {r for r in run_ids if self._db.get(b"r/" + r.encode()) is not None}
        return [(k, _run_decoder.decode(v)) for k, v in found], held

    def _tenants(self) -> list[str]:
        """Every tenant that has had a run (its ``c/`` counters), from the counters alone."""
        tenants: list[str] = []
        for key, _ in self._scan(b"c/"):
            tenant = key.decode().partition("/")[0]
            if not tenants or tenants[-1] != tenant:
                tenants.append(tenant)
        return tenants

    def _oldest(
        self, prefix: bytes, cutoff: int, limit: int, before: bytes | None = None
    ) -> list[bytes]:
        """Up to ``limit`` key suffixes of an ``<inv(slot)><run_id>`` index whose slot is before
        ``cutoff``, oldest slot first (a backward scan from the prefix's end, or from just
        before the suffix ``before``)."""
        if limit <= 0 or cutoff <= 0:
            return []
        lower = prefix + _inv(cutoff - 1)
        upper = prefix[:-1] + bytes([prefix[-1] + 1])
        options = checked_reads()
        options.set_iterate_upper_bound(upper)
        it: Any = self._db.iter(options)
        start = upper if before is None else prefix + before
        it.seek_for_prev(start)
        found: list[bytes] = []
        # The lower bound is checked here: rocksdict's iterate_lower_bound does not stop a
        # backward scan when nothing lies between the bounds.
        while it.valid() and len(found) < limit:
            key = bytes(it.key())
            if key < lower:
                break
            if key != start:
                found.append(key[len(prefix) :])
            it.prev()
        error = iterator_error(it)
        del it  # a live iterator keeps the model's LOCK
        if error is not None:
            raise StoreDamaged(f"read model {self._path}: {error}")
        return found

    def dump(self) -> list[tuple[bytes, bytes]]:
        """Every stored key and value in key order (for tests and tools)."""
        with self._db_lock, self._reading():
            return [(bytes(k), bytes(v)) for k, v in self._scan(b"")]

    # -- scanning ---------------------------------------------------------------------------

    def _indexed(self, key: bytes) -> bytes:
        """A record an index points at: written in the same batch, so it is there."""
        value = self._db.get(key)
        if value is None:
            raise StoreDamaged(f"read model {self._path}: an index points at missing {key!r}")
        return bytes(value)

    def _page_keys(self, prefix: bytes, limit: int, cursor: str | None) -> list[bytes]:
        """Up to ``limit + 1`` key suffixes after ``cursor`` (the extra one says "more")."""
        after = None if cursor is None else _decode_cursor(cursor)
        found: list[bytes] = []
        for suffix, _ in self._scan(prefix, after, limit=limit + 2):
            if suffix == after:
                continue
            found.append(suffix)
            if len(found) > limit:
                break
        return found

    def _scan(
        self, prefix: bytes | str, start: bytes | None = b"", limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key after ``prefix``, value) from ``start`` (a suffix) on, in key order; every
        block's checksum verified (StoreDamaged where one fails)."""
        if isinstance(prefix, str):
            prefix = prefix.encode()
        options = checked_reads()
        if prefix:
            options.set_iterate_upper_bound(prefix[:-1] + bytes([prefix[-1] + 1]))
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


def run_key(scheduled_for: int, run_id: str) -> bytes:
    """A run's key in a listing of runs (newest slot first); a cursor encodes one."""
    return _inv(scheduled_for) + run_id.encode()


encode_cursor = _encode_cursor
decode_cursor = _decode_cursor


def _next_cursor(keys: list[bytes], limit: int) -> str | None:
    return _encode_cursor(keys[limit - 1]) if len(keys) > limit else None


class ReadModelRunner:
    """Feeds a :class:`ReadModel` from every partition of an event log.

    ``run_once()`` folds in everything there is now and returns how many events it read.
    ``start()`` runs one thread per partition, each blocking in ``read_events(..., timeout_s)``
    from the model's position, so an event is queryable moments after it is committed;
    ``stop()`` ends them (within ``poll_s``). While ``defer_while()`` is true (the node's
    partitions are still recovering), a follower more than a batch behind the log's end waits,
    for at most ``defer_for_s`` after ``start()`` (see ``DEFER_FOR_S``). Records that are not
    events go through ``decoder`` (reported once, passed over). A model found damaged while
    folding is set aside and folded again from offset 0 (up to ``MAX_SET_ASIDE`` times), or
    refilled from a history checkpoint where there is one. A thread whose read or fold fails
    otherwise says so (the first failure of a streak with its traceback), tells ``on_failed``,
    and tries again from the model's position after a backoff: it never stops following while
    the runner runs, unless the log itself is damaged (``LogCorrupted``: the log has failed and
    the node that owns it stops).
    """

    def __init__(
        self,
        log_: EventLog,
        model: ReadModel,
        batch_size: int = 1000,
        poll_s: float = 0.2,
        on_failed: Callable[[int, BaseException], None] | None = None,
        decoder: EventDecoder | None = None,
        defer_while: Callable[[], bool] | None = None,
        defer_for_s: float = DEFER_FOR_S,
    ) -> None:
        self._log = log_
        self._model = model
        self._batch_size = batch_size
        self._poll_s = poll_s
        self._on_failed = on_failed
        self._decoder = decoder or EventDecoder("read_model")
        self._defer_while = defer_while
        self._defer_for_s = defer_for_s
        self._defer_until = 0.0
        self.deferred = threading.Event()  # set once a follower has waited (for tests)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def run_once(self, on_batch: Callable[[int], None] | None = None) -> int:
        """Fold in everything there is now; returns how many records were read. ``on_batch``
        is told how many each batch read (a tool's progress)."""
        total = 0
        for partition in range(self._log.num_partitions):
            while True:
                records = self._log.read_events(
                    partition, self._model.position(partition), self._batch_size
                )
                if not records:
                    break
                total += self._model.process_records(partition, records, self._decoder)
                if on_batch is not None:
                    on_batch(len(records))
        return total

    def start(self) -> None:
        if self._threads:
            raise CronlogError("the read model runner is already running")
        self._stopping.clear()
        self._defer_until = time.monotonic() + self._defer_for_s
        self._threads = [
            threading.Thread(target=self._follow, args=(p,), name=f"read-model:p{p}", daemon=True)
            for p in range(self._log.num_partitions)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def __enter__(self) -> ReadModelRunner:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _deferring(self, partition: int) -> bool:
        """Whether this follower waits now: the node is recovering partitions, the runner
        started less than ``defer_for_s`` ago, and the model is more than a batch behind."""
        if self._defer_while is None or time.monotonic() >= self._defer_until:
            return False
        if not self._defer_while():
            return False
        behind = self._log.end_offset("events", partition) - self._model.position(partition)
        return behind > self._batch_size

    def _follow(self, partition: int) -> None:
        model = self._model
        failures = 0
        while not self._stopping.is_set():
            try:
                if self._deferring(partition):
                    self.deferred.set()
                    self._stopping.wait(DEFER_POLL_S)
                    continue
                generation = model.generation
                records = self._log.read_events(
                    partition, model.position(partition), self._batch_size, self._poll_s
                )
                if records:
                    try:
                        model.process_records(
                            partition, records, self._decoder, generation=generation
                        )
                    except StoreDamaged as damage:
                        if model.set_asides >= MAX_SET_ASIDE:
                            raise
                        model.set_aside(damage, generation)
                failures = 0
            except LogCorrupted as damage:  # the log failed itself: reading again cannot help
                if not self._stopping.is_set():
                    log.error("read model of partition %d stopped: %s", partition, damage)
                return
            except Exception as exc:
                if self._stopping.is_set():
                    return
                failures += 1
                delay = min(MAX_RETRY_S, RETRY_S * 2.0 ** (failures - 1))
                if failures == 1:
                    log.exception("read model of partition %d failed; retrying", partition)
                else:
                    log.error(
                        "read model of partition %d failed again (%d in a row): %r",
                        partition,
                        failures,
                        exc,
                    )
                if self._on_failed is not None:
                    self._on_failed(partition, exc)
                self._stopping.wait(delay)
