"""cronlog nodes as real processes on a real Kafka, and the HTTP calls the tests make to them.

Each node is ``python -m cli.main serve --kafka ...`` with a data directory and a port of its
own; every node of a :class:`Cluster` shares the cluster's topic prefix, so a test that makes
its own cluster sees no other test's topics or consumer group. ``GET /readyz`` says when a node
owns partitions and has caught up; that is the only readiness signal the tests use.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from core.ids import log_job_id
from eventlog.port import partition_for

REPO = Path(__file__).resolve().parents[2]
TOKENS = "team-a=token-a,team-b=token-b"
AUTH = {"Authorization": "Bearer token-a"}
PARTITIONS = 4
READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def iso(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def job_ids(prefix: str, partition: int, count: int, tenant: str = "team-a") -> list[str]:
    """``count`` ids of ``tenant``'s jobs that live on ``partition`` (routing is by the log's
    id, which includes the tenant: core.ids)."""
    ids: list[str] = []
    for i in range(10_000):
        if partition_for(log_job_id(tenant, f"{prefix}-{i}"), PARTITIONS) == partition:
            ids.append(f"{prefix}-{i}")
            if len(ids) == count:
                return ids
    raise AssertionError(f"no {count} ids for partition {partition}")


def _die_with_parent() -> None:
    # A test run that dies hard must not leave nodes behind (Linux: SIGKILL when pytest goes).
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class NodeProcess:
    def __init__(self, node_id: str, base_dir: Path) -> None:
        self.node_id = node_id
        self.port = free_port()
        self.data_dir = base_dir / node_id
        self.log_path = base_dir / f"{node_id}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, headers=AUTH, timeout=30.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_id(self) -> str:
        return f"{self.node_id}/executor"

    def start(self, bootstrap: str, prefix: str) -> None:
        command = [
            sys.executable,
            "-m",
            "cli.main",
            "serve",
            "--kafka",
            bootstrap,
            "--node-id",
            self.node_id,
            "--topic-prefix",
            prefix,
            "--partitions",
            str(PARTITIONS),
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            # One broker in tests; a cluster of three given by KAFKA_BOOTSTRAP_SERVERS works too.
            "--replication-factor",
            "1",
            "--min-insync-replicas",
            "1",
            # The recording targets run on loopback, which the egress policy refuses unless told.
            "--allow-targets",
            "127.0.0.0/8",
        ]
        env = {**os.environ, "CRONLOG_TOKENS": TOKENS, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        # Polling the node's HTTP endpoint is the readiness signal another process offers.
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            assert self.alive(), f"{self.node_id} exited:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"{self.node_id} not ready:\n{self.log_tail()}"
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no revocation, no leaving the group, nothing flushed."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self, grace_s: float = 20.0) -> None:
        self.http.close()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def logged_at(self, text: str) -> float:
        """When the node last logged a line containing ``text`` (``time.time()`` scale)."""
        for line in reversed(self.log_path.read_text(errors="replace").splitlines()):
            if text in line:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()  # logging's asctime is local time, as is this
        raise AssertionError(f"{self.node_id} never logged {text!r}")

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    # -- the API -------------------------------------------------------------------------------

    def create_job(self, body: dict[str, Any]) -> httpx.Response:
        return self.http.post("/v1/jobs", json=body)

    def runs(self, job_id: str, limit: int = 200) -> list[dict[str, Any]]:
        response = self.http.get(f"/v1/jobs/{job_id}/runs", params={"limit": limit})
        response.raise_for_status()
        return list(response.json()["runs"])

    def run(self, run_id: str) -> dict[str, Any] | None:
        """The run as this node's read model has it; None while it has not seen it."""
        response = self.http.get(f"/v1/runs/{run_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return dict(response.json())

    def dead(self) -> list[dict[str, Any]]:
        response = self.http.get("/v1/runs", params={"state": "dead"})
        response.raise_for_status()
        return list(response.json()["runs"])


class Cluster:
    """Nodes sharing one topic prefix on one Kafka."""

    def __init__(self, bootstrap: str, base_dir: Path) -> None:
        self.bootstrap = bootstrap
        self.base_dir = base_dir
        self.prefix = f"cluster-{uuid.uuid4().hex[:12]}"
        self.nodes: dict[str, NodeProcess] = {}

    def start(self, *node_ids: str) -> list[NodeProcess]:
        started = []
        for node_id in node_ids:
            node = self.nodes[node_id] = NodeProcess(node_id, self.base_dir)
            node.start(self.bootstrap, self.prefix)
            started.append(node)
        for node in started:
            node.wait_ready()
        return started

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def logs(self) -> str:
        return "\n".join(
            f"--- {node.node_id} ---\n{node.log_tail()}" for node in self.nodes.values()
        )
