"""Jobs per tenant on two nodes: a team's jobs on every partition, created through either node,
count toward one quota, which both nodes enforce once their read models have the jobs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster.nodes import PARTITIONS, Cluster, NodeProcess, job_ids

pytestmark = pytest.mark.slow

JOB = {"name": "quota", "schedule": "0 0 1 1 *", "target": "pull://p"}


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll a node's HTTP API (its read model) until ``check()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def jobs_seen(node: NodeProcess, status: str = "active") -> int:
    response = node.http.get("/v1/jobs", params={"status": status, "limit": 100})
    return len(response.json()["jobs"])


def test_a_teams_jobs_through_both_nodes_count_toward_one_quota(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    limits = tmp_path / "limits.toml"
    limits.write_text(f"[tenants.team-a]\nmax_jobs = {PARTITIONS}\n")
    cluster = Cluster(kafka_bootstrap, tmp_path, serve_args=("--limits", str(limits)))
    try:
        n1, n2 = cluster.start("n1", "n2")
        ids = [job_ids("quota", p, 2) for p in range(PARTITIONS)]  # two per partition
        # One job on every partition, half asked of each node (so some travel to the owner).
        for p, pair in enumerate(ids):
            node = n1 if p % 2 else n2
            response = node.http.put(f"/v1/jobs/{pair[0]}", json=JOB)
            assert response.status_code == 201, response.text
        for node in (n1, n2):
            wait_until(f"{node.node_id} sees every job", lambda n=node: jobs_seen(n) == PARTITIONS)
        for node in (n1, n2):
            for pair in ids:
                response = node.http.put(f"/v1/jobs/{pair[1]}", json=JOB)
                assert (response.status_code, response.json()["error"]) == (403, "quota_exceeded")
        # Another team is not held back by this one's count.
        other = n1.http.post("/v1/jobs", json=JOB, headers={"Authorization": "Bearer token-b"})
        assert other.status_code == 201, other.text
        # A job cancelled through one node frees a place on the other.
        assert n2.http.delete(f"/v1/jobs/{ids[0][0]}").status_code == 200
        wait_until("n1 sees the cancel", lambda: jobs_seen(n1, "cancelled") == 1)
        assert n1.http.put(f"/v1/jobs/{ids[3][1]}", json=JOB).status_code == 201
    finally:
        cluster.stop()
        print(cluster.logs())
