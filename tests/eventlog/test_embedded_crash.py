"""The embedded log's storage: kill -9 durability, and the rules for opening a directory.

The crash test runs ``crash_writer.py`` in a child process, reads its acknowledgements until it
has enough, kills it with SIGKILL mid-stream, reopens the log and checks that every
acknowledged write is there and that what is there is a consistent prefix: contiguous offsets,
each writer's records a prefix of what it sent, every batch whole, and each partition's command
position the one its last surviving batch carried. It does this twice over the same directory,
so the second round also recovers a log that was itself recovered.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from core.errors import CronlogError
from eventlog.embedded import EmbeddedLog
from eventlog.port import Record

REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("crash_writer.py")
PARTITIONS = 4
THREADS = 16
ACKS_PER_ROUND = 4000


@dataclass
class Acks:
    """What the children acknowledged, by (round, thread): seq -> (partition, offsets, values)."""

    commands: dict[tuple[int, int], dict[int, tuple[int, int, bytes]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    events: dict[tuple[int, int], dict[int, tuple[int, list[int]]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    count: int = 0

    def add(self, line: str) -> None:
        kind, *fields = line.split()
        round_, thread, seq, partition, offset = map(int, fields[:5])
        if kind == "C":
            value = f"c/{round_}/{thread}/{seq}".encode()
            self.commands[round_, thread][seq] = (partition, offset, value)
        else:
            count = int(fields[5])
            self.events[round_, thread][seq] = (partition, list(range(offset, offset + count)))
        self.count += 1


def run_and_kill(path: Path, round_: int, acks: Acks, stderr_path: Path) -> None:
    """Start a writer child, take ``ACKS_PER_ROUND`` acknowledgements, then SIGKILL it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, str(WRITER), str(path), str(PARTITIONS), str(THREADS), str(round_)]
    with stderr_path.open("w") as stderr:
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    assert child.stdout is not None
    taken = 0
    try:
        for line in child.stdout:
            acks.add(line)
            taken += 1
            if taken >= ACKS_PER_ROUND:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # Lines already in the pipe were acknowledged before the kill: they count too.
    for line in child.stdout.read().splitlines(keepends=True):
        if line.endswith("\n"):
            acks.add(line)
    child.stdout.close()
    assert taken >= ACKS_PER_ROUND, f"the writer stopped early: {stderr_path.read_text()}"


def read_all(log: EmbeddedLog, stream: str, partition: int) -> list[Record]:
    read = log.read_commands if stream == "commands" else log.read_events
    records: list[Record] = []
    while batch := read(partition, records[-1].offset + 1 if records else 0, 5000):
        records.extend(batch)
    return records


def check_recovered(log: EmbeddedLog, acks: Acks) -> None:
    stored = {
        stream: {p: read_all(log, stream, p) for p in range(PARTITIONS)}
        for stream in ("commands", "events")
    }
    by_value: dict[bytes, tuple[int, int]] = {}
    for stream, partitions in stored.items():
        for partition, records in partitions.items():
            # Contiguous from 0: a prefix of what was written, nothing missing in the middle.
            assert [r.offset for r in records] == list(range(len(records))), (stream, partition)
            assert log.end_offset(stream, partition) == len(records)
            by_value.update({r.value: (partition, r.offset) for r in records})

    for sent in acks.commands.values():
        for partition, offset, value in sent.values():
            assert by_value.get(value) == (partition, offset), f"lost acked command {value!r}"
    for (round_, thread), batches in acks.events.items():
        for seq, (partition, offsets) in batches.items():
            prefix = f"e/{round_}/{thread}/{seq}/".encode()
            events = stored["events"][partition]
            assert offsets[-1] < len(events), f"lost acked batch {prefix!r}"
            assert all(events[o].value.startswith(prefix) for o in offsets), prefix

    # Each writer's surviving records are a prefix of its sequence, and batches are whole.
    seqs: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    batch_sizes: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    last_through = {p: 0 for p in range(PARTITIONS)}
    for records in stored["commands"].values():
        for r in records:
            c_round, c_thread, c_seq = map(int, r.value.decode()[2:].split("/"))
            seqs["c", c_round, c_thread].add(c_seq)
    for partition, records in stored["events"].items():
        for r in records:
            e_round, e_thread, e_seq, _, count, through = map(int, r.value.decode()[2:].split("/"))
            seqs["e", e_round, e_thread].add(e_seq)
            batch_sizes[e_round, e_thread, e_seq].append(count)
            last_through[partition] = through
    for key, present in seqs.items():
        assert present == set(range(len(present))), f"{key}: not a prefix"
    for batch, counts in batch_sizes.items():
        assert len(counts) == counts[0], f"batch {batch} is torn: {len(counts)} of {counts[0]}"

    # The command position travelled in the same batch as the events it came with.
    member = log.join(_Quiet())
    member.poll(0.0)
    for partition, through in last_through.items():
        assert member.writer(partition).command_position() == through
    member.close()


class _Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def test_kill_9_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "log"
    acks = Acks()
    for round_ in range(2):
        run_and_kill(path, round_, acks, tmp_path / f"writer-{round_}.err")
        with EmbeddedLog.open(path, PARTITIONS) as log:
            check_recovered(log, acks)
    assert acks.count >= 2 * ACKS_PER_ROUND


# -- opening and closing ----------------------------------------------------------------------


def test_another_process_cannot_open_an_open_log(tmp_path: Path) -> None:
    with EmbeddedLog.open(tmp_path / "log", 2):
        probe = "import sys; import eventlog.embedded as e; e.EmbeddedLog.open(sys.argv[1], 2)"
        result = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / "log")],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=60,
        )
    assert result.returncode != 0
    assert "is already open" in result.stderr


def test_a_second_open_in_the_same_process_fails_clearly(tmp_path: Path) -> None:
    with EmbeddedLog.open(tmp_path / "log", 2), pytest.raises(CronlogError, match="already open"):
        EmbeddedLog.open(tmp_path / "log", 2)


def test_the_partition_count_is_fixed_at_creation(tmp_path: Path) -> None:
    EmbeddedLog.open(tmp_path / "log", 4).close()
    with pytest.raises(CronlogError, match="has 4 partitions"):
        EmbeddedLog.open(tmp_path / "log", 8)
    EmbeddedLog.open(tmp_path / "log", 4).close()


def test_close_wakes_waiters_and_releases_the_lock(tmp_path: Path) -> None:
    log = EmbeddedLog.open(tmp_path / "log", 2)
    log.submit(0, b"c")
    member = log.join(_Quiet())
    assert member.poll(1.0)
    outcome: list[BaseException] = []

    def wait_for_events() -> None:
        try:
            log.read_events(1, 0, timeout_s=30.0)
        except CronlogError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_for_events)
    waiter.start()
    log.close()
    waiter.join(timeout=30.0)
    assert len(outcome) == 1 and "closed" in str(outcome[0])
    with pytest.raises(CronlogError, match="closed"):
        log.submit(0, b"late")
    EmbeddedLog.open(tmp_path / "log", 2).close()


def test_concurrent_writers_share_synced_batches(tmp_path: Path) -> None:
    with EmbeddedLog.open(tmp_path / "log", 4) as log:
        before = log.synced_batches
        threads = [
            threading.Thread(target=lambda n=n: [log.submit(n % 4, b"x") for _ in range(50)])
            for n in range(16)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60.0)
        assert sum(log.end_offset("commands", p) for p in range(4)) == 16 * 50
        assert log.synced_batches - before < 16 * 50


class _Recording:
    """The log's database, every call passed through and the writes and WAL syncs noted."""

    def __init__(self, db: Any, calls: list[str]) -> None:
        self._db = db
        self._calls = calls

    def write(self, batch: Any, options: Any) -> None:
        self._db.write(batch, options)
        self._calls.append("write, synced" if options.sync else "write")

    def flush_wal(self, sync: bool) -> None:
        self._db.flush_wal(sync)
        self._calls.append(f"flush_wal({sync})")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_write_is_acknowledged_only_after_its_wal_is_synced(tmp_path: Path) -> None:
    """The committer writes unsynced and then syncs the WAL with ``flush_wal(True)``: durable on
    return as a synced write is, but rocksdict holds the GIL through a synced write's fsync
    (every thread of the node stopped for it) and releases it through ``flush_wal``'s."""
    calls: list[str] = []
    path = tmp_path / "log"
    with EmbeddedLog.open(path, 2) as log:
        db = log._db
        log._db = _Recording(db, calls)
        try:
            log.submit(0, b"first")
            assert calls[-2:] == ["write", "flush_wal(True)"], calls
            log._tables["commands"].flush()  # a memtable switch: RocksDB starts a new WAL file
            calls.clear()
            log.submit(1, b"second")
            assert calls == ["write", "flush_wal(True)"], calls
        finally:
            log._db = db  # closed as it was opened (eventlog.rocks.close_store)
    with EmbeddedLog.open(path, 2) as again:
        assert [r.value for r in read_all(again, "commands", 1)] == [b"second"]


def test_a_commit_wakes_the_readers_of_its_partition_only(tmp_path: Path) -> None:
    """Every reader waiting on the one condition woke for every commit to any partition: a
    node's dozen followers each took the lock and went back to sleep, every batch."""
    with EmbeddedLog.open(tmp_path / "log", 3) as log:
        writers = log._take_over(object())
        wakes: list[int] = []
        woke = threading.Event()
        cond = log._signal.stream("events", 1)
        real_wait = cond.wait

        def wait(timeout: float | None = None) -> bool:
            result = real_wait(timeout)
            wakes.append(1)
            woke.set()
            return result

        cond.wait = wait  # type: ignore[method-assign]
        reader = threading.Thread(target=lambda: log.read_events(1, 0, 10, timeout_s=30.0))
        reader.start()
        for _ in range(5):
            writers[0].append([b"elsewhere"])
            writers[2].append([b"elsewhere"])
        assert not woke.wait(0.2), "a commit to partitions 0 and 2 woke partition 1's reader"
        writers[1].append([b"here"])
        reader.join(10)
        assert wakes == [1]
