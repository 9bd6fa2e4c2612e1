"""``Archive(store)``: ranges of a partition's events, written once, read by offset.

:meth:`Archive.write` puts the range's file first and the manifest after it, so a manifest
never names a file that is not there (a crash between the two leaves a file nobody lists,
which the next write of the same range replaces with the same bytes). The manifest is what
says how far a partition is archived (:meth:`Archive.archived_through`): the archivers keep
their progress there, so it survives any restart with the files it describes.

Reads check each file against the manifest's SHA-256 before trusting it; the most recently
decoded files are kept (up to ``_DECODED_RECORDS`` records in all), since a reader walks a file
in batches.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence

from archive.files import (
    FORMAT,
    ArchiveDamaged,
    ArchivedFile,
    Manifest,
    at_of,
    checksum,
    decode_manifest,
    decode_records,
    encode_manifest,
    encode_records,
    file_key,
    manifest_key,
)
from archive.store import ArchiveMissing, ObjectStore
from eventlog.port import Record

_DECODED_RECORDS = 250_000  # ~100 MB of decoded events at most, whatever the files' sizes


class Archive:
    def __init__(self, store: ObjectStore, stream: str = "events") -> None:
        self.store = store
        self.stream = stream
        self._lock = threading.Lock()
        self._manifests: dict[int, list[ArchivedFile]] = {}
        # key -> (records, their offsets), most recently used last
        self._decoded: OrderedDict[str, tuple[list[Record], list[int]]] = OrderedDict()

    def files(self, partition: int, *, refresh: bool = False) -> list[ArchivedFile]:
        """The partition's manifest, oldest range first (read once, then kept current by this
        process's writes; ``refresh`` reads it again)."""
        with self._lock:
            if refresh or partition not in self._manifests:
                self._manifests[partition] = self._load(partition)
            return list(self._manifests[partition])

    def archived_through(self, partition: int, *, refresh: bool = False) -> int:
        """The offset after the newest archived range (0 when nothing is archived);
        ``refresh`` reads the manifest again (another node may have archived since)."""
        files = self.files(partition, refresh=refresh)
        return files[-1].end_offset if files else 0

    def first_offset(self, partition: int) -> int | None:
        """Where the archive's readable history of the partition starts (after its last gap)."""
        files = self.files(partition)
        readable = [f for f in files if not f.gap]
        if not readable:
            return None
        gaps = [f for f in files if f.gap]
        return max([readable[0].from_offset] + [g.end_offset for g in gaps])

    def write(
        self, partition: int, records: Sequence[Record], from_offset: int, end_offset: int
    ) -> ArchivedFile:
        """Archive ``records``, the partition's records in ``[from_offset, end_offset)``.
        ``from_offset`` must be where the archive ends (ranges are contiguous)."""
        if any(r.partition != partition for r in records):
            raise ValueError(f"records of another partition given to archive {partition}")
        if records and not (from_offset <= records[0].offset and records[-1].offset < end_offset):
            raise ValueError(f"records outside [{from_offset}, {end_offset})")
        self._check_next(partition, from_offset, end_offset)
        data = encode_records(records)
        ats = [a for a in (at_of(records[0].value), at_of(records[-1].value))] if records else []
        entry = ArchivedFile(
            key=file_key(self.stream, partition, from_offset, end_offset),
            from_offset=from_offset,
            end_offset=end_offset,
            records=len(records),
            first_at_ms=ats[0] if ats else None,
            last_at_ms=ats[-1] if ats else None,
            bytes=len(data),
            sha256=checksum(data),
        )
        self.store.put(entry.key, data)
        self._append(partition, entry)
        return entry

    def record_gap(self, partition: int, from_offset: int, end_offset: int) -> ArchivedFile:
        """Say in the manifest that ``[from_offset, end_offset)`` left the log unarchived."""
        self._check_next(partition, from_offset, end_offset)
        entry = ArchivedFile(
            key=f"gap:{from_offset}-{end_offset}",
            from_offset=from_offset,
            end_offset=end_offset,
            records=0,
            gap=True,
        )
        self._append(partition, entry)
        return entry

    def covering(self, partition: int, offset: int) -> ArchivedFile | None:
        """The manifest entry whose range holds ``offset`` (a file or a gap), if any."""
        files = self.files(partition, refresh=offset >= self.archived_through(partition))
        i = bisect.bisect_right([f.from_offset for f in files], offset) - 1
        if i < 0 or offset >= files[i].end_offset:
            return None
        return files[i]

    def read(self, partition: int, from_offset: int, max_records: int) -> list[Record]:
        """Archived records with offset >= ``from_offset``, from the file that covers it (and
        those after it while short of ``max_records``); empty when nothing archived covers it
        (not archived yet, or in a gap)."""
        files = self.files(partition, refresh=from_offset >= self.archived_through(partition))
        out: list[Record] = []
        i = bisect.bisect_right([f.from_offset for f in files], from_offset) - 1
        if i < 0 or from_offset >= files[i].end_offset:
            return out
        for entry in files[i:]:
            if entry.gap or len(out) >= max_records:
                break
            records, offsets = self._decode(partition, entry)
            start = bisect.bisect_left(offsets, from_offset)
            out.extend(records[start : start + max_records - len(out)])
        return out

    # -- internals -------------------------------------------------------------------------

    def _check_next(self, partition: int, from_offset: int, end_offset: int) -> None:
        if end_offset <= from_offset:
            raise ValueError(f"empty range [{from_offset}, {end_offset})")
        through = self.archived_through(partition)
        if from_offset != through:
            raise ValueError(
                f"archive of {self.stream} partition {partition} ends at {through}; a range from "
                f"{from_offset} would leave a hole or overlap"
            )

    def _append(self, partition: int, entry: ArchivedFile) -> None:
        with self._lock:
            files = [*self._manifests.get(partition, []), entry]
            manifest = Manifest(format=FORMAT, stream=self.stream, partition=partition, files=files)
            self.store.put(manifest_key(self.stream, partition), encode_manifest(manifest))
            self._manifests[partition] = files

    def _load(self, partition: int) -> list[ArchivedFile]:
        key = manifest_key(self.stream, partition)
        try:
            data = self.store.get(key)
        except ArchiveMissing:
            return []
        manifest = decode_manifest(data, key)
        if manifest.partition != partition or manifest.stream != self.stream:
            raise ArchiveDamaged(f"archive manifest {key} describes another stream-partition")
        return list(manifest.files)

    def _decode(self, partition: int, entry: ArchivedFile) -> tuple[list[Record], list[int]]:
        with self._lock:
            cached = self._decoded.get(entry.key)
            if cached is not None:
                self._decoded.move_to_end(entry.key)
                return cached
        try:
            data = self.store.get(entry.key)
        except ArchiveMissing:
            raise ArchiveDamaged(
                f"archive file {entry.key} is in the manifest but not in the store"
            ) from None
        if checksum(data) != entry.sha256:
            raise ArchiveDamaged(
                f"archive file {entry.key} does not match its manifest's SHA-256 (damaged or "
                "replaced); it is not read"
            )
        records = decode_records(data, partition, entry.key)
        if len(records) != entry.records:
            raise ArchiveDamaged(
                f"archive file {entry.key} holds {len(records)} records, its manifest says "
                f"{entry.records}"
            )
        decoded = (records, [r.offset for r in records])
        with self._lock:
            self._decoded[entry.key] = decoded
            held = sum(len(r) for r, _ in self._decoded.values())
            while held > _DECODED_RECORDS and len(self._decoded) > 1:
                _, (gone, _) = self._decoded.popitem(last=False)
                held -= len(gone)
        return decoded
