"""The embedded log checks what it reads, and a damaged log fails loudly, naming where.

Each test writes a real RocksDB on disk, closes it, damages it as a disk or a careless hand
would (a flipped block, a missing record, a lost tail, a record it never framed), reopens it
and reads. Before these checks a read simply stopped at the damage, as if the partition ended
there: ``dump`` stopped early and exited 0, and a node served what it had.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from core.errors import LogCorrupted
from eventlog.embedded import EmbeddedLog
from tests import corruption
from tests.projections.histories import Writers

PARTITIONS = 4
PER_PARTITION = 2000
KEY = struct.Struct(">IQ")


def record(partition: int, i: int) -> bytes:
    # Varied enough that blocks do not compress to nothing.
    return b'{"type":"X","p":%d,"i":%d,"pad":"%s"}' % (partition, i, str(i * 7919).encode() * 20)


def fill(path: Path) -> None:
    with EmbeddedLog.open(path, PARTITIONS) as log:
        writers = Writers(log)
        for p in range(PARTITIONS):
            writers.append(p, [record(p, i) for i in range(PER_PARTITION)], chunk=100)
        writers.close()


def read_all(log: EmbeddedLog, stream: str = "events") -> dict[int, int]:
    """Records read per partition, reading as every reader does: from the last offset + 1."""
    counts = {}
    for p in range(PARTITIONS):
        offset, n = 0, 0
        while records := log._read(stream, p, offset, 500, 0.0):
            n += len(records)
            offset = records[-1].offset + 1
        counts[p] = n
    return counts


def edit(
    path: Path, *, delete: tuple[bytes, ...] = (), put: dict[bytes, bytes] | None = None
) -> None:
    """Change the events column family behind the (closed) log's back."""
    db = Rdict(
        str(path),
        options=Options(raw_mode=True),
        column_families={n: Options(raw_mode=True) for n in ("commands", "events", "meta")},
    )
    events = db.get_column_family("events")
    for key in delete:
        del events[key]
    for key, value in (put or {}).items():
        events[key] = value
    del events  # a live handle keeps the LOCK
    db.close()


def test_a_sound_log_reads_back_whole_and_verify_counts_every_record(tmp_path: Path) -> None:
    fill(tmp_path / "log")
    corruption.flush(tmp_path / "log")
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        assert read_all(log) == dict.fromkeys(range(PARTITIONS), PER_PARTITION)
        assert log.verify() == PARTITIONS * PER_PARTITION
        assert log.damage is None


def test_a_flipped_block_stops_the_read_names_partition_offset_and_file_and_fails_the_log(
    tmp_path: Path,
) -> None:
    fill(tmp_path / "log")
    sst = corruption.damage(tmp_path / "log", "events")
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        with pytest.raises(LogCorrupted) as caught:
            read_all(log)
        damage = caught.value
        assert damage.stream == "events" and damage.partition is not None
        assert damage.offset is not None and 0 < damage.offset < PER_PARTITION
        assert damage.file is not None and Path(damage.file).name == sst.name
        message = str(damage)
        assert f"events partition {damage.partition} at offset {damage.offset}" in message
        assert sst.name in message and "checksum" in message
        # Known damaged: nothing more is read from it or written to it, and whoever owns the
        # log hears of it.
        assert log.wait_damaged(0) is not None and str(log.wait_damaged(0)) == message
        with pytest.raises(LogCorrupted):
            log.read_events(0, 0)
        with pytest.raises(LogCorrupted):
            log.submit(0, b"command")
    with (
        EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log,
        pytest.raises(LogCorrupted) as again,
    ):
        log.verify()
    assert str(again.value) == message


def test_a_missing_record_is_damage_not_a_shorter_partition(tmp_path: Path) -> None:
    fill(tmp_path / "log")
    edit(tmp_path / "log", delete=(KEY.pack(2, 700),))
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        assert [r.offset for r in log.read_events(2, 690, 10)] == list(range(690, 700))
        with pytest.raises(LogCorrupted, match="events partition 2 has no record at offset 700"):
            log.read_events(2, 690, 100)
        assert log.damage is not None and log.damage.offset == 700
    with (
        EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log,
        pytest.raises(LogCorrupted, match="events partition 2 has no record at offset 700"),
    ):
        log.verify()  # the start check finds it without anyone reading partition 2


def test_a_lost_tail_is_found_when_the_log_opens(tmp_path: Path) -> None:
    fill(tmp_path / "log")
    edit(tmp_path / "log", delete=tuple(KEY.pack(1, i) for i in range(1997, PER_PARTITION)))
    with pytest.raises(LogCorrupted) as caught:
        EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    message = str(caught.value)
    assert "events partition 1 ends at offset 1997, but 2000 records were written" in message
    assert "offsets 1997..1999 are missing" in message
    # Closed properly on the way out: the directory can be opened (and refused) again.
    with pytest.raises(LogCorrupted):
        EmbeddedLog.open(tmp_path / "log", PARTITIONS)


def test_a_record_the_log_did_not_frame_is_damage(tmp_path: Path) -> None:
    fill(tmp_path / "log")
    edit(tmp_path / "log", put={KEY.pack(3, 5): b'\x07{"type":"X"}'})
    with (
        EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log,
        pytest.raises(LogCorrupted, match="events partition 3 at offset 5: the record is not"),
    ):
        log.read_events(3, 0, 100)
    with (
        EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log,
        pytest.raises(LogCorrupted, match="events partition 3 at offset 5: the record is not"),
    ):
        log.verify()


def test_a_log_written_before_the_end_keys_opens_and_records_them(tmp_path: Path) -> None:
    fill(tmp_path / "log")
    db = Rdict(
        str(tmp_path / "log"),
        options=Options(raw_mode=True),
        column_families={n: Options(raw_mode=True) for n in ("commands", "events", "meta")},
    )
    meta = db.get_column_family("meta")
    ends = [bytes(k) for k, _ in meta.items() if bytes(k).startswith(b"end")]
    assert len(ends) == PARTITIONS  # one per events partition written; no commands were
    for key in ends:
        del meta[key]
    del meta
    db.close()
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        assert log.end_offset("events", 0) == PER_PARTITION
        Writers(log).append(0, [record(0, PER_PARTITION)])
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        assert log.end_offset("events", 0) == PER_PARTITION + 1


def test_a_log_rocksdb_will_not_open_is_named_damaged_with_its_file(tmp_path: Path) -> None:
    fill(tmp_path / "log")
    [manifest] = (tmp_path / "log").glob("MANIFEST-*")
    corruption.flip(manifest, size=min(4096, manifest.stat().st_size // 2), at=0.25)
    with pytest.raises(LogCorrupted) as caught:
        EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    assert caught.value.file == str(manifest)
    assert str(caught.value).startswith(f"event log {tmp_path / 'log'} is damaged: file {manifest}")


def test_a_start_check_reads_only_what_was_written_since_the_previous_one(tmp_path: Path) -> None:
    fill(tmp_path / "log")
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        assert log.verify(since_last=True) == PARTITIONS * PER_PARTITION  # never checked yet
        assert log.verify(since_last=True) == 0
        for p in range(PARTITIONS):
            log.submit(p, b"a command")
        assert log.verify(since_last=True) == PARTITIONS  # the new commands, nothing else
    # Damage in records already checked: the next start check does not read them, a full
    # check and the read that reaches them find it.
    edit(tmp_path / "log", put={KEY.pack(3, 5): b'\x07{"type":"X"}'})
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        assert log.verify(since_last=True) == 0
        with pytest.raises(LogCorrupted, match="events partition 3 at offset 5"):
            log.read_events(3, 0, 100)
    with (
        EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log,
        pytest.raises(LogCorrupted, match="events partition 3 at offset 5"),
    ):
        log.verify()


def test_records_written_after_a_check_are_checked_by_the_next(tmp_path: Path) -> None:
    fill(tmp_path / "log")
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        log.verify(since_last=True)
        writers = Writers(log)
        writers.append(2, [record(2, PER_PARTITION + i) for i in range(10)], chunk=10)
        writers.close()
    edit(tmp_path / "log", put={KEY.pack(2, PER_PARTITION + 4): b'\x07{"type":"X"}'})
    with (
        EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log,
        pytest.raises(LogCorrupted, match=f"events partition 2 at offset {PER_PARTITION + 4}"),
    ):
        log.verify(since_last=True)
