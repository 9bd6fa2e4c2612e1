"""The read model's fold alone: CPU per run as ``ReadModelRunner`` feeds it, no node around it.

    python -m bench.bench_fold [--jobs 2000] [--batch 1000] [--layout herd|interleaved]
                               [--partitions 1] [--rounds 3] [--profile out.prof]

``--jobs`` HTTP jobs are registered, then each has one run: ``RunMaterialised``,
``LeaseGranted``, ``RunCompleted`` (as a herd's HTTP runs go). ``herd``: every materialisation
first, then every lease, then every completion, as a herd's partitions append them (a run's
events fall in different batches); ``interleaved``: each run's three events one after another
(a quiet node's batches, or a sustained rate's, hold whole runs). Records are folded
``--batch`` at a time through ``ReadModel.process_records``, as the followers fold them.
``--partitions N`` spreads the jobs over N partitions, each fed by a thread of its own as
``ReadModelRunner`` runs one follower a partition (``process_with_others`` where the model
has it, a group commit tried on 2026-12-01 and left out; ``process_records`` otherwise), with
``--batch`` small as a follower's reads are under a steady load. The figure is the
process's CPU (user + system, RocksDB's own threads included) per run for the runs' events,
the registrations left out; medians over ``--rounds`` fresh models. Appends one JSON line to
bench/results/bench_fold.jsonl.
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import append_result, loadavg, log
from core import events as ev
from core.jobs import HttpTarget, JobSpec
from eventlog.port import Record
from projections.read_model import ReadModel

T0 = 1_800_000_000_000
TENANT = "bench"


def _records(events: list[ev.AnyEvent], start: int, partition: int) -> list[Record]:
    return [Record(partition, start + i, ev.encode(e)) for i, e in enumerate(events)]


def histories(
    jobs: int, layout: str, partition: int = 0, partitions: int = 1
) -> tuple[list[Record], list[Record]]:
    """The registrations, and the runs' events in ``layout``'s order, as records of
    ``partition`` (which holds every ``partitions``-th job)."""
    spec = JobSpec(
        name="herd",
        tenant=TENANT,
        target=HttpTarget(url="http://127.0.0.1:9/hook"),
        schedule="0 0 * * *",
        tags=("bench",),
    )
    ids = [f"{TENANT}/job-{i:06d}" for i in range(partition, jobs, partitions)]
    registered: list[ev.AnyEvent] = [
        ev.JobRegistered(at=T0, job_id=j, tenant=TENANT, spec=spec, next_slot=T0 + 60_000)
        for j in ids
    ]
    slot = T0 + 60_000
    made: list[ev.AnyEvent] = []
    leased: list[ev.AnyEvent] = []
    done: list[ev.AnyEvent] = []
    for n, j in enumerate(ids):
        run = f"{j}@{slot}"
        made.append(
            ev.RunMaterialised(
                at=slot,
                job_id=j,
                tenant=TENANT,
                run_id=run,
                scheduled_for=slot,
                available_at=slot,
                priority=5,
                next_slot=slot + 86_400_000,
            )
        )
        leased.append(
            ev.LeaseGranted(
                at=slot + 5,
                job_id=j,
                tenant=TENANT,
                run_id=run,
                scheduled_for=slot,
                fencing_token=n + 1,
                worker_id="node-1",
                lease_expires_at=slot + 60_000,
                lateness_ms=5,
            )
        )
        done.append(
            ev.RunCompleted(
                at=slot + 20,
                job_id=j,
                tenant=TENANT,
                run_id=run,
                scheduled_for=slot,
                fencing_token=n + 1,
                started_at=slot + 5,
            )
        )
    if layout == "herd":
        runs = made + leased + done
    else:
        runs = [e for trio in zip(made, leased, done, strict=True) for e in trio]
    return _records(registered, 0, partition), _records(runs, len(registered), partition)


def _follow(fold: Any, partition: int, runs: list[Record], batch: int) -> None:
    for i in range(0, len(runs), batch):
        fold(partition, runs[i : i + batch])


def _cpu() -> float:
    return time.process_time()


def fold_once(
    jobs: int, batch: int, layout: str, partitions: int, profile: cProfile.Profile | None
) -> float:
    made = [histories(jobs, layout, p, partitions) for p in range(partitions)]
    with tempfile.TemporaryDirectory(prefix="cronlog-fold-") as tmp:
        model = ReadModel(Path(tmp) / "read_model")
        fold = getattr(model, "process_with_others", model.process_records)
        try:
            for p, (registered, _) in enumerate(made):
                for i in range(0, len(registered), 1000):
                    model.process_records(p, registered[i : i + 1000])
            started = _cpu()
            if profile is not None:
                profile.enable()
            if partitions == 1:
                runs = made[0][1]
                for i in range(0, len(runs), batch):
                    model.process_records(0, runs[i : i + batch])
            else:
                followers = [
                    threading.Thread(target=_follow, args=(fold, p, runs, batch))
                    for p, (_, runs) in enumerate(made)
                ]
                for follower in followers:
                    follower.start()
                for follower in followers:
                    follower.join()
            if profile is not None:
                profile.disable()
            spent = _cpu() - started
            counts = model.counts(TENANT)
            if counts["succeeded"] != jobs:
                raise RuntimeError(f"folded {counts}, expected {jobs} succeeded")
        finally:
            model.close()
    return spent / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--layout", choices=("herd", "interleaved"), default="herd")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=Path)
    args = parser.parse_args()
    load = loadavg()
    profile = cProfile.Profile() if args.profile else None
    per_run = [
        fold_once(args.jobs, args.batch, args.layout, args.partitions, profile)
        for _ in range(args.rounds)
    ]
    if profile is not None:
        profile.dump_stats(str(args.profile))
    record = {
        "bench": "bench_fold",
        "jobs": args.jobs,
        "batch": args.batch,
        "layout": args.layout,
        "partitions": args.partitions,
        "rounds": [round(s * 1e6, 1) for s in per_run],
        "cpu_us_per_run": round(statistics.median(per_run) * 1e6, 1),
        "load_at_start": load,
        "profiled": profile is not None,
    }
    log(f"fold: {record['cpu_us_per_run']} µs of CPU a run ({args.layout}, batch {args.batch})")
    if profile is None:
        append_result("bench_fold", record)
    print(record)


if __name__ == "__main__":
    main()
