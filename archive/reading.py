"""``ArchivedLog(log, archive)``: the log port over archive + log, for every reader.

The node, the replay tools and anything else that reads a partition's events from offset 0
are given this instead of the bare log. A read goes to the log; when the log says the offset
was pruned (:class:`core.errors.Pruned`, invariant 8 of the port), it goes to the archive,
which hands back the records of the file that covers the offset. The reader goes on from the
last offset it got, as always, and crosses back into the log once the archive ends where the
log starts::

    archive  [0 .. 4096) [4096 .. 9000)
    log                          [8192 ........ 12000)    start 8192
    read(0)    -> log: Pruned -> archive, records 0..999
    read(8192) -> log (the archive holds it too; from the log's start on, the log answers)

Offsets below the log's start that the archive does not hold (archiving was off, or fell
behind Kafka's retention) are never skipped: the read raises ``Pruned`` naming the hole.
Everything else (commands, writers, membership, replies) is the log's, unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from archive.archive import Archive
from core.errors import Pruned
from eventlog.port import EventLog, Membership, OwnershipListener, Record

if TYPE_CHECKING:
    from eventlog.port import Mailbox


class ArchivedLog:
    def __init__(self, log: EventLog, archive: Archive) -> None:
        self.log = log
        self.archive = archive

    @property
    def num_partitions(self) -> int:
        return self.log.num_partitions

    def read_events(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        try:
            return self.log.read_events(partition, from_offset, max_records, timeout_s)
        except Pruned as pruned:
            return self._from_archive(partition, from_offset, max_records, timeout_s, pruned)

    def _from_archive(
        self, partition: int, from_offset: int, max_records: int, timeout_s: float, pruned: Pruned
    ) -> list[Record]:
        offset = from_offset
        for _ in range(len(self.archive.files(partition)) + 1):  # one step per manifest entry
            records = self.archive.read(partition, offset, max_records)
            if records:
                return records
            entry = self.archive.covering(partition, offset)
            if entry is None or entry.gap:
                break
            # A file whose records all lie before ``offset`` (Kafka's markers follow them):
            # the next record is past its range, in the next file or in the log.
            offset = entry.end_offset
            if offset >= pruned.start:
                return self.log.read_events(partition, offset, max_records, timeout_s)
        where = (
            f"archive records a gap {entry.from_offset}..{entry.end_offset - 1} (they left the "
            "log before they were archived)"
            if entry is not None
            else f"archive ends at {self.archive.archived_through(partition)}"
        )
        raise Pruned(
            f"events of partition {partition} from offset {offset} are in neither the archive "
            f"(the {where}) nor the log (it starts at {pruned.start}): {pruned}",
            stream="events",
            partition=partition,
            start=pruned.start,
        ) from None

    def start_offset(self, stream: str, partition: int) -> int:
        """For events: where the readable history starts, archive included."""
        start = self.log.start_offset(stream, partition)
        if stream != "events":
            return start
        first = self.archive.first_offset(partition)
        if first is None or self.archive.archived_through(partition) < start:
            return start
        return min(first, start)

    def end_offset(self, stream: str, partition: int) -> int:
        return self.log.end_offset(stream, partition)

    def submit(self, partition: int, value: bytes, key: bytes | None = None) -> int:
        return self.log.submit(partition, value, key)

    def read_commands(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        return self.log.read_commands(partition, from_offset, max_records, timeout_s)

    def join(self, listener: OwnershipListener) -> Membership:
        return self.log.join(listener)

    def send_reply(self, node_id: str, value: bytes) -> None:
        self.log.send_reply(node_id, value)

    def mailbox(self, node_id: str) -> Mailbox:
        return self.log.mailbox(node_id)

    def close(self) -> None:
        self.log.close()


if TYPE_CHECKING:

    def _implements_the_port(log_: ArchivedLog) -> EventLog:  # mypy checks it against the port
        return log_
