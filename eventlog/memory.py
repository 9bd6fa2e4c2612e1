"""The in-memory reference adapter of the log port, and the single-node membership.

``MemoryLog`` keeps every stream-partition as a list guarded by one condition variable: an
append is "durable" the moment it returns (the process is the whole world), readers wait on
the condition, and fencing compares a writer's epoch with the partition's current one. It is
the adapter the node's unit tests run against, so it is strict where Kafka is: with
``gaps=True`` every append leaves one unused offset behind it, as a Kafka transaction marker
does, so code that assumes contiguous offsets fails here first.

``SingleNodeMembership`` is shared with the embedded log. An in-process log has one node, so
the newest member takes every partition: its first ``poll`` opens a writer per partition
(fencing the previous member's writers), and the previous member, on its next ``poll``,
learns it lost them through ``revoked``. That is exactly a zombie node being replaced.

Both logs also open writers a partition at a time (:meth:`SingleProcessLog.take_over`), for a
group of several members sharing the partitions (``eventlog.group``, which the local log
server runs for a node's worker processes).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from core.errors import CronlogError, Fenced
from eventlog.mailbox import LocalMailbox, LocalPostOffice
from eventlog.port import NO_OUTBOUND, Outbound, OwnershipListener, PartitionWriter, Record

STREAMS = ("commands", "events")


class ChangeSignal:
    """The condition variables that in-process readers and pollers wait on, over one lock.

    ``version`` grows on every commit, takeover and close, so a waiter that noted it before
    reading cannot miss a change that lands between its read and its wait. ``cond`` wakes on
    every change (pollers of several partitions wait there); a reader of one stream-partition
    waits on :meth:`stream` instead, woken only when that stream-partition moved (or on a
    change of everything: a takeover, a close, damage), so a commit to one partition does not
    wake the readers of all the others.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self._streams: dict[tuple[str, int], threading.Condition] = {}
        self.version = 0
        self.owner: object | None = None
        self.closed = False

    def stream(self, stream: str, partition: int) -> threading.Condition:
        """The condition of one stream-partition's readers; the caller holds ``cond``."""
        key = (stream, partition)
        cond = self._streams.get(key)
        if cond is None:
            cond = self._streams[key] = threading.Condition(self.lock)
        return cond

    def changed(self, moved: Iterable[tuple[str, int]] | None = None) -> None:
        """Publish a change of the stream-partitions ``moved`` (``None``: of everything); the
        caller holds ``cond``."""
        self.version += 1
        self.cond.notify_all()
        if moved is None:
            for cond in self._streams.values():
                cond.notify_all()
            return
        for key in moved:
            readers = self._streams.get(key)
            if readers is not None:
                readers.notify_all()

    def wait_for_change(self, seen: int, deadline: float) -> bool:
        """Wait until ``version`` moves past ``seen``; False once ``deadline`` has passed."""
        with self.cond:
            while self.version == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(remaining)
            return True


class SingleNodeMembership:
    """The only member of an in-process log's group: owns every partition until replaced.

    ``take_over(member)`` opens a writer per partition, fencing the earlier ones, and makes
    ``member`` the signal's owner in the same step; ``read_commands(partition, from_offset,
    max_records)`` reads committed commands. Commands are returned once per membership: a
    cursor per partition starts at the writer's recorded command position and advances past
    every record handed out.
    """

    def __init__(
        self,
        listener: OwnershipListener,
        signal: ChangeSignal,
        take_over: Callable[[object], dict[int, PartitionWriter]],
        read_commands: Callable[[int, int, int], list[Record]],
    ) -> None:
        self._listener = listener
        self._signal = signal
        self._take_over = take_over
        self._read_commands = read_commands
        self._lock = threading.Lock()
        self._state = "joining"  # -> "owning" -> "replaced" | "closed"
        self._writers: dict[int, PartitionWriter] = {}
        self._cursors: dict[int, int] = {}
        self._next_first = 0  # round-robin start, so one busy partition cannot starve others

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Record]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._follow_ownership()
            with self._signal.cond:
                if self._signal.closed:
                    raise CronlogError("the event log was closed under this membership")
                seen = self._signal.version
            records = self._fetch(max_records)
            if records:
                return records
            if not self._signal.wait_for_change(seen, deadline):
                return []

    def writer(self, partition: int) -> PartitionWriter:
        with self._lock:
            writer = self._writers.get(partition)
        if writer is None:
            raise Fenced(f"partition {partition} is not owned by this member")
        return writer

    def owned(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._writers)

    def others(self, timeout_s: float) -> int | None:
        return None  # tests' in-process members: a stop drains first, as a node alone does

    def renew(self, partition: int) -> PartitionWriter:
        # The only writer of an in-process log fails only once another member replaced this
        # one, and then the partition is not owned here any more.
        return self.writer(partition)

    def close(self) -> None:
        with self._lock:
            if self._state == "closed":
                return
            lost = self._drop_writers()
            self._state = "closed"
        if lost:
            self._listener.revoked(lost)
        with self._signal.cond:
            if self._signal.owner is self:
                self._signal.owner = None

    def _follow_ownership(self) -> None:
        """Take every partition on the first poll; give them up once a newer member took them."""
        with self._lock:
            state = self._state
        if state == "closed":
            raise CronlogError("poll on a closed membership")
        if state == "joining":
            writers = self._take_over(self)
            cursors = {p: w.command_position() for p, w in writers.items()}
            with self._lock:
                self._writers, self._cursors, self._state = writers, cursors, "owning"
            self._listener.assigned(sorted(writers))
        elif state == "owning":
            with self._signal.cond:
                replaced = self._signal.owner is not self
            if replaced:
                with self._lock:
                    lost = self._drop_writers()
                    self._state = "replaced"
                self._listener.revoked(lost)

    def _drop_writers(self) -> list[int]:
        lost = sorted(self._writers)
        for writer in self._writers.values():
            writer.close()
        self._writers, self._cursors = {}, {}
        return lost

    def _fetch(self, max_records: int) -> list[Record]:
        with self._lock:
            cursors = dict(self._cursors)
        if not cursors:
            return []
        partitions = sorted(cursors)
        start = self._next_first % len(partitions)
        self._next_first += 1
        records: list[Record] = []
        for partition in partitions[start:] + partitions[:start]:
            if len(records) >= max_records:
                break
            got = self._read_commands(partition, cursors[partition], max_records - len(records))
            if got:
                records.extend(got)
                cursors[partition] = got[-1].offset + 1
        with self._lock:
            # A membership replaced meanwhile keeps no cursors; do not resurrect them.
            for partition in self._cursors:
                self._cursors[partition] = cursors[partition]
        return records


class MemoryWriter:
    def __init__(self, log: MemoryLog, partition: int, epoch: int) -> None:
        self._log = log
        self._partition = partition
        self._epoch = epoch
        self._closed = False

    @property
    def partition(self) -> int:
        return self._partition

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
        if commands_through is not None and commands_through < 0:
            raise ValueError(f"commands_through {commands_through} is not an offset")
        return self._log._append(self._partition, self._epoch, events, commands_through)

    def wait_until_readable(self) -> None:
        pass  # readable when append returned

    def command_position(self) -> int:
        return self._log._command_position(self._partition)

    def close(self) -> None:
        self._closed = True


class _Stream:
    """One stream-partition: records in offset order and the offset the next one gets."""

    __slots__ = ("next_offset", "offsets", "records")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.offsets: list[int] = []
        self.next_offset = 0


class SingleProcessLog:
    """What a log whose only node is this process gives that node: every partition (through
    :class:`SingleNodeMembership`) and in-process mailboxes. Shared by the memory and embedded
    logs."""

    _post_office: LocalPostOffice
    _signal: ChangeSignal
    _num_partitions: int

    @property
    def change_signal(self) -> ChangeSignal:
        """What moves on every commit, takeover and close: what a poller of several partitions
        waits on (the single-node membership here, ``eventlog.group``'s members)."""
        return self._signal

    def take_over(self, partitions: Sequence[int]) -> dict[int, PartitionWriter]:
        """Open a writer of each of ``partitions`` at a new epoch, fencing every earlier writer
        of them at once (invariant 4), in one step; the other partitions' writers stay. A
        member of a group that shares the partitions takes them this way as they move to it;
        it does not change which :class:`SingleNodeMembership` owns the log."""
        return self._open_writers(partitions, None)

    def _take_over(self, member: object) -> dict[int, PartitionWriter]:
        """Every partition, for ``member``, which becomes the signal's owner in the same step."""
        return self._open_writers(range(self._num_partitions), member)

    def _open_writers(
        self, partitions: Iterable[int], member: object | None
    ) -> dict[int, PartitionWriter]:
        raise NotImplementedError

    def read_commands(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        raise NotImplementedError

    def send_reply(self, node_id: str, value: bytes) -> None:
        self._post_office.send(node_id, value)

    def mailbox(self, node_id: str) -> LocalMailbox:
        return self._post_office.open(node_id)

    def join(self, listener: OwnershipListener) -> SingleNodeMembership:
        return SingleNodeMembership(
            listener,
            self._signal,
            self._take_over,
            lambda partition, offset, limit: self.read_commands(partition, offset, limit),
        )


class MemoryLog(SingleProcessLog):
    """``MemoryLog(num_partitions, gaps=False)``: the log port, in memory, thread-safe."""

    def __init__(self, num_partitions: int, *, gaps: bool = False) -> None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
        self._num_partitions = num_partitions
        self._gap = 1 if gaps else 0
        self._signal = ChangeSignal()
        self._post_office = LocalPostOffice()
        self._streams = {name: [_Stream() for _ in range(num_partitions)] for name in STREAMS}
        self._epochs = [0] * num_partitions
        self._positions = [0] * num_partitions

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def submit(self, partition: int, value: bytes, key: bytes | None = None) -> int:
        self._check_partition(partition)
        with self._signal.cond:
            self._check_open()
            [offset] = self._add("commands", partition, [value], key)
            self._signal.changed([("commands", partition)])
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
        self._check_partition(partition)
        with self._signal.cond:
            return self._stream(stream, partition).next_offset

    def start_offset(self, stream: str, partition: int) -> int:
        """The in-memory log keeps everything: its first record's offset (0 for the first)."""
        self._check_partition(partition)
        with self._signal.cond:
            s = self._stream(stream, partition)
            return s.offsets[0] if s.offsets else s.next_offset

    def close(self) -> None:
        with self._signal.cond:
            self._signal.closed = True
            self._signal.changed()

    def __enter__(self) -> MemoryLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _append(
        self,
        partition: int,
        epoch: int,
        events: Sequence[bytes],
        commands_through: int | None,
    ) -> list[int]:
        with self._signal.cond:
            self._check_open()
            if epoch != self._epochs[partition]:
                raise Fenced(
                    f"writer of partition {partition} has epoch {epoch}, "
                    f"partition is at epoch {self._epochs[partition]}"
                )
            offsets = self._add("events", partition, events, None)
            if commands_through is not None:
                self._positions[partition] = commands_through
            self._signal.changed([("events", partition)])
            return offsets

    def _command_position(self, partition: int) -> int:
        with self._signal.cond:
            return self._positions[partition]

    def _open_writers(
        self, partitions: Iterable[int], member: object | None
    ) -> dict[int, PartitionWriter]:
        partitions = sorted(set(partitions))
        for partition in partitions:
            self._check_partition(partition)
        with self._signal.cond:
            self._check_open()
            for partition in partitions:
                self._epochs[partition] += 1
            if member is not None:
                self._signal.owner = member
            self._signal.changed()
            return {p: MemoryWriter(self, p, self._epochs[p]) for p in partitions}

    def _add(
        self, stream: str, partition: int, values: Sequence[bytes], key: bytes | None
    ) -> list[int]:
        """Append under the lock; the caller publishes the change."""
        s = self._streams[stream][partition]
        offsets = []
        for value in values:
            offset = s.next_offset
            s.records.append(Record(partition, offset, bytes(value), key))
            s.offsets.append(offset)
            s.next_offset = offset + 1
            offsets.append(offset)
        if offsets:
            s.next_offset += self._gap
        return offsets

    def _read(
        self, stream: str, partition: int, from_offset: int, max_records: int, timeout_s: float
    ) -> list[Record]:
        self._check_partition(partition)
        s = self._stream(stream, partition)
        deadline = time.monotonic() + timeout_s
        with self._signal.cond:
            moved = self._signal.stream(stream, partition)
            while True:
                self._check_open()
                start = bisect.bisect_left(s.offsets, from_offset)
                if start < len(s.records):
                    return s.records[start : start + max_records]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                moved.wait(remaining)

    def _stream(self, stream: str, partition: int) -> _Stream:
        if stream not in self._streams:
            raise ValueError(f"unknown stream {stream!r}; expected one of {STREAMS}")
        return self._streams[stream][partition]

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self._num_partitions:
            raise ValueError(f"partition {partition} is out of range 0..{self._num_partitions - 1}")

    def _check_open(self) -> None:
        if self._signal.closed:
            raise CronlogError("the in-memory event log is closed")
