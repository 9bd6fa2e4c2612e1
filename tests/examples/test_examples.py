"""Every example in ``examples/`` runs as written against a real ``cronlog serve``: as its own
process, with only ``CRONLOG_URL`` and ``CRONLOG_TOKEN`` set, as the examples' README says."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
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


def _run(node: Serve, example: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CRONLOG_")},
        "CRONLOG_URL": node.url,
        "CRONLOG_TOKEN": "token-a",
    }
    return subprocess.run(
        [sys.executable, str(EXAMPLES / example)],
        env=env,
        cwd=EXAMPLES.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_the_example_runs_as_written(node: Serve, example: str) -> None:
    done = _run(node, example)
    assert done.returncode == 0, done.stdout + done.stderr
    for expected in EXPECTED[example]:
        assert expected in done.stdout, done.stdout


def test_the_quickstart_runs_again_beside_the_readmes_job(node: Serve) -> None:
    """After the README's first five minutes (a job named `report`), the quickstart runs, and
    runs again, with a job of its own: `cronlog jobs trigger report` still finds one job."""
    auth = {"Authorization": "Bearer token-a"}
    created = httpx.post(
        f"{node.url}/v1/jobs",
        headers=auth,
        json={"name": "report", "interval_sec": 60, "target": "pull://reports"},
    )
    assert created.status_code == 201, created.text
    for _ in range(2):
        done = _run(node, "quickstart.py")
        assert done.returncode == 0, done.stdout + done.stderr
        [job_id] = {line.split()[-1] for line in done.stdout.splitlines() if " job j_" in line}
        assert f"job {job_id}: next run" in done.stdout  # the resend answered the same job
    named = httpx.get(f"{node.url}/v1/jobs", headers=auth, params={"name": "report"}).json()
    assert [j["job_id"] for j in named["jobs"]] == [created.json()["job_id"]]
    quickstarts = httpx.get(f"{node.url}/v1/jobs", headers=auth, params={"q": "quickstart"})
    assert {j["status"] for j in quickstarts.json()["jobs"]} <= {"cancelled"}
