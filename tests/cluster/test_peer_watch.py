"""A node killed with ``kill -9`` on a live machine: its port refuses connections at once, and
the survivor removes the dead node's group member instead of waiting out its session
(``node/peer_watch.py``). The group session here is 20 s, so the survivor owning every
partition within a few seconds is the watch's doing; with ``--no-peer-watch`` it takes the
session."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.cluster.nodes import PARTITIONS, Cluster, NodeProcess

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
