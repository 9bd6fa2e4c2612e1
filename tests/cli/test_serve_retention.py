"""``cronlog serve`` with a retention so short it prunes while jobs fire: killed with -9 and
restarted (its read model lost too), it still knows every run from the first, and its stores
equal a replay from offset 0 over archive + log."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.test_serve import A, Serve, _iso
from tests.node.targets import Target
from tools.replay.cli import main

pytestmark = pytest.mark.slow
FAST = ["--segment-bytes", "2KiB", "--retention", "1s", "--retention-check", "100ms"]
JOBS = 3


def _metric(node: Serve, name: str) -> float:
    token = (node.data_dir / "metrics_token").read_text().strip()
    text = httpx.get(
        f"{node.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return 0.0 if found is None else float(found.group(1))


def _wait_for(node: Serve, name: str, at_least: float, timeout_s: float = 30.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # an external process: poll its metrics
        value = _metric(node, name)
        if value >= at_least:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{name} stayed below {at_least}")


def _first_slots(node: Serve, job_id: str) -> list[str]:
    runs = httpx.get(
        f"{node.url}/v1/jobs/{job_id}/runs", params={"limit": 500}, headers=A, timeout=10
    ).json()["runs"]
    return sorted(r["scheduled_for"] for r in runs)


@pytest.fixture
def target() -> Target:
    t = Target().start()
    yield t  # type: ignore[misc]
    t.stop()


def test_pruned_archived_killed_and_restarted_it_still_has_every_run(
    tmp_path: Path, target: Target
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    node = Serve(data_dir, args=FAST).start()
    try:
        before = _fire_until_pruned(node, target)
    finally:
        node.kill()
    shutil.rmtree(data_dir / "node" / "read_model")  # rebuilt from offset 0: archive + log

    node = Serve(data_dir, args=FAST).start()
    try:
        for job, slots in before.items():
            after = _first_slots(node, job)
            assert after[: len(slots)] == slots  # the first runs too
    finally:
        assert node.stop() == 0
    assert main(["verify", "--data-dir", str(data_dir)]) == 0


def _fire_until_pruned(node: Serve, target: Target) -> dict[str, list[str]]:
    """Jobs firing every second until retention has archived and pruned a few segments;
    each job's runs (their slots) as the node shows them then."""
    jobs = []
    for i in range(JOBS):
        body = {
            "name": f"tick-{i}",
            "schedule": "* * * * *",
            "seconds": "*",
            "target": target.url,
            "start_at": _iso(time.time()),
        }
        response = httpx.post(f"{node.url}/v1/jobs", json=body, headers=A, timeout=10)
        assert response.status_code == 201, response.text
        jobs.append(response.json()["job_id"])
    pruned = 'cronlog_retention_pruned_segments_total{stream="events"}'
    _wait_for(node, pruned, 3)
    _wait_for(node, "cronlog_archive_segments_total", 3)
    before = {job: _first_slots(node, job) for job in jobs}
    assert all(before.values())
    return before
