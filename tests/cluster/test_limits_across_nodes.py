"""A team's limits on three nodes: its token's request rate and its event streams hold across
the cluster (core.shares), not on each node, and follow where the team's requests go."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.nodes import Cluster, NodeProcess

pytestmark = pytest.mark.slow

RATE = 30  # team-a's requests a second, and its burst
STREAMS = 3  # team-a's event streams
LIMITS = f"""
[tenants.team-a]
requests_per_sec = {RATE}
request_burst = {RATE}
max_event_streams = {STREAMS}
"""


@contextlib.contextmanager
def three_nodes(bootstrap: str, base_dir: Path) -> Iterator[list[NodeProcess]]:
    limits = base_dir / "limits.toml"
    limits.write_text(LIMITS)
    cluster = Cluster(bootstrap, base_dir, serve_args=("--limits", str(limits)))
    try:
        yield cluster.start("n1", "n2", "n3")
    finally:
        cluster.stop()
        print(cluster.logs())


def push(nodes: list[NodeProcess], seconds: float) -> list[list[float]]:
    """Requests as fast as one client a node makes them, for ``seconds``; the instants (since
    the start) of each node's requests that were let through."""
    start = time.monotonic()
    passed: list[list[float]] = [[] for _ in nodes]

    def hammer(i: int, node: NodeProcess) -> None:
        with httpx.Client(base_url=node.url, headers=node.config.auth, timeout=10.0) as client:
            while (at := time.monotonic() - start) < seconds:
                code = client.get("/v1/team").status_code
                assert code in (200, 429), code
                if code == 200:
                    passed[i].append(at)

    threads = [threading.Thread(target=hammer, args=(i, n)) for i, n in enumerate(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return passed


def within(passed: list[list[float]], start: float, end: float) -> list[int]:
    return [sum(start <= at < end for at in node) for node in passed]


def test_a_token_pushing_through_three_nodes_gets_its_rate_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with three_nodes(kafka_bootstrap, tmp_path) as nodes:
        # Through all three: the rate, once the shares have settled (a few seconds).
        passed = push(nodes, 12.0)
        settled = within(passed, 4.0, 12.0)
        print("through three nodes, per node over 8 s:", settled)
        assert 0.75 * RATE * 8 <= sum(settled) <= 1.15 * RATE * 8 + RATE, settled
        # Through one: that node gets the whole rate, not a third of it.
        [alone] = push(nodes[:1], 10.0)
        moved = sum(4.0 <= at < 10.0 for at in alone)
        print("through one node, over 6 s:", moved)
        assert 0.75 * RATE * 6 <= moved <= 1.15 * RATE * 6 + RATE, moved


def open_stream(node: NodeProcess, stack: contextlib.ExitStack, wait_s: float) -> bool:
    """Open one event stream on ``node``, trying again on 429 for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        client = stack.enter_context(
            httpx.Client(base_url=node.url, headers=node.config.auth, timeout=30.0)
        )
        response = stack.enter_context(
            client.stream("GET", "/v1/events", params={"follow": "true"})
        )
        if response.status_code == 200:
            return True
        assert response.status_code == 429, response.status_code
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def test_a_team_holds_its_event_streams_once_across_the_nodes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with three_nodes(kafka_bootstrap, tmp_path) as (n1, n2, n3):
        with contextlib.ExitStack() as held_on_n1:
            for _ in range(STREAMS):  # n1's share grows to what it holds
                assert open_stream(n1, held_on_n1, 10.0)
            # Every stream the team may hold is held on n1: none more anywhere, for a while.
            with contextlib.ExitStack() as refused:
                assert not open_stream(n2, refused, 4.0)
                assert not open_stream(n3, refused, 1.0)
        # n1's streams ended: another node may hold them now.
        with contextlib.ExitStack() as held_on_n2:
            for _ in range(STREAMS):
                assert open_stream(n2, held_on_n2, 10.0)
