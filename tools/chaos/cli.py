"""``python -m tools.chaos``: run the chaos harness, check a finished run again, or (used by the
harness itself) serve the recording target or run a pull worker.

    python -m tools.chaos run --duration 600 --seed 7            # random faults for 10 minutes
    python -m tools.chaos run --duration 240 --seed 7 --sequence issue12    # its four faults
    python -m tools.chaos run --ci                               # CI's bounded form
    python -m tools.chaos check RUN_DIR                          # the checker, offline

A run writes everything to ``--out`` (default ``chaos-runs/seed-N-<time>``); its report is
``report.json`` and ``report.txt``. The exit status is 0 when the checker found no violation,
1 when it found some, 2 when the run itself could not be carried out.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from tools.chaos import faults as fl
from tools.chaos.workload import Shape


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run_p = sub.add_parser("run", help="start a cluster, fault it, check it")
    run_p.add_argument("--seed", type=int, default=None, help="default: from the time")
    run_p.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    run_p.add_argument("--out", type=Path)
    which = run_p.add_mutually_exclusive_group()
    which.add_argument(
        "--faults",
        default=",".join(fl.KINDS),
        help=f"kinds to draw from, comma-separated (default all: {','.join(fl.KINDS)})",
    )
    which.add_argument(
        "--sequence",
        help="kinds to strike one at a time in this order ('issue12': "
        + ",".join(fl.ISSUE_12)
        + ")",
    )
    run_p.add_argument("--each-once", action="store_true", help="every kind once, shuffled")
    run_p.add_argument(
        "--ci",
        action="store_true",
        help="CI's bounded form (seed 12 unless --seed); the rest of the run's options are ignored",
    )
    run_p.add_argument(
        "--combine",
        type=float,
        default=0.35,
        help="chance a fault is combined with another (default 0.35)",
    )
    run_p.add_argument("--drain", type=float, default=25.0, help="seconds without faults")
    run_p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        dest="serve_args",
        metavar="ARG",
        help="one more `cronlog serve` argument for every node, repeated for each"
        " (--serve-arg=--standby-replicas --serve-arg=1); with --ci too",
    )
    run_p.add_argument("--warmup", type=float, default=8.0, help="seconds before the faults")
    run_p.add_argument("--every-second", type=int, default=Shape.every_second)
    run_p.add_argument("--critical", type=int, default=Shape.every_second_critical)
    run_p.add_argument(
        "--guarded",
        type=int,
        default=Shape.every_second_guarded,
        help="of the critical every-second jobs, how many call the guard and name a status_url",
    )
    run_p.add_argument("--every-five", type=int, default=Shape.every_five)
    run_p.add_argument("--pull", type=int, default=Shape.pull)
    run_p.add_argument("--pull-critical", type=int, default=Shape.pull_critical)
    run_p.add_argument("--bursts", type=int, default=Shape.oneshot_bursts)
    run_p.add_argument("--burst-size", type=int, default=Shape.oneshot_per_burst)

    check_p = sub.add_parser("check", help="check a finished run again from its directory")
    check_p.add_argument("run_dir", type=Path)

    target_p = sub.add_parser("target", help="(internal) the recording HTTP target")
    target_p.add_argument("--port", type=int, required=True)
    target_p.add_argument("--record", type=Path, required=True)
    target_p.add_argument("--max-seconds", type=float, default=3600.0)
    target_p.add_argument(
        "--guard-secret", default="", help="the bearer secret asks at the status path carry"
    )

    worker_p = sub.add_parser("worker", help="(internal) a pull worker")
    worker_p.add_argument("--worker-id", required=True)
    worker_p.add_argument("--pool", required=True)
    worker_p.add_argument("--node", action="append", required=True, dest="nodes")
    worker_p.add_argument("--token", required=True)
    worker_p.add_argument("--record", type=Path, required=True)
    # A run holds its thread from the claim that leases it ahead (up to AHEAD_SEC before its
    # start) through its work and completion: the workload's 4 pull jobs a second need about
    # 4 x (3 + 1.8 + 0.3) = 20 threads. With 4 each, the two workers were the bottleneck and
    # every pull run started late (p50 30-56 s in a run of three broker kills).
    worker_p.add_argument("--threads", type=int, default=16)
    worker_p.add_argument("--max-seconds", type=float, default=3600.0)

    events_p = sub.add_parser("events", help="(internal) append a topic's records to a file")
    events_p.add_argument("--bootstrap", required=True)
    events_p.add_argument("--topic", required=True)
    events_p.add_argument("--out", type=Path, required=True)
    events_p.add_argument("--start", default="-", help="p:offset,... (- for the beginning)")

    args = parser.parse_args(argv)
    if args.command == "events":
        from tools.chaos.gather import read_to_file

        start = {}
        if args.start != "-":
            for item in args.start.split(","):
                p, _, offset = item.partition(":")
                start[int(p)] = int(offset)
        read_to_file(args.bootstrap, args.topic, start, args.out)
        return 0
    if args.command == "target":
        from tools.chaos.target import serve

        serve(args.port, args.record, args.max_seconds, args.guard_secret)
        return 0
    if args.command == "worker":
        from tools.chaos.worker import main as worker_main

        worker_main(
            args.worker_id,
            args.pool,
            args.nodes,
            args.token,
            args.record,
            args.threads,
            args.max_seconds,
        )
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for chatty in ("kafka", "httpx"):  # the checker's Kafka client; every API call
        logging.getLogger(chatty).setLevel(logging.WARNING)
    from tools.chaos.checker import check, summary
    from tools.chaos.run import CI_SEED, Settings, ci_settings, load_history, run, write_report

    if args.command == "check":
        report = check(load_history(args.run_dir))
        write_report(args.run_dir, report)
        print(summary(report))
        return 0 if report.ok else 1

    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    out = args.out or Path("chaos-runs") / f"seed-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.sequence:
        kinds = list(fl.ISSUE_12) if args.sequence == "issue12" else args.sequence.split(",")
        mode = "sequence"
    else:
        kinds = args.faults.split(",")
        mode = "each_once" if args.each_once else "random"
    if args.pull <= 0:  # no pull jobs, no workers to kill
        kinds = [k for k in kinds if k != "worker_kill"]
    unknown = [k for k in kinds if k not in fl.KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; kinds: {', '.join(fl.KINDS)}")
    settings = Settings(
        workers=2 if args.pull > 0 else 0,
        seed=seed,
        duration_s=args.duration,
        out=out.resolve(),
        kinds=kinds,
        mode=mode,
        combine_p=args.combine,
        drain_s=args.drain,
        warmup_s=args.warmup,
        serve_args=tuple(args.serve_args),
        shape=Shape(
            every_second=args.every_second,
            every_second_critical=args.critical,
            every_second_guarded=args.guarded,
            every_five=args.every_five,
            pull=args.pull,
            pull_critical=args.pull_critical,
            oneshot_bursts=args.bursts,
            oneshot_per_burst=args.burst_size,
        ),
    )
    if args.ci:
        settings = ci_settings(out.resolve(), args.seed if args.seed is not None else CI_SEED)
        settings.serve_args = tuple(args.serve_args)
        seed = settings.seed
    print(f"chaos run, seed {seed}, into {out}", flush=True)
    try:
        report = run(settings)
    except Exception as e:
        logging.getLogger("chaos").exception("the run could not be carried out")
        print(f"chaos run failed to run: {e}", file=sys.stderr)
        return 2
    print(summary(report))
    print(f"report: {out / 'report.json'}")
    return 0 if report.ok else 1
