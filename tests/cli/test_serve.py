"""``cronlog serve`` as a newcomer runs it: a real process, real HTTP, a real target.

The promise under test: a job the API acknowledged runs, even if the node is killed the next
instant. And the other half of the API a team uses at a terminal: pull workers over HTTP.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from tests.node.targets import Target

pytestmark = pytest.mark.slow
TOKENS = "team-a=token-a,team-b=token-b"
A = {"Authorization": "Bearer token-a"}
B = {"Authorization": "Bearer token-b"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Serve:
    """One ``cronlog serve`` process on a data directory."""

    def __init__(
        self,
        data_dir: Path,
        tokens: str | None = TOKENS,
        env: dict[str, str] | None = None,
        partitions: int = 4,
        args: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.tokens = tokens
        self.env = env or {}
        self.partitions = partitions
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Serve:
        env = {k: v for k, v in os.environ.items() if k != "CRONLOG_TOKENS"}
        if self.tokens is not None:
            env["CRONLOG_TOKENS"] = self.tokens
        env.update(self.env)
        log = (self.data_dir / "serve.log").open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "serve",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.port),
                "--partitions",
                str(self.partitions),
                "--allow-targets",  # the tests' targets run on loopback
                "127.0.0.0/8",
                "--log-level",
                "warning",
                *self.args,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()  # the child has its own descriptor
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # an external process: poll its readiness endpoint
            assert self.proc.poll() is None, (self.data_dir / "serve.log").read_text()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError("cronlog serve did not become ready")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(20)
        return self.proc.returncode


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target().start()
    yield t
    t.stop()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


def test_an_acknowledged_job_runs_after_kill_9(data_dir: Path, target: Target) -> None:
    node = Serve(data_dir).start()
    run_at = time.time() + 3
    body = {
        "name": "pay",
        "run_at": _iso(run_at),
        "target": target.url,
        "critical": True,
        "idempotency_key": "invoice-42",
    }
    response = httpx.post(f"{node.url}/v1/jobs", json=body, headers=A, timeout=10)
    assert response.status_code == 201, response.text
    job_id = response.json()["job_id"]
    node.kill()  # the instant after "created"

    node = Serve(data_dir).start()
    try:
        (call,) = target.wait_for(1, timeout_s=10)
        assert call.headers["Idempotency-Key"].startswith(f"team-a/{job_id}:")
        assert call.body["job_id"] == job_id
        assert call.received_at >= run_at - 0.001  # never early
        # The repeat of the same request is the same job, still one run.
        again = httpx.post(f"{node.url}/v1/jobs", json=body, headers=A, timeout=10)
        assert again.status_code == 200 and again.json()["job_id"] == job_id
        assert len(target.wait_for(2, timeout_s=1.5)) == 1
    finally:
        assert node.stop() == 0  # SIGTERM: a graceful exit


def test_a_crash_in_native_code_leaves_every_thread_s_stack_on_stderr(data_dir: Path) -> None:
    # A segfault in RocksDB or librdkafka used to end the node with signal 11 and not a word.
    node = Serve(data_dir).start()
    assert node.proc is not None
    node.proc.send_signal(signal.SIGSEGV)  # as a crash in native code raises it
    assert node.proc.wait(20) == -signal.SIGSEGV
    said = (data_dir / "serve.log").read_text()
    assert "Fatal Python error: Segmentation fault" in said
    assert said.count("Thread 0x") >= 2  # the node's threads, each with its stack
    assert 'File "' in said


def test_sigusr1_prints_every_thread_s_stack_and_the_node_goes_on(data_dir: Path) -> None:
    node = Serve(data_dir).start()
    try:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while "Thread 0x" not in (data_dir / "serve.log").read_text():  # another process
            assert time.monotonic() < deadline, "no stacks printed"
            time.sleep(0.05)
        assert httpx.get(f"{node.url}/readyz", timeout=5).status_code == 200
    finally:
        assert node.stop() == 0


def test_pull_workers_over_http_and_a_late_completion_is_refused(data_dir: Path) -> None:
    node = Serve(data_dir).start()
    try:
        body = {
            "name": "crunch",
            "run_at": _iso(time.time()),
            "target": "pull://crunchers",
            "lease_sec": 1,
            "backoff": {"base_sec": 0.5, "jitter": False},
        }
        job = httpx.post(f"{node.url}/v1/jobs", json=body, headers=A, timeout=10).json()
        claim = {"pool": "crunchers", "worker_id": "w1"}
        (first,) = _claim(node, claim)
        assert first["job_id"] == job["job_id"] and first["attempt"] == 1
        # team-b's worker of the same pool sees nothing of team-a's.
        assert (
            httpx.post(f"{node.url}/v1/workers/claim", json=claim, headers=B, timeout=10).json()[
                "runs"
            ]
            == []
        )
        # w1 stops heartbeating; after the lease and the retry backoff, w2 gets the run.
        second = _claim(node, {"pool": "crunchers", "worker_id": "w2"}, wait_s=10)[0]
        assert second["run_id"] == first["run_id"] and second["attempt"] == 2
        assert second["fencing_token"] > first["fencing_token"]
        run = first["run_id"]
        done = {"fencing_token": second["fencing_token"], "status": "succeeded"}
        ok = httpx.post(f"{node.url}/v1/runs/{run}/complete", json=done, headers=A, timeout=10)
        assert ok.status_code == 200, ok.text
        late = {"fencing_token": first["fencing_token"], "status": "succeeded"}
        refused = httpx.post(f"{node.url}/v1/runs/{run}/complete", json=late, headers=A, timeout=10)
        assert refused.status_code == 409
        view = httpx.get(f"{node.url}/v1/runs/{run}", headers=A, timeout=10).json()
        assert view["state"] == "succeeded" and len(view["attempts"]) == 2
    finally:
        node.stop()


def _claim(node: Serve, body: dict[str, object], wait_s: float = 5) -> list[dict[str, object]]:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:  # a worker polls for work, as real ones do
        runs = httpx.post(f"{node.url}/v1/workers/claim", json=body, headers=A, timeout=10)
        assert runs.status_code == 200, runs.text
        if runs.json()["runs"]:
            return list(runs.json()["runs"])
        time.sleep(0.1)
    raise AssertionError(f"nothing to claim for {body}")


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def test_serve_help_says_what_each_address_flag_is_and_its_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "where the node keeps its log" in text and "(default 127.0.0.1" in text
    assert "(default 8080)" in text and "CRONLOG_DATA_DIR" in text
