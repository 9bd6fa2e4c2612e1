"""The floor: a bare aiohttp client making the herd's calls itself, in a process of its own.

    python -m bench.floor URL --jobs N --at-ms T [--concurrency 512]

At ``T`` (Unix ms) it makes ``N`` POSTs to ``URL``, ``--concurrency`` at a time over one pooled
session (as many connections as cronlog's executors keep: 512 by default), each with a body
and headers shaped like cronlog's calls (``Idempotency-Key: floor/<job>:<T>`` among them), so
the recorder measures it exactly as it measures cronlog. Nothing is scheduled, logged or
stored: no scheduler can start the same calls sooner on this machine, so cronlog's spike is
judged against it.

Prints one JSON line: the client's own view (seconds from ``T`` to the last call sent and to
the last answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import msgspec

from bench.common import iso_ms, now_ms


async def fire(url: str, jobs: int, at_ms: int, concurrency: int) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:
        encode = msgspec.json.encode
        scheduled = iso_ms(at_ms)
        failed = 0
        last_sent = 0.0
        numbers = iter(range(jobs))

        async def worker() -> None:
            nonlocal failed, last_sent
            for i in numbers:
                body = encode(
                    {
                        "job_id": f"job-{i:07d}",
                        "name": f"bench job {i}",
                        "tenant": "floor",
                        "run_id": f"r-{i:07d}-{at_ms}",
                        "scheduled_for": scheduled,
                        "scheduled_for_ms": at_ms,
                        "attempt": 1,
                        "fencing_token": 1,
                        "payload": {"n": i},
                    }
                )
                headers = {
                    "Idempotency-Key": f"floor/job-{i:07d}:{at_ms}",
                    "X-Cronlog-Run-Id": f"r-{i:07d}-{at_ms}",
                    "X-Cronlog-Attempt": "1",
                    "X-Cronlog-Fencing-Token": "1",
                    "Content-Type": "application/json",
                }
                last_sent = time.time()
                async with session.post(url, data=body, headers=headers) as response:
                    async for _ in response.content.iter_chunked(1 << 16):
                        pass
                    if response.status != 200:
                        failed += 1

        while (left := at_ms - now_ms()) > 0:
            await asyncio.sleep(min(left / 1000, 0.2))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        done = time.time()
    return {
        "client_last_sent_s": round(last_sent - at_ms / 1000, 3),
        "client_all_answered_s": round(done - at_ms / 1000, 3),
        "failed": failed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--at-ms", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=512)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(fire(args.url, args.jobs, args.at_ms, args.concurrency))))


if __name__ == "__main__":
    main()
