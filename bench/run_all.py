"""Every benchmark of cronlog as a user runs it, side by side with its floors and peers, in one
command: ``python -m bench.run_all`` (the full form) or ``python -m bench.run_all --short``.

Each of ``--repeat`` rounds (3 by default) runs every scenario once, in the same order, so a
noisy minute falls on all of them alike; the report gives the median of the rounds and their
range. The scenarios (see each module's docstring):

1. the herd (:mod:`bench.herd_serve`): the floor, cronlog's HTTP and pull herds (one process,
   and ``--workers 2``; the pull herd also through the SDK's ``Worker``), APScheduler's
   variants;
2. registration (:mod:`bench.registration`): ``POST /v1/jobs`` with wrk against cronlog and a
   bare Starlette endpoint; the batch endpoint when served;
3. restart (:mod:`bench.restart`): ``/readyz`` and RSS on a data directory built once;
   every node of the run starts from compiled bytecode, as an installed cronlog does;
4. sustained load (:mod:`bench.sustained`): HTTP and pull, the highest rate holding p99 ≤ 100 ms;
5. Kafka mode: the HTTP herd and registration on one local broker (``tools/kafka/broker.py``).

Records go to ``bench/results/<scenario>.jsonl`` with the run's id, the summary to
``bench/results/run_all.jsonl``, and ``bench/RESULTS.md`` is written from them
(:mod:`bench.report`), with the latest full run of :mod:`bench.scaleout` (1 vs 3 Kafka nodes,
run apart: it needs its own broker and about 15 minutes). The full form refuses to start while
the 1-minute load average is above 2 (``--ignore-load`` overrides): its figures are meant to be
the ones the goals are judged by.
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import herd_serve, registration, restart, sustained
from bench.common import Recorder, append_result, loadavg, log, machine, stamp

MAX_LOAD_FULL = 2.0


@dataclass
class Plan:
    form: str
    herd_jobs: int
    aps_jobs: dict[str, int]
    kafka_jobs: int
    registration_s: float
    restart_jobs: int
    window_s: int
    http_rates: list[int]
    pull_rates: list[int]
    repeat: int = 3
    skip: list[str] = field(default_factory=list)


FULL = Plan(
    form="full",
    herd_jobs=50_000,
    # APScheduler on SQLite takes its jobs one transaction each: with SQLite's defaults (an
    # fsync per commit, about 90 jobs/s here) 5,000 already take a minute to add.
    aps_jobs={
        "aps-memory-asyncio": 50_000,
        "aps-memory-threads": 50_000,
        "aps-memory-defaults": 50_000,
        "aps-sqlite-asyncio": 20_000,
        "aps-sqlite-threads": 20_000,
        "aps-sqlite-defaults": 5_000,
    },
    kafka_jobs=50_000,
    registration_s=15,
    restart_jobs=1_000_000,
    window_s=60,
    http_rates=[250, 500, 1000, 2000, 3000, 4000, 6000],
    pull_rates=[500, 1000, 2500, 5000, 7500, 10_000],
)

SHORT = Plan(
    form="short",
    herd_jobs=2_000,
    aps_jobs={
        "aps-memory-asyncio": 2_000,
        "aps-memory-threads": 2_000,
        "aps-memory-defaults": 2_000,
        "aps-sqlite-asyncio": 1_000,
        "aps-sqlite-threads": 1_000,
        "aps-sqlite-defaults": 300,
    },
    kafka_jobs=1_000,
    registration_s=4,
    restart_jobs=50_000,
    window_s=5,
    http_rates=[100, 300, 1000],
    pull_rates=[250, 1000, 2500],
)

SECTIONS = ("herd", "aps", "registration", "restart", "sustained", "kafka")


class Run:
    """One ``run_all``: its id, and every record it appends carries it."""

    def __init__(self, plan: Plan, command: str) -> None:
        self.id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        self.plan = plan
        self.command = command
        self.failures: list[dict[str, Any]] = []

    def add(self, name: str, record: dict[str, Any], round_: int) -> None:
        record["run_id"] = self.id
        record["round"] = round_
        append_result(name, record)

    def attempt(self, what: str, round_: int, work: Any) -> None:
        """Run one scenario; a failure is recorded and reported, and the run goes on."""
        try:
            work()
        except Exception as e:
            log(f"FAILED {what} (round {round_}): {type(e).__name__}: {e}")
            self.failures.append(
                {"what": what, "round": round_, "error": f"{type(e).__name__}: {e}",
                 "traceback": traceback.format_exc(limit=5)}
            )  # fmt: skip


def run(plan: Plan, command: str, tmp: Path, restart_dir: Path | None) -> Run:
    the_run = Run(plan, command)
    log(f"run {the_run.id}: {plan.form} form, {plan.repeat} rounds")
    tool = "wrk" if registration.ensure_wrk() else "python"
    cluster = None
    bootstrap = None
    if "kafka" not in plan.skip:
        from tools.kafka import broker

        cluster = broker.start(1, tmp / "kafka")
        bootstrap = cluster.bootstrap_servers
    restart_data = restart_dir or tmp / "restart-data"
    try:
        with Recorder() as recorder:
            for r in range(1, plan.repeat + 1):
                log(f"round {r} of {plan.repeat}")
                _round(the_run, r, recorder, tool, tmp, restart_data, bootstrap)
    finally:
        if cluster is not None:
            cluster.stop()
    return the_run


def _round(
    the_run: Run,
    r: int,
    recorder: Recorder,
    tool: str,
    tmp: Path,
    restart_data: Path,
    bootstrap: str | None,
) -> None:
    plan = the_run.plan

    def herd(name: str, jobs: int, kafka: str | None = None) -> None:
        record = herd_serve.run_scenario(name, recorder, jobs, tmp, kafka)
        the_run.add("herd_serve", record, r)
        log(herd_serve.describe(record))

    if "herd" not in plan.skip:
        # The node as one process (``--workers 1``, the default) and as two worker processes
        # beside their parent (``--workers 2``, history kept with each worker's partitions).
        for name in ("floor", "http", "pull", "pull-sdk", "http-w2", "pull-w2"):
            the_run.attempt(name, r, lambda n=name: herd(n, plan.herd_jobs))
    if "aps" not in plan.skip:
        for name, jobs in plan.aps_jobs.items():
            the_run.attempt(name, r, lambda n=name, j=jobs: herd(n, j))
    if "registration" not in plan.skip:

        def register() -> None:
            for record in registration.run(plan.registration_s, tool, tmp):
                the_run.add("registration", record, r)
                log(f"{record['scenario']}: {record['figures']['ok_per_s']} ok/s")

        the_run.attempt("registration", r, register)
    if "restart" not in plan.skip:

        def restarts() -> None:
            for record in restart.run(restart_data, plan.restart_jobs, 1, tmp):
                the_run.add("restart", record, r)

        the_run.attempt("restart", r, restarts)
    if "sustained" not in plan.skip:
        for kind, rates in (("http", plan.http_rates), ("pull", plan.pull_rates)):

            def steps(k: str = kind, rs: list[int] = rates) -> None:
                found = sustained.search(
                    k, rs, plan.window_s, tmp, recorder if k == "http" else None,
                    tags={"run_id": the_run.id, "round": r},
                )  # fmt: skip
                the_run.add(
                    "sustained_search",
                    {"timestamp": stamp(), "scenario": f"sustained-{k}",
                     "load_at_start": found["steps"][0]["load_at_start"],
                     "highest_holding_per_s": found["highest_holding_per_s"],
                     "rates": rs, "window_s": plan.window_s,
                     "p99_by_rate": {str(s["rate"]): s["figures"]["lag"].get("p99_ms")
                                     for s in found["steps"]}},
                    r,
                )  # fmt: skip

            the_run.attempt(f"sustained-{kind}", r, steps)
    if bootstrap is not None:
        the_run.attempt("http-kafka", r, lambda: herd("http", plan.kafka_jobs, bootstrap))

        def register_kafka() -> None:
            records = registration.run(
                plan.registration_s, tool, tmp, kafka=bootstrap, with_bare=False
            )
            for record in records:
                the_run.add("registration", record, r)
                log(f"{record['scenario']}: {record['figures']['ok_per_s']} ok/s")

        the_run.attempt("registration-kafka", r, register_kafka)


def _stop(signum: int, frame: object) -> None:
    # SystemExit unwinds through every ``finally``: the nodes, workers, recorder and broker this
    # run started are stopped, not orphaned.
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--short", action="store_true", help="small sizes: about 10 minutes on 2 cores"
    )
    parser.add_argument("--repeat", type=int, help="rounds (default 3)")
    parser.add_argument("--skip", default="", help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--jobs", type=int, help="the herd's N (and Kafka's)")
    parser.add_argument("--restart-jobs", type=int)
    parser.add_argument("--restart-dir", type=Path, help="keep (and reuse) the restart data")
    parser.add_argument("--ignore-load", action="store_true")
    parser.add_argument("--no-report", action="store_true", help="do not rewrite RESULTS.md")
    args = parser.parse_args()
    plan = SHORT if args.short else FULL
    if args.repeat:
        plan.repeat = args.repeat
    if args.jobs:
        plan.herd_jobs = plan.kafka_jobs = args.jobs
    if args.restart_jobs:
        plan.restart_jobs = args.restart_jobs
    plan.skip = [s for s in args.skip.split(",") if s]
    unknown = set(plan.skip) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections to skip: {sorted(unknown)}")
    load = loadavg()[0]
    if plan.form == "full" and load > MAX_LOAD_FULL and not args.ignore_load:
        sys.exit(
            f"the 1-minute load average is {load} (> {MAX_LOAD_FULL}): the full form's figures"
            " would be noise. Run it on a quiet machine, or pass --ignore-load."
        )
    command = shlex.join(["python", "-m", "bench.run_all", *sys.argv[1:]])
    began, load_at_start, the_machine = stamp(), loadavg(), machine()
    with tempfile.TemporaryDirectory(prefix="cronlog-bench-") as tmp:
        # Every node runs from compiled bytecode, as an installed cronlog does: the restart's
        # figure, above all, would otherwise count compiling the sources at each start.
        restart.cache_bytecode(Path(tmp) / "pycache")
        the_run = run(plan, command, Path(tmp), args.restart_dir)
    append_result(
        "run_all",
        {"run_id": the_run.id, "started": began, "ended": stamp(), "command": command,
         "plan": asdict(plan), "machine": the_machine, "load_at_start": load_at_start,
         "failures": the_run.failures},
    )  # fmt: skip
    if not args.no_report:
        from bench import report

        path = report.write(the_run.id)
        log(f"wrote {path}")
    if the_run.failures:
        failed = [f["what"] for f in the_run.failures]
        log(f"{len(failed)} scenario run(s) failed: {failed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
