"""The embedded log: the log port on one machine, in RocksDB (through rocksdict).

Layout (raw mode, three column families)::

    commands   (partition:u32, offset:u64) big-endian -> record
    events     (partition:u32, offset:u64) big-endian -> record
    meta       b"num_partitions"            -> u32
               b"epoch"   + partition:u32   -> u64   writer epoch, bumped on every takeover
               b"through" + partition:u32   -> u64   next command offset to process
               b"end" + stream:u8 + partition:u32 -> u64   records in the stream-partition
               b"start" + stream:u8 + partition:u32 -> u64  first offset retention left
               b"seg" + stream:u8 + partition:u32 + first:u64
                                                  -> end, bytes, first_ms, last_ms (u64 each)
               b"checked" + stream:u8 + partition:u32 -> u64  where the last verify ended

A record is ``0x00 value`` or ``0x01 len(key):u32 key value``. Big-endian keys make RocksDB's
byte order the (partition, offset) order, so a read is one seek and a forward scan. Offsets
are contiguous from 0 in every stream-partition: the committer gives each record the next one.

**Group commit.** A synced write costs a WAL fsync (~0.3 ms on a quiet disk, many times that
on a busy one), so callers never write themselves. ``submit``, ``append`` and takeovers queue a
pending write and wait; one committer thread drains the whole queue, assigns offsets (so they
strictly increase per stream-partition in queue order), checks each append's writer epoch, puts
everything accepted into one ``WriteBatch``, writes it and syncs the WAL (``flush_wal(True)``:
rocksdict releases the GIL through its fsync, and holds it through a synced write's) and only then
publishes the new end offsets to readers and wakes every waiter with its offsets. While one
batch is being synced the next one fills up, so sixteen writers share one fsync instead of
queueing for sixteen::

    t1 submit ─┐                       ┌─> t1 gets [41]
    t2 append ─┼─> queue ─> committer ─┼─> t2 gets [17, 18]     one WriteBatch, one fsync
    t3 append ─┘   (epoch of t3 stale) └─> t3 raises Fenced     (nothing of t3 is written)

Because a batch is atomic and the WAL is synced before anyone is told, a crash at any point
loses nothing acknowledged and leaves a prefix of the queue order: events and the command
position they carry land together or not at all.

**Fencing.** The embedded log is single-process (RocksDB's ``LOCK`` file refuses a second
opener), so the current epochs live in memory and every change is also stored. A takeover bumps
the epochs of the partitions it takes (the single node's: all of them) in one batch; an append
whose writer epoch is stale raises ``Fenced``.

**Integrity.** The log is the source of truth, so it never hands out what it cannot vouch for.
Every read verifies RocksDB's block checksums, and checks that the offsets it returns are the
contiguous ones it asked for, up to the published end, and that every record is framed as the
log frames them. At open, each stream-partition's last record must be where the ``end`` meta
key (written in the same batch as the records) says; :meth:`EmbeddedLog.verify` reads every
record once (``cronlog serve`` runs it before it starts deciding). Any failure is a
:class:`core.errors.LogCorrupted` naming the stream, the partition, the offset and, where
RocksDB says which, the file; the first one also puts the log in a failed state: every later
read and write raises the same error, and :meth:`EmbeddedLog.wait_damaged` wakes, so the node
that owns the log stops rather than serve from it. What the records *mean* is the readers'
business: a record that is not an event is reported by ``projections.decoding``.

**Segments and retention.** Each stream-partition is cut into segments
(:mod:`eventlog.retention`): the committer adds every record to its partition's active segment
and starts a new one when the active one reaches ``segment_bytes`` or has been open
``segment_ms``; the segments' meta keys are written in the same batch as the records, so they
always agree. :meth:`EmbeddedLog.prune` removes whole sealed segments from the front (one
``delete_range`` and the new start, in one synced batch through the committer) and then
compacts the range so the disk space comes back. A read from below the start raises
:class:`core.errors.Pruned`; which segments go is decided above the log (``node.retention``).

**Closing.** rocksdict keeps the ``LOCK`` while any column-family handle, iterator or snapshot
is alive, even after ``close()``. Iterators live only inside a read; ``close`` waits for
in-flight reads, drops the handles, then closes the database.
"""

from __future__ import annotations

import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocksdict import (
    DBRecoveryMode,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from core.errors import CronlogError, Fenced, LogCorrupted, Pruned
from eventlog.mailbox import LocalPostOffice
from eventlog.memory import ChangeSignal, SingleProcessLog
from eventlog.port import NO_OUTBOUND, Outbound, PartitionWriter, Record
from eventlog.retention import DEFAULT_SEGMENT_BYTES, DEFAULT_SEGMENT_MS, Segment
from eventlog.rocks import (
    bounded,
    checked_reads,
    close_store,
    is_damage,
    iterator_error,
    open_store,
)

STREAMS = ("commands", "events")
_STREAM_ID = {"commands": b"c", "events": b"e"}
_META = "meta"
_KEY = struct.Struct(">IQ")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_NUM_PARTITIONS = b"num_partitions"
_EPOCH = b"epoch"
_THROUGH = b"through"
_END = b"end"
_START = b"start"
_SEG = b"seg"
_CHECKED = b"checked"
_SEG_VALUE = struct.Struct(">QQQQ")
_MAX_OFFSET = 2**64 - 1
_KEY_BYTES = _KEY.size  # what a record's key takes, counted in a segment's bytes
_EVENT_OVERHEAD = _KEY_BYTES + 1  # and an event's frame byte


def _encode(value: bytes, key: bytes | None) -> bytes:
    if key is None:
        return b"\x00" + value
    return b"\x01" + _U32.pack(len(key)) + key + value


def _unframe(path: Path, stream: str, partition: int, offset: int, stored: bytes) -> Record:
    """The record the log framed as ``stored``, or LogCorrupted if it is not one."""
    if stored[:1] == b"\x00":
        return Record(partition, offset, stored[1:])
    if stored[:1] == b"\x01" and len(stored) >= 5:
        (key_len,) = _U32.unpack_from(stored, 1)
        if 5 + key_len <= len(stored):
            return Record(partition, offset, stored[5 + key_len :], stored[5 : 5 + key_len])
    raise LogCorrupted(
        f"event log {path} is damaged: {stream} partition {partition} at offset {offset}: "
        f"the record is not framed as the log frames records ({len(stored)} bytes, "
        f"starting {stored[:8].hex() or 'nothing'})",
        stream=stream,
        partition=partition,
        offset=offset,
    )


def _end_key(stream: str, partition: int) -> bytes:
    return _END + _STREAM_ID[stream] + _U32.pack(partition)


def _start_key(stream: str, partition: int) -> bytes:
    return _START + _STREAM_ID[stream] + _U32.pack(partition)


def _segment_key(stream: str, partition: int, first: int) -> bytes:
    return _SEG + _STREAM_ID[stream] + _U32.pack(partition) + _U64.pack(first)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


# RocksDB names the file in its messages: "... in /data/log/000009.sst offset 13099 ...",
# "The file /data/log/MANIFEST-000005 may be corrupted".
_FILE = re.compile(r"(\S*/(?:\d+\.(?:sst|log|blob)|MANIFEST-\d+))\b")


def _rocksdb_damage(
    path: Path, exc: Exception, stream: str | None, partition: int | None, offset: int | None
) -> LogCorrupted:
    """LogCorrupted from RocksDB's own report (its checksum messages name the file)."""
    found = _FILE.search(str(exc))
    file = found.group(1) if found else None
    where = "" if stream is None else f"{stream} partition {partition}"
    if offset is not None:
        where += f" at offset {offset}"
    if file is not None:
        where += f" (file {file})" if where else f"file {file}"
    return LogCorrupted(
        f"event log {path} is damaged: {where + ': ' if where else ''}{exc}",
        stream=stream,
        partition=partition,
        offset=offset,
        file=file,
    )


def _copy(damage: LogCorrupted) -> LogCorrupted:
    return LogCorrupted(
        str(damage),
        stream=damage.stream,
        partition=damage.partition,
        offset=damage.offset,
        file=damage.file,
    )


@dataclass(frozen=True, slots=True)
class _Submit:
    partition: int
    value: bytes
    key: bytes | None


@dataclass(frozen=True, slots=True)
class _Append:
    partition: int
    epoch: int
    events: Sequence[bytes]
    commands_through: int | None


@dataclass(frozen=True, slots=True)
class _TakeOver:
    partitions: tuple[int, ...]
    member: object | None  # the single-node membership taking every partition, or None


@dataclass(frozen=True, slots=True)
class _Prune:
    stream: str
    partition: int
    before: int


@dataclass(slots=True)
class _Pending:
    """A write waiting for the committer; ``done`` is set once it is durable or refused."""

    op: _Submit | _Append | _TakeOver | _Prune
    done: threading.Event = field(default_factory=threading.Event)
    offsets: list[int] = field(default_factory=list)
    error: BaseException | None = None


class EmbeddedWriter:
    """The fenced writer of one partition's events; thread-safe."""

    def __init__(self, log: EmbeddedLog, partition: int, epoch: int) -> None:
        self._log = log
        self._partition = partition
        self._epoch = epoch
        self._closed = False

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def epoch(self) -> int:
        return self._epoch

    def append(
        self,
        events: Sequence[bytes],
        *,
        commands_through: int | None = None,
        outbound: Sequence[Outbound] = (),
    ) -> list[int]:
        if outbound:
            raise ValueError(NO_OUTBOUND)
        if self._closed:
            raise Fenced(f"writer of partition {self._partition} (epoch {self._epoch}) is closed")
        if commands_through is not None and not 0 <= commands_through <= _MAX_OFFSET:
            raise ValueError(f"commands_through {commands_through} is not an offset")
        op = _Append(self._partition, self._epoch, [bytes(e) for e in events], commands_through)
        return self._log._commit(op)

    def wait_until_readable(self) -> None:
        pass  # readable when append returned

    def command_position(self) -> int:
        return self._log._command_position(self._partition)

    def close(self) -> None:
        self._closed = True


class EmbeddedLog(SingleProcessLog):
    """``EmbeddedLog.open(path, num_partitions)``: the log port on local RocksDB.

    ``segment_bytes``/``segment_ms`` say when a segment is sealed (the unit retention prunes);
    ``wall_ms`` is the clock that stamps segments (tests pass a fake one)."""

    def __init__(
        self,
        path: str | Path,
        num_partitions: int,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        segment_ms: int = DEFAULT_SEGMENT_MS,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
        if segment_bytes < 1 or segment_ms < 1:
            raise ValueError("segment_bytes and segment_ms must be positive")
        self._segment_bytes = segment_bytes
        self._segment_ms = segment_ms
        self._wall_ms = wall_ms
        self._path = Path(path)
        self._num_partitions = num_partitions
        self._post_office = LocalPostOffice()
        self._damage: LogCorrupted | None = None
        self._damage_seen = threading.Event()
        self._db = self._open_db(self, self._path)
        self._cf = {name: self._db.get_column_family_handle(name) for name in (*STREAMS, _META)}
        self._tables = {name: self._db.get_column_family(name) for name in (*STREAMS, _META)}
        self._sync = WriteOptions()
        self._sync.sync = True
        self._unsynced = WriteOptions()
        self._unsynced.sync = False

        try:
            self._check_num_partitions()
            self._starts = {
                s: [self._meta_u64(_start_key(s, p), None) for p in self._partitions()]
                for s in STREAMS
            }
            # Owned by the committer; readers see ``_visible``, published after each fsync.
            self._next = {s: [self._checked_end(s, p) for p in self._partitions()] for s in STREAMS}
            self._segments = {
                s: [self._load_segments(s, p) for p in self._partitions()] for s in STREAMS
            }
            self._epochs = [self._meta_u64(_EPOCH, p) for p in self._partitions()]
            self._positions = [self._meta_u64(_THROUGH, p) for p in self._partitions()]
        except BaseException:
            self._release_db()
            raise
        self._visible = {s: list(ends) for s, ends in self._next.items()}

        self._signal = ChangeSignal()
        self._readers = 0  # reads in flight; close waits for them (their iterators hold LOCK)
        self._no_readers = threading.Condition(self._signal.lock)  # what close waits on
        self._queue: list[_Pending] = []
        self._synced_batches = 0
        self._queue_cond = threading.Condition()
        self._stopping = False
        self._failure: BaseException | None = None
        self._committer = threading.Thread(
            target=self._run_committer, name=f"cronlog-committer:{self._path.name}", daemon=True
        )
        self._committer.start()

    @classmethod
    def open(cls, path: str | Path, num_partitions: int, **segments: Any) -> EmbeddedLog:
        """Open the log at ``path``, creating it; the partition count is fixed at creation.
        ``segments``: ``segment_bytes``, ``segment_ms``, ``wall_ms`` (see the class)."""
        return cls(path, num_partitions, **segments)

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    @property
    def path(self) -> Path:
        return self._path

    @property
    def damage(self) -> LogCorrupted | None:
        """The first damage any read found (None while the log is sound)."""
        return self._known_damage()

    @property
    def closed(self) -> bool:
        with self._signal.cond:
            return bool(self._signal.closed)

    def wait_damaged(self, timeout_s: float | None = None) -> LogCorrupted | None:
        """Block until a read finds the log damaged, the log is closed, or ``timeout_s``
        passes; the damage, or None."""
        self._damage_seen.wait(timeout_s)
        return self._known_damage()

    def verify(self, *, since_last: bool = False) -> int:
        """Read every record of every stream-partition once, checking what a read checks
        (checksums, contiguous offsets, framing) without handing records out; returns how many
        it read. Raises LogCorrupted, and the log fails as on any read that finds damage.

        Where a verify ends is recorded per stream-partition; ``since_last`` reads only the
        records written after that (the log is append-only: what was checked is never
        rewritten), so a start check costs what was written since the previous one, not the
        log's age. Damage that appears later in records already checked is found by the read
        that reaches them, as all damage after a start is, or by a full verify.

        RocksDB reads every block: a million records of ~250 bytes (34 MB) took 0.63 s on the
        2-core machine the benchmarks ran on (2 s a million at load 4-13)."""
        total = 0
        for stream in STREAMS:
            for partition in self._partitions():
                with self._signal.cond:
                    known = self._known_damage()
                    if known is not None:
                        raise known
                    if self._signal.closed:
                        raise CronlogError(f"event log {self._path} is closed")
                    start, end = self._starts[stream][partition], self._visible[stream][partition]
                    self._readers += 1
                try:
                    checked = _CHECKED + _STREAM_ID[stream]
                    if since_last:
                        start = max(start, min(end, self._meta_u64(checked, partition)))
                    total += self._check_pruning(stream, partition, start, end)
                    self._tables[_META].put(checked + _U32.pack(partition), _U64.pack(end))
                except LogCorrupted as found:
                    raise self._damaged(found) from None
                finally:
                    with self._signal.cond:
                        self._readers -= 1
                        if not self._readers:
                            self._no_readers.notify_all()
        return total

    @property
    def synced_batches(self) -> int:
        """How many synced ``WriteBatch``es were written: writes per batch measure group commit."""
        return self._synced_batches

    def submit(self, partition: int, value: bytes, key: bytes | None = None) -> int:
        self._check_partition(partition)
        [offset] = self._commit(
            _Submit(partition, bytes(value), None if key is None else bytes(key))
        )
        return offset

    def read_events(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        return self._read("events", partition, from_offset, max_records, timeout_s)

    def read_commands(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        return self._read("commands", partition, from_offset, max_records, timeout_s)

    def end_offset(self, stream: str, partition: int) -> int:
        self._check_stream(stream)
        self._check_partition(partition)
        with self._signal.cond:
            return self._visible[stream][partition]

    def start_offset(self, stream: str, partition: int) -> int:
        self._check_stream(stream)
        self._check_partition(partition)
        with self._signal.cond:
            return self._starts[stream][partition]

    def segments(self, stream: str, partition: int) -> list[Segment]:
        """The stream-partition's segments, oldest first; the last is the active one."""
        self._check_stream(stream)
        self._check_partition(partition)
        with self._signal.cond:
            return list(self._segments[stream][partition])

    def command_position(self, partition: int) -> int:
        """The next command offset the partition's owner will process: every command below
        it has been decided, so no owner needs it again."""
        self._check_partition(partition)
        return self._command_position(partition)

    def prune(self, stream: str, partition: int, before: int) -> int:
        """Remove the sealed segments wholly below ``before``, which must be where a segment
        starts (never the active one's end); returns the new start offset. Durable on return.
        The disk space comes back as RocksDB compacts the range, asked for here at once."""
        self._check_stream(stream)
        self._check_partition(partition)
        [start] = self._commit(_Prune(stream, partition, before))
        with self._signal.cond:
            if self._signal.closed:
                return start
            self._readers += 1
        try:
            self._tables[stream].compact_range(_KEY.pack(partition, 0), _KEY.pack(partition, start))
        finally:
            with self._signal.cond:
                self._readers -= 1
                if not self._readers:
                    self._signal.cond.notify_all()
        return start

    def close(self) -> None:
        """Finish queued writes, wake every waiter, wait for reads, then release the LOCK."""
        with self._queue_cond:
            if self._stopping:
                return
            self._stopping = True
            self._queue_cond.notify()
        self._committer.join()
        with self._signal.cond:
            self._signal.closed = True
            self._signal.changed()
            while self._readers:
                self._no_readers.wait()
        self._release_db()
        self._damage_seen.set()  # wakes wait_damaged: nothing more will be read

    def __enter__(self) -> EmbeddedLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- opening and closing -------------------------------------------------------------

    @staticmethod
    def _open_db(owner: EmbeddedLog, path: Path) -> Rdict:
        path.mkdir(parents=True, exist_ok=True)
        options = bounded(Options(raw_mode=True))
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        # The default, stated: recover the WAL up to the first torn record, a consistent prefix.
        options.set_wal_recovery_mode(DBRecoveryMode.point_in_time())
        # RocksDB's default, stated: refuse to open on damage it notices (missing files, ...).
        options.set_paranoid_checks(True)
        families = {name: bounded(Options(raw_mode=True)) for name in (*STREAMS, _META)}
        try:
            return open_store(owner, path, options=options, column_families=families)
        except Exception as exc:
            if "lock" in str(exc).lower():
                raise CronlogError(
                    f"event log {path} is already open (by another process, or another "
                    f"EmbeddedLog in this one); the embedded log has a single owner: {exc}"
                ) from exc
            if is_damage(exc):
                raise _rocksdb_damage(path, exc, None, None, None) from exc
            raise

    def _release_db(self) -> None:
        # Every handle must go before close(), or rocksdict keeps the LOCK.
        self._cf.clear()
        self._tables.clear()
        close_store(self._db)

    def _check_num_partitions(self) -> None:
        meta = self._tables[_META]
        stored = meta.get(_NUM_PARTITIONS)
        if stored is None:
            meta.put(_NUM_PARTITIONS, _U32.pack(self._num_partitions), self._sync)
            return
        (count,) = _U32.unpack(stored)
        if count != self._num_partitions:
            raise CronlogError(
                f"event log {self._path} has {count} partitions; it was opened with "
                f"num_partitions={self._num_partitions} (the count is fixed when a log is created)"
            )

    def _scan_end(self, stream: str, partition: int, recorded: int | None = None) -> int:
        """The offset after the last stored record of a stream-partition (its start when
        empty: 0, or where retention left it).
        ``recorded``: the end the log recorded, which names the record that cannot be read."""
        it = self._tables[stream].iter(checked_reads())
        it.seek_for_prev(_KEY.pack(partition, _MAX_OFFSET))
        last = it.key() if it.valid() else None
        error = iterator_error(it)
        del it  # a live iterator keeps the LOCK, and a traceback would keep it alive
        if error is not None:
            last_written = None if not recorded else recorded - 1
            raise _rocksdb_damage(self._path, error, stream, partition, last_written)
        start = self._starts[stream][partition]
        if last is None:
            return start
        found, offset = _KEY.unpack(last)
        return offset + 1 if found == partition else start

    def _checked_end(self, stream: str, partition: int) -> int:
        """The scanned end, which must be the end recorded with the last batch.

        A log written before the ``end`` keys existed has none yet: its scanned end is taken
        (and recorded with its next write)."""
        stored = self._tables[_META].get(_end_key(stream, partition))
        recorded = None if stored is None else int(_U64.unpack(stored)[0])
        end = self._scan_end(stream, partition, recorded)
        if recorded is not None and recorded != end:
            expected = recorded
            raise LogCorrupted(
                f"event log {self._path} is damaged: {stream} partition {partition} ends at "
                f"offset {end}, but {expected} records were written to it "
                + (
                    f"(offsets {end}..{expected - 1} are missing)"
                    if end < expected
                    else f"(offsets {expected}..{end - 1} were never written by the log)"
                ),
                stream=stream,
                partition=partition,
                offset=min(end, expected),
            )
        return end

    def _meta_u64(self, prefix: bytes, partition: int | None) -> int:
        key = prefix if partition is None else prefix + _U32.pack(partition)
        stored = self._tables[_META].get(key)
        return 0 if stored is None else int(_U64.unpack(stored)[0])

    def _load_segments(self, stream: str, partition: int) -> list[Segment]:
        """The stored segments; a log written before segments existed gets one segment over
        what it holds, stamped now (so time-based retention counts from its first start)."""
        prefix = _SEG + _STREAM_ID[stream] + _U32.pack(partition)
        it = self._tables[_META].iter(checked_reads())
        it.seek(prefix)
        found: list[Segment] = []
        while it.valid() and it.key().startswith(prefix):
            (first,) = _U64.unpack(it.key()[len(prefix) :])
            end, size, first_ms, last_ms = _SEG_VALUE.unpack(it.value())
            found.append(Segment(first, end, size, first_ms, last_ms))
            it.next()
        error = iterator_error(it)
        del it
        if error is not None:
            raise _rocksdb_damage(self._path, error, _META, None, None)
        start, end = self._starts[stream][partition], self._next[stream][partition]
        if not found and end > start:
            now = self._wall_ms()
            return [Segment(start, end, 0, now, now)]
        if found and (found[0].first != start or found[-1].end != end):
            raise LogCorrupted(
                f"event log {self._path} is damaged: {stream} partition {partition} holds "
                f"offsets {start}..{end - 1}, but its segments cover "
                f"{found[0].first}..{found[-1].end - 1}",
                stream=stream,
                partition=partition,
                offset=start,
            )
        return found

    def _grow(
        self, segments: list[Segment], at: int, offset: int, count: int, size: int, now: int
    ) -> int:
        """Add ``count`` records of ``size`` bytes in all from ``offset`` on (one append, which
        a segment takes whole: like Kafka's batches, an append is never split) to a partition's
        segments (a copy the committer owns); returns the index of the first segment this
        changed, given ``at``, the first changed so far in the batch."""
        last = segments[-1] if segments else None
        if (
            last is None
            or last.bytes >= self._segment_bytes
            or now - last.first_ms >= self._segment_ms
        ):
            segments.append(Segment(offset, offset + count, size, now, now))
        else:
            segments[-1] = Segment(
                last.first, offset + count, last.bytes + size, last.first_ms, now
            )
        return min(at, len(segments) - 1)

    def _damaged(self, damage: LogCorrupted) -> LogCorrupted:
        """Record the first damage found: from now on the log refuses reads and writes.
        Returns a fresh copy of it to raise."""
        with self._signal.cond:
            first = self._damage is None
            if first:
                self._damage = _copy(damage)  # no traceback: it would keep frames alive
            self._signal.changed()
        if first:  # the owner (serve) reports it, once, and stops
            self._damage_seen.set()
        return self._known_damage() or damage

    def _known_damage(self) -> LogCorrupted | None:
        return None if self._damage is None else _copy(self._damage)

    # -- writing: callers queue, the committer batches ----------------------------------

    def _commit(self, op: _Submit | _Append | _TakeOver | _Prune) -> list[int]:
        pending = _Pending(op)
        damage = self._known_damage()
        if damage is not None:
            raise damage
        with self._queue_cond:
            if self._stopping:
                raise CronlogError(f"event log {self._path} is closed")
            if self._failure is not None:
                raise CronlogError(f"event log {self._path} failed: {self._failure!r}")
            self._queue.append(pending)
            self._queue_cond.notify()
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.offsets

    def _run_committer(self) -> None:
        while True:
            with self._queue_cond:
                while not self._queue and not self._stopping:
                    self._queue_cond.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            try:
                self._write_batch(batch)
            except BaseException as exc:
                # A bug here must not leave callers waiting forever. Offsets may no longer
                # match the store, so the log stops taking writes (fail-stop) until reopened.
                with self._queue_cond:
                    self._failure = exc
                    batch += self._queue
                    self._queue = []
                for pending in batch:
                    if not pending.done.is_set():
                        pending.offsets = []
                        pending.error = CronlogError(f"event log {self._path} failed: {exc!r}")
                        pending.done.set()
                raise

    def _write_batch(self, batch: list[_Pending]) -> None:
        """Write every acceptable pending write in one synced batch; then publish and wake."""
        next_offsets = {s: list(ends) for s, ends in self._next.items()}
        epochs = list(self._epochs)
        positions = list(self._positions)
        starts = {s: list(firsts) for s, firsts in self._starts.items()}
        segments = {s: list(parts) for s, parts in self._segments.items()}  # copied when touched
        changed: dict[tuple[str, int], int] = {}  # first segment index written, per partition
        now = self._wall_ms()

        def grow(stream: str, partition: int, offset: int, count: int, size: int) -> None:
            key = (stream, partition)
            if key not in changed:
                segments[stream][partition] = list(segments[stream][partition])
            at = changed.get(key, len(segments[stream][partition]))
            changed[key] = self._grow(segments[stream][partition], at, offset, count, size, now)

        owner: object | None = None
        took_over = False
        wb = WriteBatch(raw_mode=True)
        accepted: list[_Pending] = []
        for pending in batch:
            match pending.op:
                case _Submit(partition, value, key):
                    offset = next_offsets["commands"][partition]
                    next_offsets["commands"][partition] = offset + 1
                    stored = _encode(value, key)
                    wb.put(_KEY.pack(partition, offset), stored, self._cf["commands"])
                    grow("commands", partition, offset, 1, len(stored) + _KEY_BYTES)
                    pending.offsets = [offset]
                case _Append(partition, epoch, events, through):
                    if epoch != epochs[partition]:
                        pending.error = Fenced(
                            f"writer of partition {partition} has epoch {epoch}, "
                            f"partition is at epoch {epochs[partition]}"
                        )
                        continue
                    first = next_offsets["events"][partition]
                    size = 0
                    for i, event in enumerate(events):
                        wb.put(_KEY.pack(partition, first + i), b"\x00" + event, self._cf["events"])
                        size += len(event)
                    if events:
                        grow(
                            "events",
                            partition,
                            first,
                            len(events),
                            size + len(events) * _EVENT_OVERHEAD,
                        )
                    next_offsets["events"][partition] = first + len(events)
                    pending.offsets = list(range(first, first + len(events)))
                    if through is not None:
                        positions[partition] = through
                        wb.put(_THROUGH + _U32.pack(partition), _U64.pack(through), self._cf[_META])
                case _TakeOver(partitions, member):
                    for partition in partitions:
                        epochs[partition] += 1
                        wb.put(
                            _EPOCH + _U32.pack(partition),
                            _U64.pack(epochs[partition]),
                            self._cf[_META],
                        )
                    pending.offsets = [epochs[p] for p in partitions]
                    took_over = True
                    if member is not None:
                        owner = member
                case _Prune(stream, partition, before):
                    kept = segments[stream][partition]
                    start = starts[stream][partition]
                    if before <= start:
                        pending.offsets = [start]
                        continue
                    firsts = [segment.first for segment in kept[1:]]
                    if before not in firsts:
                        pending.error = ValueError(
                            f"cannot prune {stream} partition {partition} before offset {before}:"
                            f" not where a sealed segment ends (segments start at "
                            f"{[start, *firsts]}; the active one is never pruned)"
                        )
                        continue
                    cut = firsts.index(before) + 1
                    cf = self._cf[stream]
                    wb.delete_range(_KEY.pack(partition, start), _KEY.pack(partition, before), cf)
                    for gone in kept[:cut]:
                        wb.delete(_segment_key(stream, partition, gone.first), self._cf[_META])
                    wb.put(_start_key(stream, partition), _U64.pack(before), self._cf[_META])
                    segments[stream][partition] = kept[cut:]
                    starts[stream][partition] = before
                    if (stream, partition) in changed:  # indexes moved down with the cut
                        changed[stream, partition] = max(0, changed[stream, partition] - cut)
                    pending.offsets = [before]
            accepted.append(pending)
        for stream, ends in next_offsets.items():
            for partition, end in enumerate(ends):
                if end != self._next[stream][partition]:
                    wb.put(_end_key(stream, partition), _U64.pack(end), self._cf[_META])
        for (stream, partition), at in changed.items():
            for segment in segments[stream][partition][at:]:
                wb.put(
                    _segment_key(stream, partition, segment.first),
                    _SEG_VALUE.pack(segment.end, segment.bytes, segment.first_ms, segment.last_ms),
                    self._cf[_META],
                )
        try:
            if not wb.is_empty():
                # Written, then the WAL synced: durable on return as a synced write is, but
                # rocksdict holds the GIL through a synced write's fsync (every thread of the
                # node stopped for it), and releases it through flush_wal's.
                self._db.write(wb, self._unsynced)
                self._db.flush_wal(True)
                self._synced_batches += 1
        except Exception as exc:
            for pending in accepted:
                pending.offsets = []
                pending.error = CronlogError(f"write to event log {self._path} failed: {exc}")
                pending.error.__cause__ = exc
        else:
            moved = [
                (stream, partition)
                for stream, ends in next_offsets.items()
                for partition, end in enumerate(ends)
                if end != self._next[stream][partition]
            ]
            with self._signal.cond:
                self._next, self._epochs, self._positions = next_offsets, epochs, positions
                self._starts, self._segments = starts, segments
                self._visible = {s: list(ends) for s, ends in next_offsets.items()}
                if owner is not None:
                    self._signal.owner = owner
                self._signal.changed(None if took_over else moved)
        for pending in batch:
            pending.done.set()

    def _open_writers(
        self, partitions: Iterable[int], member: object | None
    ) -> dict[int, PartitionWriter]:
        taken = tuple(sorted(set(partitions)))
        for partition in taken:
            self._check_partition(partition)
        epochs = self._commit(_TakeOver(taken, member))
        return {p: EmbeddedWriter(self, p, e) for p, e in zip(taken, epochs, strict=True)}

    def _command_position(self, partition: int) -> int:
        with self._signal.cond:
            return self._positions[partition]

    # -- reading --------------------------------------------------------------------------

    def _read(
        self, stream: str, partition: int, from_offset: int, max_records: int, timeout_s: float
    ) -> list[Record]:
        self._check_stream(stream)
        self._check_partition(partition)
        from_offset = max(from_offset, 0)
        deadline = time.monotonic() + timeout_s
        with self._signal.cond:
            while True:
                if self._signal.closed:
                    raise CronlogError(f"event log {self._path} is closed")
                known = self._known_damage()
                if known is not None:
                    raise known
                start = self._starts[stream][partition]
                if from_offset < start:
                    raise self._pruned(stream, partition, from_offset, start)
                end = self._visible[stream][partition]
                if end > from_offset:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._signal.stream(stream, partition).wait(remaining)
            self._readers += 1
        try:
            return self._scan(stream, partition, from_offset, end, max_records)
        except LogCorrupted as found:
            with self._signal.cond:
                start = self._starts[stream][partition]
            if from_offset < start:  # pruned while the scan ran: not damage
                raise self._pruned(stream, partition, from_offset, start) from None
            raise self._damaged(found) from None
        finally:
            with self._signal.cond:
                self._readers -= 1
                if not self._readers:
                    self._no_readers.notify_all()

    def _scan(
        self, stream: str, partition: int, from_offset: int, end: int, max_records: int
    ) -> list[Record]:
        """Records in [from_offset, end): end is published only after its batch was synced.

        Every offset in the range is there (offsets are contiguous), so anything short of
        ``min(end - from_offset, max_records)`` records, in order, is damage."""
        read_options = checked_reads()
        read_options.set_iterate_upper_bound(_KEY.pack(partition, end))
        it: Any = self._tables[stream].iter(read_options)
        it.seek(_KEY.pack(partition, from_offset))
        records: list[Record] = []
        expected = from_offset
        problem: LogCorrupted | None = None
        while it.valid() and len(records) < max_records:
            key = it.key()
            found, offset = _KEY.unpack(key) if len(key) == _KEY.size else (-1, -1)
            if found != partition or offset != expected:
                problem = LogCorrupted(
                    f"event log {self._path} is damaged: {stream} partition {partition} has no "
                    f"record at offset {expected} (the next key is {key.hex()})",
                    stream=stream,
                    partition=partition,
                    offset=expected,
                )
                break
            try:
                records.append(_unframe(self._path, stream, partition, offset, it.value()))
            except LogCorrupted as bad:
                problem = bad
                break
            expected += 1
            it.next()
        error = iterator_error(it)
        del it  # before raising: a traceback would keep the iterator, and so the LOCK
        if problem is not None:
            raise problem
        if error is not None:
            raise _rocksdb_damage(self._path, error, stream, partition, expected)
        if len(records) < max_records and expected < end:
            raise LogCorrupted(
                f"event log {self._path} is damaged: {stream} partition {partition} ends at "
                f"offset {expected}, but it holds records up to {end - 1} "
                f"(offsets {expected}..{end - 1} are missing)",
                stream=stream,
                partition=partition,
                offset=expected,
            )
        return records

    def _pruned(self, stream: str, partition: int, offset: int, start: int) -> Pruned:
        return Pruned(
            f"event log {self._path}: {stream} partition {partition} starts at offset {start} "
            f"(retention pruned what was before it); offset {offset} is in the archive, if any",
            stream=stream,
            partition=partition,
            start=start,
        )

    def _check_pruning(self, stream: str, partition: int, start: int, end: int) -> int:
        """:meth:`_check` over ``[start, end)`` while retention may prune the front: a gap
        where the start has moved past is the prune, not damage, and the check goes on from
        the new start (how many records it counts is then what is left of the range)."""
        while True:
            try:
                return self._check(stream, partition, start, end)
            except LogCorrupted as found:
                with self._signal.cond:
                    now = self._starts[stream][partition]
                if found.offset is None or found.offset >= now or now <= start:
                    raise
                start = min(now, end)

    def _check(self, stream: str, partition: int, start: int, end: int) -> int:
        """:meth:`_scan`'s checks over ``[start, end)``, one iterator, no records made; returns
        how many records there are."""
        read_options = checked_reads()
        read_options.set_iterate_upper_bound(_KEY.pack(partition, end))
        it: Any = self._tables[stream].iter(read_options)
        it.seek(_KEY.pack(partition, start))
        expected = start
        problem: LogCorrupted | None = None
        while it.valid():
            key, value = it.key(), it.value()
            if key != _KEY.pack(partition, expected):
                problem = LogCorrupted(
                    f"event log {self._path} is damaged: {stream} partition {partition} has no "
                    f"record at offset {expected} (the next key is {key.hex()})",
                    stream=stream,
                    partition=partition,
                    offset=expected,
                )
                break
            if value[:1] != b"\x00":  # the common frame; anything else is checked in full
                try:
                    _unframe(self._path, stream, partition, expected, value)
                except LogCorrupted as bad:
                    problem = bad
                    break
            expected += 1
            it.next()
        error = iterator_error(it)
        del it  # before raising: a traceback would keep the iterator, and so the LOCK
        if problem is not None:
            raise problem
        if error is not None:
            raise _rocksdb_damage(self._path, error, stream, partition, expected)
        if expected < end:
            raise LogCorrupted(
                f"event log {self._path} is damaged: {stream} partition {partition} ends at "
                f"offset {expected}, but it holds records up to {end - 1} "
                f"(offsets {expected}..{end - 1} are missing)",
                stream=stream,
                partition=partition,
                offset=expected,
            )
        return expected - start

    # -- checks ---------------------------------------------------------------------------

    def _partitions(self) -> range:
        return range(self._num_partitions)

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self._num_partitions:
            raise ValueError(f"partition {partition} is out of range 0..{self._num_partitions - 1}")

    @staticmethod
    def _check_stream(stream: str) -> None:
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}; expected one of {STREAMS}")
