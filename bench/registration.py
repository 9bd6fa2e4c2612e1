"""Registration: ``POST /v1/jobs`` 64 at a time against ``cronlog serve`` and against a bare
Starlette endpoint under the same uvicorn settings; and the batch endpoint when there is one.

    python -m bench.registration [--seconds 15] [--tool wrk|python] [--kafka HOST:PORT]

``--kafka`` runs the node on that broker instead of the embedded log (start one with
``python -m tools.kafka.broker start``; ``python -m bench.run_all`` starts its own).

The load generator is ``wrk`` (Debian's package; installed with apt-get when missing and this
runs as root), one thread and 64 connections, each request the same body (no ``job_id``, so
each one creates a new job). Without wrk, :mod:`bench.post_load` (aiohttp, 64 at once, in a
process of its own) stands in, and the record says so. The batch endpoint is always driven by
:mod:`bench.post_load`: 4 requests at once of as many jobs as the endpoint takes (at most
1,000). Every target is a leap-day cron, so nothing fires.

Appends one JSON line per measurement to bench/results/registration.jsonl and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.common import (
    API_CONCURRENCY,
    NEVER_SOON,
    PYTHON,
    ROOT,
    Serve,
    append_result,
    find_batch_endpoint,
    free_port,
    loadavg,
    log,
    stamp,
    stop_process,
    wait_port,
)

BODY = {
    "name": "registered job",
    "schedule": NEVER_SOON,
    "target": "http://127.0.0.1:9/hook",
    "payload": {"report": "daily"},
}
BATCH_CONCURRENCY = 4


def ensure_wrk() -> str | None:
    """wrk's path, installing Debian's package first when it is missing and we may."""
    if shutil.which("wrk"):
        return shutil.which("wrk")
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "install", "-y", "-qq", "wrk"], ["apt-get", "update", "-qq"],
                        ["apt-get", "install", "-y", "-qq", "wrk"]):  # fmt: skip
            subprocess.run(command, env=env, capture_output=True, timeout=600, check=False)
            if shutil.which("wrk"):
                break
    return shutil.which("wrk")


LUA = """\
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
{auth}
"""


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def wrk(url: str, body: bytes, token: str | None, seconds: float, tmp: Path) -> dict[str, Any]:
    script = tmp / f"post-{secrets.token_hex(4)}.lua"
    auth = f'wrk.headers["Authorization"] = "Bearer {token}"' if token else ""
    script.write_text(LUA.format(body=_lua_string(body.decode()), auth=auth))
    command = ["wrk", "-t1", f"-c{API_CONCURRENCY}", f"-d{max(1, round(seconds))}s",
               "--latency", "-s", str(script), url]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    text = out.stdout

    def find(pattern: str) -> str | None:
        match = re.search(pattern, text)
        return match.group(1) if match else None

    requests = int(find(r"(\d+) requests in") or 0)
    non_2xx = int(find(r"Non-2xx or 3xx responses: (\d+)") or 0)
    errors = find(r"Socket errors: (.*)")
    return {
        "tool": "wrk -t1 -c64",
        "requests": requests,
        "non_2xx": non_2xx,
        "socket_errors": errors,
        "requests_per_s": float(find(r"Requests/sec:\s+([\d.]+)") or 0),
        "ok_per_s": round(float(find(r"Requests/sec:\s+([\d.]+)") or 0)
                          * (requests - non_2xx) / max(1, requests), 1),
        "latency_p50": find(r"\s50%\s+(\S+)"),
        "latency_p99": find(r"\s99%\s+(\S+)"),
    }  # fmt: skip


def post_load(
    url: str, body: bytes, token: str | None, seconds: float, tmp: Path, concurrency: int
) -> dict[str, Any]:
    path = tmp / f"body-{secrets.token_hex(4)}.json"
    path.write_bytes(body)
    command = [PYTHON, "-m", "bench.post_load", url, "--body-file", str(path),
               "--concurrency", str(concurrency), "--seconds", str(seconds)]  # fmt: skip
    if token:
        command.append(f"--token={token}")  # a token may begin with "-"
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=seconds + 300)  # fmt: skip
    figures: dict[str, Any] = json.loads(out.stdout)
    ok = sum(v for k, v in figures["statuses"].items() if k.startswith("2"))
    figures["tool"] = f"bench.post_load (aiohttp) c{concurrency}"
    figures["ok_per_s"] = round(ok / figures["seconds"], 1)
    figures["non_2xx"] = figures["requests"] - ok
    return figures


def measure(url: str, token: str | None, seconds: float, tool: str, tmp: Path) -> dict[str, Any]:
    body = json.dumps(BODY).encode()
    if tool == "wrk":
        return wrk(url, body, token, seconds, tmp)
    return post_load(url, body, token, seconds, tmp, API_CONCURRENCY)


def bare(seconds: float, tool: str, tmp: Path) -> dict[str, Any]:
    port = free_port()
    output = (tmp / f"bare-{port}.out").open("wb")
    proc = subprocess.Popen(
        [PYTHON, "-m", "bench.bare_starlette", "--port", str(port)],
        cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/v1/jobs"
        wait_port(port, proc)
        return measure(url, None, seconds, tool, tmp)
    finally:
        stop_process(proc, 20)
        output.close()


def run(
    seconds: float, tool: str, tmp: Path, *, kafka: str | None = None, with_bare: bool = True
) -> list[dict[str, Any]]:
    """One round: cronlog (single, then batch when served) and the bare endpoint."""
    records = []

    def record(scenario: str, figures: dict[str, Any], load: list[float]) -> None:
        records.append({"timestamp": stamp(), "scenario": scenario, "seconds": seconds,
                        "load_at_start": load, "figures": figures})  # fmt: skip

    load = loadavg()
    suffix = "-kafka" if kafka else ""
    with Serve(tmp / f"serve-{secrets.token_hex(4)}", kafka=kafka) as serve:
        record(f"register-single{suffix}",
               measure(f"{serve.url}/v1/jobs", serve.token, seconds, tool, tmp), load)  # fmt: skip
        batch = find_batch_endpoint(serve.openapi())
        if batch is not None:
            load = loadavg()
            body = json.dumps(batch.body([BODY] * batch.max_items)).encode()
            figures = post_load(f"{serve.url}{batch.path}", body, serve.token, seconds, tmp,
                                BATCH_CONCURRENCY)  # fmt: skip
            figures["jobs_per_request"] = batch.max_items
            figures["jobs_per_s"] = round(figures["ok_per_s"] * batch.max_items)
            figures["path"] = batch.path
            record(f"register-batch{suffix}", figures, load)
    if with_bare:
        load = loadavg()
        record("register-bare-starlette", bare(seconds, tool, tmp), load)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--tool", choices=("wrk", "python"))
    parser.add_argument("--kafka", metavar="HOST:PORT", help="run the node on this broker")
    args = parser.parse_args()
    tool = args.tool or ("wrk" if ensure_wrk() else "python")
    with tempfile.TemporaryDirectory(prefix="cronlog-registration-") as tmp:
        for record in run(args.seconds, tool, Path(tmp), kafka=args.kafka):
            append_result("registration", record)
            f = record["figures"]
            log(f"{record['scenario']}: {f['ok_per_s']} ok/s ({f['tool']}, non-2xx {f['non_2xx']})")


if __name__ == "__main__":
    main()
