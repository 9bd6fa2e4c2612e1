"""The midnight herd, end to end: one embedded node, N jobs due in the same second.

    python -m bench.bench_herd [--jobs 50000] [--workers 1] [--profile]

Seed 1 of the design: many cron jobs use ``0 0 * * *``, so 50,000 jobs may be due in the same
second. This drives a real :class:`~node.node.Node` on an :class:`EmbeddedLog` (8 partitions)
in a temporary directory. Every job has a pull target, so no HTTP call is made: the figures
are the scheduler's own.

1. **Warm-up.** 2,000 jobs of another tenant on a leap-day schedule (they never fire during
   the run) measure the registration rate; the herd's slot is chosen from it, far enough out
   that registration ends before it.
2. **Registration.** N jobs on ``M H * * * S`` (6 fields, seconds last: daily at the slot's
   UTC second), registered through ``node.execute(PutJob(...))`` in concurrent chunks, so the
   runners decide them in batches and the log commits them in groups. Leases last an hour,
   so none runs out while the claims are made.
3. **The slot.** From the slot until all N ``RunMaterialised`` are durable (the log's end
   offsets, polled every 2 ms) and visible in the read model (pending count == N). Lateness
   is each event's ``at`` (when its runner decided it) minus the slot, read back from the
   log. Events of one runner batch share one ``at``, so grouping by (partition, ``at``) gives
   the runner batch sizes; ``synced_batches`` gives the log's fsyncs.
4. **Claims.** ``node.claim(tenant, pool, worker, limit=100)`` in a loop (``--workers``
   concurrent loops) until every run is leased.

``--profile [registration|slot|claims]`` runs one phase (the slot by default) under cProfile:
one profile per runner, read-model and committer thread and the caller's, on each thread's CPU
clock, merged; it prints the top functions. Its timings are inflated, so a profiled run is not
recorded. Otherwise appends one JSON line to bench/results/herd.jsonl and
prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.common import daily_at, now_ms, percentile
from core import events as ev
from core.commands import PutJob
from core.jobs import JobSpec, PullTarget
from core.wheel import TimingWheel
from eventlog.embedded import EmbeddedLog
from node.node import Node
from node.runner import MAX_BATCH, PartitionRunner
from projections.read_model import ReadModel

RESULTS = Path(__file__).parent / "results" / "herd.jsonl"
PARTITIONS = 8
TENANT = "herd"
POOL = "herd"
WARM_UP_TENANT = "herd-warmup"
WARM_UP_JOBS = 2000
CHUNK = 500
CLAIM_LIMIT = 100
LEASE_SEC = 3600.0  # the longest allowed: no lease runs out while the bench claims
MARGIN_S = 5.0


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def spec(i: int, tenant: str, schedule: str) -> JobSpec:
    return JobSpec(
        name=f"{tenant} job {i}",
        tenant=tenant,
        target=PullTarget(pool=POOL),
        schedule=schedule,
        lease_sec=LEASE_SEC,
    )


async def register(
    node: Node, tenant: str, prefix: str, count: int, schedule: str
) -> list[ev.AnyEvent]:
    """Register ``count`` jobs in concurrent chunks; the events they decided."""
    decided: list[ev.AnyEvent] = []
    for start in range(0, count, CHUNK):
        answers = await asyncio.gather(
            *(
                node.execute(PutJob(job_id=f"{prefix}-{i:06d}", spec=spec(i, tenant, schedule)))
                for i in range(start, min(count, start + CHUNK))
            )
        )
        for events in answers:
            decided += events
    return decided


async def claim_all(node: Node, total: int, workers: int) -> tuple[int, int, int]:
    """Claim until ``total`` runs are leased; (leases, claim calls, empty claims)."""
    granted = calls = empty = 0

    async def worker(name: str) -> None:
        nonlocal granted, calls, empty
        while granted < total:
            leases = await node.claim(TENANT, POOL, name, limit=CLAIM_LIMIT)
            calls += 1
            granted += len(leases)
            if not leases:
                empty += 1
                if empty > 1000:
                    raise RuntimeError(f"claims stalled at {granted} of {total} runs")
                await asyncio.sleep(0.01)

    await asyncio.gather(*(worker(f"bench-worker-{w}") for w in range(workers)))
    return granted, calls, empty


class DurableWatch:
    """Polls the log's end offsets until ``target`` events past ``base`` are durable."""

    def __init__(self, log: EmbeddedLog, base: int, target: int) -> None:
        self._log = log
        self._base = base
        self._target = target
        self.reached_ms: int | None = None
        self.first_ms: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="durable-watch", daemon=True)

    def _end(self) -> int:
        return sum(self._log.end_offset("events", p) for p in range(self._log.num_partitions))

    def _poll(self) -> None:
        while not self._stop.is_set():
            written = self._end() - self._base
            if written > 0 and self.first_ms is None:
                self.first_ms = now_ms()
            if written >= self._target:
                self.reached_ms = now_ms()
                return
            time.sleep(0.002)

    def __enter__(self) -> DurableWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


class ThreadProfiles:
    """cProfile per thread for a few methods, switched on only during one phase.

    Timed by each thread's CPU clock: a wall clock would charge the time a thread waits for
    the GIL or a lock to whatever it was running when it let go.
    """

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.active = False
        self._profiles: dict[int, cProfile.Profile] = {}
        self._lock = threading.Lock()

    def _profile(self) -> cProfile.Profile:
        with self._lock:
            return self._profiles.setdefault(
                threading.get_ident(), cProfile.Profile(time.thread_time)
            )

    def wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def profiled(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return method(*args, **kwargs)
            return self._profile().runcall(method, *args, **kwargs)

        return profiled

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """Profile the node's threads, and this one, while ``phase`` is the one asked for."""
        if phase != self.phase:
            yield
            return
        here = self._profile()
        self.active = True
        here.enable()
        try:
            yield
        finally:
            here.disable()
            self.active = False

    @contextmanager
    def patched(self) -> Iterator[None]:
        targets = [
            (PartitionRunner, "_process"),
            (TimingWheel, "advance"),
            (ReadModel, "process_records"),
            (EmbeddedLog, "_write_batch"),
        ]
        originals = [(cls, name, getattr(cls, name)) for cls, name in targets]
        for cls, name, method in originals:
            setattr(cls, name, self.wrap(method))
        try:
            yield
        finally:
            for cls, name, method in originals:
                setattr(cls, name, method)

    def report(self, top: int = 30) -> str:
        out = io.StringIO()
        profiles = list(self._profiles.values())
        if not profiles:
            return "(nothing profiled)"
        stats = pstats.Stats(profiles[0], stream=out)
        for profile in profiles[1:]:
            stats.add(profile)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        stats.print_stats(r"wheel\.py|embedded\.py")  # the timing wheel and the log committer
        return out.getvalue()


def materialised_since(log: EmbeddedLog, ends: list[int]) -> dict[int, list[ev.RunMaterialised]]:
    """The herd's ``RunMaterialised`` events per partition, read back from the log."""
    found: dict[int, list[ev.RunMaterialised]] = {}
    for p in range(log.num_partitions):
        offset = ends[p]
        found[p] = []
        while records := log.read_events(p, offset, 5000):
            for record in records:
                event = ev.decode(record.value)
                if isinstance(event, ev.RunMaterialised) and event.tenant == TENANT:
                    found[p].append(event)
            offset = records[-1].offset + 1
    return found


def bench(tmp: Path, jobs: int, workers: int, profiles: ThreadProfiles | None) -> dict[str, Any]:
    wall_start = time.perf_counter()
    figures: dict[str, Any] = {}

    def phase(name: str) -> AbstractContextManager[None]:
        return nullcontext() if profiles is None else profiles.during(name)

    log = EmbeddedLog.open(tmp / "log", PARTITIONS)
    node = Node(log, tmp / "node", node_id="bench-herd")
    node.start()
    try:
        if not node.wait_ready(30):
            raise RuntimeError("the node did not own and catch up its partitions in 30 s")

        # 1. warm-up: the registration rate, to place the slot after registration ends
        began = time.perf_counter()
        asyncio.run(register(node, WARM_UP_TENANT, "warmup", WARM_UP_JOBS, "0 0 29 2 *"))
        warm_rate = WARM_UP_JOBS / (time.perf_counter() - began)
        # Headroom: the rate falls as the partitions fill, and profiling slows it severalfold.
        headroom = 5.0 if profiles is not None and profiles.phase == "registration" else 1.5
        lead_s = headroom * jobs / warm_rate + MARGIN_S
        slot = (now_ms() + round(lead_s * 1000)) // 1000 * 1000 + 1000
        schedule = daily_at(slot)

        # 2. registration
        batches0 = log.synced_batches
        began = time.perf_counter()
        with phase("registration"):
            decided = asyncio.run(register(node, TENANT, "herd", jobs, schedule))
        reg_s = time.perf_counter() - began
        registered_at = now_ms()
        fsyncs = log.synced_batches - batches0
        slots = Counter(e.next_slot for e in decided if isinstance(e, ev.JobRegistered))
        if registered_at >= slot or slots != Counter({slot: jobs}):
            raise RuntimeError(
                f"registration ended {registered_at - slot} ms after the slot or missed it "
                f"(first slots {dict(slots)}); the warm-up rate {warm_rate:.0f}/s was optimistic"
            )
        figures["registration"] = {
            "seconds": round(reg_s, 3),
            "jobs_per_s": round(jobs / reg_s),
            "warm_up_jobs_per_s": round(warm_rate),
            "fsyncs": fsyncs,
            "jobs_per_fsync": round(jobs / max(1, fsyncs), 1),
            "slack_before_slot_ms": slot - registered_at,
            "peak_rss_mb": peak_rss_mb(),
        }

        # 3. the slot
        ends = [log.end_offset("events", p) for p in range(PARTITIONS)]
        batches0 = log.synced_batches
        time.sleep(max(0.0, (slot - now_ms()) / 1000 - 0.3))

        def all_pending() -> bool:
            return node.history.counts(TENANT)["pending"] >= jobs

        with phase("slot"), DurableWatch(log, sum(ends), jobs) as watch:
            visible = node.history.wait_until(all_pending, max(120.0, jobs / 100))
            visible_ms = now_ms()
        if not visible:
            raise RuntimeError(
                f"only {node.history.counts(TENANT)['pending']} of {jobs} runs visible in time"
            )
        slot_fsyncs = log.synced_batches - batches0
        found = materialised_since(log, ends)
        events = [e for p in found.values() for e in p]
        if len(events) != jobs or any(e.scheduled_for != slot for e in events):
            raise RuntimeError(f"{len(events)} runs materialised for {jobs} jobs")
        lateness = sorted(e.at - slot for e in events)
        runner_batches = sorted(
            Counter((p, e.at) for p, part in found.items() for e in part).values()
        )
        assert watch.reached_ms is not None and watch.first_ms is not None
        durable_s = (watch.reached_ms - slot) / 1000
        figures["slot"] = {
            "first_durable_ms": watch.first_ms - slot,
            "all_durable_s": round(durable_s, 3),
            "all_visible_s": round((visible_ms - slot) / 1000, 3),
            "runs_per_s_durable": round(jobs / durable_s),
            "runs_per_s_visible": round(jobs / ((visible_ms - slot) / 1000)),
            "lateness_ms": {
                "min": lateness[0],
                "p50": percentile(lateness, 0.5),
                "p99": percentile(lateness, 0.99),
                "max": lateness[-1],
                "mean": round(statistics.fmean(lateness), 1),
            },
            "runner_batches": len(runner_batches),
            "runner_batch_runs": {
                "min": runner_batches[0],
                "p50": percentile(runner_batches, 0.5),
                "max": runner_batches[-1],
            },
            "fsyncs": slot_fsyncs,
            "runs_per_fsync": round(jobs / max(1, slot_fsyncs), 1),
            "peak_rss_mb": peak_rss_mb(),
        }

        # 4. claims
        batches0 = log.synced_batches
        began = time.perf_counter()
        with phase("claims"):
            granted, calls, empty = asyncio.run(claim_all(node, jobs, workers))
        claim_s = time.perf_counter() - began
        left = node.history.counts(TENANT)
        figures["claims"] = {
            "workers": workers,
            "seconds": round(claim_s, 3),
            "leases": granted,
            "leases_per_s": round(granted / claim_s),
            "claim_calls": calls,
            "empty_claims": empty,
            "claim_ms_mean": round(1000 * claim_s * workers / max(1, calls), 2),
            "fsyncs": log.synced_batches - batches0,
            "pending_after": left["pending"],
            "running_after": left["running"],
        }
    finally:
        node.stop()
        log.close()
    figures["peak_rss_mb"] = peak_rss_mb()
    figures["wall_s"] = round(time.perf_counter() - wall_start, 3)
    return figures


def print_table(jobs: int, f: dict[str, Any]) -> None:
    r, s, c = f["registration"], f["slot"], f["claims"]
    late, sizes = s["lateness_ms"], s["runner_batch_runs"]
    rows = [
        ("registration", f"{r['seconds']:.2f} s", f"{r['jobs_per_s']:,} jobs/s"),
        ("", "jobs per fsync", f"{r['jobs_per_fsync']:,}"),
        ("slot -> all durable", f"{s['all_durable_s']:.2f} s", f"{s['runs_per_s_durable']:,}/s"),
        ("slot -> all visible", f"{s['all_visible_s']:.2f} s", f"{s['runs_per_s_visible']:,}/s"),
        ("lateness (at - slot)", "p50/p99/max", f"{late['p50']}/{late['p99']}/{late['max']} ms"),
        ("runner batches", f"{s['runner_batches']}", f"{sizes['p50']} runs p50"),
        ("", "runs per fsync", f"{s['runs_per_fsync']:,}"),
        (f"claims, {c['workers']} loop(s)", f"{c['seconds']:.2f} s", f"{c['leases_per_s']:,}/s"),
        ("", "claim call mean", f"{c['claim_ms_mean']} ms"),
        ("peak RSS", f"{f['peak_rss_mb']} MB", ""),
        ("wall", f"{f['wall_s']:.1f} s", ""),
    ]
    print(f"midnight herd: {jobs:,} jobs, {PARTITIONS} partitions, {os.cpu_count()} CPUs")
    for name, a, b in rows:
        print(f"{name:<24}{a:>18}  {b}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=1, help="concurrent claim loops")
    parser.add_argument(
        "--profile",
        nargs="?",
        const="slot",
        choices=("registration", "slot", "claims"),
        help="cProfile one phase (default: the slot); the run is not recorded",
    )
    args = parser.parse_args()
    profiles = None if args.profile is None else ThreadProfiles(args.profile)
    with tempfile.TemporaryDirectory(prefix="cronlog-bench-herd-") as tmp:
        if profiles is not None:
            with profiles.patched():
                figures = bench(Path(tmp), args.jobs, args.workers, profiles)
        else:
            figures = bench(Path(tmp), args.jobs, args.workers, None)
    print_table(args.jobs, figures)
    if profiles is not None:
        print(profiles.report())
        print("profiled run: timings inflated, not recorded", file=sys.stderr)
        return
    line = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "rocksdict": version("rocksdict"),
        "msgspec": version("msgspec"),
        "partitions": PARTITIONS,
        "max_batch": MAX_BATCH,
        "jobs": args.jobs,
        "figures": figures,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
