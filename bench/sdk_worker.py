"""The SDK's pull ``Worker`` as a team runs it, through ``cronlog serve``: runs/s and the node's
CPU per run, this checkout's SDK beside a baseline's, interleaved round by round.

    python -m bench.sdk_worker --base /tmp/base-sdk [--runs 3000] [--rounds 3]
        [--concurrency 100] [--out bench/results/sdk_worker.md]

Each round and variant: a fresh ``cronlog serve`` (this checkout's node: only the SDK differs),
``--runs`` pull jobs registered through ``POST /v1/jobs:batch``, all due at one instant a few
seconds later; one worker process (``Worker(concurrency=...)``, a handler that does nothing)
started before the instant, long-polling, with ``PYTHONPATH`` set to the variant's
``sdk/python``. From the instant until the worker has completed every run: the node's CPU
(user + system from ``/proc``, its process tree), the wall time, the worker's own CPU (from
its start, past its imports) and its request counts. The variants alternate which goes
first, round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    ROOT,
    CpuWindow,
    Serve,
    find_batch_endpoint,
    iso_ms,
    loadavg,
    machine,
    now_ms,
    pull_job,
    register,
    sleep_until_ms,
)

LEAD_MS = 4000  # from the end of registration until the runs are due
POOL = "sdk-bench"


async def _work(url: str, token: str, runs: int, concurrency: int) -> dict[str, Any]:
    import cronlog_client
    import httpx
    from cronlog_client import AsyncClient, RunContext, Worker

    paths: dict[str, int] = {}

    async def count(request: httpx.Request) -> None:
        key = (
            "complete_many"
            if request.url.path.endswith(":complete")
            else ("complete" if request.url.path.endswith("/complete") else request.url.path)
        )
        paths[key] = paths.get(key, 0) + 1

    async def handle(run: RunContext) -> None:
        return None

    async with AsyncClient(url, token, timeout_s=60) as cronlog:
        cronlog._http.event_hooks["request"].append(count)
        worker = Worker(cronlog, POOL, handle, concurrency=concurrency, wait_sec=10)
        before = resource.getrusage(resource.RUSAGE_SELF)  # after the imports and the setup
        task = asyncio.ensure_future(worker.run())
        while worker.completed + worker.lost + getattr(worker, "refused", 0) < runs:
            if task.done():
                task.result()
                raise RuntimeError("the worker stopped early")
            await asyncio.sleep(0.01)
        done = time.time()
        worker.stop()
        await asyncio.wait_for(task, 60)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "sdk": str(Path(cronlog_client.__file__).parent),
        "completed": worker.completed,
        "lost": worker.lost,
        "done_unix": done,
        "worker_cpu_s": round(
            usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime, 2
        ),
        "requests": paths,
    }


def worker_main(argv: list[str]) -> None:
    url, token, runs, concurrency = argv[0], argv[1], int(argv[2]), int(argv[3])
    print(json.dumps(asyncio.run(_work(url, token, runs, concurrency))), flush=True)


def one_round(variant: str, sdk: Path, runs: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sdkbench-") as tmp, Serve(Path(tmp) / "node") as node:
        batch = find_batch_endpoint(node.openapi())
        due = now_ms() + LEAD_MS
        jobs = [pull_job(i, POOL, 60, run_at=iso_ms(due)) for i in range(runs)]
        registered = register(node, jobs, concurrency=8, batch=batch)
        if now_ms() > due - 1000:
            raise RuntimeError(f"registration took {registered.seconds:.1f} s: raise LEAD_MS")
        env = {**os.environ, "PYTHONPATH": str(sdk)}
        worker = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "bench.sdk_worker",
                "--worker",
                node.url,
                node.token,
                str(runs),
                str(concurrency),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        sleep_until_ms(due)
        window = CpuWindow(node.pid)
        window.begin()
        out, _ = worker.communicate(timeout=600)
        cpu = window.end()
        answer = json.loads(out.strip().splitlines()[-1])
        wall = answer["done_unix"] - due / 1000
        return {
            "variant": variant,
            "runs": runs,
            "concurrency": concurrency,
            "registration_s": round(registered.seconds, 2),
            "wall_s": round(wall, 3),
            "runs_per_s": round(runs / wall),
            "node_cpu_s": cpu["cpu_s"],
            "node_cpu_ms_per_run": round(cpu["cpu_s"] * 1000 / runs, 3),
            "load_1m": loadavg()[0],
            **answer,
        }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a baseline checkout")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/sdk_worker.md")
    args = parser.parse_args()
    variants = {"main": args.base / "sdk/python", "branch": ROOT / "sdk/python"}
    rows: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in order:
            row = one_round(name, variants[name], args.runs, args.concurrency)
            row["round"] = i + 1
            print(json.dumps(row), flush=True)
            rows.append(row)
    write(args, rows)


def write(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    def med(name: str, key: str) -> float:
        return float(statistics.median(r[key] for r in rows if r["variant"] == name))

    lines = [
        "# The SDK Worker's pull path: batched completions",
        "",
        f"`python -m bench.sdk_worker --base {args.base} --runs {args.runs} --rounds "
        f"{args.rounds} --concurrency {args.concurrency}`; {args.runs} pull runs due at one "
        f"instant, one `Worker(concurrency={args.concurrency})` process with a handler that "
        "does nothing, a fresh `cronlog serve` (this branch's node) each round; `main` is the "
        "SDK of a `git archive main` checkout, `branch` this one's. Node CPU is user + system "
        "of the serve process tree from the due instant until the worker has every run "
        "completed. Machine: "
        f"{machine().get('cpu', '')} {os.cpu_count()} cores, shared with other benchmarks "
        "(the load is in each row).",
        "",
        "| SDK | runs/s (median) | node CPU ms per run (median) | worker CPU s (median) |",
        "|---|---|---|---|",
    ]
    for name in ("main", "branch"):
        lines.append(
            f"| {name} | {med(name, 'runs_per_s'):.0f} | {med(name, 'node_cpu_ms_per_run'):.3f}"
            f" | {med(name, 'worker_cpu_s'):.2f} |"
        )
    lines += [
        "",
        "Every round, in the order run:",
        "",
        "| round | SDK | wall s | runs/s | node CPU s | node CPU ms/run | worker CPU s "
        "| requests | load 1m |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        requests = ", ".join(f"{k} {v}" for k, v in sorted(r["requests"].items()))
        lines.append(
            f"| {r['round']} | {r['variant']} | {r['wall_s']} | {r['runs_per_s']} | "
            f"{r['node_cpu_s']} | {r['node_cpu_ms_per_run']} | {r['worker_cpu_s']} | "
            f"{requests} | {r['load_1m']} |"
        )
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
