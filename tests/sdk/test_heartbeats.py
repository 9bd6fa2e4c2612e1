"""Heartbeats against a real ``cronlog serve``: a thousand runs held through several heartbeat
periods, each heartbeat reaching the node on the first try, and an idle connection kept open
by the node longer than the client keeps one.

The client lets go of an idle connection before the node closes it (``KEEPALIVE_S`` against
``KEEP_ALIVE_S``), so no request is written to a connection the node is closing: with
uvicorn's own 5 s and httpx's own 5 s, a client whose loop was a moment late wrote
heartbeats to connections the node had just closed. And at most ``MAX_CONNECTIONS`` requests
are in flight from one client: a thousand heartbeats queued in httpx's pool kept a core busy
in the client, heartbeats took up to 13 s, and leases ran out under running handlers."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from cronlog_client import AsyncClient, NewJob, RunContext, Worker

from tests.cli.test_serve import Serve

pytestmark = pytest.mark.slow

RUNS = 1000
LEASE_SEC = 18.0  # a heartbeat every 6 s: longer than uvicorn's 5 s keep-alive
HOLD_SEC = 24.0  # each run heartbeats three or four times


class Counting(httpx.AsyncBaseTransport):
    """The client's own transport, counting what it sends and every failure on the way; a
    batch of heartbeats (``runs:heartbeat``) counts a beat for each run it names."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.sent: Counter[str] = Counter()
        self.beats: Counter[str] = Counter()  # heartbeats sent, by run
        self.failed: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        kind = request.url.path.rsplit("/", 1)[-1]
        self.sent[kind] += 1
        if kind == "heartbeat":
            self.beats[request.url.path.split("/")[3]] += 1
        elif kind == "runs:heartbeat":
            self.beats.update(beat["run_id"] for beat in json.loads(request.content)["runs"])
        try:
            return await self.inner.handle_async_request(request)
        except httpx.TransportError as e:
            self.failed.append(f"{kind}: {e!r}")
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture
def node(tmp_path: Path) -> Any:
    limits = tmp_path / "limits.toml"
    # The team's heartbeats count against its request rate: 1,000 runs beating every 6 s.
    limits.write_text("[defaults]\nrequests_per_sec = 2000\nrequest_burst = 4000\n")
    served = Serve(tmp_path / "node", "team-a=token-a", args=["--limits", str(limits)])
    served.data_dir.mkdir()
    served.start()
    yield served
    assert served.stop() == 0, (served.data_dir / "serve.log").read_text()[-5000:]


def test_a_thousand_runs_heartbeat_with_no_connection_error(node: Serve) -> None:
    finished: list[str] = []
    lost: list[str] = []

    async def hold(run: RunContext) -> None:
        await asyncio.sleep(HOLD_SEC)
        if run.lost.is_set():
            lost.append(run.run_id)
        finished.append(run.run_id)

    async def scenario() -> Counting:
        async with AsyncClient(node.url, "token-a", timeout_s=60) as cronlog:
            counting = Counting(cronlog._http._transport)
            cronlog._http._transport = counting
            at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
            jobs = [
                NewJob(name=f"h{i}", run_at=at, lease_sec=LEASE_SEC, target="pull://held")
                for i in range(RUNS)
            ]
            created = await cronlog.create_jobs(jobs, idempotency_key="held")
            assert created.created == RUNS
            worker = Worker(cronlog, "held", hold, concurrency=RUNS, worker_id="w")
            running = asyncio.ensure_future(worker.run())
            deadline = asyncio.get_running_loop().time() + HOLD_SEC + 60
            while len(finished) < RUNS and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)  # a test's wait on a condition another task makes
            worker.stop()
            await asyncio.wait_for(running, 60)
            return counting

    counting = asyncio.run(scenario())
    assert len(finished) == RUNS and not lost, (len(finished), len(lost), counting.sent)
    assert counting.failed == [], counting.failed[:5]
    # Every run beat through several periods, and no beat had to be sent twice.
    assert len(counting.beats) == RUNS and min(counting.beats.values()) >= 2, counting.sent
    # In batches: a few requests a period for the thousand runs, not one a run.
    assert counting.sent["heartbeat"] == 0, counting.sent
    assert counting.sent["runs:heartbeat"] < sum(counting.beats.values()) / 20, counting.sent


def test_the_node_keeps_an_idle_connection_longer_than_uvicorn_would(node: Serve) -> None:
    """A connection idle for 8 s still takes a request (uvicorn alone closes it after 5 s;
    the node keeps it 75 s, and the SDK lets go of it after 30 s)."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=5) as conn:
        ask = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{node.port}\r\n\r\n".encode()
        conn.sendall(ask)
        assert answer(conn).startswith(b"HTTP/1.1 200")
        time.sleep(8)  # the idle time itself is what is tested
        conn.sendall(ask)
        assert answer(conn).startswith(b"HTTP/1.1 200")


def answer(conn: socket.socket) -> bytes:
    """One whole HTTP response (head and a Content-Length body) from ``conn``; b"" once the
    other end has closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
