"""A node killed with ``kill -9`` on a live machine: its port refuses connections at once, and
the survivor removes the dead node's group member instead of waiting out its session
(``node/peer_watch.py``). The group session here is 20 s, so the survivor owning every
partition within a few seconds is the watch's doing; with ``--no-peer-watch`` it takes the
session."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.nodes import PARTITIONS, Cluster, NodeProcess
from tools.chaos.procs import children

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SESSION_MS = 20_000


def owned(node: NodeProcess) -> int:
    found = re.search(r"^cronlog_partitions_owned (\S+)$", node.metrics(), re.M)
    return 0 if found is None else int(float(found.group(1)))


def test_a_killed_nodes_partitions_move_at_once_not_a_session_later(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    cluster = Cluster(kafka_bootstrap, tmp_path, ("--group-session-ms", str(SESSION_MS)))
    try:
        n1, n2 = cluster.start("n1", "n2")
        deadline = time.monotonic() + 30
        while owned(n1) == PARTITIONS or owned(n2) == 0:  # both own some before the kill
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.1)
        n2.kill()
        killed = time.monotonic()
        while owned(n1) < PARTITIONS:
            assert time.monotonic() - killed < SESSION_MS / 1000 + 10, cluster.logs()
            time.sleep(0.1)
        took = time.monotonic() - killed
        assert took < 6, f"{took:.1f} s\n{cluster.logs()}"
        assert "removed node n2's group member" in n1.log_tail(400)
    finally:
        cluster.stop()


def owned_by_live_workers(node: NodeProcess) -> int:
    """The partitions a node of several workers owns in the workers that answer (a dead one's
    samples are missing from the merged exposition)."""
    found = re.findall(r"^cronlog_partitions_owned\{[^}]*\} (\S+)$", metrics(node), re.M)
    return sum(int(float(v)) for v in found)


def metrics(node: NodeProcess) -> str:
    """The node's merged exposition; empty when the scrape met a connection the killed worker
    had accepted (the test asks again, as a scraper would at its next interval)."""
    try:
        return node.metrics()
    except httpx.TransportError:
        return ""


def test_a_killed_worker_process_leaves_the_group_at_once_through_its_parent(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # A worker's death is invisible to the other nodes' watch (the node's port still answers,
    # as the same boot): its parent removes its member as it sees the process end.
    cluster = Cluster(
        kafka_bootstrap, tmp_path, ("--group-session-ms", str(SESSION_MS), "--workers", "2")
    )
    try:
        [n1] = cluster.start("n1")
        assert n1.pid is not None
        deadline = time.monotonic() + 30
        while len(children(n1.pid)) < 2 or owned_by_live_workers(n1) < PARTITIONS:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.1)
        os.kill(max(children(n1.pid)), signal.SIGKILL)
        killed = time.monotonic()
        while not re.search(r"^cronlog_worker_up\{[^}]*\} 0", metrics(n1), re.M):
            assert time.monotonic() - killed < 5, cluster.logs()  # its samples gone from the
            time.sleep(0.05)  # merged exposition: it answers no more
        while owned_by_live_workers(n1) < PARTITIONS:
            assert time.monotonic() - killed < SESSION_MS / 1000 + 10, cluster.logs()
            time.sleep(0.1)
        took = time.monotonic() - killed
        assert took < 6, f"{took:.1f} s\n{cluster.logs()}"
        assert re.search(r"removed worker n1-w\d's group member", n1.log_tail(400)), cluster.logs()
    finally:
        cluster.stop()
