"""Throughput of the embedded log (RocksDB, every acknowledged write fsynced).

    python -m bench.bench_log

Scenarios, each run for a fixed time on a fresh log of 16 partitions, 100-byte values:

* submit: after a 0.5 s warm-up, commands from 1 thread, then from 16 threads at once
  (group commit shares fsyncs).
* append: events through partition writers, 1 or 100 events per append, from 1 thread and from
  16 threads (one writer each).
* replay: every event written above, read back partition by partition, 1000 per read.

"per fsync" is writes (submits or appends) per synced WriteBatch: 1.0 means no sharing.
Appends one JSON line to bench/results/log.jsonl and prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from eventlog.embedded import EmbeddedLog
from eventlog.port import PartitionWriter

PARTITIONS = 16
VALUE = b"v" * 100
SECONDS = 2.5
RESULTS = Path(__file__).parent / "results" / "log.jsonl"


class _Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def run_threads(
    threads: int, one_write: Callable[[int], int], seconds: float = SECONDS
) -> tuple[int, int, float]:
    """Call ``one_write(thread)`` from ``threads`` threads for ``seconds``: writes, records, s."""
    counts = [(0, 0)] * threads
    start = threading.Barrier(threads + 1)
    deadline = 0.0

    def loop(n: int) -> None:
        writes = records = 0
        start.wait()
        while time.perf_counter() < deadline:
            records += one_write(n)
            writes += 1
        counts[n] = (writes, records)

    workers = [threading.Thread(target=loop, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    deadline = began + seconds
    start.wait()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    return sum(w for w, _ in counts), sum(r for _, r in counts), elapsed


def measure(log: EmbeddedLog, threads: int, one_write: Callable[[int], int]) -> dict[str, float]:
    batches_before = log.synced_batches
    writes, records, elapsed = run_threads(threads, one_write)
    batches = log.synced_batches - batches_before
    return {
        "threads": threads,
        "writes_per_s": writes / elapsed,
        "records_per_s": records / elapsed,
        "writes_per_fsync": writes / max(batches, 1),
        "mean_latency_ms": 1000 * elapsed * threads / max(writes, 1),
    }


def bench(path: Path) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    with EmbeddedLog.open(path, PARTITIONS) as log:

        def submit(n: int) -> int:
            log.submit(n % PARTITIONS, VALUE)
            return 1

        run_threads(16, submit, seconds=0.5)  # warm up: WAL file, memtable, thread start-up
        figures["submit x1"] = measure(log, 1, submit)
        figures["submit x16"] = measure(log, 16, submit)

        member = log.join(_Quiet())
        member.poll(0.0)
        writers: list[PartitionWriter] = [member.writer(p) for p in range(PARTITIONS)]
        for per_append in (1, 100):
            events = [VALUE] * per_append

            def append(n: int, events: list[bytes] = events) -> int:
                return len(writers[n].append(events))

            for threads in (1, 16):
                figures[f"append {per_append}/batch x{threads}"] = measure(log, threads, append)
        member.close()

        total, began = 0, time.perf_counter()
        for partition in range(PARTITIONS):
            offset = 0
            while batch := log.read_events(partition, offset, 1000):
                total += len(batch)
                offset = batch[-1].offset + 1
        elapsed = time.perf_counter() - began
        figures["replay"] = {"records": total, "records_per_s": total / elapsed}
    return figures


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cronlog-bench-") as scratch:
        figures = bench(Path(scratch) / "log")
    line = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "rocksdict": version("rocksdict"),
        "partitions": PARTITIONS,
        "value_bytes": len(VALUE),
        "seconds_per_scenario": SECONDS,
        "figures": {
            name: {k: round(v, 3) for k, v in values.items()} for name, values in figures.items()
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(line) + "\n")

    print(f"embedded log, {line['nproc']} CPUs, {PARTITIONS} partitions, 100-byte values")
    print(f"{'scenario':<22}{'writes/s':>12}{'records/s':>14}{'per fsync':>11}{'latency ms':>12}")
    for name, values in figures.items():
        if name == "replay":
            continue
        print(
            f"{name:<22}{values['writes_per_s']:>12,.0f}{values['records_per_s']:>14,.0f}"
            f"{values['writes_per_fsync']:>11.1f}{values['mean_latency_ms']:>12.2f}"
        )
    replay = figures["replay"]
    print(
        f"{'replay':<22}{'':>12}{replay['records_per_s']:>14,.0f}  {replay['records']:,.0f} events"
    )


if __name__ == "__main__":
    main()
