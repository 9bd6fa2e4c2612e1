"""A load generator in a process of its own: the same POST, ``--concurrency`` at a time, for
``--seconds``; the fallback where ``wrk`` cannot be had, and the batch endpoint's loader.

    python -m bench.post_load URL --body-file F [--token T] [--concurrency 64] [--seconds 10]

Prints one JSON line: requests, answers by status, requests a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp


async def load(args: argparse.Namespace) -> dict[str, Any]:
    body = Path(args.body_file).read_bytes()
    headers = {"Content-Type": "application/json"}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    statuses: Counter[int] = Counter()
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        began = time.perf_counter()
        deadline = began + args.seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                async with session.post(args.url, data=body, headers=headers) as response:
                    await response.read()
                    statuses[response.status] += 1

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - began
    total = sum(statuses.values())
    return {
        "requests": total,
        "statuses": {str(k): v for k, v in statuses.items()},
        "seconds": round(elapsed, 3),
        "requests_per_s": round(total / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--body-file", required=True)
    parser.add_argument("--token")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    print(json.dumps(asyncio.run(load(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
