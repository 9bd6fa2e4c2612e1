"""Cron math: croniter against ``core.cron``, and the midnight herd.

    python -m bench.bench_cron

* croniter: ``get_next`` on one iterator, and a fresh ``croniter(expr, start)`` per call
  (what advancing a job from its last slot costs without a cache), America/New_York.
* ``CronSchedule.next_after``: walking fire after fire (every call a new key, so every call
  computes), and the same call repeated (memoised).
* herd: 50,000 jobs on ``0 0 * * *`` in one zone, all advanced from the same slot through
  ``next_fire``: cold (empty caches) and warm; croniter per job for comparison.

Appends one JSON line to bench/results/cron.jsonl and prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from zoneinfo import ZoneInfo

from croniter import croniter

from core.cron import CronSchedule, clear_caches, next_fire

RESULTS = Path(__file__).parent / "results" / "cron.jsonl"
ZONE = "America/New_York"
START_MS = 1_730_592_000_000  # 2024-11-03T00:00:00Z, the fall-back weekend in New York
HERD = 50_000
SECONDS = 1.0
EXPRESSIONS = ("0 0 * * *", "30 2 * * 1-5", "*/15 * * * *", "0 0 * * * */10")


def rate(step: Callable[[], object], seconds: float = SECONDS) -> float:
    """Calls per second of ``step``, run in batches of 100 for ``seconds``."""
    calls, began = 0, time.perf_counter()
    deadline = began + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            step()
        calls += 100
    return calls / (time.perf_counter() - began)


def croniter_rates(expression: str) -> dict[str, float]:
    start = datetime.fromtimestamp(START_MS / 1000, ZoneInfo(ZONE))
    iterator = croniter(expression, start)
    return {
        "croniter_get_next_per_s": rate(lambda: iterator.get_next(float)),
        "croniter_fresh_get_next_per_s": rate(lambda: croniter(expression, start).get_next(float)),
    }


def schedule_rates(expression: str) -> dict[str, float]:
    clear_caches()
    schedule = CronSchedule.parse(expression, ZONE)
    at = START_MS

    def walk() -> None:
        nonlocal at
        at = schedule.next_after(at)

    walked = rate(walk)
    repeated = rate(lambda: schedule.next_after(START_MS))
    return {"next_after_walk_per_s": walked, "next_after_repeat_per_s": repeated}


def herd() -> dict[str, float]:
    jobs = [("0 0 * * *", ZONE, START_MS) for _ in range(HERD)]
    clear_caches()
    began = time.perf_counter()
    cold = [next_fire(expression, zone, after) for expression, zone, after in jobs]
    cold_s = time.perf_counter() - began
    began = time.perf_counter()
    warm = [next_fire(expression, zone, after) for expression, zone, after in jobs]
    warm_s = time.perf_counter() - began
    assert cold == warm and len(set(cold)) == 1
    start = datetime.fromtimestamp(START_MS / 1000, ZoneInfo(ZONE))
    began = time.perf_counter()
    for expression, _, _ in jobs:
        croniter(expression, start).get_next(float)
    croniter_s = time.perf_counter() - began
    return {
        "herd_jobs": HERD,
        "herd_cold_ms": cold_s * 1000,
        "herd_warm_ms": warm_s * 1000,
        "herd_croniter_per_job_ms": croniter_s * 1000,
    }


def main() -> None:
    figures: dict[str, dict[str, float]] = {}
    for expression in EXPRESSIONS:
        figures[expression] = {**croniter_rates(expression), **schedule_rates(expression)}
    figures["herd"] = herd()
    line = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "croniter": version("croniter"),
        "zone": ZONE,
        "figures": {
            name: {k: round(v, 3) for k, v in values.items()} for name, values in figures.items()
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(line) + "\n")

    print(f"cron math, {line['nproc']} CPUs, {ZONE}, calls per second")
    header = (
        f"{'expression':<18}{'croniter':>11}{'croniter new':>14}{'next_after':>12}{'memoised':>12}"
    )
    print(header)
    for expression in EXPRESSIONS:
        f = figures[expression]
        print(
            f"{expression:<18}{f['croniter_get_next_per_s']:>11,.0f}"
            f"{f['croniter_fresh_get_next_per_s']:>14,.0f}"
            f"{f['next_after_walk_per_s']:>12,.0f}{f['next_after_repeat_per_s']:>12,.0f}"
        )
    h = figures["herd"]
    print(
        f"herd of {HERD:,} on '0 0 * * *': next_fire cold {h['herd_cold_ms']:.1f} ms, "
        f"warm {h['herd_warm_ms']:.1f} ms; croniter per job {h['herd_croniter_per_job_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
