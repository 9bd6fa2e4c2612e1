"""The archive's files, manifest and store: what an auditor with ``zcat`` and ``jq`` reads, and
what ``Archive.read`` hands back byte for byte."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from archive.archive import Archive
from archive.archiver import Archiver
from archive.files import ArchiveDamaged, manifest_key
from archive.store import ArchiveMissing, DirectoryStore
from eventlog.memory import MemoryLog
from eventlog.port import Record
from tests.projections.histories import Writers


def _event(n: int, at: int) -> bytes:
    return b'{"type":"JobPaused","at":%d,"job_id":"j%d","tenant":"t"}' % (at, n)


RECORDS = [
    Record(3, 10, _event(1, 1000)),
    Record(3, 11, _event(2, 2000), key=b"k\x00\xff"),
    Record(3, 13, b"\x00\x01 not json"),  # a foreign record; offset 12 is a Kafka marker
    Record(3, 14, b'{\n  "pretty": true\n}'),  # JSON, but not one line: kept as bytes
    Record(3, 15, _event(3, 5000)),
]


@pytest.fixture
def archive(tmp_path: Path) -> Archive:
    archive = Archive(DirectoryStore(tmp_path / "archive"))
    archive.record_gap(3, 0, 10)  # ranges are contiguous from 0: these tests start at 10
    return archive


def test_records_read_back_byte_for_byte_and_the_file_is_plain_gzip_json_lines(
    archive: Archive, tmp_path: Path
) -> None:
    entry = archive.write(3, RECORDS, 10, 16)
    assert archive.read(3, 10, 100) == RECORDS
    assert archive.read(3, 12, 100) == RECORDS[2:]  # from inside the range, past the marker
    assert archive.read(3, 16, 100) == []  # not archived
    path = tmp_path / "archive" / entry.key
    assert entry.key == "events/p00003/00000000000000000010-00000000000000000016.jsonl.gz"
    lines = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    assert [line["offset"] for line in lines] == [10, 11, 13, 14, 15]
    assert lines[0]["event"] == json.loads(RECORDS[0].value)
    assert "event" not in lines[2] and "event" not in lines[3]


def test_the_manifest_names_each_range_its_count_times_and_checksum(
    archive: Archive, tmp_path: Path
) -> None:
    first = archive.write(3, RECORDS[:2], 10, 12)
    second = archive.write(3, RECORDS[2:], 12, 16)
    manifest = json.loads((tmp_path / "archive" / manifest_key("events", 3)).read_text())
    assert manifest["partition"] == 3 and manifest["format"] == 1
    assert [(f["from_offset"], f["end_offset"], f["records"]) for f in manifest["files"]] == [
        (0, 10, 0),
        (10, 12, 2),
        (12, 16, 3),
    ]
    data = (tmp_path / "archive" / second.key).read_bytes()
    assert manifest["files"][0]["gap"]
    assert manifest["files"][2]["sha256"] == hashlib.sha256(data).hexdigest()
    assert (first.first_at_ms, first.last_at_ms) == (1000, 2000)
    assert second.first_at_ms is None and second.last_at_ms == 5000
    # Another process reads the same archive from the store alone.
    again = Archive(DirectoryStore(tmp_path / "archive"))
    assert again.archived_through(3) == 16 and again.read(3, 10, 2) == RECORDS[:2]
    assert again.read(3, 0, 2) == []  # the gap: nothing to read there
    assert again.read(3, 11, 100) == RECORDS[1:]  # a read crosses from one file to the next


def test_a_file_that_does_not_match_its_checksum_is_refused(
    archive: Archive, tmp_path: Path
) -> None:
    entry = archive.write(3, RECORDS, 10, 16)
    path = tmp_path / "archive" / entry.key
    path.write_bytes(gzip.compress(b'{"offset":10,"event":{"forged":true}}\n'))
    with pytest.raises(ArchiveDamaged, match="SHA-256"):
        Archive(DirectoryStore(tmp_path / "archive")).read(3, 10, 10)
    path.unlink()
    with pytest.raises(ArchiveDamaged, match="not in the store"):
        Archive(DirectoryStore(tmp_path / "archive")).read(3, 10, 10)


def test_ranges_are_contiguous_a_hole_or_overlap_is_refused(archive: Archive) -> None:
    archive.write(3, RECORDS[:2], 10, 12)
    with pytest.raises(ValueError, match="hole or overlap"):
        archive.write(3, RECORDS[2:], 13, 16)
    with pytest.raises(ValueError, match="hole or overlap"):
        archive.write(3, RECORDS[1:], 11, 16)
    assert archive.archived_through(3) == 12 and len(archive.files(3)) == 2


def test_a_gap_is_recorded_and_reads_do_not_cross_it(archive: Archive) -> None:
    archive.write(3, RECORDS[:2], 10, 12)
    archive.record_gap(3, 12, 15)
    archive.write(3, RECORDS[4:], 15, 16)
    assert archive.read(3, 10, 100) == RECORDS[:2]
    assert archive.read(3, 13, 100) == []
    assert archive.read(3, 15, 100) == RECORDS[4:]
    assert archive.first_offset(3) == 15


def test_keys_cannot_leave_the_directory(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "archive")
    for key in ("../escape", "a//b", "/abs", "a/./b", "sp ace"):
        with pytest.raises(ValueError, match="not a"):
            store.put(key, b"x")
    assert not (tmp_path / "escape").exists()
    store.put("events/p00000/x", b"1")
    assert store.list("events/") == ["events/p00000/x"] and store.get("events/p00000/x") == b"1"


def test_a_writer_goes_on_from_what_another_process_archived(tmp_path: Path) -> None:
    """A partition's new owner archives after its old owner, each with its own Archive."""
    log = MemoryLog(4)
    writers = Writers(log)
    writers.append(3, [r.value for r in RECORDS], chunk=2)
    old_owner = Archive(DirectoryStore(tmp_path / "archive"))
    new_owner = Archive(DirectoryStore(tmp_path / "archive"))
    assert new_owner.archived_through(3) == 0  # it has looked before the old owner wrote
    Archiver(log, old_owner).archive_until(3, 2)
    Archiver(log, new_owner).archive_until(3, 5)
    again = Archive(DirectoryStore(tmp_path / "archive"))
    assert [(f.from_offset, f.end_offset) for f in again.files(3)] == [(0, 2), (2, 5)]
    assert [r.value for r in again.read(3, 0, 10)] == [r.value for r in RECORDS]
    writers.close()


def test_a_deleted_key_is_gone_and_listing_a_prefix_finds_only_its_keys(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "archive")
    for key in ("a/b/one", "a/b/two", "a/bc/three", "a/top", "z/other"):
        store.put(key, key.encode())
    assert store.list("a/b") == ["a/b/one", "a/b/two", "a/bc/three"]
    assert store.list("a/b/") == ["a/b/one", "a/b/two"]
    assert store.list("a/") == ["a/b/one", "a/b/two", "a/bc/three", "a/top"]
    assert store.list("missing/") == []
    store.delete("a/b/one")
    store.delete("a/b/one")  # again: nothing to do
    assert store.list("a/b/") == ["a/b/two"]
    with pytest.raises(ArchiveMissing):
        store.get("a/b/one")
