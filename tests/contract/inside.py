"""Run inside a fresh network namespace: bring loopback up, start ``cronlog serve``, run
schemathesis against its ``/openapi.json`` with a valid token and without one, stop the server,
and write what happened to ``<work>/summary.json``.

``python -m tests.contract.inside WORK SEED MAX_EXAMPLES`` (the test in this folder starts it
under ``unshare --net``). In the namespace there is no interface but ``lo``: a job target the
fuzzer makes up can reach nothing but this machine's own loopback of the namespace, where
only the server under test listens.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")
TOKEN = "contract-token"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 40.0
RUN_TIMEOUT_S = 300.0

# The fuzzing tenant's request rate is set high so the run is not spent waiting; 429 is in the
# document all the same (tests/api/test_rate.py covers it).
LIMITS = """
[tenants.contract]
requests_per_sec = 100000
request_burst = 100000
"""

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    """``ip link set lo up``, without needing iproute2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(work: Path, port: int) -> subprocess.Popen[bytes]:
    limits = work / "limits.toml"
    limits.write_text(LIMITS)
    env = {**os.environ, "CRONLOG_TOKENS": f"contract={TOKEN}", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        "-m",
        "cli.main",
        "serve",
        "--data-dir",
        str(work / "data"),
        "--port",
        str(port),
        "--limits",
        str(limits),
        "--drain-sec",
        "2",
    ]
    with (work / "server.log").open("wb") as log:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"cronlog serve exited with {server.returncode} before it was ready")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"cronlog serve was not ready within {READY_TIMEOUT_S:.0f} s")


def schemathesis(
    work: Path, name: str, url: str, seed: int, max_examples: int, token: str | None
) -> dict[str, Any]:
    report = work / f"{name}.ndjson"
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "use_after_free",  # a cancelled job stays readable: see schemathesis.toml
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        # One worker: hypothesis' lambda descriptions are not thread-safe on Python 3.11 (an
        # "AST constructor recursion depth mismatch" error of the tool, not of the service).
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--request-timeout",
        "10",
        "--no-color",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
    ]
    if token is not None:
        command += ["--header", f"Authorization: Bearer {token}"]
    started = time.monotonic()
    done = subprocess.run(
        command,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    (work / f"{name}.txt").write_text(done.stdout + done.stderr)
    return {
        "exit_code": done.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "summary": summary_line(done.stdout),
        **count_cases(report),
    }


def summary_line(output: str) -> str:
    lines = [line.strip("= ") for line in output.splitlines() if line.startswith("====")]
    return lines[-1] if lines else ""


def count_cases(report: Path) -> dict[str, Any]:
    """Test cases, failed checks and the responses' statuses, from schemathesis' NDJSON events."""
    cases = failures = 0
    statuses: dict[str, int] = {}
    if report.exists():
        for line in report.read_text().splitlines():
            recorder = json.loads(line).get("ScenarioFinished", {}).get("recorder", {})
            cases += len(recorder.get("cases", {}))
            for checks in recorder.get("checks", {}).values():
                failures += sum(1 for check in checks if check.get("status") == "failure")
            for interaction in recorder.get("interactions", {}).values():
                status = str((interaction.get("response") or {}).get("status_code", "none"))
                statuses[status] = statuses.get(status, 0) + 1
    return {"cases": cases, "failed_checks": failures, "statuses": dict(sorted(statuses.items()))}


def unauthenticated_examples(max_examples: int) -> int:
    """Examples per operation for the run without a token: a fifth. Every operation answers
    it 401 before reading the rest of the request (those that need one), so more examples
    fuzz the same answer."""
    return max(5, max_examples // 5)


def main() -> None:
    work, seed, max_examples = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    loopback_up()
    summary: dict[str, Any] = {"interfaces": interfaces(), "seed": seed}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(work, port)
    try:
        wait_ready(url, server)
        for run, token in (("with_token", TOKEN), ("without_token", None)):
            name = run.replace("_", "-")
            examples = max_examples if token else unauthenticated_examples(max_examples)
            summary[run] = schemathesis(work, name, url, seed, examples, token)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    log = (work / "server.log").read_text(errors="replace")
    summary["server_exit_code"] = server.returncode
    summary["server_tracebacks"] = log.count("Traceback (most recent call last)")
    (work / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
