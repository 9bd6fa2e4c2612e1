"""A partition taken over by a node with no local store: from zero, and from a snapshot.

    python -m bench.bench_takeover                   # short form: 1M events, 100k live jobs
    python -m bench.bench_takeover --events 10000000 # the full form (on demand: minutes)
    python -m bench.bench_takeover --kafka           # on Kafka (KAFKA_BOOTSTRAP_SERVERS or own)
    python -m bench.bench_takeover --serve           # a real ``cronlog serve`` takes over
                                                     # (bench/takeover_serve.py)

The history is real: one partition's events, decided by ``core.partition.Partition``
(decide, evolve, the timing wheel) on a simulated clock and appended to a fresh embedded log.
``--live-jobs`` jobs are registered (all but ``--hot`` of them yearly cron jobs, which stay
armed and never fire in the window); the ``--hot`` jobs run every second with an HTTP target,
each run three events (materialised, leased, completed), until the log holds ``--events``.

The previous owner then caught up a state store and left a snapshot through the node's own
:class:`node.snapshotter.Snapshotter`, and decided ``--tail`` more events after it. Then, on the
same log, side by side, a :class:`node.runner.PartitionRunner` with an empty data directory
takes the partition over:

* **from zero** — today's design before snapshots: ``catch_up`` folds every event;
* **snapshot** — restores the newest snapshot and replays the tail.

Each is timed from assignment (the runner's start) to **deciding** (recovered, wheel armed;
also the process's CPU seconds until then, which a loaded machine does not inflate)
and to the **first fire**: the first run materialised for a slot at or after the moment of
assignment. The runners' clock is the simulated one continued from the hot jobs' next slot,
so a slot is due at the very moment of assignment and the first fire is how late it fires.
Last, the new owner takes one snapshot of its 100k-job state: the runner's **pause** (opening
the view) and the snapshotter's time to read, encode and write it, off the deciding thread.

Appends one JSON line to bench/results/takeover.jsonl and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core import events as ev
from core.clock import Millis
from core.commands import CompleteRun, Outcome, PutJob, StartRun
from core.jobs import HttpTarget, JobSpec
from core.partition import Partition
from core.state import RunState
from eventlog.embedded import EmbeddedLog
from eventlog.port import EventLog, Membership
from eventlog.snapshots import FileSnapshots, SnapshotStore
from node.runner import Dispatcher, PartitionRunner
from node.snapshotter import SnapshotPolicy, Snapshotter, Written
from projections.state_store import RocksStateStore, catch_up
from tests.projections.histories import Writers

RESULTS = Path(__file__).parent / "results" / "takeover.jsonl"
PARTITION = 0
WORKER = "bench-node/executor"
CHUNK = 5000  # events per append while building


class OffsetClock:
    """The simulated clock, continued in real time from ``start`` on."""

    def __init__(self, start: Millis) -> None:
        self._offset = start - time.time_ns() // 1_000_000

    def now_ms(self) -> Millis:
        return time.time_ns() // 1_000_000 + self._offset


class NoRoom(Dispatcher):
    """Executors that never have room: the benchmark times the fire, not the call."""

    worker_id = WORKER

    def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
        return False

    def release(self, tenant: str) -> None:
        pass

    def dispatch(self, runner: PartitionRunner, lease: ev.LeaseGranted) -> None:
        pass


class Measured:
    """Snapshot figures, as ``node.metrics.NodeMetrics`` would take them."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.written: list[Written] = []
        self.was_written = threading.Event()
        self.restored = 0
        self.unusable = 0
        self.failed = 0

    def snapshot_paused(self, seconds: float) -> None:
        self.pauses.append(seconds)

    def snapshot_written(self, written: Written) -> None:
        self.written.append(written)
        self.was_written.set()

    def snapshot_failed(self) -> None:
        self.failed += 1

    def snapshot_restored(self) -> None:
        self.restored += 1

    def snapshot_unusable(self) -> None:
        self.unusable += 1


class History:
    """Decides the partition's history on a simulated clock and appends it to the log."""

    def __init__(
        self,
        log: EventLog,
        start: Millis,
        live_jobs: int,
        hot: int,
        hot_url: str = "http://127.0.0.1:9/hot",
        hot_grace_s: float = 60.0,
    ) -> None:
        self.writers = Writers(log)
        self.now = start
        self.partition = Partition(PARTITION, start)
        self.pending: list[bytes] = []
        self.appended = 0
        hot_spec = JobSpec(
            name="hot",
            tenant="bench",
            target=HttpTarget(url=hot_url),
            interval_sec=1.0,
            misfire_grace_sec=hot_grace_s,
        )
        for i in range(live_jobs - hot):
            spec = JobSpec(
                name=f"yearly-{i}",
                tenant=f"team-{i % 100}",
                target=HttpTarget(url=f"http://127.0.0.1:9/yearly/{i}"),
                schedule="0 0 1 1 *",
            )
            self._keep(self.partition.handle(PutJob(job_id=f"y{i:07d}", spec=spec), self.now))
        for i in range(hot):
            self._keep(self.partition.handle(PutJob(job_id=f"h{i:05d}", spec=hot_spec), self.now))

    def run_until(self, events: int) -> None:
        """Let simulated seconds pass, each hot job's run started and completed, until the
        log holds ``events``."""
        while self.appended + len(self.pending) < events:
            self.now += 1000
            self.partition.advance(self.now)
            leases: list[ev.LeaseGranted] = []
            while (key := self.partition.next_due()) is not None:
                if key[0] == "ready":
                    got = self.partition.handle(StartRun(run_id=key[1], worker_id=WORKER), self.now)
                    leases += [e for e in got if isinstance(e, ev.LeaseGranted)]
                    self._keep(got)
                elif key[0] != "ask":  # no target here to ask: its deadline answers
                    self._keep(self.partition.fire(key, self.now))
            for lease in leases:
                done = CompleteRun(
                    run_id=lease.run_id,
                    fencing_token=lease.fencing_token,
                    outcome=Outcome.SUCCEEDED,
                )
                self._keep(self.partition.handle(done, self.now + 50))
        self.flush()

    def _keep(self, events: list[ev.AnyEvent]) -> None:
        self.pending += [ev.encode(e) for e in events]
        if len(self.pending) >= CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.writers.append(PARTITION, self.pending, chunk=CHUNK)
            self.appended += len(self.pending)
            self.pending = []

    def close(self) -> None:
        self.flush()
        self.writers.close()


def leave_snapshot(log: EventLog, data: Path, snapshots: SnapshotStore) -> dict[str, Any]:
    """What the previous owner did: a store caught up, and a snapshot of it written."""
    measured = Measured()
    snapshotter = Snapshotter(snapshots, SnapshotPolicy(), measured)
    snapshotter.start()
    try:
        with RocksStateStore.open(data, PARTITION) as store:
            catch_up(store, log, PARTITION, batch_size=5000)
            started = time.perf_counter()
            view = store.view()
            snapshotter.take(PARTITION, view, 0)
            pause = time.perf_counter() - started
            snapshotter.wait_idle(PARTITION, 600)
    finally:
        snapshotter.stop()
    if not measured.written:
        raise SystemExit("the previous owner's snapshot was not written")
    written = measured.written[0]
    return {"offset": written.offset, "bytes": written.size, "write_s": written.seconds,
            "pause_s": pause}  # fmt: skip


def take_over(
    log: EventLog, data: Path, clock_start: Millis, snapshots: SnapshotStore | None
) -> dict[str, Any]:
    """A runner with an empty data directory takes the partition: seconds to deciding and to
    the first fire at or after assignment."""
    measured = Measured()
    # Every event: the new owner's first batch after recovery takes a snapshot of its whole
    # state, which is what the pause is measured on.
    snapshotter = (
        Snapshotter(snapshots, SnapshotPolicy(every_events=1, every_s=3600), measured)
        if snapshots is not None
        else None
    )
    if snapshotter is not None:
        snapshotter.start()
    member = log.join(_Quiet())
    deadline = time.monotonic() + 120
    while PARTITION not in member.owned():  # Kafka: the group's assignment takes a moment
        if time.monotonic() > deadline:
            raise SystemExit("the partition was never assigned")
        member.poll(0.1)
    polling = threading.Event()
    # A Kafka member must poll within max.poll.interval.ms or lose its partitions.
    poller = threading.Thread(target=_keep_polling, args=(member, polling), daemon=True)
    poller.start()
    first_fire = threading.Event()
    fired_at: list[float] = []
    assigned_ms = clock_start  # the hot jobs' next slots are due at this very instant

    def appended(partition: int, offsets: list[int], events: list[ev.AnyEvent]) -> None:
        for event in events:
            if isinstance(event, ev.RunMaterialised) and event.scheduled_for >= assigned_ms:
                if not first_fire.is_set():
                    fired_at.append(time.perf_counter())
                    first_fire.set()
                return

    started = time.perf_counter()
    cpu_started = time.process_time()
    clock = OffsetClock(clock_start)
    runner = PartitionRunner(
        PARTITION, log, member.writer(PARTITION), lambda: RocksStateStore.open(data, PARTITION),
        clock, NoRoom(), on_appended=appended, snapshotter=snapshotter,
    )  # fmt: skip
    runner.start()
    try:
        if not runner.deciding.wait(600):
            raise SystemExit("the runner did not recover within 10 minutes")
        deciding = time.perf_counter() - started
        # The process's CPU time over the recovery (nothing else of it runs meanwhile): what
        # the takeover costs on a core of its own, whatever the machine's load.
        deciding_cpu = time.process_time() - cpu_started
        if not first_fire.wait(60):
            raise SystemExit("no run fired within a minute of deciding")
        result: dict[str, Any] = {
            "deciding_s": round(deciding, 3),
            "deciding_cpu_s": round(deciding_cpu, 3),
            "first_fire_s": round(fired_at[0] - started, 3),
            "restored_from": runner.restored_from,
            "jobs": len(runner.state.jobs),
        }
        if snapshotter is not None and measured.was_written.wait(120):
            result["snapshot_pause_ms"] = round(measured.pauses[0] * 1000, 3)
            result["snapshot_write_s"] = round(measured.written[0].seconds, 3)
            result["snapshot_bytes"] = measured.written[0].size
        result["next_slot"] = min(
            job.next_slot for job in runner.state.jobs.values()
            if job.job_id.startswith("h") and job.next_slot is not None
        )  # fmt: skip
        return result
    finally:
        runner.stop()
        polling.set()
        poller.join(10)
        member.close()
        if snapshotter is not None:
            snapshotter.stop()


def _keep_polling(member: Membership, stop: threading.Event) -> None:
    while not stop.is_set():
        member.poll(0.1)


class _Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def build(
    log: EventLog,
    tmp: Path,
    snapshots: SnapshotStore,
    events: int,
    live_jobs: int,
    hot: int,
    tail: int,
) -> tuple[History, dict[str, Any], float]:
    """The partition's history with a snapshot ``tail`` events before its end."""
    start = int(datetime(2026, 6, 1, tzinfo=UTC).timestamp() * 1000)
    built = time.perf_counter()
    history = History(log, start, live_jobs, hot)
    history.run_until(events - tail)
    snapshot = leave_snapshot(log, tmp / "previous-owner", snapshots)
    history.run_until(events)
    history.close()
    return history, snapshot, time.perf_counter() - built


def bench(tmp: Path, events: int, live_jobs: int, hot: int, tail: int) -> dict[str, Any]:
    snapshots = FileSnapshots(tmp / "snapshots")
    with EmbeddedLog.open(tmp / "log", 1) as log:
        history, snapshot, build_s = build(log, tmp, snapshots, events, live_jobs, hot, tail)
        end = history.now + 1000  # the hot jobs' next slot
        total = log.end_offset("events", PARTITION)
    # Side by side, each from an empty data directory, each on its own copy of the same log
    # (a takeover appends what it decides).
    shutil.copytree(tmp / "log", tmp / "log-copy")
    with EmbeddedLog.open(tmp / "log", 1) as log:
        from_zero = take_over(log, tmp / "owner-from-zero", end, None)
    with EmbeddedLog.open(tmp / "log-copy", 1) as log:
        from_snapshot = take_over(log, tmp / "owner-from-snapshot", end, snapshots)
    return _figures("embedded", total, live_jobs, hot, snapshot, build_s, from_zero, from_snapshot)


def bench_kafka(
    tmp: Path, bootstrap: str, events: int, live_jobs: int, hot: int, tail: int
) -> dict[str, Any]:
    """The same on Kafka. A topic cannot be copied, so the snapshot's takeover comes second on
    the same log, its clock started at the hot jobs' next slot after the first takeover's
    (its tail then also holds what the first takeover decided: a little more to read)."""
    from eventlog.kafka import KafkaLog
    from eventlog.kafka_snapshots import KafkaSnapshots

    opened: dict[str, Any] = {
        "prefix": f"takeover-{uuid.uuid4().hex[:12]}", "replication_factor": -1,
        "min_insync_replicas": None,
    }  # fmt: skip
    log = KafkaLog.open(bootstrap, 1, **opened)
    snapshots = KafkaSnapshots.open(bootstrap, 1, **opened)
    try:
        history, snapshot, build_s = build(log, tmp, snapshots, events, live_jobs, hot, tail)
        total = log.end_offset("events", PARTITION)
        from_zero = take_over(log, tmp / "owner-from-zero", history.now + 1000, None)
        from_snapshot = take_over(
            log, tmp / "owner-from-snapshot", from_zero["next_slot"], snapshots
        )
    finally:
        snapshots.close()
        log.close()
    return _figures("kafka", total, live_jobs, hot, snapshot, build_s, from_zero, from_snapshot)


def _figures(
    log: str, total: int, live_jobs: int, hot: int, snapshot: dict[str, Any], build_s: float,
    from_zero: dict[str, Any], from_snapshot: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    return {
        "log": log,
        "events": total,
        "live_jobs": live_jobs,
        "hot_jobs": hot,
        "tail": total - snapshot["offset"],
        "build_s": round(build_s, 1),
        "previous_owner_snapshot": snapshot,
        "from_zero": from_zero,
        "snapshot": from_snapshot,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--live-jobs", type=int, default=100_000)
    parser.add_argument(
        "--hot",
        type=int,
        help="jobs that run every second (default 1000; --serve: 100, calls a real node makes"
        " on time on a shared 2-core machine)",
    )
    parser.add_argument(
        "--tail", type=int, default=50_000, help="events decided after the snapshot"
    )
    parser.add_argument(
        "--kafka",
        action="store_true",
        help="on Kafka: KAFKA_BOOTSTRAP_SERVERS, or a one-node broker of its own",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="the new owner is a `cronlog serve` process with no local store, timed to its first"
        " on-time fire, with and without snapshots (bench/takeover_serve.py)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="--serve: rounds of each design (medians)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="--serve, embedded: a checkout of another commit, run on the same history right"
        " after each round (before and after side by side)",
    )
    parser.add_argument(
        "--zero-repeats",
        type=int,
        help="--serve: rounds of today's design (default --repeats; at 10M events each takes"
        " minutes)",
    )
    parser.add_argument(
        "--checked-log",
        action="store_true",
        help="--serve, embedded: check the log to its end before the rounds, so the new owner's"
        " start check reads nothing and a round times the recovery alone (by default it reads"
        " the whole history, as a start reads everything appended since the previous one)",
    )
    args = parser.parse_args()
    if args.hot is None:
        args.hot = 100 if args.serve else 1000
    if args.serve:
        serve_main(args)
        return
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-takeover-") as tmp:
        if args.kafka:
            from tools.kafka import broker

            external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
            cluster = None if external else broker.start(1, Path(tmp) / "broker")
            try:
                bootstrap = external or cluster.bootstrap_servers  # type: ignore[union-attr]
                figures = bench_kafka(
                    Path(tmp), bootstrap, args.events, args.live_jobs, args.hot, args.tail
                )
            finally:
                if cluster is not None:
                    cluster.stop()
        else:
            figures = bench(Path(tmp), args.events, args.live_jobs, args.hot, args.tail)
    record = {
        "bench": "takeover",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        **figures,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(record) + "\n")
    zero, snap = figures["from_zero"], figures["snapshot"]
    print(
        f"{figures['log']}: partition of {figures['events']:,} events,"
        f" {figures['live_jobs']:,} live jobs;"
        f" snapshot at {figures['previous_owner_snapshot']['offset']:,}"
        f" ({figures['previous_owner_snapshot']['bytes']:,} bytes), tail {figures['tail']:,}"
    )
    print(f"{'takeover':<12} {'deciding':>10} {'first fire':>11} {'CPU to deciding':>16}")
    for name, row in (("from zero", zero), ("snapshot", snap)):
        print(
            f"{name:<12} {row['deciding_s']:>9.2f}s {row['first_fire_s']:>10.2f}s"
            f" {row['deciding_cpu_s']:>15.2f}s"
        )
    if "snapshot_pause_ms" in snap:
        print(
            f"a snapshot of the new owner's state: runner pause {snap['snapshot_pause_ms']} ms,"
            f" written off-thread in {snap['snapshot_write_s']} s"
            f" ({snap['snapshot_bytes']:,} bytes)"
        )
    print(f"load average before {record['load_before']}, after {record['load_after']}")


def serve_main(args: argparse.Namespace) -> None:
    from bench import takeover_serve

    load = os.getloadavg()
    zero_repeats = args.repeats if args.zero_repeats is None else args.zero_repeats
    sizes = (args.events, args.live_jobs, args.hot, args.tail, args.repeats, zero_repeats)
    with tempfile.TemporaryDirectory(prefix="bench-takeover-serve-") as tmp:
        if args.kafka:
            from tools.kafka import broker

            external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
            cluster = None if external else broker.start(1, Path(tmp) / "broker")
            try:
                bootstrap = external or cluster.bootstrap_servers  # type: ignore[union-attr]
                figures = takeover_serve.run_kafka(Path(tmp), bootstrap, *sizes)
            finally:
                if cluster is not None:
                    cluster.stop()
        else:
            figures = takeover_serve.run_embedded(
                Path(tmp), *sizes, baseline=args.baseline, checked_log=args.checked_log
            )
    record = {
        "bench": "takeover",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        **figures,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(record) + "\n")
    takeover_serve.report(figures)
    print(f"load average before {record['load_before']}, after {record['load_after']}")


if __name__ == "__main__":
    main()
