"""The embedded log's segments and pruning: what ``eventlog.retention`` and the node's
retention loop stand on.

A fake wall clock stamps the segments; offsets and records are the log's own.
"""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest

from core.errors import LogCorrupted, Pruned
from eventlog.embedded import EmbeddedLog
from tests.projections.histories import Writers

DAY = 86_400_000


class Wall:
    def __init__(self, ms: int = 1_000 * DAY) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def _open(path: Path, wall: Wall, segment_bytes: int = 1000) -> EmbeddedLog:
    return EmbeddedLog.open(path, 2, segment_bytes=segment_bytes, segment_ms=DAY, wall_ms=wall)


def _fill(log: EmbeddedLog, partition: int, count: int, size: int = 100) -> list[bytes]:
    values = [b'{"n":%d,"pad":"%s"}' % (i, b"x" * (size - 20)) for i in range(count)]
    writers = Writers(log)
    writers.append(partition, values, chunk=7)
    writers.close()
    return values


def test_segments_roll_at_their_size_and_age_and_cover_the_stream(tmp_path: Path) -> None:
    wall = Wall()
    with _open(tmp_path / "log", wall) as log:
        # 110 bytes a record (value, frame, 12-byte key), appended 7 at a time: an append is
        # never split, so a segment seals after the append that takes it past 1000 bytes.
        _fill(log, 0, 40)
        segments = log.segments("events", 0)
        assert [s.end - s.first for s in segments] == [14, 14, 12]
        assert [s.bytes for s in segments] == [1530, 1540, 1320]  # offsets 0-9 are 1 byte short
        assert segments[0].first == 0 and segments[-1].end == 40
        assert all(a.end == b.first for a, b in itertools.pairwise(segments))
        wall.ms += DAY  # the active segment is now a day old: the next record starts another
        before = len(segments)
        writers = Writers(log)
        writers.append(0, [b"{}"])
        writers.close()
        segments = log.segments("events", 0)
        assert len(segments) == before + 1 and segments[-1].first == 40
        assert segments[-1].first_ms == wall.ms
        assert log.segments("events", 1) == []


def test_prune_removes_whole_sealed_segments_and_survives_a_restart(tmp_path: Path) -> None:
    wall = Wall()
    with _open(tmp_path / "log", wall) as log:
        values = _fill(log, 0, 40)
        segments = log.segments("events", 0)
        cut = segments[2].first
        assert log.prune("events", 0, cut) == cut
        assert log.start_offset("events", 0) == cut
        assert log.end_offset("events", 0) == 40
        with pytest.raises(Pruned) as pruned:
            log.read_events(0, 0)
        assert pruned.value.start == cut and pruned.value.partition == 0
        assert [r.value for r in log.read_events(0, cut, 100)] == values[cut:]
        assert log.verify() == 40 - cut + log.end_offset("commands", 0) * 2
    with _open(tmp_path / "log", wall) as log:
        assert log.start_offset("events", 0) == cut
        assert log.segments("events", 0) == segments[2:]
        assert [r.value for r in log.read_events(0, cut, 100)] == values[cut:]
        writers = Writers(log)
        assert writers.append(0, [b"{}"]) == [40]  # offsets go on from the end, not the start
        writers.close()
        log.verify()


def test_prune_refuses_what_is_not_a_sealed_segment_boundary_and_changes_nothing(
    tmp_path: Path,
) -> None:
    with _open(tmp_path / "log", Wall()) as log:
        _fill(log, 0, 40)
        segments = log.segments("events", 0)
        for before in (segments[1].first + 1, segments[-1].end):
            with pytest.raises(ValueError, match="sealed segment"):
                log.prune("events", 0, before)
        assert log.start_offset("events", 0) == 0
        assert log.segments("events", 0) == segments
        assert len(log.read_events(0, 0, 100)) == 40
        assert log.prune("events", 0, 0) == 0  # nothing below the start: a no-op


def test_pruning_everything_but_the_active_segment_then_reopening(tmp_path: Path) -> None:
    wall = Wall()
    with _open(tmp_path / "log", wall) as log:
        _fill(log, 1, 30)
        last = log.segments("events", 1)[-1]
        log.prune("events", 1, last.first)
        assert log.segments("events", 1) == [last]
    with _open(tmp_path / "log", wall) as log:
        assert log.start_offset("events", 1) == last.first
        assert log.end_offset("events", 1) == 30
        assert log.verify() > 0


def test_commands_are_cut_into_segments_too(tmp_path: Path) -> None:
    with _open(tmp_path / "log", Wall(), segment_bytes=200) as log:
        for i in range(20):
            log.submit(0, b"command %d" % i)
        segments = log.segments("commands", 0)
        assert len(segments) > 1 and segments[-1].end == 20
        log.prune("commands", 0, segments[1].first)
        assert log.read_commands(0, segments[1].first)[0].value == b"command %d" % segments[1].first
        with pytest.raises(Pruned):
            log.read_commands(0, 0)


def test_a_prune_while_the_check_runs_is_not_damage(tmp_path: Path) -> None:
    """Serve checks the log while retention archives and prunes: the check read the start,
    then a prune removed the front before its iterator was made. The gap it meets is the
    prune; the check goes on from the new start and the log stays usable."""
    with _open(tmp_path / "log", Wall()) as log:
        values = _fill(log, 0, 40)
        cut = log.segments("events", 0)[2].first
        check = log._check
        pruned: list[int] = []

        def pruning_first(stream: str, partition: int, start: int, end: int) -> int:
            if stream == "events" and partition == 0 and not pruned:
                pruned.append(log.prune("events", 0, cut))
            return check(stream, partition, start, end)

        log._check = pruning_first  # type: ignore[method-assign]
        checked = log.verify()
        assert pruned == [cut]
        assert checked == 40 - cut + log.end_offset("commands", 0) * 2
        assert [r.value for r in log.read_events(0, cut, 100)] == values[cut:]


def test_a_gap_past_the_start_is_damage_though_a_prune_ran(tmp_path: Path) -> None:
    """The prune excuses only what it removed: a record missing at or past the new start is
    damage, and the log fails."""
    with _open(tmp_path / "log", Wall()) as log:
        _fill(log, 0, 40)
        cut = log.segments("events", 0)[1].first
        log.prune("events", 0, cut)
        log._tables["events"].delete(struct.pack(">IQ", 0, cut + 3))  # raw: a lost record
        with pytest.raises(LogCorrupted, match=f"no record at offset {cut + 3}"):
            log.verify()
        with pytest.raises(LogCorrupted):
            log.read_events(0, cut, 100)
