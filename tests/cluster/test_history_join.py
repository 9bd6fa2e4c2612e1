"""A node joining a cluster with an empty data directory restores the read-model checkpoint
another node left in the shared archive directory, and serves the history from it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from archive.store import DirectoryStore
from projections import history_checkpoint
from tests.cluster.nodes import Cluster, iso, job_ids
from tests.node.targets import Target

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_joining_node_restores_the_checkpoint_and_serves_the_history(
    kafka_bootstrap: str, tmp_path: Path, target: Target
) -> None:
    shared = tmp_path / "archive"
    args = ("--archive-dir", str(shared), "--history-checkpoint-every", "1s")
    cluster = Cluster(kafka_bootstrap, tmp_path, serve_args=args)
    store = DirectoryStore(shared)
    try:
        [n1] = cluster.start("n1")
        [job_id] = job_ids("tick", 0, 1)
        body = {
            "job_id": job_id,
            "name": "tick",
            "schedule": "* * * * *",
            "seconds": "*",
            "target": target.url,
            "start_at": iso(time.time()),
        }
        assert n1.create_job(body).status_code == 201
        deadline = time.monotonic() + 60
        while True:  # another process: poll what it serves and what it wrote
            succeeded = [r for r in n1.all_runs(job_id) if r["state"] == "succeeded"]
            newest = history_checkpoint.newest(store)
            if len(succeeded) >= 3 and newest is not None and newest.events > 0:
                break
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.2)
        before = {r["run_id"] for r in succeeded}

        [n2] = cluster.start("n2")  # an empty data directory
        deadline = time.monotonic() + 60
        while not before <= {r["run_id"] for r in n2.all_runs(job_id)}:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.2)
        n2.logged_at("read model restored from history checkpoint history/checkpoints/")
        assert "cronlog_history_checkpoint_restores_total 1.0" in n2.metrics()
    finally:
        cluster.stop()
