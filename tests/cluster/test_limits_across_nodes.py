"""A team's limits on three nodes: a token's request rate, a team's event streams and a team's
calls in flight hold across the cluster (core.shares), not on each node, and follow where the
team's requests and runs go. One cluster serves the module's tests: team-a's rate, team-b's
streams and calls."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

import bench.cluster_limits
from tests.cluster.nodes import Cluster, NodeProcess, iso, now_ms

pytestmark = pytest.mark.slow

RATE = 30  # team-a's requests a second, and its burst
STREAMS = 3  # team-b's event streams
CALLS = 4  # --max-calls-per-team, a team's calls in flight across the cluster
LIMITS = f"""
[tenants.team-a]
requests_per_sec = {RATE}
request_burst = {RATE}

[tenants.team-b]
max_event_streams = {STREAMS}
"""
TEAM_B = {"Authorization": "Bearer token-b"}


@pytest.fixture(scope="module")
def nodes(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    base = tmp_path_factory.mktemp("limits")
    limits = base / "limits.toml"
    limits.write_text(LIMITS)
    serve_args = ("--limits", str(limits), "--max-calls-per-team", str(CALLS))
    cluster = Cluster(kafka_bootstrap, base, serve_args=serve_args)
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


def test_a_token_pushing_through_three_nodes_gets_its_rate_once(nodes: list[NodeProcess]) -> None:
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
    """One of team-b's event streams on ``node``, tried again on 429 for up to ``wait_s``."""
    return bench.cluster_limits.open_stream(node.url, TEAM_B, stack, wait_s)


def test_a_team_holds_its_event_streams_once_across_the_nodes(nodes: list[NodeProcess]) -> None:
    n1, n2, n3 = nodes
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


class CountingTarget:
    """Holds every call ``hold_s`` and keeps the most calls it held at once."""

    def __init__(self, hold_s: float) -> None:
        self.open = 0
        self.most = 0
        self.answered = 0
        lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    target.open += 1
                    target.most = max(target.most, target.open)
                time.sleep(hold_s)
                with lock:
                    target.open -= 1
                    target.answered += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/run"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_team_s_calls_in_flight_hold_its_cap_across_the_nodes(nodes: list[NodeProcess]) -> None:
    target = CountingTarget(hold_s=1.5)
    jobs = 18  # spread over every partition, so over the three nodes
    run_at = iso(now_ms() + 3000)
    with httpx.Client(base_url=nodes[0].url, headers=TEAM_B, timeout=30.0) as client:
        for i in range(jobs):
            job = {"name": f"held {i}", "target": target.url, "run_at": run_at, "timeout_sec": 30}
            response = client.put(f"/v1/jobs/calls-{uuid.uuid4().hex[:8]}", json=job)
            assert response.status_code == 201, response.text
    deadline = time.monotonic() + 60
    while target.answered < jobs:
        assert time.monotonic() < deadline, f"{target.answered} of {jobs} calls answered"
        time.sleep(0.1)
    target.server.shutdown()
    target.server.server_close()
    print("most calls in flight at once:", target.most)
    assert 2 <= target.most <= CALLS
