"""Registration, side by side: ``cronlog serve`` of another checkout (a baseline, e.g. ``main``)
and of this one, in interleaved rounds, with the bare Starlette endpoint in each round.

    git worktree add --detach /tmp/base main
    python -m bench.registration_compare --base /tmp/base [--rounds 3] [--seconds 5] [--kafka]

Each round starts the baseline's node and this checkout's (which goes first alternates from
round to round), each on a fresh data directory,
and measures on each: ``POST /v1/jobs`` with ``wrk -t1 -c64`` (as :mod:`bench.registration`),
then ``POST /v1/jobs:batch`` with 4 requests of 1,000 jobs at once (:mod:`bench.post_load`);
then the bare endpoint with the same wrk. ``--kafka`` starts one local broker
(``tools/kafka/broker.py``) and runs both nodes on it, each on topics of its own, without the
bare endpoint. Besides the rates, each record
has the serve process's CPU (user + system, its threads and children) per job (on a machine
shared with other work the rate moves with the load, the CPU a job costs much less) and the
node's appends in the measurement (from ``/metrics``: how many, events an append, their mean
time). The baseline runs under this checkout's interpreter, from its own directory
(:class:`bench.common.Serve`).

Appends one JSON line per measurement to bench/results/registration_compare.jsonl and
prints the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench import registration
from bench.common import (
    ROOT,
    Serve,
    append_counters,
    append_figures,
    append_result,
    cpu_seconds,
    find_batch_endpoint,
    loadavg,
    log,
    stamp,
)


def git_commit(checkout: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout,
                             capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _cpu(pid: int) -> float:
    return cpu_seconds(pid) or 0.0


def measure(serve: Serve, seconds: float, tmp: Path, only: set[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if "single" in only:
        load, before, appends = loadavg(), _cpu(serve.pid), append_counters(serve)
        body = json.dumps(registration.BODY).encode()
        f = registration.wrk(f"{serve.url}/v1/jobs", body, serve.token, seconds, tmp)
        out.append({"what": "single", "load_at_start": load, "per_s": f["ok_per_s"],
                    "cpu_us_per_job": round(1e6 * (_cpu(serve.pid) - before)
                                            / max(1, f["requests"])),
                    "non_2xx": f["non_2xx"], "latency_p50": f["latency_p50"],
                    "latency_p99": f["latency_p99"],
                    **append_figures(appends, append_counters(serve))})  # fmt: skip
    batch = find_batch_endpoint(serve.openapi()) if "batch" in only else None
    if batch is not None:
        body = json.dumps(batch.body([registration.BODY] * batch.max_items)).encode()
        load, before, appends = loadavg(), _cpu(serve.pid), append_counters(serve)
        f = registration.post_load(f"{serve.url}{batch.path}", body, serve.token, seconds, tmp,
                                   registration.BATCH_CONCURRENCY)  # fmt: skip
        jobs = f["requests"] * batch.max_items
        out.append({"what": "batch", "load_at_start": load,
                    "per_s": round(f["ok_per_s"] * batch.max_items),
                    "cpu_us_per_job": round(1e6 * (_cpu(serve.pid) - before) / max(1, jobs), 1),
                    "non_2xx": f["non_2xx"],
                    **append_figures(appends, append_counters(serve))})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the baseline's checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--only", default="single,batch,bare")
    parser.add_argument("--kafka", action="store_true", help="both nodes on a local broker")
    args = parser.parse_args()
    only = set(args.only.split(","))
    run_id = secrets.token_hex(3)
    commits = {"base": git_commit(args.base), "this": git_commit(ROOT)}
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cronlog-registration-") as tmp_dir:
        tmp = Path(tmp_dir)
        with contextlib.ExitStack() as stack:
            kafka = None
            if args.kafka:  # one broker for every round, each node on topics of its own
                from tools.kafka import broker

                cluster = broker.start(1, tmp / "kafka")
                stack.callback(cluster.stop)
                kafka = cluster.bootstrap_servers
                only.discard("bare")
            rounds(args, tmp, only, kafka, commits, records)
    report(run_id, args.seconds, records)


def rounds(
    args: argparse.Namespace,
    tmp: Path,
    only: set[str],
    kafka: str | None,
    commits: dict[str, str | None],
    records: list[dict[str, Any]],
) -> None:
    for round_ in range(1, args.rounds + 1):
        # Which goes first alternates, so neither always meets what the other left behind. On
        # Kafka the first node of a run measured at a fraction of the later rates in every run
        # (a warm-up measurement before it did not change that): read the medians with it.
        sides = [("base", args.base), ("this", None)]
        for who, source in sides if round_ % 2 else sides[::-1]:
            with Serve(tmp / f"{who}-{round_}", source=source, kafka=kafka) as serve:
                for figures in measure(serve, args.seconds, tmp, only):
                    records.append({"who": who, "commit": commits[who],
                                    "kafka": kafka is not None, **figures})  # fmt: skip
                    log(f"round {round_} {who} {figures['what']}: {figures['per_s']}/s,"
                        f" {figures['cpu_us_per_job']} us of CPU a job")  # fmt: skip
        if "bare" in only:
            load = loadavg()
            f = registration.bare(args.seconds, "wrk", tmp)
            records.append({"who": "bare", "what": "single", "load_at_start": load,
                            "per_s": f["ok_per_s"], "latency_p99": f["latency_p99"]})  # fmt: skip
            log(f"round {round_} bare: {f['ok_per_s']}/s")


def report(run_id: str, seconds: float, records: list[dict[str, Any]]) -> None:
    for record in records:
        row = {"run": run_id, "timestamp": stamp(), "seconds": seconds, **record}
        append_result("registration_compare", row)
    for who in ("base", "this", "bare"):
        for what in ("single", "batch"):
            rows = [r for r in records if r["who"] == who and r["what"] == what]
            if rows:
                cpu = [r["cpu_us_per_job"] for r in rows if "cpu_us_per_job" in r]
                print(f"{who} {what}: median {statistics.median(r['per_s'] for r in rows):,.0f}/s"
                      f" {[r['per_s'] for r in rows]}"
                      + (f", CPU {statistics.median(cpu)} us a job {cpu}" if cpu else "")
                      + (f", events an append {[r.get('events_per_append') for r in rows]}"
                         if who != "bare" else "")
                      + f", load {[r['load_at_start'][0] for r in rows]}")  # fmt: skip


if __name__ == "__main__":
    main()
