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
* **wal** and **info logs**, counted apart from the above: every database's write-ahead log
  files, which RocksDB drops once their memtables are flushed and bounds at
  ``eventlog.rocks.WAL_BYTES`` a database, and its ``LOG`` files, rolled at
  ``INFO_LOG_BYTES`` with ``INFO_LOGS_KEPT`` kept. Both grow to their cap (tens of MiB a
  database, more than a short run writes) and no further; a short run sees them rise.

After a warm-up of two retention windows, the largest hot size of the last third of the run
must be at most ``--factor`` times the largest of the first third (RocksDB compacts in steps,
so the size saws; the bound is on its peaks). Appends one JSON line to
``bench/results/disk_flat.jsonl``; ``tests/bench/test_disk_flat.py`` runs the short form.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import Recorder, Serve, loadavg, machine

RESULTS = Path(__file__).parent / "results" / "disk_flat.jsonl"
DEFAULT_FACTOR = 1.5


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


@dataclass
class Run:
    retention_s: float
    duration_s: float
    jobs: int
    samples: list[Sample] = field(default_factory=list)
    runs_fired: int = 0

    def thirds(self) -> tuple[list[Sample], list[Sample]]:
        """The samples of the first and last thirds of the run after the warm-up."""
        warm = [s for s in self.samples if s.at_s >= 2 * self.retention_s]
        third = len(warm) // 3
        return warm[:third], warm[len(warm) - third :]

    def growth(self) -> float:
        """The last third's largest hot size over the first third's."""
        first, last = self.thirds()
        if not first or not last:
            raise ValueError("too few samples after the warm-up: run longer")
        return max(s.hot for s in last) / max(s.hot for s in first)

    def summary(self) -> dict[str, Any]:
        first, last = self.thirds()

        def peak(samples: list[Sample], name: str) -> int:
            return max(int(getattr(s, name)) for s in samples)

        parts = ("hot", "log", "stores", "snapshots", "history", "archive", "wal", "info_logs")
        return {
            "retention_s": self.retention_s,
            "duration_s": self.duration_s,
            "jobs": self.jobs,
            "runs_fired": self.runs_fired,
            "samples": len(self.samples),
            "first_third_peak_bytes": {p: peak(first, p) for p in parts},
            "last_third_peak_bytes": {p: peak(last, p) for p in parts},
            "hot_growth": round(self.growth(), 3),
        }


def _kind(name: str) -> str:
    """``info`` (RocksDB's info log), ``wal`` (a RocksDB write-ahead log file) or ``data``."""
    if name == "LOG" or name.startswith("LOG.old"):
        return "info"
    if name.endswith(".log") and name[:-4].isdigit():
        return "wal"
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
    calls: Any = None,
) -> Run:
    """``cronlog serve`` on ``data_dir`` under the load for ``duration_s``, sampled;
    ``calls()``, if given, counts the target's calls so far."""
    result = Run(retention_s, duration_s, jobs)
    serve = Serve(data_dir, extra=serve_args(retention_s))
    serve.start()
    try:
        serve.wait_ready(timeout_s=60)
        _create_jobs(serve, jobs, target_url)
        started = time.monotonic()
        rounds = int(duration_s / sample_s) + 1
        for i in range(rounds):  # the load runs on its own; this only samples it
            next_at = started + i * sample_s
            time.sleep(max(0.0, next_at - time.monotonic()))
            assert serve.proc is not None
            if serve.proc.poll() is not None:
                raise RuntimeError(f"cronlog serve exited: {serve.tail()}")
            result.samples.append(measure(data_dir, time.monotonic() - started))
        if calls is not None:
            result.runs_fired = calls()
    finally:
        serve.stop()
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
    for name in ("hot", "log", "stores", "snapshots", "history", "archive", "wal", "info_logs"):
        a = summary["first_third_peak_bytes"][name] / mib
        b = summary["last_third_peak_bytes"][name] / mib
        print(f"{name:<10} first third peak {a:8.2f} MiB   last third peak {b:8.2f} MiB")
    verdict = "flat" if record["flat"] else "NOT flat"
    print(f"hot growth x{summary['hot_growth']} (bound x{args.factor}): {verdict}")
    print(f"load average before {load}, after {record['load_after']}")
    if not record["flat"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
