"""How fast a partition's state and the read model are rebuilt from the log.

    python -m bench.bench_replay

The events are real: four partitions' histories made by driving the core (decide, evolve and
the timing wheel on a fake clock; ``tests/projections/histories.py``): cron, interval, one-shot
and dependency jobs, retries, lease expiries, dead letters, replays, cancels, skips. They are
appended to a fresh embedded log, then each figure starts from empty stores:

* evolve only: read, decode and ``evolve`` every event, no store (the floor);
* state store: ``catch_up`` into a fresh ``RocksStateStore`` per partition, 1000 events a batch
  (read, decode, evolve, and one incremental WriteBatch per batch);
* read model: ``ReadModelRunner.run_once`` into a fresh ``ReadModel`` (every partition).

Appends one JSON line to bench/results/replay.jsonl and prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from core import events as ev
from core.state import PartitionState, evolve
from eventlog.embedded import EmbeddedLog
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import RocksStateStore, catch_up
from tests.projections.histories import Writers, busy_partition

PARTITIONS = 4
STEPS = 18_000  # per partition: about 50k events each
RESULTS = Path(__file__).parent / "results" / "replay.jsonl"


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def evolve_only(log: EmbeddedLog) -> None:
    for p in range(PARTITIONS):
        state = PartitionState(p)
        offset = 0
        while records := log.read_events(p, offset, 1000):
            for record in records:
                evolve(state, ev.decode(record.value))
            offset = records[-1].offset + 1


def into_state_stores(log: EmbeddedLog, data: Path) -> None:
    for p in range(PARTITIONS):
        with RocksStateStore.open(data, p) as store:
            catch_up(store, log, p)


def into_read_model(log: EmbeddedLog, data: Path) -> None:
    with ReadModel.open(data) as model:
        ReadModelRunner(log, model).run_once()


def bench(tmp: Path) -> tuple[int, dict[str, dict[str, float]]]:
    sims = [
        busy_partition(100 + p, STEPS, partition=p, prefix=f"p{p}", cancel_jobs=False)
        for p in range(PARTITIONS)
    ]
    total = sum(len(sim.log) for sim in sims)
    figures: dict[str, dict[str, float]] = {}
    with EmbeddedLog.open(tmp / "log", PARTITIONS) as log:
        writers = Writers(log)
        for p, sim in enumerate(sims):
            writers.append(p, sim.log, chunk=1000)
        writers.close()
        for name, work in (
            ("evolve only", lambda: evolve_only(log)),
            ("state store", lambda: into_state_stores(log, tmp / "node")),
            ("read model", lambda: into_read_model(log, tmp / "node")),
        ):
            seconds = timed(work)
            figures[name] = {"seconds": round(seconds, 3), "events_per_s": round(total / seconds)}
    return total, figures


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cronlog-bench-replay-") as tmp:
        total, figures = bench(Path(tmp))
    line = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "rocksdict": version("rocksdict"),
        "partitions": PARTITIONS,
        "events": total,
        "figures": figures,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(f"replay of {total} events over {PARTITIONS} partitions, {line['nproc']} CPUs")
    print(f"{'into':<14}{'seconds':>10}{'events/s':>12}")
    for name, figure in figures.items():
        print(f"{name:<14}{figure['seconds']:>10.2f}{figure['events_per_s']:>12,.0f}")


if __name__ == "__main__":
    main()
