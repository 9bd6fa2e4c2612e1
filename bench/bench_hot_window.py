"""The history window: what forgetting costs the read model's writers, what a run costs on disk,
and how long answers from the archive take.

``python -m bench.bench_hot_window --runs 200000`` builds one partition's history of ``--runs``
finished runs (materialised, leased, succeeded: three events each) over ``--jobs`` jobs, folds
it into a read model, then lets :class:`node.hot_window.HotWindow` forget every run, in its
default batches, while a writer folds more events in: it reports the longest time one batch
held the writer's lock, and how long the writer's folds waited at most. The same events are
archived (the real archiver, files of 100k records) and pruned from the log; a run and a page
of a job's runs are then answered from archive + log (:mod:`projections.history`).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from archive.archive import Archive
from archive.archiver import Archiver
from archive.reading import ArchivedLog
from archive.store import DirectoryStore
from core import events as ev
from core.clock import FakeClock
from core.decide import run_id_of
from eventlog.embedded import EmbeddedLog
from eventlog.port import Record
from node.hot_window import HotWindow
from projections.decoding import EventDecoder
from projections.history import ArchivedRuns
from projections.read_model import ReadModel
from tests.projections.histories import Writers

T0 = 1_767_225_600_000
DAY = 86_400_000


def history(runs: int, jobs: int, t0: int = T0, tenant: str = "team-a") -> list[bytes]:
    """``runs`` finished runs of ``jobs`` jobs, slots a minute apart per job from ``t0``."""
    out = []
    per_job = max(1, runs // jobs)
    for i in range(per_job):
        for j in range(jobs):
            job_id = f"{tenant}/job-{j}"
            slot = t0 + i * 60_000
            run_id = run_id_of(job_id, slot)
            out.append(
                ev.encode(
                    ev.RunMaterialised(
                        at=slot,
                        job_id=job_id,
                        tenant=tenant,
                        run_id=run_id,
                        scheduled_for=slot,
                        available_at=slot,
                        priority=0,
                    )
                )
            )
            out.append(
                ev.encode(
                    ev.LeaseGranted(
                        at=slot + 5,
                        job_id=job_id,
                        tenant=tenant,
                        run_id=run_id,
                        scheduled_for=slot,
                        worker_id="w",
                        fencing_token=i + 1,
                        lease_expires_at=slot + 30_000,
                        lateness_ms=5,
                    )
                )
            )
            out.append(ev.encode(ev.RunCompleted(
                at=slot + 900, job_id=job_id, tenant=tenant, run_id=run_id, scheduled_for=slot,
                fencing_token=i + 1, started_at=slot + 5,
            )))  # fmt: skip
    return out


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    values = history(args.runs, args.jobs)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = ReadModel(root / "read_model")
        step = 3000
        for start in range(0, len(values), step):
            chunk = values[start : start + step]
            model.process_records(0, [Record(0, start + i, v) for i, v in enumerate(chunk)])
        model.durable_positions()
        before = sum(len(k) + len(v) for k, v in model.dump())

        # A writer folding while the window forgets: how long does one fold wait at most?
        waits: list[float] = []
        stop = threading.Event()
        last_slot = T0 + (args.runs // args.jobs) * 60_000
        more = history(30_000, 10, last_slot + 40 * DAY, "team-b")  # inside the window
        offset = len(values)

        def writer() -> None:
            nonlocal offset
            i = 0
            while not stop.is_set() and i < len(more):
                batch = [Record(0, offset + k, v) for k, v in enumerate(more[i : i + 30])]
                t = time.perf_counter()
                model.process_records(0, batch)
                waits.append(time.perf_counter() - t)
                offset += len(batch)
                i += 30

        window = HotWindow(model, 30 * DAY, FakeClock(last_slot + 30 * DAY), max_batches=10**6)
        folding = threading.Thread(target=writer)
        folding.start()
        started = time.perf_counter()
        done = window.run_once()
        took = time.perf_counter() - started
        stop.set()
        folding.join()
        after = sum(len(k) + len(v) for k, v in model.dump())
        model.close()

        log = EmbeddedLog.open(root / "log", 1)
        writers = Writers(log)
        writers.append(0, values, chunk=5000)
        writers.close()
        archive = Archive(DirectoryStore(root / "archive"))
        Archiver(log, archive).archive_until(0, log.end_offset("events", 0))
        segments = log.segments("events", 0)
        log.prune("events", 0, segments[-1].first)
        reader = ArchivedRuns(ArchivedLog(log, archive), archive, EventDecoder("bench"))
        middle = T0 + (args.runs // args.jobs // 2) * 60_000
        t = time.perf_counter()
        found = reader.run(run_id_of("team-a/job-7", middle), middle)
        one = time.perf_counter() - t
        assert found is not None and found.state == "succeeded"
        t = time.perf_counter()
        page = reader.older("team-a/job-7", middle, 21, T0 - DAY, held=lambda _: False)
        twenty = time.perf_counter() - t
        assert len(page) >= 21
        print(json.dumps({
            "runs": args.runs,
            "forgotten": done.runs,
            "forget_s": round(took, 2),
            "forget_runs_per_s": round(done.runs / took),
            "longest_batch_hold_ms": round(done.longest_hold_s * 1000, 2),
            "writer_fold_wait_max_ms": round(max(waits) * 1000, 2) if waits else None,
            "writer_fold_wait_median_ms": round(sorted(waits)[len(waits) // 2] * 1000, 2)
            if waits else None,
            "model_bytes_per_run_logical": round((before - after) / max(1, done.runs)),
            "archive_bytes_per_run": round(_size(root / "archive") / args.runs),
            "archive_run_s": round(one, 3),
            "archive_page_of_20_s": round(twenty, 3),
            "load_average": os.getloadavg(),
        }, indent=1))  # fmt: skip
        log.close()


if __name__ == "__main__":
    main()
