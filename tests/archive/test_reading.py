"""``ArchivedLog``: a reader from offset 0 reads archive + log as one stream, and a hole that
neither holds is an error, never a skip."""

from __future__ import annotations

from pathlib import Path

import pytest

from archive.archive import Archive
from archive.archiver import Archiver
from archive.reading import ArchivedLog
from archive.store import DirectoryStore
from core.errors import Pruned
from eventlog.embedded import EmbeddedLog
from tests.projections.histories import Writers
from tools.replay.records import events


def _filled(path: Path, count: int = 60) -> tuple[EmbeddedLog, list[bytes]]:
    log = EmbeddedLog.open(path, 1, segment_bytes=500)
    values = [b'{"type":"x","at":%d,"n":"%s"}' % (i, b"y" * 40) for i in range(count)]
    writers = Writers(log)
    writers.append(0, values, chunk=9)
    writers.close()
    return log, values


def test_a_read_from_zero_crosses_from_the_archive_into_the_log(tmp_path: Path) -> None:
    log, values = _filled(tmp_path / "log")
    archive = Archive(DirectoryStore(tmp_path / "archive"))
    archiver = Archiver(log, archive, file_records=7)  # files do not line up with segments
    segments = log.segments("events", 0)
    archiver.archive_until(0, segments[3].end)
    log.prune("events", 0, segments[3].first)  # the archive reaches past the log's start
    both = ArchivedLog(log, archive)
    assert [r.value for r in events(both, 0)] == values
    assert [r.offset for r in events(both, 0, from_offset=5)] == list(range(5, 60))
    assert both.start_offset("events", 0) == 0
    log.close()


def test_offsets_in_neither_the_archive_nor_the_log_raise_pruned(tmp_path: Path) -> None:
    log, _ = _filled(tmp_path / "log")
    archive = Archive(DirectoryStore(tmp_path / "archive"))
    segments = log.segments("events", 0)
    Archiver(log, archive).archive_until(0, segments[1].end)
    log.prune("events", 0, segments[3].first)  # pruned past the archive: a hole
    both = ArchivedLog(log, archive)
    assert both.read_events(0, 0, 1000)[-1].offset == segments[1].end - 1
    with pytest.raises(Pruned, match="neither the archive"):
        list(events(both, 0))
    log.close()


def test_the_archiver_records_a_gap_for_what_left_the_log_unarchived(tmp_path: Path) -> None:
    log, values = _filled(tmp_path / "log")
    cut = log.segments("events", 0)[2].first
    log.prune("events", 0, cut)
    archive = Archive(DirectoryStore(tmp_path / "archive"))
    gaps: list[tuple[int, int, int]] = []
    written = Archiver(log, archive, on_gap=lambda *g: gaps.append(g)).archive_until(0, 60)
    assert gaps == [(0, 0, cut)]
    assert archive.files(0)[0].gap and archive.archived_through(0) == 60
    assert sum(f.records for f in written) == 60 - cut
    assert [r.value for r in archive.read(0, cut, 1000)] == values[cut:]
    both = ArchivedLog(log, archive)
    with pytest.raises(Pruned, match=r"gap 0\.\."):  # the hole is named, never stepped over
        both.read_events(0, 0)
    assert [r.value for r in events(both, 0, from_offset=cut)] == values[cut:]
    log.close()
