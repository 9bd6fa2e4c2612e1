"""``cronlog serve`` writes snapshots as it decides, and a restart without its state stores
restores them instead of folding the log from the first event."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.cli.test_serve import A, Serve

pytestmark = pytest.mark.slow


def metric(node: Serve, name: str) -> float:
    token = (node.data_dir / "metrics_token").read_text().strip()
    text = httpx.get(
        f"{node.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the metrics")


def test_a_node_without_its_stores_restores_its_snapshots(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    args = ("--snapshot-every-events", "3")
    node = Serve(data, partitions=1, args=args).start()
    try:
        for i in range(7):
            body = {"name": f"j{i}", "schedule": "0 0 1 1 *", "target": "pull://p"}
            created = httpx.post(f"{node.url}/v1/jobs", json=body, headers=A, timeout=10)
            assert created.status_code == 201, created.text
        assert metric(node, "cronlog_snapshot_restores_total") == 0
    finally:
        assert node.stop() == 0
    snapshots = sorted((data / "snapshots" / "p0").glob("*.snap"))
    assert [int(p.stem) for p in snapshots] == [3, 6]  # every third event, the newest two
    shutil.rmtree(data / "node" / "state")  # the state stores are gone

    node = Serve(data, partitions=1, args=args).start()
    try:
        assert metric(node, "cronlog_snapshot_restores_total") == 1
        jobs = httpx.get(f"{node.url}/v1/jobs", headers=A, timeout=10).json()
        assert sorted(j["name"] for j in jobs["jobs"]) == [f"j{i}" for i in range(7)]
        again = {"name": "j0", "schedule": "0 0 1 1 *", "target": "pull://p"}
        # The restored state knows j0: the same definition again changes nothing.
        assert httpx.post(f"{node.url}/v1/jobs", json=again, headers=A, timeout=10).status_code in (
            200,
            201,
        )
    finally:
        assert node.stop() == 0
