"""The peer: APScheduler 3.11 running the same herd against the same recorder, in a process of
its own.

    python -m bench.aps_peer URL --jobs N [--store memory|sqlite] [--executor asyncio|threads]
        [--pool 20] [--misfire-grace none|SECONDS] [--coalesce] [--defaults]

The scheduler is started paused; a warm-up of jobs that never fire measures how fast its job
store takes jobs, and the slot is placed far enough out that adding all ``N`` ends before it.
Each job is a ``CronTrigger`` (UTC) firing daily at that second, whose function POSTs to
``URL`` a body and headers shaped like cronlog's (``Idempotency-Key: aps/<job>:<slot ms>``).

* ``--executor asyncio``: ``AsyncIOScheduler`` + ``AsyncIOExecutor``; the function is a
  coroutine on one aiohttp session of ``--pool`` connections (the floor's client).
* ``--executor threads``: ``BackgroundScheduler`` + ``ThreadPoolExecutor(--pool)``; the
  function makes the call with ``http.client`` on a keep-alive connection per thread.
* ``--store sqlite``: ``SQLAlchemyJobStore`` on a SQLite file (``--sqlite PATH``;
  ``--sqlite-wal`` switches it to write-ahead logging with ``synchronous=NORMAL``); otherwise
  ``MemoryJobStore``.
* ``--defaults``: APScheduler's job defaults (``misfire_grace_time`` 1 s, ``coalesce``,
  ``max_instances`` 1) and, for threads, its default pool of 10; otherwise the given settings.

Prints ``slot <ms>`` once the jobs are in, then one JSON line when every job has run or been
reported missed (or ``--timeout-s`` passed): counts from APScheduler's own events.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import msgspec

from bench.common import NEVER_SOON, iso_ms, now_ms

WARM_UP = 200
MARGIN_S = 5.0

_session: Any = None  # the aiohttp session of the asyncio executor (set in the loop)
_target: tuple[str, int, str] = ("127.0.0.1", 0, "/")
_local = threading.local()


def _call(i: int, slot_ms: int) -> tuple[bytes, dict[str, str]]:
    body = msgspec.json.encode(
        {
            "job_id": f"job-{i:07d}",
            "name": f"bench job {i}",
            "tenant": "aps",
            "run_id": f"r-{i:07d}-{slot_ms}",
            "scheduled_for": iso_ms(slot_ms),
            "scheduled_for_ms": slot_ms,
            "attempt": 1,
            "fencing_token": 1,
            "payload": {"n": i},
        }
    )
    headers = {
        "Idempotency-Key": f"aps/job-{i:07d}:{slot_ms}",
        "X-Cronlog-Run-Id": f"r-{i:07d}-{slot_ms}",
        "X-Cronlog-Attempt": "1",
        "X-Cronlog-Fencing-Token": "1",
        "Content-Type": "application/json",
    }
    return body, headers


async def call_async(i: int, slot_ms: int) -> None:
    body, headers = _call(i, slot_ms)
    host, port, path = _target
    async with _session.post(f"http://{host}:{port}{path}", data=body, headers=headers) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")


def call_sync(i: int, slot_ms: int) -> None:
    body, headers = _call(i, slot_ms)
    host, port, path = _target
    connection = getattr(_local, "connection", None)
    for attempt in (1, 2):  # a kept-alive connection the server closed is opened again once
        if connection is None:
            connection = _local.connection = http.client.HTTPConnection(host, port, timeout=30)
        try:
            connection.request("POST", path, body, headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
            return
        except (http.client.HTTPException, OSError):
            connection.close()
            connection = _local.connection = None
            if attempt == 2:
                raise


def sqlite_engine(path: str, *, wal: bool) -> Any:
    """SQLAlchemy's engine on ``path``; ``wal``: write-ahead logging with ``synchronous=NORMAL``
    (a commit no longer waits for an fsync, the usual way to make SQLite take many small
    transactions), else SQLite's defaults (a rollback journal, an fsync per commit)."""
    from sqlalchemy import create_engine, event

    engine = create_engine(f"sqlite:///{path}")
    if wal:

        @event.listens_for(engine, "connect")
        def tune(connection: Any, record: Any) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    return engine


class Counts:
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.executed = self.errors = self.missed = self.max_instances = 0
        self.done = threading.Event()
        self.first_error = ""

    def listen(self, event: Any) -> None:
        from apscheduler import events as e

        if event.code == e.EVENT_JOB_EXECUTED:
            self.executed += 1
        elif event.code == e.EVENT_JOB_ERROR:
            self.errors += 1
            self.first_error = self.first_error or repr(event.exception)
        elif event.code == e.EVENT_JOB_MISSED:
            self.missed += 1
        elif event.code == e.EVENT_JOB_MAX_INSTANCES:
            self.max_instances += 1
        if self.executed + self.errors + self.missed + self.max_instances >= self.expected:
            self.done.set()


def build(args: argparse.Namespace, loop: asyncio.AbstractEventLoop | None = None) -> Any:
    from apscheduler.executors.asyncio import AsyncIOExecutor
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.schedulers.background import BackgroundScheduler

    store: Any = MemoryJobStore()
    if args.store == "sqlite":
        store = SQLAlchemyJobStore(engine=sqlite_engine(args.sqlite, wal=args.sqlite_wal))
    job_defaults: dict[str, Any] = {}
    if not args.defaults:
        grace = None if args.misfire_grace == "none" else float(args.misfire_grace)
        job_defaults = {"misfire_grace_time": grace, "coalesce": args.coalesce}
    if args.executor == "asyncio":
        return AsyncIOScheduler(
            jobstores={"default": store},
            executors={"default": AsyncIOExecutor()},
            job_defaults=job_defaults,
            timezone=UTC,
            event_loop=loop,
        )
    pool = ThreadPoolExecutor() if args.defaults else ThreadPoolExecutor(args.pool)
    return BackgroundScheduler(
        jobstores={"default": store},
        executors={"default": pool},
        job_defaults=job_defaults,
        timezone=UTC,
    )


def run(args: argparse.Namespace, scheduler: Any) -> dict[str, Any]:
    """Register the herd in the paused scheduler, let it run, wait for every job's outcome."""
    from apscheduler.events import EVENT_ALL
    from apscheduler.triggers.cron import CronTrigger

    function = call_async if args.executor == "asyncio" else call_sync
    counts = Counts(args.jobs)
    scheduler.add_listener(counts.listen, EVENT_ALL)
    scheduler.start(paused=True)
    never = CronTrigger.from_crontab(NEVER_SOON, timezone=UTC)
    began = time.perf_counter()
    for i in range(WARM_UP):
        scheduler.add_job(function, never, args=(1_000_000 + i, 0), id=f"warm-{i}")
    warm_rate = WARM_UP / (time.perf_counter() - began)
    lead_s = 1.5 * args.jobs / warm_rate + MARGIN_S
    slot = (now_ms() + round(lead_s * 1000)) // 1000 * 1000 + 1000
    at = datetime.fromtimestamp(slot / 1000, UTC)
    trigger = CronTrigger(hour=at.hour, minute=at.minute, second=at.second, timezone=UTC)
    began = time.perf_counter()
    for i in range(args.jobs):
        scheduler.add_job(function, trigger, args=(i, slot), id=f"job-{i}")
    registration_s = time.perf_counter() - began
    if now_ms() >= slot - 200:
        raise RuntimeError(f"adding the jobs ran past the slot (warm-up rate {warm_rate:.0f}/s)")
    scheduler.resume()
    print(f"slot {slot}", flush=True)
    finished = counts.done.wait(max(0.0, (slot - now_ms()) / 1000) + args.timeout_s)
    return {
        "registration": {
            "jobs": args.jobs,
            "seconds": round(registration_s, 3),
            "jobs_per_s": round(args.jobs / registration_s),
        },
        "executed": counts.executed,
        "errors": counts.errors,
        "missed": counts.missed,
        "max_instances_skipped": counts.max_instances,
        "finished": finished,
        "first_error": counts.first_error,
        "slot_ms": slot,
    }


async def run_in_loop(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    global _session
    connector = aiohttp.TCPConnector(limit=args.pool, limit_per_host=0)
    _session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))
    loop = asyncio.get_running_loop()
    scheduler = build(args, loop)
    try:
        # add_job and the wait block; the scheduler's own work needs this loop free meanwhile
        return await loop.run_in_executor(None, run, args, scheduler)
    finally:
        scheduler.shutdown(wait=False)
        await _session.close()


def main() -> None:
    global _target
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--sqlite", default="aps.sqlite")
    parser.add_argument("--sqlite-wal", action="store_true")
    parser.add_argument("--executor", choices=("asyncio", "threads"), default="asyncio")
    parser.add_argument("--pool", type=int, default=512)
    parser.add_argument("--misfire-grace", default="none")
    parser.add_argument("--coalesce", action="store_true")
    parser.add_argument("--defaults", action="store_true")
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    # A missed run is counted through EVENT_JOB_MISSED; its WARNING line each would flood.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    parts = urlsplit(args.url)
    _target = (parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/")
    if args.executor == "asyncio":
        figures = asyncio.run(run_in_loop(args))
    else:
        scheduler = build(args)
        try:
            figures = run(args, scheduler)
        finally:
            scheduler.shutdown(wait=False)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
