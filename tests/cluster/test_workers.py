"""A cluster node of several worker processes (``cronlog serve --kafka ... --workers 2``): each
worker is a member of the consumer group; a worker killed with ``kill -9`` is started again by
its node, and the jobs due meanwhile run once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.test_serve_workers import wait_until
from tests.cluster.nodes import Cluster, iso
from tests.node.targets import Target
from tools.chaos.procs import children

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_node_of_two_workers_on_kafka_survives_a_worker_killed(
    kafka_bootstrap: str, tmp_path: Path, target: Target
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path, serve_args=("--workers", "2"))
    try:
        [n1] = cluster.start("n1")
        assert n1.pid is not None
        wait_until(lambda: len(children(n1.pid)) == 2, 10, "two worker processes")

        def create(name: str, at: float) -> str:
            body = {"name": name, "run_at": iso(round(at * 1000)), "target": target.url}
            deadline = time.monotonic() + 30
            while True:
                try:
                    created = n1.create_job(body)
                except httpx.TransportError:
                    # A pooled connection to the worker just killed; a create is idempotent (the
                    # same body again is the same job), so a client sends it again, as the SDK does.
                    created = n1.create_job(body)
                if created.status_code not in (429, 503) or time.monotonic() > deadline:
                    break
                # Until the group hands the killed worker's partitions on, their creates are
                # answered 503 (nothing decided) with a Retry-After; the SDK's client waits it
                # and sends the create again, and so does this test.
                assert created.headers.get("Retry-After"), created.text
                time.sleep(min(float(created.headers["Retry-After"]), 0.5))
            assert created.status_code in (200, 201), created.text
            return str(created.json()["job_id"])

        at = time.time() + 4
        first = {create(f"before-{i}", at) for i in range(8)}
        calls = target.wait_for(8, timeout_s=30)
        assert sorted(c.body["job_id"] for c in calls) == sorted(first), cluster.logs()

        victim = min(children(n1.pid))
        os.kill(victim, signal.SIGKILL)
        at = time.time() + 4
        later = {create(f"after-{i}", at) for i in range(8)}
        calls = target.wait_for(16, timeout_s=60)
        assert sorted(c.body["job_id"] for c in calls) == sorted(first | later), cluster.logs()
        wait_until(
            lambda: len(children(n1.pid)) == 2 and victim not in children(n1.pid),
            30,
            "the killed worker started again",
        )
        assert len(target.wait_for(17, timeout_s=1.5)) == 16  # nothing ran twice
    finally:
        cluster.stop()
