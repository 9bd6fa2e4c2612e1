"""Every example in ``examples/`` runs as written against a real ``cronlog serve``: as its own
process, with only ``CRONLOG_URL`` and ``CRONLOG_TOKEN`` set, as the examples' README says."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_serve import Serve

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# What each example's output must show: that it did what it says.
EXPECTED = {
    "quickstart.py": ["fires at", "triggered", "cancelled"],
    "pull_worker.py": ["attempt 2: thumbnail of cat.png", "handled 3 runs in"],
    "target_service.py": ["run succeeded after attempts [1: failed", "invoices sent: 1"],
    "tail.py": [
        "JobRegistered",
        "RunMaterialised",
        "after cursor",
        "['JobCancelled', 'RunCancelled']",
    ],
    "backfill.py": ["to trigger", "5/5", "triggered 5 runs; again: 0"],
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    data = tmp_path_factory.mktemp("examples")
    served = Serve(data, "team-a=token-a").start()
    yield served
    assert served.stop() == 0


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_the_example_runs_as_written(node: Serve, example: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CRONLOG_")},
        "CRONLOG_URL": node.url,
        "CRONLOG_TOKEN": "token-a",
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        env=env,
        cwd=EXAMPLES.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for expected in EXPECTED[example]:
        assert expected in done.stdout, done.stdout
