"""Disk stays flat under a steady load run for ten times the retention window.

    python -m bench.disk_flat                       # 10 s retention, 120 s of load, 50 jobs
    python -m bench.disk_flat --retention 30 --duration 330 --jobs 200

``cronlog serve`` (embedded) runs with a short retention (``--retention``, seconds), small
segments (``--segment-bytes 16KiB``, ``--segment-age`` a fifth of the retention), a retention
check five times a second and a snapshot every second, while ``--jobs`` jobs fire every
second at a recording target. Every ``--sample`` seconds the data directory's parts are
measured (bytes of the files under each):

* **hot**: what the node must keep for recovery: the log (``log/``), the partitions' state
  stores (``node/p*``) and the snapshots (``snapshots/``). This is what must stay flat;
* **history**: the read model (``node/read_model``), which keeps every run;
* **archive** (``archive/``): meant to grow, by what left the log;
* **wal**, **info logs** and **bookkeeping**, counted apart from the above: every database's
  write-ahead log files, which RocksDB drops once their memtables are flushed and bounds at
  ``eventlog.rocks.WAL_BYTES`` a database; its ``LOG`` files, rolled at ``INFO_LOG_BYTES``
  with ``INFO_LOGS_KEPT`` kept; its MANIFEST and OPTIONS files (two OPTIONS kept: a restart
  adds one). The first two grow to their cap (tens of MiB a database, more than a short run
  writes) and no further; the MANIFEST gains a record per flush and compaction until RocksDB
  starts a new one.

The node is stopped a third of the way in (at least two retention windows of warm-up) and
restarted at once, and stopped again at the end: each time, once stopped, the data directory
is measured (RocksDB flushes its memtables on close, so that is the data itself; a live size is
mostly write-ahead log, whose files go only as memtables flush). The hot size at the end must
be at most ``--factor`` times the one at a third; without retention it would be about three
times. Appends one JSON line to
``bench/results/disk_flat.jsonl``; ``tests/bench/test_disk_flat.py`` runs the short form.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import Recorder, Serve, loadavg, machine

RESULTS = Path(__file__).parent / "results" / "disk_flat.jsonl"
DEFAULT_FACTOR = 1.5
PARTS: tuple[str, ...] = ("hot", "log", "stores", "snapshots", "history", "archive", "wal")
PARTS += ("info_logs", "bookkeeping")


@dataclass
class Sample:
    at_s: float
    hot: int
    log: int
    stores: int
    snapshots: int
    history: int
    archive: int
    wal: int
    info_logs: int
    bookkeeping: int


@dataclass
class Run:
    retention_s: float
    duration_s: float
    jobs: int
    samples: list[Sample] = field(default_factory=list)  # live, every ``sample_s``
    settled: list[Sample] = field(default_factory=list)  # after a stop: memtables flushed
    runs_fired: int = 0

    def growth(self) -> float:
        """The hot size at the end over the hot size a third of the way in, each measured
        with the node stopped (RocksDB flushes its memtables on close, so what the data
        directory holds then is the data, not what a write-ahead log happens to hold)."""
        if len(self.settled) < 2:
            raise ValueError("the run was not measured stopped twice")
        return self.settled[-1].hot / self.settled[0].hot

    def summary(self) -> dict[str, Any]:
        parts = PARTS

        def peak(name: str) -> int:
            return max(int(getattr(s, name)) for s in self.samples)

        return {
            "retention_s": self.retention_s,
            "duration_s": self.duration_s,
            "jobs": self.jobs,
            "runs_fired": self.runs_fired,
            "samples": len(self.samples),
            "settled_at_third_bytes": {p: getattr(self.settled[0], p) for p in parts},
            "settled_at_end_bytes": {p: getattr(self.settled[-1], p) for p in parts},
            "live_peak_bytes": {p: peak(p) for p in parts},
            "hot_growth": round(self.growth(), 3),
        }


_BOOKKEEPING = ("OPTIONS-", "MANIFEST-", "CURRENT", "IDENTITY", "LOCK", "rocksdict-config")


def _kind(name: str) -> str:
    """``info`` (RocksDB's info log), ``wal`` (a RocksDB write-ahead log file),
    ``bookkeeping`` (RocksDB's MANIFEST, OPTIONS and small files of its own) or ``data``."""
    if name == "LOG" or name.startswith("LOG.old"):
        return "info"
    if name.endswith(".log") and name[:-4].isdigit():
        return "wal"
    if name.startswith(_BOOKKEEPING):
        return "bookkeeping"
    return "data"


def _bytes(path: Path, kind: str = "data") -> int:
    """Bytes of the files of ``kind`` under ``path``."""
    total = 0
    if not path.exists():
        return 0
    for item in path.rglob("*"):
        try:
            if item.is_file() and _kind(item.name) == kind:
                total += item.stat().st_size
        except OSError:  # RocksDB removed it while we walked
            continue
    return total


def measure(data_dir: Path, at_s: float) -> Sample:
    log = _bytes(data_dir / "log")
    node = data_dir / "node"
    history = _bytes(node / "read_model")
    stores = _bytes(node) - history
    snapshots = _bytes(data_dir / "snapshots")
    return Sample(
        round(at_s, 2),
        log + stores + snapshots,
        log,
        stores,
        snapshots,
        history,
        _bytes(data_dir / "archive"),
        _bytes(data_dir, "wal"),
        _bytes(data_dir, "info"),
        _bytes(data_dir, "bookkeeping"),
    )


def serve_args(retention_s: float) -> list[str]:
    """A retention of seconds: segments sealed by age five times a retention window."""
    segment_ms = max(200, round(retention_s * 1000 / 5))
    return [
        "--partitions", "2",
        "--retention", f"{round(retention_s * 1000)}ms",
        "--segment-bytes", "16KiB",
        "--segment-age", f"{segment_ms}ms",
        "--retention-check", "200ms",
        "--snapshot-every-sec", "1",
        "--log-level", "warning",
    ]  # fmt: skip


def _create_jobs(serve: Serve, jobs: int, target_url: str) -> None:
    for i in range(jobs):
        body = json.dumps(
            {
                "job_id": f"tick-{i}",
                "name": f"tick-{i}",
                "interval_sec": 1,
                "target": target_url,
            }
        ).encode()
        request = urllib.request.Request(
            f"{serve.url}/v1/jobs",
            data=body,
            method="POST",
            headers={**serve.headers, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status not in (200, 201):
                raise RuntimeError(f"job {i} refused: {response.status}")


def run(
    data_dir: Path,
    target_url: str,
    *,
    retention_s: float,
    duration_s: float,
    jobs: int,
    sample_s: float = 0.5,
    calls: Callable[[], int] | None = None,
) -> Run:
    """``cronlog serve`` on ``data_dir`` under the load for ``duration_s``, sampled live, and
    measured stopped twice: a third of the way in (restarted at once: the jobs go on firing)
    and at the end. ``calls()``, if given, counts the target's calls so far."""
    if duration_s < 6 * retention_s:
        raise ValueError("run at least six retention windows: two of warm-up in the first third")
    result = Run(retention_s, duration_s, jobs)
    started = time.monotonic()
    for phase, until in enumerate((duration_s / 3, duration_s)):
        serve = Serve(data_dir, extra=serve_args(retention_s))
        serve.start()
        try:
            serve.wait_ready(timeout_s=60)
            if phase == 0:
                _create_jobs(serve, jobs, target_url)
                started = time.monotonic()
            for _ in range(int(duration_s / sample_s) + 1):  # the load runs on its own
                at = time.monotonic() - started
                if at >= until:
                    break
                assert serve.proc is not None
                if serve.proc.poll() is not None:
                    raise RuntimeError(f"cronlog serve exited: {serve.tail()}")
                result.samples.append(measure(data_dir, at))
                time.sleep(sample_s)
        finally:
            serve.stop()
        result.settled.append(measure(data_dir, time.monotonic() - started))
    if calls is not None:
        result.runs_fired = calls()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retention", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument(
        "--duration", type=float, help="seconds of load (default 12 retentions: 2 of warm-up)"
    )
    parser.add_argument("--jobs", type=int, default=50, help="jobs firing every second")
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--factor", type=float, default=DEFAULT_FACTOR)
    parser.add_argument("--data-dir", type=Path, help="default: a fresh temporary directory")
    args = parser.parse_args()
    duration = args.duration or 12 * args.retention
    load = loadavg()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-disk-flat-") as tmp:
        data_dir = args.data_dir or Path(tmp) / "data"
        data_dir.mkdir(mode=0o700, exist_ok=True)
        with Recorder() as recorder:
            result = run(
                data_dir,
                recorder.url,
                retention_s=args.retention,
                duration_s=duration,
                jobs=args.jobs,
                sample_s=args.sample,
                calls=recorder.count,
            )
    summary = result.summary()
    record = {
        "bench": "disk_flat",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": load,
        "load_after": loadavg(),
        "factor": args.factor,
        "flat": summary["hot_growth"] <= args.factor,
        **summary,
        "series": [vars(s) for s in result.samples[:: max(1, len(result.samples) // 60)]],
    }
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(record) + "\n")
    mib = 2**20
    print(
        f"{args.jobs} jobs every second for {duration:g} s, retention {args.retention:g} s;"
        f" {result.runs_fired} calls"
    )
    print(f"{'':<10} {'stopped at 1/3':>15} {'stopped at end':>15} {'live peak':>12}")
    for name in PARTS:
        a = summary["settled_at_third_bytes"][name] / mib
        b = summary["settled_at_end_bytes"][name] / mib
        c = summary["live_peak_bytes"][name] / mib
        print(f"{name:<10} {a:11.2f} MiB {b:11.2f} MiB {c:8.2f} MiB")
    verdict = "flat" if record["flat"] else "NOT flat"
    print(f"hot growth x{summary['hot_growth']} (bound x{args.factor}): {verdict}")
    print(f"load average before {load}, after {record['load_after']}")
    if not record["flat"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
