"""Pull workers as a team runs them, through the SDK's ``Worker``, each run held a while.

    python -m bench.held_workers URL TOKEN POOL --out FILE --until-ms T
        [--hold-s 60] [--concurrency 5000]

One ``Worker`` (long-polling claims, heartbeats every third of the lease, outcomes in batches)
whose handler sleeps ``--hold-s`` seconds: a team's runs that execute for a minute, holding
their leases meanwhile. For each run the handler started, one line in ``--out``:
``<started ns> <slot ms> <run id>``, written when the worker stops (at ``--until-ms``, or on
SIGTERM). Prints one JSON line of counts: runs started, completed, lost, and the heartbeats the
SDK could not deliver (its warnings), which a lease lost under a running handler would follow.
Each heartbeat's time, as its run waits for it (from the beat asked until its answer: the SDK's
linger that gathers a batch, the request, the node's answer), a line of ``<asked, unix ms>
<ms>`` in ``<out>.beats``; each heartbeat request's round trip in ``<out>.requests``.
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


def _time_the_beats(worker: Any, client: Any) -> tuple[list[str], list[str]]:
    """Each heartbeat's time as its run waits for it (checks before a start are not
    heartbeats, and not timed), and each heartbeat request's round trip: lines of ``<asked,
    unix ms> <ms>`` (a request's with its beats after). A benchmark's look inside the SDK: its
    heartbeats go through the worker's one ``Beater``, its requests through the client."""
    beater = worker._beater
    beat, many = beater.beat, client.heartbeat_many
    beats: list[str] = []
    requests: list[str] = []

    async def timed(run_id: str, fencing_token: int, **kw: Any) -> Any:
        if kw.get("check"):
            return await beat(run_id, fencing_token, **kw)
        at, asked = time.time(), time.perf_counter()
        try:
            return await beat(run_id, fencing_token, **kw)
        finally:
            beats.append(f"{at * 1000:.0f} {(time.perf_counter() - asked) * 1000:.2f}\n")

    async def timed_many(batch: Any) -> Any:
        at, asked = time.time(), time.perf_counter()
        try:
            return await many(batch)
        finally:
            ms = (time.perf_counter() - asked) * 1000
            requests.append(f"{at * 1000:.0f} {ms:.2f} {len(batch)}\n")

    beater.beat, client.heartbeat_many = timed, timed_many
    return beats, requests


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
        options: dict[str, Any] = {}
        if args.ahead_sec is not None:
            options["ahead_sec"] = args.ahead_sec
        if args.beat_spread is not None:
            options["heartbeat_spread_per_sec"] = args.beat_spread
        worker = Worker(
            client,
            args.pool,
            hold,
            concurrency=args.concurrency,
            worker_id=args.worker_id,
            **options,
        )
        beats, requests = _time_the_beats(worker, client)
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
        Path(f"{args.out}.beats").write_text("".join(beats))
        Path(f"{args.out}.requests").write_text("".join(requests))
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
    parser.add_argument(
        "--beat-spread", type=float, help="heartbeat_spread_per_sec (default: the SDK's)"
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(work(args))), flush=True)


if __name__ == "__main__":
    main()
