"""A takeover as a user runs it: ``cronlog serve`` with no local store takes a long history over.

    python -m bench.bench_takeover --serve                    # embedded, 1M events, 3 rounds
    python -m bench.bench_takeover --serve --events 10000000  # the issue's goal (minutes)
    python -m bench.bench_takeover --serve --kafka            # a broker from tools/kafka

The history is the one :mod:`bench.bench_takeover` builds (decided by
``core.partition.Partition`` on a simulated clock: ``--live-jobs`` jobs, ``--hot`` of them
running every second), except that the hot jobs call a recording target
(:mod:`bench.recorder`) and the simulated clock ends at about the moment the build starts, so
the log looks like one a node wrote up to a few minutes ago. The previous owner's snapshot is
left ``--tail`` events before the end, where a node finds it:

* **embedded**: a data directory holding ``log/``, ``snapshots/`` and ``archive/`` (every
  sealed segment archived, as the previous owner's retention loop leaves it) and nothing else
  (no ``node/``: the state stores and the read model are gone, as on a machine restored from
  the log alone). No ``cronlog serve`` has checked the log yet, so the new owner's start check
  reads all of it, as a node's start reads everything appended since its previous start
  (``--checked-log``: the log checked to its end beforehand, which isolates the recovery from
  that check). Each round starts ``cronlog serve`` on a fresh copy of it (hard links:
  RocksDB never writes a file it has closed) and times from the process's start.
* **Kafka**: the events topic and the compacted snapshots topic of one topic prefix; each
  round starts ``cronlog serve --kafka`` on an empty data directory and times from the moment
  it logs that it owns the partition (its JSON log's timestamp). A topic cannot be copied, so
  each round's tail also holds what the rounds before it decided (a few thousand events).

Today's design (``--no-snapshots``: the node folds the partition from its first event) and the
new one (restore the newest snapshot, read the tail) alternate, ``--repeats`` rounds each
(``--zero-repeats`` for today's design, whose rounds take minutes at 10M events), medians
reported. A round ends at the **first on-time fire**: the first call the recorder
receives for a slot at or after the start (or the assignment) that arrives within a second of
its slot (the hot jobs' misfire grace is a second, so the slots missed meanwhile are skipped
rather than run first: see ``HOT_GRACE_S``). The node's own log gives the phases on the way
(log check, ownership, restore).

``--baseline SRC`` (embedded only; a checkout of another commit) runs that cronlog too, on
the same history, right after each round of this one's: before and after side by side, under
the same load, recorded under ``baseline_snapshot`` and ``baseline_from_zero``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from bench.bench_takeover import PARTITION, History, leave_snapshot
from bench.common import Recorder, Serve, slot_of
from eventlog.embedded import EmbeddedLog
from eventlog.port import EventLog
from eventlog.snapshots import FileSnapshots, SnapshotStore

ON_TIME_MS = 1000  # a run started within a second of its slot is on time
ROUND_TIMEOUT_S = 1800.0
# The hot jobs' misfire grace: a slot missed by more than this while no node owned the
# partition is skipped (fire_once fires one of them), not run. With the default 60 s, a new
# owner first runs up to a minute of every hot job's slots, and the first on-time fire would
# time that backlog (seconds of calls) instead of the takeover.
HOT_GRACE_S = 1.0


def build(
    log: EventLog,
    tmp: Path,
    snapshots: SnapshotStore,
    events: int,
    live_jobs: int,
    hot: int,
    tail: int,
    hot_url: str,
) -> tuple[dict[str, Any], float]:
    """The partition's history, ending about now, with a snapshot ``tail`` events before
    its end."""
    # Each simulated second adds three events a hot job (materialised, leased, completed).
    seconds = max(1, (events - live_jobs) // (3 * hot))
    start = (time.time_ns() // 1_000_000 // 1000 - seconds) * 1000
    built = time.perf_counter()
    history = History(log, start, live_jobs, hot, hot_url, hot_grace_s=HOT_GRACE_S)
    history.run_until(events - tail)
    snapshot = leave_snapshot(log, tmp / "previous-owner", snapshots)
    shutil.rmtree(tmp / "previous-owner")
    history.run_until(events)
    history.close()
    return snapshot, time.perf_counter() - built


def _node_log(path: Path) -> list[dict[str, Any]]:
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
    return lines


def _at_ns(entry: dict[str, Any]) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(entry["time"]).timestamp() * 1e9)


def _phases(lines: list[dict[str, Any]], origin_ns: int) -> dict[str, float]:
    """Seconds from ``origin_ns`` to what the node logged on the way to deciding."""
    marks = {
        "log_checked_s": "checked the event log",
        "owned_s": "owns partitions",
        "restored_s": "restored the snapshot",
    }
    found: dict[str, float] = {}
    for entry in lines:
        message = str(entry.get("message", ""))
        for name, words in marks.items():
            if name not in found and words in message:
                found[name] = round((_at_ns(entry) - origin_ns) / 1e9, 3)
    return found


def _assigned_ns(serve: Serve, deadline: float) -> int:
    """When the node logged that it owns the partition (Kafka: the group's assignment)."""
    while time.monotonic() < deadline:
        assert serve.proc is not None
        if serve.proc.poll() is not None:
            raise RuntimeError(f"cronlog serve exited {serve.proc.returncode}: {serve.tail()}")
        for entry in _node_log(serve.output):
            if "owns partitions" in str(entry.get("message", "")):
                return _at_ns(entry)
        time.sleep(0.05)
    raise RuntimeError(f"the partition was never assigned: {serve.tail()}")


def one_round(
    recorder: Recorder,
    data_dir: Path,
    snapshots: bool,
    kafka: tuple[str, str] | None,
    source: Path | None = None,
) -> dict[str, Any]:
    """``cronlog serve`` on ``data_dir`` until its first on-time fire; then stopped. ``source``:
    another checkout's cronlog (a baseline)."""
    extra = ["--partitions", "1", "--log-format", "json"]
    if not snapshots:
        extra.append("--no-snapshots")
    serve = Serve(
        data_dir,
        kafka=None if kafka is None else kafka[0],
        topic_prefix=None if kafka is None else kafka[1],
        extra=extra,
        source=source,
    )
    recorder.take()  # what an earlier round's node called
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    started_ns = time.time_ns()
    serve.start()
    try:
        origin_ns = started_ns if kafka is None else _assigned_ns(serve, deadline)
        origin_ms = origin_ns // 1_000_000
        first_call_ns: int | None = None
        missed = late = 0  # calls for slots before the origin; for later slots, late
        on_time: tuple[int, int] | None = None
        while on_time is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no on-time fire in {ROUND_TIMEOUT_S} s: {serve.tail()}")
            assert serve.proc is not None
            if serve.proc.poll() is not None:
                raise RuntimeError(f"cronlog serve exited {serve.proc.returncode}: {serve.tail()}")
            for at_ns, key in recorder.take():
                slot = slot_of(key)
                if slot is None:
                    continue
                first_call_ns = first_call_ns or at_ns
                if slot < origin_ms:
                    missed += 1
                elif at_ns // 1_000_000 - slot <= ON_TIME_MS:
                    on_time = (at_ns, slot)
                    break
                else:
                    late += 1
            time.sleep(0.02)
    finally:
        serve.stop()
    assert first_call_ns is not None
    lines = _node_log(serve.output)
    return {
        "snapshots": snapshots,
        "baseline": source is not None,
        "first_on_time_fire_s": round((on_time[0] - origin_ns) / 1e9, 3),
        "first_call_s": round((first_call_ns - origin_ns) / 1e9, 3),
        "calls_for_missed_slots": missed,  # slots before the start (or the assignment)
        "late_calls_before": late,  # slots after it, called more than a second late
        "start_to_origin_s": round((origin_ns - started_ns) / 1e9, 3),
        **_phases(lines, origin_ns),
    }


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rounds if key in r]
    return round(statistics.median(values), 3) if values else None


def _summary(
    rounds: list[dict[str, Any]], snapshots: bool, baseline: bool = False
) -> dict[str, Any]:
    mine = [
        r for r in rounds if r["snapshots"] is snapshots and r.get("baseline", False) is baseline
    ]
    keys = ("first_on_time_fire_s", "first_call_s", "log_checked_s", "owned_s", "restored_s")
    return {
        "rounds": len(mine),
        **{f"median_{k}": m for k in keys if (m := _median(mine, k)) is not None},
        "each_first_on_time_fire_s": [r["first_on_time_fire_s"] for r in mine],
    }


def archive_sealed(log: EmbeddedLog, where: Path) -> int:
    """What the previous owner's retention loop had done: every sealed segment archived (a
    node that finds them unarchived spends its first minutes archiving, beside the takeover)."""
    from archive.archive import Archive
    from archive.archiver import Archiver
    from archive.store import DirectoryStore

    where.mkdir(mode=0o700)
    archive = Archive(DirectoryStore(where))
    archiver = Archiver(log, archive)
    for segment in log.segments("events", PARTITION)[:-1]:
        archiver.archive_until(PARTITION, segment.end)
    return archive.archived_through(PARTITION)


def _link_copy(source: Path, target: Path) -> None:
    """A copy of a stopped node's data directory made of hard links: instant at any size, and
    safe because RocksDB never rewrites a file once written (it opens a new WAL, MANIFEST and
    info log, and replaces CURRENT by a rename)."""
    subprocess.run(["cp", "-al", str(source), str(target)], check=True)


def _designs(repeats: int, zero_repeats: int) -> list[tuple[int, bool]]:
    """(round, with snapshots) in the order run: the two designs alternate while both run."""
    order = []
    for i in range(max(repeats, zero_repeats)):
        if i < zero_repeats:
            order.append((i, False))
        if i < repeats:
            order.append((i, True))
    return order


def run_embedded(
    tmp: Path,
    events: int,
    live_jobs: int,
    hot: int,
    tail: int,
    repeats: int,
    zero_repeats: int,
    baseline: Path | None = None,
    checked_log: bool = False,
) -> dict[str, Any]:
    base = tmp / "history"
    base.mkdir(mode=0o700)
    with Recorder() as recorder:
        snapshots = FileSnapshots(base / "snapshots")
        with EmbeddedLog.open(base / "log", 1) as log:
            snapshot, build_s = build(
                log, tmp, snapshots, events, live_jobs, hot, tail, recorder.url
            )
            total = log.end_offset("events", PARTITION)
            archived = archive_sealed(log, base / "archive")
            # A node's start checks what was appended since the previous start, so by
            # default the new owner's check reads the whole history. --checked-log checks it
            # here first (timed apart), so a round measures the recovery alone.
            checked_s = None
            if checked_log:
                started = time.monotonic()
                log.verify()
                checked_s = time.monotonic() - started
        snapshots.close()
        (base / "partitions").write_text("1\n")
        rounds = []
        sources = [None] if baseline is None else [None, baseline]
        for i, with_snapshots in _designs(repeats, zero_repeats):
            for source in sources:
                # A directory of its own: the node's output file is named after it.
                copy = tmp / f"round-{i}-{'snapshot' if with_snapshots else 'zero'}"
                copy = copy.with_name(copy.name + ("-before" if source else ""))
                _link_copy(base, copy)
                try:
                    rounds.append(one_round(recorder, copy, with_snapshots, None, source))
                finally:
                    shutil.rmtree(copy, ignore_errors=True)
                print(json.dumps(rounds[-1]), flush=True)
    figures = _figures("embedded", total, live_jobs, hot, snapshot, build_s, rounds)
    figures["archived_through"] = archived
    figures["checked_beforehand_s"] = None if checked_s is None else round(checked_s, 2)
    if baseline is not None:
        figures["baseline"] = str(baseline)
        figures["baseline_from_zero"] = _summary(rounds, False, baseline=True)
        figures["baseline_snapshot"] = _summary(rounds, True, baseline=True)
    return figures


def run_kafka(
    tmp: Path,
    bootstrap: str,
    events: int,
    live_jobs: int,
    hot: int,
    tail: int,
    repeats: int,
    zero_repeats: int,
) -> dict[str, Any]:
    from eventlog.kafka import KafkaLog
    from eventlog.kafka_snapshots import KafkaSnapshots

    prefix = f"takeover{uuid.uuid4().hex[:10]}"
    opened: dict[str, Any] = {
        "prefix": prefix, "replication_factor": 1, "min_insync_replicas": 1,
    }  # fmt: skip
    with Recorder() as recorder:
        log = KafkaLog.open(bootstrap, 1, **opened)
        snapshots = KafkaSnapshots.open(bootstrap, 1, **opened)
        try:
            snapshot, build_s = build(
                log, tmp, snapshots, events, live_jobs, hot, tail, recorder.url
            )
            total = log.end_offset("events", PARTITION)
        finally:
            snapshots.close()
            log.close()
        rounds = []
        for i, with_snapshots in _designs(repeats, zero_repeats):
            data = tmp / f"round-{i}-{'snapshot' if with_snapshots else 'zero'}"
            data.mkdir(mode=0o700)
            try:
                rounds.append(one_round(recorder, data, with_snapshots, (bootstrap, prefix)))
            finally:
                shutil.rmtree(data, ignore_errors=True)
            print(json.dumps(rounds[-1]), flush=True)
    return _figures("kafka", total, live_jobs, hot, snapshot, build_s, rounds)


def _figures(
    log: str, total: int, live_jobs: int, hot: int, snapshot: dict[str, Any], build_s: float,
    rounds: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    return {
        "mode": "serve",
        "log": log,
        "events": total,
        "live_jobs": live_jobs,
        "hot_jobs": hot,
        "tail": total - snapshot["offset"],
        "build_s": round(build_s, 1),
        "previous_owner_snapshot": snapshot,
        "from_zero": _summary(rounds, False),
        "snapshot": _summary(rounds, True),
        "rounds": rounds,
        "cpus": os.cpu_count(),
    }


def report(figures: dict[str, Any]) -> None:
    print(
        f"cronlog serve, {figures['log']}: partition of {figures['events']:,} events,"
        f" {figures['live_jobs']:,} live jobs ({figures['hot_jobs']:,} every second);"
        f" snapshot at {figures['previous_owner_snapshot']['offset']:,}, tail {figures['tail']:,}"
    )
    origin = "start" if figures["log"] == "embedded" else "assignment"
    print(
        f"medians of {figures['from_zero']['rounds']} (from zero) and"
        f" {figures['snapshot']['rounds']} (snapshot) rounds, seconds from the node's {origin}"
    )
    print(f"{'takeover':<12} {'first on-time fire':>19} {'log checked':>12} {'restored':>9}")
    rows = [("from zero", figures["from_zero"]), ("snapshot", figures["snapshot"])]
    if "baseline" in figures:
        rows += [
            ("(before) 0", figures["baseline_from_zero"]),
            ("(before) sn", figures["baseline_snapshot"]),
        ]
    for name, row in rows:
        if not row["rounds"]:
            continue
        checked = row.get("median_log_checked_s")
        restored = row.get("median_restored_s")
        print(
            f"{name:<12} {row['median_first_on_time_fire_s']:>18.2f}s"
            f" {'-' if checked is None else f'{checked:.2f}s':>12}"
            f" {'-' if restored is None else f'{restored:.2f}s':>9}"
        )
