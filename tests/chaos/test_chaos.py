"""The chaos run in its bounded form: every fault kind once, in pairs where they combine, on a
real cluster on loopback (three KRaft brokers, three nodes, the recording target, two pull
workers); the checker must find no violation.

It takes a few minutes on two cores. Its seed is fixed, so a failure here replays with
``python -m tools.chaos run --each-once --combine 1 --seed 12 ...`` (see
``docs/reliability.md``); the run's directory (logs, records, the events as read, the report)
is kept under pytest's temporary directory and its path printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.chaos.checker import summary
from tools.chaos.run import Settings, run
from tools.chaos.workload import Shape

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(900)]

SEED = 12
CI_SHAPE = Shape(
    every_second=12,
    every_second_critical=3,
    every_five=3,
    pull=2,
    pull_critical=1,
    oneshot_bursts=2,
    oneshot_per_burst=30,
)


def test_every_fault_kind_once_and_the_checker_finds_no_violation(tmp_path: Path) -> None:
    out = tmp_path / f"chaos-seed-{SEED}"
    report = run(
        Settings(
            seed=SEED,
            duration_s=420.0,  # a bound: every episode of the plan runs, then the drain
            out=out,
            mode="each_once",
            combine_p=1.0,
            shape=CI_SHAPE,
            warmup_s=5.0,
            drain_s=20.0,
        )
    )
    text = summary(report)
    print(f"{text}\nrun directory: {out}")
    assert report.figures["fault_episodes"] >= 5, text  # every kind struck
    assert report.figures["slots_checked"] > 1000, text
    assert report.ok, text
