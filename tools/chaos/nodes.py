"""cronlog nodes as real processes on a real Kafka, and the HTTP calls made to them.

Each node is ``python -m cli.main serve --kafka ...`` with a data directory and a port of its
own; every node of a :class:`Cluster` shares the cluster's topic prefix, so a cluster sees no
other cluster's topics or consumer group. ``GET /readyz`` says when a node owns partitions and
has caught up; that is the only readiness signal used here.

A node keeps its port and data directory across restarts, so a node killed with SIGKILL and
started again recovers from its own state stores, as a restarted machine would. The signals a
fault sends are methods here: :meth:`NodeProcess.kill` (SIGKILL), :meth:`NodeProcess.pause`
and :meth:`NodeProcess.resume` (SIGSTOP, SIGCONT), :meth:`NodeProcess.stop` (SIGTERM, then a
graceful drain). A node started with a :class:`~tools.chaos.skew.SkewedClock` runs under
libfaketime and its wall clock can be moved while it runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from tools.chaos.procs import children, free_port, popen
from tools.chaos.skew import SkewedClock

log = logging.getLogger("chaos")

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0
METRICS_TOKEN = "chaos-metrics"


@dataclass(frozen=True)
class NodeConfig:
    """What every node of a cluster is started with."""

    partitions: int = 4
    replication_factor: int = 1
    min_insync_replicas: int = 1
    tokens: str = "team-a=token-a,team-b=token-b"  # CRONLOG_TOKENS
    token: str = "token-a"  # the bearer token the harness speaks with
    drain_sec: float | None = None  # serve's --drain-sec; None: its default
    log_level: str = "info"
    # The recording targets run on loopback, which the egress policy refuses unless told.
    allow_targets: str | None = "127.0.0.0/8"
    serve_args: tuple[str, ...] = ()  # more `cronlog serve` options

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


class NodeProcess:
    def __init__(
        self,
        node_id: str,
        base_dir: Path,
        config: NodeConfig | None = None,
        clock: SkewedClock | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.node_id = node_id
        self.extra_args = extra_args  # this node's own `cronlog serve` options
        self.config = config or NodeConfig()
        self.clock = clock
        self.port = free_port()
        self.data_dir = base_dir / node_id
        self.log_path = base_dir / f"{node_id}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, headers=self.config.auth, timeout=30.0)
        self._bootstrap = ""
        self._prefix = ""
        # Held down on purpose (killed or stopped, not yet started again): a supervisor leaves
        # such a node alone and restarts one that exited by itself (:meth:`revive`).
        self.down = False
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_id(self) -> str:
        return f"{self.node_id}/executor"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, bootstrap: str, prefix: str) -> None:
        """Start the node process (again, after a kill or a stop: same port, same data)."""
        with self._lock:
            self._start(bootstrap, prefix)
            self.down = False

    def _start(self, bootstrap: str, prefix: str) -> None:
        assert not self.alive(), f"{self.node_id} is running"
        self._bootstrap, self._prefix = bootstrap, prefix
        c = self.config
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
            str(c.partitions),
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--replication-factor",
            str(c.replication_factor),
            "--min-insync-replicas",
            str(c.min_insync_replicas),
            "--log-level",
            c.log_level,
        ]
        if c.drain_sec is not None:
            command += ["--drain-sec", str(c.drain_sec)]
        if c.allow_targets is not None:
            command += ["--allow-targets", c.allow_targets]
        command += c.serve_args
        command += self.extra_args
        env = {
            **os.environ,
            "CRONLOG_TOKENS": c.tokens,
            "CRONLOG_METRICS_TOKEN": METRICS_TOKEN,
            "PYTHONUNBUFFERED": "1",
        }
        if self.clock is not None:
            env.update(self.clock.env())
        with self.log_path.open("ab") as log:
            self.process = popen(
                command,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def restart(self) -> None:
        self.start(self._bootstrap, self._prefix)

    def revive(self) -> int | None:
        """Start the node again if it exited by itself (not held down by a fault), as a
        supervisor would; its exit status if it did."""
        with self._lock:
            if self.down or self.process is None or self.process.poll() is None:
                return None
            code = self.process.returncode
            self._start(self._bootstrap, self._prefix)
            return code

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, supervised: bool = False) -> None:
        """Poll ``/readyz`` until 200 (the readiness signal another process offers). A node that
        exits meanwhile fails the wait, unless ``supervised`` (a supervisor starts it again)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            assert supervised or self.alive(), f"{self.node_id} exited:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"{self.node_id} not ready:\n{self.log_tail()}"
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no revocation, no leaving the group, nothing flushed. The node stays down
        until started again."""
        with self._lock:
            self.down = True
            assert self.process is not None
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()

    def pause(self) -> None:
        """SIGSTOP: the process stops where it is, sockets open, believing it owns what it did
        (its worker processes too, when it runs some)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        for pid in children(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        for pid in children(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.process.send_signal(signal.SIGCONT)

    def workers(self) -> list[int]:
        """The node's worker processes (``--workers N``), oldest pid first; none when it runs as
        one process."""
        return [] if self.process is None else sorted(children(self.process.pid))

    def dump_stacks(self, timeout_s: float = 5.0) -> None:
        """SIGUSR1: the node prints every thread's Python stack into its log and goes on;
        returns once they are there (or after ``timeout_s``)."""
        if self.process is None or self.process.poll() is not None:
            return
        before = self.log_path.stat().st_size
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # another process: its log is what it tells
            with self.log_path.open("rb") as log:
                log.seek(before)
                if b"(most recent call first)" in log.read():
                    return
            time.sleep(0.05)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM, as a rolling restart sends it; SIGKILL if the node has not left in time.
        The node stays down until started again."""
        self.down = True
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)  # a paused node cannot act on SIGTERM
        self.process.terminate()
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            # a finding: what held it is in its log (every thread's stack) before the kill
            log.warning("%s did not stop within %.0f s of SIGTERM: killed", self.node_id, grace_s)
            self.dump_stacks()
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        self.stop()
        self.http.close()

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

    def all_runs(self, job_id: str, page: int = 200, max_pages: int = 1000) -> list[dict[str, Any]]:
        """Every run of ``job_id`` this node's read model holds, newest first."""
        runs: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(max_pages):
            params: dict[str, Any] = {"limit": page}
            if cursor is not None:
                params["cursor"] = cursor
            response = self.http.get(f"/v1/jobs/{job_id}/runs", params=params)
            response.raise_for_status()
            body = response.json()
            runs += body["runs"]
            cursor = body["next_cursor"]
            if cursor is None:
                return runs
        raise AssertionError(f"{job_id}: more than {max_pages} pages of runs")

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

    def metrics(self) -> str:
        response = self.http.get(
            "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10.0
        )
        response.raise_for_status()
        return response.text


class Cluster:
    """Nodes sharing one topic prefix on one Kafka."""

    def __init__(
        self,
        bootstrap: str,
        base_dir: Path,
        config: NodeConfig | None = None,
        prefix: str | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.base_dir = base_dir
        self.config = config or NodeConfig()
        self.prefix = prefix or f"cluster-{uuid.uuid4().hex[:12]}"
        self.nodes: dict[str, NodeProcess] = {}

    def add(
        self, node_id: str, clock: SkewedClock | None = None, extra_args: tuple[str, ...] = ()
    ) -> NodeProcess:
        node = self.nodes[node_id] = NodeProcess(
            node_id, self.base_dir, self.config, clock, extra_args
        )
        return node

    def start(self, *node_ids: str) -> list[NodeProcess]:
        started = []
        for node_id in node_ids:
            node = self.nodes.get(node_id) or self.add(node_id)
            node.start(self.bootstrap, self.prefix)
            started.append(node)
        for node in started:
            node.wait_ready()
        return started

    def stop(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.close()

    def logs(self) -> str:
        return "\n".join(
            f"--- {node.node_id} ---\n{node.log_tail()}" for node in self.nodes.values()
        )
