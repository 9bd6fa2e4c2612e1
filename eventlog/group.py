"""Several members sharing an in-process log's partitions: the group the local log server runs.

:class:`eventlog.memory.SingleNodeMembership` gives the newest member every partition, which is
right for the one node of a process. A node of several processes has one log (the embedded log
in the parent, served by :mod:`eventlog.log_server`) and several members (its workers), which
share the partitions as nodes share them on Kafka. :class:`Group` is that sharing; members are
named by handles the server hands to its clients, and nothing here knows about sockets.

**Assignment: round robin over the live members sorted by member id.** Partition ``p`` goes to
member ``p mod m`` of the ``m`` live members in id order. It is a function of the member set
alone, so every member could compute it; it is even (counts differ by at most one); and it is
recomputed whenever a member joins, leaves or expires. Eight partitions::

    {a, b}        a: 0 2 4 6      b: 1 3 5 7
    c joins       a: 0 3 6        b: 1 4 7      c: 2 5
    b leaves      a: 0 2 4 6      c: 1 3 5 7

It is not sticky: a change of the member set moves most partitions (c joining above moves six
of eight, where two would do). Members change when a worker starts, stops or hangs, rarely,
and a move costs a recovery from the partition's state store, which is local to the machine.

**Moves happen inside polls** (invariant 6). The group keeps the target assignment; a member's
:meth:`Group.poll` brings it up to date and says what changed, revocations first: a partition
it lost has its writer closed (its next append raises ``Fenced``), and a partition it gained is
taken over (:meth:`SingleProcessLog.take_over`: a writer at a new epoch, which fences whoever
wrote it before, whether or not that member has polled since). The gained partition's command
cursor is the position recorded with its events, read after the takeover, so it is final: a
command is decided once across the move (invariant 5). A change of a member's target wakes its
waiting poll, so the new owner takes over promptly and the old one hears promptly.

**A member leaves** by :meth:`Group.leave` (its client closed the membership, or its session
connection closed: the server calls it), by being **replaced** (a join under a member id
already in the group replaces that member at once, as Kafka's static membership does: a worker
restarted under its id takes its share without waiting out its predecessor's session), or by
**expiring**: a member that has not polled for ``session_timeout_s`` (a worker stopped with
SIGSTOP, a poller thread wedged) loses its partitions, its writers are closed, and the others
take them. When it polls again it hears ``revoked`` for everything and rejoins, as a Kafka
consumer past ``max.poll.interval.ms`` does; an append it makes first raises ``Fenced``.

Expiry needs no thread of its own: it is checked at every join, poll and append, and a waiting
poll wakes at the next member's expiry. A member matters only to the members that would take
its partitions, and those are the ones polling.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from core.errors import CronlogError, Fenced
from eventlog.memory import ChangeSignal
from eventlog.port import EventLog, PartitionWriter, Record

DEFAULT_SESSION_TIMEOUT_S = 10.0


class InProcessLog(EventLog, Protocol):
    """A log whose writers live in this process (:class:`eventlog.memory.MemoryLog`,
    :class:`eventlog.embedded.EmbeddedLog`): an append is readable when it returns."""

    @property
    def change_signal(self) -> ChangeSignal: ...

    def take_over(self, partitions: Sequence[int]) -> dict[int, PartitionWriter]: ...


@dataclass(eq=False)
class _Member:
    handle: int
    member_id: str
    last_seen: float
    state: Literal["live", "expired", "replaced"] = "live"
    polling: int = 0  # polls in progress: a member waiting in a poll is not idle
    told: dict[int, int] = field(default_factory=dict)  # partition -> its writer's token
    cursors: dict[int, int] = field(default_factory=dict)  # partition -> next command offset
    next_first: int = 0  # where the next fetch starts, so a busy partition starves no other


@dataclass(eq=False)
class _Slot:
    """The writer of one partition last opened, and the member it was opened for."""

    token: int
    writer: PartitionWriter
    holder: int | None  # None once revoked, left or expired


@dataclass(frozen=True, slots=True)
class Polled:
    """What a poll brought: partitions lost, partitions gained (with their writers' tokens),
    commands, and ``gone`` when this member will never own anything again (replaced, left)."""

    revoked: list[int]
    assigned: dict[int, int]
    records: list[Record]
    gone: bool = False


class Group:
    """``Group(log, session_timeout_s=10.0)``: the members sharing ``log``'s partitions.

    Thread-safe. A member is a handle from :meth:`join`; writers are tokens from a poll."""

    def __init__(
        self,
        log: InProcessLog,
        *,
        session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if session_timeout_s <= 0:
            raise ValueError(f"session_timeout_s must be positive, got {session_timeout_s}")
        self._log = log
        self._signal = log.change_signal
        self._session_timeout_s = session_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._members: dict[int, _Member] = {}
        self._target: dict[int, int] = {}  # partition -> member handle
        self._slots: dict[int, _Slot] = {}
        self._handles = itertools.count(1)
        self._tokens = itertools.count(1)
        self._closed = False

    @property
    def session_timeout_s(self) -> float:
        return self._session_timeout_s

    def assignment(self) -> dict[str, list[int]]:
        """The target assignment: member id -> its partitions (for logs and tests)."""
        with self._lock:
            out: dict[str, list[int]] = {
                m.member_id: [] for m in self._members.values() if m.state == "live"
            }
            for partition, handle in sorted(self._target.items()):
                out[self._members[handle].member_id].append(partition)
            return out

    def join(self, member_id: str) -> int:
        """Add a member; one already in the group under ``member_id`` is replaced."""
        if not member_id:
            raise ValueError("a member id must not be empty")
        with self._lock:
            self._check_open()
            now = self._clock()
            self._expire_idle(now)
            for member in self._members.values():
                if member.member_id == member_id and member.state != "replaced":
                    member.state = "replaced"
                    self._close_writers_of(member.handle)
            handle = next(self._handles)
            self._members[handle] = _Member(handle, member_id, now)
            self._rebalance()
            return handle

    def leave(self, handle: int) -> None:
        """The member is gone: its writers close and its partitions go to the others."""
        with self._lock:
            member = self._members.pop(handle, None)
            if member is None:
                return
            self._close_writers_of(handle)
            if member.state == "live":
                self._rebalance()

    def poll(self, handle: int, timeout_s: float, max_records: int = 500) -> Polled:
        """Bring the member's partitions up to date, then return commands from its cursors,
        waiting up to ``timeout_s`` for some (or for its partitions to change)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            member = self._members.get(handle)
            if member is None:
                return Polled([], {}, [], gone=True)
            # Back from a silence longer than its session (nobody else polled to notice)?
            # Then it has expired all the same: it hears so below and rejoins.
            self._expire_idle(self._clock())
            member.polling += 1
            member.last_seen = self._clock()
        revoked: list[int] = []
        assigned: dict[int, int] = {}
        try:
            while True:
                with self._signal.cond:
                    if self._signal.closed:
                        raise CronlogError("the event log was closed under this group")
                    seen = self._signal.version
                with self._lock:
                    self._check_open()
                    now = self._clock()
                    self._expire_idle(now)
                    if member.state == "replaced" or self._members.get(handle) is not member:
                        revoked += sorted(member.told)
                        member.told.clear()
                        member.cursors.clear()
                        return Polled(revoked, {}, [], gone=True)
                    if member.state == "expired":  # back after its session ran out: rejoin
                        revoked += sorted(member.told)
                        member.told.clear()
                        member.cursors.clear()
                        member.state = "live"
                        self._rebalance()
                    lost, gained = self._catch_up(member)
                    revoked += lost
                    assigned.update(gained)
                    told = dict(member.told)
                    cursors = dict(member.cursors)
                    first = member.next_first
                    member.next_first += 1
                    wake_at = self._next_expiry(handle)
                records, moved = _fetch(self._log, cursors, first, max_records)
                if moved:
                    with self._lock:
                        for partition, cursor in moved.items():
                            # Moved meanwhile (another poll of this member): keep its cursor.
                            if member.told.get(partition) == told[partition]:
                                member.cursors[partition] = cursor
                if records or revoked or assigned:
                    return Polled(revoked, assigned, records)
                until = deadline if wake_at is None else min(deadline, wake_at)
                if not self._signal.wait_for_change(seen, until) and until >= deadline:
                    return Polled([], {}, [])
        finally:
            with self._lock:
                member.polling -= 1
                member.last_seen = self._clock()

    def append(
        self,
        partition: int,
        token: int,
        events: Sequence[bytes],
        commands_through: int | None,
    ) -> list[int]:
        """Append with the writer ``token`` names; ``Fenced`` once it is not the partition's."""
        with self._lock:
            slot = self._slots.get(partition)
            if slot is None or slot.token != token:
                raise Fenced(f"writer of partition {partition} was replaced by a newer one")
            if slot.holder is not None:  # a holder back from a long silence is fenced here
                self._expire_idle(self._clock())
            writer = slot.writer
        return writer.append(events, commands_through=commands_through)

    def wait_until_readable(self, partition: int, token: int) -> None:
        with self._lock:
            slot = self._slots.get(partition)
        if slot is not None and slot.token == token:
            slot.writer.wait_until_readable()

    def command_position(self, partition: int) -> int:
        """The partition's recorded command position (whichever writer asks)."""
        with self._lock:
            slot = self._slots.get(partition)
        if slot is None:
            raise Fenced(f"partition {partition} has had no writer in this group")
        return slot.writer.command_position()

    def close_writer(self, partition: int, token: int) -> None:
        with self._lock:
            slot = self._slots.get(partition)
            if slot is not None and slot.token == token:
                slot.writer.close()

    def renew(self, handle: int, partition: int) -> int:
        """A new writer of a partition the member still owns (fencing its old one); its token."""
        with self._lock:
            self._check_open()
            member = self._members.get(handle)
            if (
                member is None
                or member.state != "live"
                or partition not in member.told
                or self._target.get(partition) != handle
            ):
                raise Fenced(f"partition {partition} is not owned by this member")
            [token] = self._open(member, [partition]).values()
            return token

    def close(self) -> None:
        """Stop: every writer closes, and waiting polls wake and raise."""
        with self._lock:
            self._closed = True
            for slot in self._slots.values():
                slot.writer.close()
                slot.holder = None
        self._publish()

    # -- under the lock ----------------------------------------------------------------------

    def _catch_up(self, member: _Member) -> tuple[list[int], dict[int, int]]:
        """Give up what the target took from ``member``, then take what it gave."""
        mine = {p for p, handle in self._target.items() if handle == member.handle}
        lost = sorted(set(member.told) - mine)
        for partition in lost:
            token = member.told.pop(partition)
            member.cursors.pop(partition, None)
            slot = self._slots.get(partition)
            if slot is not None and slot.token == token:
                slot.writer.close()
                slot.holder = None
        gained = sorted(mine - set(member.told))
        return lost, self._open(member, gained) if gained else {}

    def _open(self, member: _Member, partitions: list[int]) -> dict[int, int]:
        """Take ``partitions`` over for ``member`` (one step in the log, which fences their
        earlier writers); their cursors start at the positions recorded, final from here."""
        writers = self._log.take_over(partitions)
        tokens: dict[int, int] = {}
        for partition in partitions:
            old = self._slots.get(partition)
            if old is not None:
                old.writer.close()
            writer = writers[partition]
            token = next(self._tokens)
            self._slots[partition] = _Slot(token, writer, member.handle)
            member.told[partition] = token
            member.cursors.setdefault(partition, writer.command_position())
            tokens[partition] = token
        return tokens

    def _expire_idle(self, now: float) -> None:
        expired = [
            m
            for m in self._members.values()
            if m.state == "live" and not m.polling and now - m.last_seen > self._session_timeout_s
        ]
        for member in expired:
            member.state = "expired"
            self._close_writers_of(member.handle)
        if expired:
            self._rebalance()

    def _next_expiry(self, handle: int) -> float | None:
        """When the next other idle member expires (on this poll's clock), if any does."""
        idle = [
            m.last_seen
            for m in self._members.values()
            if m.handle != handle and m.state == "live" and not m.polling
        ]
        if not idle:
            return None
        return time.monotonic() + max(0.0, min(idle) + self._session_timeout_s - self._clock())

    def _close_writers_of(self, handle: int) -> None:
        for slot in self._slots.values():
            if slot.holder == handle:
                slot.writer.close()
                slot.holder = None

    def _rebalance(self) -> None:
        live = sorted(
            (m for m in self._members.values() if m.state == "live"),
            key=lambda m: (m.member_id, m.handle),
        )
        num_partitions = self._log.num_partitions
        self._target = (
            {p: live[p % len(live)].handle for p in range(num_partitions)} if live else {}
        )
        self._publish()

    def _publish(self) -> None:
        """Wake every waiting poll: the group changed (the log's own readers stay asleep)."""
        with self._signal.cond:
            self._signal.changed([])

    def _check_open(self) -> None:
        if self._closed:
            raise CronlogError("the log server's group is closed")


def _fetch(
    log: EventLog, cursors: dict[int, int], first: int, max_records: int
) -> tuple[list[Record], dict[int, int]]:
    """Commands from ``cursors``, partitions taken round robin from the ``first``-th; returns
    the records and the cursors that moved."""
    if not cursors:
        return [], {}
    partitions = sorted(cursors)
    start = first % len(partitions)
    records: list[Record] = []
    moved: dict[int, int] = {}
    for partition in partitions[start:] + partitions[:start]:
        if len(records) >= max_records:
            break
        got = log.read_commands(partition, cursors[partition], max_records - len(records))
        if got:
            records.extend(got)
            moved[partition] = got[-1].offset + 1
    return records, moved
