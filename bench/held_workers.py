"""Pull workers as a team runs them, through the SDK's ``Worker``, each run held a while.

    python -m bench.held_workers URL TOKEN POOL --out FILE --until-ms T
        [--hold-s 60] [--concurrency 5000]

One ``Worker`` (long-polling claims, heartbeats every third of the lease, outcomes in batches)
whose handler sleeps ``--hold-s`` seconds: a team's runs that execute for a minute, holding
their leases meanwhile. For each run the handler started, one line in ``--out``:
``<started ns> <slot ms> <run id>``, written when the worker stops (at ``--until-ms``, or on
SIGTERM). Prints one JSON line of counts: runs started, completed, lost, and the heartbeats the
SDK could not deliver (its warnings), which a lease lost under a running handler would follow.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

from bench.common import now_ms


class _Undelivered(logging.Handler):
    """Counts the SDK's own warnings of a heartbeat it could not deliver."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.heartbeats = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "heartbeat not delivered" in record.getMessage():
            self.heartbeats += 1


async def work(args: argparse.Namespace) -> dict[str, Any]:
    from cronlog_client import AsyncClient, RunContext, Worker

    undelivered = _Undelivered()
    logging.getLogger("cronlog_client").addHandler(undelivered)
    started: list[tuple[int, RunContext]] = []

    async def hold(run: RunContext) -> None:
        # the instant first, and nothing else a run: the record is written at the end
        started.append((time.time_ns(), run))
        await asyncio.sleep(args.hold_s)

    async with AsyncClient(args.url, args.token, timeout_s=120) as client:
        options = {} if args.ahead_sec is None else {"ahead_sec": args.ahead_sec}
        worker = Worker(
            client,
            args.pool,
            hold,
            concurrency=args.concurrency,
            worker_id=args.worker_id,
            **options,
        )
        running = asyncio.ensure_future(worker.run())
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        left = max(0.0, (args.until_ms - now_ms()) / 1000)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), left)
        Path(args.out).write_text(
            "".join(
                f"{at} {round(run.scheduled_for.timestamp() * 1000)} {run.run_id}\n"
                for at, run in started
            )
        )
        worker.stop()
        await asyncio.wait_for(running, 120)
    return {
        "started": len(started),
        "completed": worker.completed,
        "lost": worker.lost,
        "refused": worker.refused,
        "withdrawn": worker.withdrawn,
        "heartbeats_undelivered": undelivered.heartbeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("token")
    parser.add_argument("pool")
    parser.add_argument("--out", required=True)
    parser.add_argument("--until-ms", type=int, required=True)
    parser.add_argument("--hold-s", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=5000)
    parser.add_argument("--worker-id", default="held")
    parser.add_argument(
        "--ahead-sec", type=float, help="how far claims reach ahead (default: the SDK's)"
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(work(args))), flush=True)


if __name__ == "__main__":
    main()
