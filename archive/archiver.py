"""``Archiver(log, archive)``: copies a partition's events from the log into the archive.

The archive's manifest is the archiver's progress: each call starts where the archive ends
(:meth:`archive.archive.Archive.archived_through`), so a restart, or a new owner of the
partition, goes on from the last file written and never from a position kept elsewhere.

When the log starts past where the archive ends, the records between left the log before
anyone archived them (archiving was off, or fell behind Kafka's retention). That is recorded
as a gap in the manifest, reported to ``on_gap`` (a metric and an error in the node's log),
and archiving goes on from the log's start: what is lost is said, never skipped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from archive.archive import Archive
from archive.files import ArchivedFile
from eventlog.port import EventLog, Record

log = logging.getLogger(__name__)

READ_BATCH = 1000
DEFAULT_FILE_RECORDS = 100_000
DEFAULT_FILE_BYTES = 64 * 1024 * 1024


class Archiver:
    def __init__(
        self,
        log_: EventLog,
        archive: Archive,
        *,
        file_records: int = DEFAULT_FILE_RECORDS,
        file_bytes: int = DEFAULT_FILE_BYTES,
        on_gap: Callable[[int, int, int], None] | None = None,
    ) -> None:
        if file_records < 1 or file_bytes < 1:
            raise ValueError("file_records and file_bytes must be positive")
        self.log = log_
        self.archive = archive
        self.file_records = file_records
        self.file_bytes = file_bytes
        self._on_gap = on_gap

    def archive_until(self, partition: int, until: int) -> list[ArchivedFile]:
        """Archive the partition's records below ``until`` that the archive lacks, in files
        of at most ``file_records`` records or about ``file_bytes`` bytes. Stops early where
        the log has nothing readable yet (Kafka: an open transaction); returns the files."""
        # From the store, not this process's copy: the partition's previous owner (another
        # node) may have archived since this one last looked.
        through = self.archive.archived_through(partition, refresh=True)
        start = self.log.start_offset("events", partition)
        if through < start:
            self.archive.record_gap(partition, through, start)
            log.error(
                "events %d..%d of partition %d left the log before they were archived: the "
                "archive records the gap and goes on from %d",
                through,
                start - 1,
                partition,
                start,
            )
            if self._on_gap is not None:
                self._on_gap(partition, through, start)
            through = start
        written: list[ArchivedFile] = []
        pending: list[Record] = []
        size = 0
        offset = through
        bounded = (until - through) // READ_BATCH + 2  # every batch moves at least one offset
        for _ in range(bounded):
            if offset >= until:
                break
            batch = self.log.read_events(partition, offset, min(READ_BATCH, until - offset))
            batch = [r for r in batch if r.offset < until]
            if not batch:
                break
            for record in batch:
                pending.append(record)
                size += len(record.value)
                if len(pending) >= self.file_records or size >= self.file_bytes:
                    written.append(self._write(partition, pending))
                    pending, size = [], 0
            offset = batch[-1].offset + 1
        if pending:
            written.append(self._write(partition, pending))
        return written

    def backlog(self, partition: int) -> int:
        """Offsets the log holds past what is archived (records, and Kafka's markers)."""
        end = self.log.end_offset("events", partition)
        return max(0, end - self.archive.archived_through(partition))

    def _write(self, partition: int, records: list[Record]) -> ArchivedFile:
        from_offset = self.archive.archived_through(partition)
        return self.archive.write(partition, records, from_offset, records[-1].offset + 1)
