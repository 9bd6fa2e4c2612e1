"""Throughput and memory of core.wheel.TimingWheel.

    python -m bench.bench_wheel

Scenarios (tick 10 ms, 512 buckets, keys built before timing so only the wheel is measured):

* spread: 1,000,000 timers due uniformly over the next hour. Inserts, then cancels and
  re-arms of a fifth of them, then expiry by advancing in 1 s steps (a busy partition).
* sleeper: the same hour of timers expired the way an idle-between-deadlines scheduler
  does it: advance to ``next_deadline()``, repeat. Mostly per-call cost.
* midnight herd: 50,000 timers due in the same millisecond, a day out.
* memory: tracemalloc peak while holding 1,000,000 spread timers, per timer.

Appends one JSON line to bench/results/wheel.jsonl and prints a table.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import random
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from core.wheel import TimingWheel

START = 1_700_000_000_000
HOUR = 3_600_000
DAY = 24 * HOUR
SPREAD = 1_000_000
HERD = 50_000
RESULTS = Path(__file__).parent / "results" / "wheel.jsonl"


def timed(action: Callable[[], object]) -> float:
    gc.collect()
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def spread_timers(count: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"run-{i}", START + 1 + rng.randrange(HOUR)) for i in range(count)]


def bench_spread(figures: dict[str, float]) -> None:
    timers = spread_timers(SPREAD, seed=1)
    rng = random.Random(2)
    some = rng.sample(timers, SPREAD // 5)
    wheel: TimingWheel[str] = TimingWheel(START)

    def insert() -> None:
        for key, deadline in timers:
            wheel.add(key, deadline)

    def cancel() -> None:
        for key, _ in some:
            wheel.cancel(key)

    def re_arm() -> None:
        for key, deadline in some:
            wheel.add(key, deadline)

    fired = 0

    def expire() -> None:
        nonlocal fired
        for now in range(START + 1_000, START + HOUR + 1_001, 1_000):
            fired += len(wheel.advance(now))

    figures["insert_per_s"] = SPREAD / timed(insert)
    figures["cancel_per_s"] = len(some) / timed(cancel)
    figures["rearm_per_s"] = len(some) / timed(re_arm)
    figures["expire_1s_steps_per_s"] = SPREAD / timed(expire)
    assert fired == SPREAD and len(wheel) == 0


def bench_sleeper(figures: dict[str, float]) -> None:
    timers = spread_timers(SPREAD, seed=3)
    wheel: TimingWheel[str] = TimingWheel(START)
    for key, deadline in timers:
        wheel.add(key, deadline)
    fired = 0
    wakeups = 0

    def expire() -> None:
        nonlocal fired, wakeups
        while (wake := wheel.next_deadline()) is not None:
            wakeups += 1
            fired += len(wheel.advance(wake))

    figures["expire_sleeper_per_s"] = SPREAD / timed(expire)
    figures["sleeper_wakeups"] = wakeups
    assert fired == SPREAD


def bench_herd(figures: dict[str, float]) -> None:
    midnight = START + DAY
    keys = [f"job-{i}" for i in range(HERD)]
    wheel: TimingWheel[str] = TimingWheel(START)

    def insert() -> None:
        for key in keys:
            wheel.add(key, midnight)

    fired: list[tuple[int, str]] = []
    figures["herd_insert_per_s"] = HERD / timed(insert)
    figures["herd_expire_per_s"] = HERD / timed(lambda: fired.extend(wheel.advance(midnight)))
    assert len(fired) == HERD


def bench_memory(figures: dict[str, float]) -> None:
    timers = spread_timers(SPREAD, seed=4)
    gc.collect()
    tracemalloc.start()
    wheel: TimingWheel[str] = TimingWheel(START)
    for key, deadline in timers:
        wheel.add(key, deadline)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    figures["bytes_per_timer_peak"] = peak / SPREAD
    figures["bytes_per_timer_held"] = current / SPREAD
    del wheel


def main() -> None:
    figures: dict[str, float] = {}
    bench_spread(figures)
    bench_sleeper(figures)
    bench_herd(figures)
    bench_memory(figures)
    record = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "tick_ms": 10,
        "wheel_size": 512,
        "spread_timers": SPREAD,
        "herd_timers": HERD,
        "figures": {name: round(value, 1) for name, value in figures.items()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    width = max(map(len, figures))
    print(f"{'figure':<{width}}  value")
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:>14,.0f}")
    print(f"nproc {record['nproc']}, python {record['python']}; appended to {RESULTS}")


if __name__ == "__main__":
    main()
