"""A herd of HTTP jobs, and a small team beside it: how fast calls go out, and who waits.

    python -m bench.bench_fanout [--jobs 10000] [--small 50] [--max-calls 128] [--hold-ms 50]

One embedded node (8 partitions) with ``--max-calls`` room for calls. Team ``big`` has
``--jobs`` one-shot HTTP jobs due at one slot; team ``small`` has ``--small`` jobs due at the
same slot. The target is a separate process (so it takes no CPU time from the node's
interpreter) that answers every call after ``--hold-ms``: with room for 128 calls held 50 ms
each, the node can finish at most 2,560 calls a second, so the herd queues for seconds.

Measured from the target's side (its arrival clock is the same machine's): calls per second
over the whole herd, and each team's lateness (first call minus slot) at p50/p99/max. With
teams taking turns, the small team's runs go out within the first free rounds of calls, not
behind the big team's queue. ``--max-calls-per-team`` adds the per-team cap.

Appends one JSON line to bench/results/fanout.jsonl and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import now_ms, percentile
from core.commands import PutJob
from core.egress import EgressPolicy
from core.jobs import Backoff, HttpTarget, JobSpec
from eventlog.embedded import EmbeddedLog
from node.executors import Executors
from node.node import Node

RESULTS = Path(__file__).parent / "results" / "fanout.jsonl"
PARTITIONS = 8
CHUNK = 500

# The target: an asyncio HTTP/1.1 server that holds each call, answers 200 with keep-alive,
# and on SIGTERM writes "<arrival unix s> <run id>" lines to the file named by argv[2].
TARGET = r"""
import asyncio, signal, sys, time
hold, out = float(sys.argv[1]), sys.argv[2]
arrivals = []
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            at = time.time()
            length, run = 0, b"?"
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"x-cronlog-run-id":
                    run = value.strip()
            await reader.readexactly(length)
            arrivals.append((at, run.decode()))
            await asyncio.sleep(hold)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    with open(out, "w") as f:
        f.writelines(f"{at} {run}\n" for at, run in arrivals)
asyncio.run(main())
"""


def spec(tenant: str, url: str, slot: int) -> JobSpec:
    return JobSpec(
        name=f"{tenant} job",
        tenant=tenant,
        target=HttpTarget(url=url),
        run_at=slot,
        timeout_sec=60,
        lease_sec=120,
        backoff=Backoff(base_sec=1, jitter=False),
    )


async def register(node: Node, tenant: str, count: int, url: str, slot: int) -> None:
    for start in range(0, count, CHUNK):
        await asyncio.gather(
            *(
                node.execute(PutJob(job_id=f"{tenant}-{i:06d}", spec=spec(tenant, url, slot)))
                for i in range(start, min(count, start + CHUNK))
            )
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cronlog-fanout-") as tmp:
        arrivals_path = Path(tmp) / "arrivals"
        target = subprocess.Popen(
            [sys.executable, "-c", TARGET, str(args.hold_ms / 1000), str(arrivals_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert target.stdout is not None
            url = f"http://127.0.0.1:{target.stdout.readline().strip()}/hook"
            log = EmbeddedLog.open(Path(tmp) / "log", PARTITIONS)
            executors = Executors(
                "bench",
                max_in_flight=args.max_calls,
                max_in_flight_per_tenant=args.max_calls_per_team,
                egress=EgressPolicy.build(allow=["127.0.0.0/8"]),  # the target runs on loopback
                processes=args.processes,
            )
            node = Node(log, Path(tmp) / "node", node_id="bench", executors=executors)
            node.start()
            assert node.wait_ready(30)
            total = args.jobs + args.small
            # Far enough out that registration (several thousand jobs a second) ends first.
            slot = now_ms() + 3000 + total // 2
            started = time.monotonic()
            asyncio.run(register(node, "big", args.jobs, url, slot))
            asyncio.run(register(node, "small", args.small, url, slot))
            registration_s = time.monotonic() - started
            if now_ms() >= slot:
                raise RuntimeError("registration ran past the slot; the figures would be wrong")
            done = node.history.wait_until(
                lambda: (
                    node.history.counts("big").get("succeeded", 0)
                    + node.history.counts("small").get("succeeded", 0)
                    >= total
                ),
                timeout_s=600,
            )
            node.stop()
            log.close()
        finally:
            target.terminate()
            target.wait(30)
        lines = arrivals_path.read_text().split()
    arrivals: dict[str, float] = {}
    for stamp, run_id in zip(lines[0::2], lines[1::2], strict=True):
        arrivals.setdefault(run_id, float(stamp))  # the first call of each run
    late: dict[str, list[float]] = {"big": [], "small": []}
    for run_id, arrived_at in arrivals.items():
        late[run_id.split("-")[0]].append(arrived_at * 1000 - slot)
    first, last = min(arrivals.values()), max(arrivals.values())
    figures: dict[str, Any] = {
        "all_succeeded": done,
        "calls": len(lines) // 2,
        "runs_called": len(arrivals),
        "registration_jobs_per_s": round(total / registration_s),
        "calls_per_s": round(len(arrivals) / max(last - first, 1e-9)),
        "ceiling_calls_per_s": round(args.max_calls / (args.hold_ms / 1000)),
    }
    for team, values in late.items():
        values.sort()
        figures[f"{team}_lateness_ms"] = {
            "p50": round(percentile(values, 0.5)),
            "p99": round(percentile(values, 0.99)),
            "max": round(values[-1]),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=50)
    parser.add_argument("--max-calls", type=int, default=128)
    parser.add_argument("--max-calls-per-team", type=int)
    parser.add_argument("--hold-ms", type=float, default=50.0)
    parser.add_argument("--processes", type=int, default=0, help="executor processes")
    args = parser.parse_args()
    figures = run(args)
    record = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "partitions": PARTITIONS,
        "jobs": args.jobs,
        "small": args.small,
        "max_calls": args.max_calls,
        "max_calls_per_team": args.max_calls_per_team,
        "hold_ms": args.hold_ms,
        "executor_processes": args.processes,
        "figures": figures,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
