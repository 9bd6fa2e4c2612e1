"""A pull worker: it long-polls its pool, so a run is handled the moment it is due, heartbeats
while the handler works, and completes with the run's fencing token.

    CRONLOG_URL=... CRONLOG_TOKEN=... python examples/pull_worker.py [RUNS]

It creates a job that fires every few seconds on the pool ``thumbnails``, handles RUNS runs
(default 3; the first attempt of the first run fails and is retried), then stops cleanly.
A real worker runs until SIGTERM: ``Worker(...).run_blocking()``.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

from cronlog_client import AsyncClient, JobDefinition, RetryLater, RunContext, Worker
from cronlog_client.models import BackoffIn


async def main(runs_wanted: int) -> None:
    attempts = 0
    succeeded: set[str] = set()
    done = asyncio.Event()

    async def make_thumbnail(run: RunContext) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RetryLater(1.0, "the image store is busy")  # tried again a second later
        # Pass run.headers() on to what the work calls: the target can then ignore a repeat.
        print(f"run {run.run_id} attempt {run.attempt}: thumbnail of {run.payload['image']}")
        succeeded.add(run.run_id)
        if len(succeeded) >= runs_wanted:
            done.set()

    async with AsyncClient() as cronlog:
        job_id = f"thumbnails-{uuid.uuid4().hex[:8]}"
        await cronlog.put_job(
            job_id,
            JobDefinition(
                name="thumbnails",
                schedule="* * * * *",
                seconds="*/2",  # every two seconds
                target="pull://thumbnails",
                payload={"image": "cat.png"},
                backoff=BackoffIn(base_sec=0.5, jitter=False),
            ),
        )
        worker = Worker(cronlog, "thumbnails", make_thumbnail, concurrency=2)
        running = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(done.wait(), 60)
        worker.stop()  # stop claiming; handlers in flight finish
        await running
        await cronlog.cancel_job(job_id)
        print(f"handled {len(succeeded)} runs in {worker.completed} attempts")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
