"""The log port: cronlog's only source of truth.

The log is partitioned. Each partition has two streams:

``commands``
    Requests from the API and other nodes ("register this job", "complete this run with
    token 7"). Anyone may append (:meth:`EventLog.submit`); an append that returned is durable.

``events``
    Accepted facts, decided by the partition's owner. Exactly one writer per partition at a
    time. This stream is the audit stream: consumers outside cronlog read it.

Invariants every adapter keeps (the contract suite in ``tests/eventlog`` checks them):

1. **Durable on return.** ``submit`` and ``PartitionWriter.append`` return only once the records
   survive a crash of the process (embedded: the RocksDB WAL is synced; Kafka: ``acks=all`` and
   the transaction committed).
2. **Offsets behave as Kafka's.** Within a stream-partition, offsets strictly increase in append
   order; they need not be contiguous (Kafka's transaction markers take offsets). Readers resume
   from "last offset seen + 1".
3. **Readers see only committed records**, in offset order, never a record of an aborted or
   fenced write.
4. **One writer.** :meth:`Membership.writer` opens the partition for writing and fences every
   earlier writer of it at once: their next ``append`` raises :class:`core.errors.Fenced` and
   nothing they try to append afterwards is ever read.
5. **Events and progress together.** ``append(events, commands_through=n)`` records, atomically
   with the events, that the owner has consumed the command stream up to offset ``n``
   (exclusive). A new owner resumes commands from there, so a command is decided once.
6. **Ownership is explicit.** A node learns which partitions it owns through the listener it
   passes to :meth:`EventLog.join`; callbacks run inside :meth:`Membership.poll`. The embedded
   log assigns every partition to its single node; Kafka takes them from the consumer group.
7. **Replies are ephemeral.** A node that forwards a request to a partition another node owns
   hears the outcome through its :class:`Mailbox`; the owner replies only after the decision
   is durable. A reply may be lost (its node restarted): the caller times out and may retry,
   which is safe because every request is idempotent or fenced by its token.

8. **Retention is explicit.** A stream-partition may lose its oldest records to retention;
   :meth:`EventLog.start_offset` says where it starts now. A read from below the start raises
   :class:`core.errors.Pruned` (never a silent jump forward), so a reader that needs them turns
   to the archive (:class:`archive.reading.ArchivedLog` does it for every reader).
9. **Records for others, with the events** (Kafka only). ``append(events, outbound=[...])``
   produces ``outbound`` records to other topics of the same cluster in the events'
   transaction: a ``read_committed`` reader of those topics sees them exactly when the events
   are readable, and never those of an aborted or fenced append. A log that cannot (embedded,
   in memory, a worker process's remote log) refuses them: ``ValueError``.

All calls are blocking; the node runtime calls them from worker threads.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

NO_OUTBOUND = "this log carries no records for other topics (outbound): only Kafka's does"


@dataclass(frozen=True, slots=True)
class Outbound:
    """A record for a topic other than the log's own, produced with the events (invariant 9):
    a ``kafka://`` target's run, exactly once."""

    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Record:
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None


class OwnershipListener(Protocol):
    def assigned(self, partitions: list[int]) -> None:
        """This node now owns ``partitions``; their writers are open."""

    def revoked(self, partitions: list[int]) -> None:
        """This node no longer owns ``partitions``: stop deciding for them at once."""


class PartitionWriter(Protocol):
    """The single writer of one partition's event stream."""

    @property
    def partition(self) -> int: ...

    def append(
        self,
        events: Sequence[bytes],
        *,
        commands_through: int | None = None,
        outbound: Sequence[Outbound] = (),
    ) -> list[int]:
        """Append ``events`` atomically and durably; return their offsets.

        ``commands_through`` (if given) is the next command offset to process, stored in the
        same atomic unit; ``outbound`` records too, where the log carries them (invariant 9;
        elsewhere a ``ValueError``). Raises ``Fenced`` once a newer writer owns the partition.
        """

    def wait_until_readable(self) -> None:
        """Return once the last append is readable by every reader, or after a short bound.

        The runner calls it before it takes its next batch, so commands that arrive while the
        last append settles join that batch. Only speed depends on it (an append may begin at
        any time) and it never raises. Embedded and in memory an append is readable when it
        returns; Kafka's next transaction cannot begin until the broker has written the last
        one's commit markers, which it does after acknowledging the commit.
        """

    def command_position(self) -> int:
        """The next command offset to process, as last recorded (0 when none was)."""

    def close(self) -> None: ...


class Membership(Protocol):
    """A node's membership in the group that shares the partitions."""

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Record]:
        """Commands for the partitions this node owns, each from its recorded position.

        Ownership callbacks fire from inside this call. Returns early when records arrive.
        """

    def writer(self, partition: int) -> PartitionWriter:
        """The writer of an owned partition (opened, and its predecessor fenced, on assignment)."""

    def owned(self) -> frozenset[int]: ...

    def renew(self, partition: int) -> PartitionWriter:
        """Replace the writer of a partition this member still owns after the writer failed
        for good (closed on an error it could not recover from, such as a transaction whose
        outcome is unknown): open a new one, which fences the old and settles its open write.
        Raises ``Fenced`` when the partition is not owned here any more. Called from the
        thread that polls."""

    def others(self, timeout_s: float) -> int | None:
        """How many other members share the group now, as its coordinator says (None when
        that is not known, or not asked: a group whose members stop together). A node that
        stops hands its partitions over before it drains its calls only when others remain."""

    def close(self) -> None:
        """Leave the group; partitions are revoked first."""


class Mailbox(Protocol):
    """Replies addressed to one node."""

    def poll(self, timeout_s: float) -> list[bytes]:
        """Replies that arrived since the last poll; waits up to ``timeout_s`` for one."""

    def close(self) -> None: ...


class EventLog(Protocol):
    @property
    def num_partitions(self) -> int: ...

    def submit(self, partition: int, value: bytes, key: bytes | None = None) -> int:
        """Append a command durably; return its offset."""

    def read_events(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        """Committed events with offset >= ``from_offset``; waits up to ``timeout_s`` for some."""

    def read_commands(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        """Committed commands with offset >= ``from_offset`` (for tools and tests)."""

    def end_offset(self, stream: str, partition: int) -> int:
        """The offset the next record of ``stream`` ("commands" or "events") will get, or later."""

    def start_offset(self, stream: str, partition: int) -> int:
        """The offset of the oldest record retention has left in ``stream`` (invariant 8): every
        record below it is gone from the log; ``end_offset`` when the stream is empty."""

    def join(self, listener: OwnershipListener) -> Membership: ...

    def send_reply(self, node_id: str, value: bytes) -> None:
        """Send a reply to ``node_id``'s mailbox (best effort, see invariant 7)."""

    def mailbox(self, node_id: str) -> Mailbox:
        """Start receiving the replies sent to ``node_id`` from now on."""

    def close(self) -> None: ...


def partition_for(key: str, num_partitions: int) -> int:
    """The partition of a job: a stable hash of its id (never Python's salted ``hash``)."""
    return zlib.crc32(key.encode()) % num_partitions
