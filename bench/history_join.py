"""A node joining with no read model: from process start to a job's complete history.

    python -m bench.history_join                      # short form: 1M events, 3 rounds
    python -m bench.history_join --events 10000000    # the goal's size (on demand: long)

The history is bench_takeover's: one partition's events decided by ``core.partition.Partition``
on a simulated clock and appended to an embedded log (``--live-jobs`` yearly jobs that never
fire, ``--hot`` jobs of team ``bench`` that run every simulated second, three events a run).
``--tail`` events before its end, the cluster's writer left what a joining node finds: a
snapshot of the partition's state (``node.snapshotter``) and a checkpoint of a read model
caught up to that point (``projections.history_checkpoint.take``, what the owner of partition 0
writes every ``--history-checkpoint-every``) in the archive directory. The default tail is the
worst case of the default spacing at the seeds' load: 460 events/s for 2 minutes. At the end
the hot jobs are paused, so the node measured has nothing to fire. The history starts two days
before the run, so all of it lies within the read model's hot window (``--history-window``).

Each round starts ``cronlog serve`` twice, side by side, on copies of that data directory with
no read model (``DIR/node`` absent): **from zero** (the archive holds no checkpoint: today's
design, every event folded) and **checkpoint** (the node restores it and folds the tail). Each
is timed from the process start until ``GET /v1/jobs/h00000/runs`` returns that job's complete
history: every run from the first slot to the last, paged through (a job with runs early and
late in the history). Both start with ``--skip-log-check`` (a node joining a cluster reads no
local log; the embedded log's start-up check would add ~0.6 s per million records to both).
The medians of ``--rounds`` rounds are reported, with the read model's size on disk per run, the
checkpoint's size and the time to take it (and how long folds waited), and what the node said
it restored. Appends one JSON line to bench/results/history_join.jsonl.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
import time
import urllib.error
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from archive.store import DirectoryStore
from bench.bench_takeover import PARTITION, History, leave_snapshot
from bench.common import (
    LIMITS,
    Serve,
    append_result,
    cpu_seconds,
    http_get,
    loadavg,
    log,
    machine,
)
from core import events as ev
from core.commands import PauseJob
from eventlog.embedded import EmbeddedLog
from eventlog.snapshots import FileSnapshots
from projections import history_checkpoint
from projections.read_model import ReadModel, ReadModelRunner

JOB = "h00000"
SEEDS_EVENTS_PER_S = 460  # 10M runs a day, about four events a run
DEFAULT_TAIL = SEEDS_EVENTS_PER_S * 2 * 60
_RESTORED = re.compile(
    r"restored from history checkpoint \S+ \((\d+) events, ([\d.]+) MB in ([\d.]+) s\)"
)


class Traced(History):
    """The history, noting the slots of the job whose history is asked for."""

    def __init__(self, *args: Any) -> None:
        self.slots: list[int] = []
        self.runs = 0
        super().__init__(*args)

    def _keep(self, events: list[ev.AnyEvent]) -> None:
        for event in events:
            if isinstance(event, ev.RunMaterialised):
                self.runs += 1
                if event.job_id == JOB:
                    self.slots.append(event.scheduled_for)
        super()._keep(events)

    def pause_hot(self) -> None:
        for job_id, job in list(self.partition.state.jobs.items()):
            if job_id.startswith("h"):
                command = PauseJob(job_id=job_id, tenant=job.spec.tenant)
                self._keep(self.partition.handle(command, self.now))


def build(source: Path, events: int, live_jobs: int, hot: int, tail: int) -> dict[str, Any]:
    """The data directory a joining node finds: log, snapshot, archive with a checkpoint."""
    started = time.perf_counter()
    # Two days ago: the history then lies within the read model's hot window (30 days), which
    # is what a joining node serves from its model.
    start = (int(time.time()) - 2 * 86_400) * 1000
    snapshots = FileSnapshots(source / "snapshots")
    store = DirectoryStore(source / "archive")
    with EmbeddedLog.open(source / "log", 1) as log_:
        history = Traced(log_, start, live_jobs, hot)
        history.run_until(events - tail)
        runs_at_checkpoint = history.runs
        log("history before the checkpoint appended; the writer's model folds it")
        leave_snapshot(log_, source / "writer", snapshots)
        with ReadModel.open(source / "writer") as model:
            folded, cpu = time.perf_counter(), time.process_time()
            ReadModelRunner(log_, model, batch_size=5000).run_once()
            fold_s, fold_cpu_s = time.perf_counter() - folded, time.process_time() - cpu
            digests: dict[tuple[int, int, int], str] = {}
            taken = history_checkpoint.take(
                model, store, source / "writer", node_id="writer", now_ms=history.now,
                digests=digests,
            )  # fmt: skip
        model_bytes = _disk(source / "writer" / "read_model")
        history.run_until(events)
        history.pause_hot()
        history.close()
        total = log_.end_offset("events", PARTITION)
        # The writer's next checkpoint, after the tail (into a copy of the store, which the
        # joining nodes never see): what one costs once the first is there.
        scratch = source / "writer" / "archive"
        shutil.copytree(source / "archive", scratch)
        with ReadModel.open(source / "writer") as model:
            ReadModelRunner(log_, model, batch_size=5000).run_once()
            following = history_checkpoint.take(
                model, DirectoryStore(scratch), source / "writer", node_id="writer",
                now_ms=history.now + 1, digests=digests,
            )  # fmt: skip
    snapshots.close()
    shutil.rmtree(source / "writer")
    (source / "partitions").write_text("1\n")  # what `cronlog serve` records on a first start
    source.chmod(0o700)
    return {
        "events": total,
        "build_s": round(time.perf_counter() - started, 1),
        "job_runs": len(history.slots),
        "first_slot": history.slots[0],
        "last_slot": history.slots[-1],
        "writer_fold_s": round(fold_s, 1),
        "writer_fold_events_per_s": round(taken.positions[PARTITION] / fold_s),
        # CPU, which the machine's load does not inflate: what folding costs a core.
        "writer_fold_events_per_cpu_s": round(taken.positions[PARTITION] / fold_cpu_s),
        "read_model_bytes": model_bytes,
        "read_model_bytes_per_run": round(model_bytes / runs_at_checkpoint, 1),
        "checkpoint": {
            "at": taken.positions[PARTITION],
            "bytes": taken.size,
            "files": taken.files,
            "take_s": round(taken.seconds, 3),
            "folds_waited_ms": round(taken.pause_s * 1000, 2),
        },
        "next_checkpoint": {
            "after_events": following.positions[PARTITION] - taken.positions[PARTITION],
            "bytes": following.size,
            "uploaded_bytes": following.uploaded,
            "take_s": round(following.seconds, 3),
            "folds_waited_ms": round(following.pause_s * 1000, 2),
        },
        "tail": total - taken.positions[PARTITION],
    }


def _disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def join(source: Path, data: Path, checkpoint: bool, built: dict[str, Any]) -> dict[str, Any]:
    """One ``cronlog serve`` on a copy of ``source``: seconds until the job's whole history."""
    shutil.copytree(source, data)
    if not checkpoint:
        shutil.rmtree(data / "archive" / "history")
    serve = Serve(data, extra=["--skip-log-check"])
    limits = data.parent / f"{data.name}.limits.toml"
    limits.write_text(LIMITS + "max_page_size = 1000\n")
    load = loadavg()
    serve.start()
    try:
        answered = _wait_for_history(serve, built)
        # The node's CPU until then, which the machine's load does not inflate.
        cpu = cpu_seconds(serve.pid)
    finally:
        serve.stop()
    said = _RESTORED.search(serve.output.read_text(errors="replace"))
    result: dict[str, Any] = {
        "load_at_start": load,
        "answered_s": round(answered, 3),
        "cpu_s": None if cpu is None else round(cpu, 2),
    }
    if said is not None:
        result["restored_events"] = int(said.group(1))
        result["restored_mb"] = float(said.group(2))
        result["restore_s"] = float(said.group(3))
    shutil.rmtree(data)
    return result


def _wait_for_history(serve: Serve, built: dict[str, Any], timeout_s: float = 1800) -> float:
    """Poll the job's newest page until its last slot shows, then page through it all; the
    seconds from the process start until a paging found every run."""
    deadline = time.monotonic() + timeout_s
    assert serve.proc is not None
    while time.monotonic() < deadline:
        if serve.proc.poll() is not None:
            raise RuntimeError(f"cronlog serve exited: {serve.tail()}")
        try:
            if _newest_slot(serve) >= built["last_slot"] and _all_slots(serve) == built["job_runs"]:
                return time.monotonic() - serve.started_at
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass  # not listening yet, or the job not folded yet (404)
        time.sleep(0.1)
    raise RuntimeError(f"the history was not complete after {timeout_s} s")


def _page(serve: Serve, cursor: str | None, limit: int = 1000) -> dict[str, Any]:
    url = f"{serve.url}/v1/jobs/{JOB}/runs?limit={limit}"
    if cursor is not None:
        url += f"&cursor={cursor}"
    page: dict[str, Any] = json.loads(http_get(url, timeout=30, headers=serve.headers))
    return page


def _slot(run: dict[str, Any]) -> int:
    return int(run["run_id"].rsplit(".", 1)[1])


def _newest_slot(serve: Serve) -> int:
    runs = _page(serve, None, limit=2)["runs"]  # light: the poll shares the node's cores
    return max((_slot(r) for r in runs), default=-1)


def _all_slots(serve: Serve) -> int:
    """How many runs of the job the listing shows, paged through (bounded: one page more
    than the history needs)."""
    seen: set[int] = set()
    cursor = None
    for _ in range(10_000):
        page = _page(serve, cursor)
        seen.update(_slot(r) for r in page["runs"] if r["state"] == "succeeded")
        cursor = page["next_cursor"]
        if cursor is None:
            break
    return len(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--live-jobs", type=int, default=10_000)
    parser.add_argument("--hot", type=int, default=100, help="jobs that run every second")
    parser.add_argument(
        "--tail",
        type=int,
        default=DEFAULT_TAIL,
        help=f"events after the checkpoint (default {DEFAULT_TAIL:,}: 2 min at the seeds' load)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only",
        choices=("from_zero", "checkpoint"),
        help="run one side only (the other's figure from an earlier side-by-side run)",
    )
    args = parser.parse_args()
    if not 0 < args.tail < args.events:
        parser.error("--tail must be between 0 and --events")
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-history-join-") as tmp:
        source = Path(tmp) / "source"
        log(f"building {args.events:,} events")
        built = build(source, args.events, args.live_jobs, args.hot, args.tail)
        log(f"built: {json.dumps(built)}")
        sides = [args.only] if args.only else ["from_zero", "checkpoint"]
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
        for i in range(args.rounds):
            for name in rounds:
                result = join(source, Path(tmp) / f"{name}-{i}", name == "checkpoint", built)
                log(f"round {i + 1} {name}: {json.dumps(result)}")
                rounds[name].append(result)
    record = {
        "bench": "history_join",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": load_before,
        "load_after": loadavg(),
        "live_jobs": args.live_jobs,
        "hot_jobs": args.hot,
        **built,
        "rounds": rounds,
        "median_answered_s": {
            name: round(statistics.median(r["answered_s"] for r in results), 3)
            for name, results in rounds.items()
        },
    }
    append_result("history_join", record)
    print(
        f"{record['events']:,} events, job {JOB}: {built['job_runs']:,} runs; checkpoint at"
        f" {built['checkpoint']['at']:,} ({built['checkpoint']['bytes'] / 1e6:.1f} MB), tail"
        f" {built['tail']:,}; read model {built['read_model_bytes_per_run']} bytes a run"
    )
    for name, seconds in record["median_answered_s"].items():
        each = ", ".join(f"{r['answered_s']:.2f}" for r in rounds[name])
        cpu = ", ".join(str(r["cpu_s"]) for r in rounds[name])
        print(
            f"{name:<11} complete history after {seconds:>7.2f} s (median; rounds {each};"
            f" the node's CPU seconds {cpu})"
        )
    print(f"load average before {load_before}, after {record['load_after']}")


if __name__ == "__main__":
    main()
