"""Pull workers over HTTP, in a process of their own: claim, note when, complete.

    python -m bench.pull_workers URL TOKEN POOL --out FILE (--expect N | --until-ms T)
        [--loops 4] [--limit 100] [--poll-ms 50] [--wait-field NAME --wait-sec S]
        [--start-ms T] [--no-complete]

``--loops`` claim loops share one session. Each ``POST /v1/workers/claim`` asks for
``--limit`` runs; an empty answer waits ``--poll-ms`` before the next (or, when the node's claim
takes a long-poll field, ``--wait-field``, the node holds the claim ``--wait-sec`` instead).
Every run claimed is completed as succeeded, as workers that did their work would, unless
``--no-complete``: through ``POST /v1/runs:complete`` when the node's ``/openapi.json`` has it
(4 tasks, each sending every outcome waiting, up to 1,000 a request), else by 64 tasks, one
``POST /v1/runs/{run_id}/complete`` a run. The claim loops never wait for them, so the claims
measure how soon the node hands runs out, not how fast this process completes them.

For each claimed run, one line in ``--out``: ``<received ns> <granted ms> <slot ms> <run id>``,
where *received* is when the claim's answer reached the worker and *granted* is the lease's
start as the node stated it (``lease_expires_at - lease_sec``), written as soon as the claims
end (after ``--expect`` runs, at ``--until-ms`` or on SIGTERM); the completions then drain,
and it prints one JSON line of counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from bench.common import now_ms

COMPLETIONS_IN_FLIGHT = 64
BATCH_COMPLETERS = 4
MAX_BATCH_RUNS = 1000


def ms_of(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


async def work(args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.token}", "Content-Type": "application/json"}
    claim_body: dict[str, Any] = {"pool": args.pool, "worker_id": "", "limit": args.limit}
    if args.wait_field:
        claim_body[args.wait_field] = args.wait_sec
    counts = {"claims": 0, "empty_claims": 0, "claimed": 0, "completed": 0, "complete_failed": 0}
    records: list[str] = []
    to_complete: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    done = asyncio.Event()
    encode, decode = msgspec.json.encode, msgspec.json.decode
    connector = aiohttp.TCPConnector(limit=args.loops + COMPLETIONS_IN_FLIGHT)
    timeout = aiohttp.ClientTimeout(total=120)

    def finished() -> bool:
        if args.expect is not None and counts["claimed"] >= args.expect:
            return True
        return args.until_ms is not None and now_ms() >= args.until_ms

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with session.get(f"{args.url}/openapi.json") as response:
            batch = "/v1/runs:complete" in decode(await response.read()).get("paths", {})
        counts["batch_completions"] = batch

        async def batch_completer() -> None:
            while True:
                items = [await to_complete.get()]
                while not to_complete.empty() and len(items) < MAX_BATCH_RUNS:
                    items.append(to_complete.get_nowait())
                body = {
                    "runs": [
                        {"run_id": run_id, "fencing_token": token, "status": "succeeded"}
                        for run_id, token in items
                    ]
                }
                try:
                    async with session.post(
                        f"{args.url}/v1/runs:complete", data=encode(body), headers=headers
                    ) as response:
                        answer = await response.read()
                    if response.status == 200:
                        done_now = decode(answer)["completed"]
                        counts["completed"] += done_now
                        counts["complete_failed"] += len(items) - done_now
                    else:
                        counts["complete_failed"] += len(items)
                except (aiohttp.ClientError, TimeoutError):
                    counts["complete_failed"] += len(items)
                finally:
                    for _ in items:
                        to_complete.task_done()

        async def completer() -> None:
            while True:
                run_id, token = await to_complete.get()
                try:
                    async with session.post(
                        f"{args.url}/v1/runs/{run_id}/complete",
                        data=encode({"fencing_token": token, "status": "succeeded"}),
                        headers=headers,
                    ) as response:
                        await response.read()
                        counts["completed" if response.status == 200 else "complete_failed"] += 1
                except (aiohttp.ClientError, TimeoutError):
                    counts["complete_failed"] += 1
                finally:
                    to_complete.task_done()

        async def loop(n: int) -> None:
            body = encode({**claim_body, "worker_id": f"bench-worker-{n}"})
            while not done.is_set():
                async with session.post(
                    f"{args.url}/v1/workers/claim", data=body, headers=headers
                ) as response:
                    answer = await response.read()
                    received = time.time_ns()
                counts["claims"] += 1
                if response.status != 200:
                    raise RuntimeError(f"claim answered {response.status}: {answer[:300]!r}")
                runs = decode(answer)["runs"]
                for run in runs:
                    granted = ms_of(run["lease_expires_at"]) - round(run["lease_sec"] * 1000)
                    slot = ms_of(run["scheduled_for"])
                    records.append(f"{received} {granted} {slot} {run['run_id']}\n")
                    if args.complete:
                        to_complete.put_nowait((run["run_id"], run["fencing_token"]))
                counts["claimed"] += len(runs)
                if finished():
                    done.set()
                elif not runs:
                    counts["empty_claims"] += 1
                    if not args.wait_field:
                        await asyncio.sleep(args.poll_ms / 1000)

        # SIGTERM (the bench giving up on runs that never came) ends the claims and still writes
        # what was claimed, so the runs that did not start are counted, not lost with the file.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, done.set)
        while (left := (args.start_ms or 0) - now_ms()) > 0 and not done.is_set():
            await asyncio.sleep(min(left / 1000, 0.2))
        completers = [
            asyncio.create_task(batch_completer() if batch else completer())
            for _ in range(BATCH_COMPLETERS if batch else COMPLETIONS_IN_FLIGHT)
        ]
        loops = [asyncio.create_task(loop(n)) for n in range(args.loops)]
        await asyncio.wait(
            [*loops, asyncio.create_task(done.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        for task in loops:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        await asyncio.gather(*loops)
        # written (whole, by a rename) as soon as the claims end: the bench takes its
        # appearance as the end of the herd, while the completions drain
        partial = Path(f"{args.out}.partial")
        partial.write_text("".join(records))
        partial.rename(args.out)
        try:
            await asyncio.wait_for(to_complete.join(), timeout=120)
        except TimeoutError:
            counts["left_uncompleted"] = to_complete.qsize()
        for task in completers:
            task.cancel()
        await asyncio.gather(*completers, return_exceptions=True)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("token")
    parser.add_argument("pool")
    parser.add_argument("--out", required=True)
    parser.add_argument("--expect", type=int)
    parser.add_argument("--until-ms", type=int)
    parser.add_argument("--start-ms", type=int)
    parser.add_argument("--loops", type=int, default=4)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--poll-ms", type=float, default=50.0)
    parser.add_argument("--wait-field")
    parser.add_argument("--wait-sec", type=float, default=1.0)
    parser.add_argument("--no-complete", dest="complete", action="store_false")
    args = parser.parse_args()
    if args.expect is None and args.until_ms is None:
        parser.error("give --expect or --until-ms")
    print(json.dumps(asyncio.run(work(args))), flush=True)


if __name__ == "__main__":
    main()
