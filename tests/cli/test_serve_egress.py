"""``cronlog serve``'s egress settings as an operator gives them: the command line, a config
file, the startup line that states the policy, and a clear exit on an entry it cannot read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.nodes import free_port

pytestmark = pytest.mark.slow
AUTH = {"Authorization": "Bearer token-a"}
SERVE = [sys.executable, "-m", "cli.main", "serve", "--log-level", "warning"]
JOB = {"name": "hook", "schedule": "0 9 * * *"}


def serve(data_dir: Path, *options: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {**os.environ, "CRONLOG_TOKENS": "team-a=token-a"}
    proc = subprocess.Popen(
        [*SERVE, "--data-dir", str(data_dir), "--port", str(port), "--partitions", "2", *options],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # an external process: poll its readiness endpoint
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("cronlog serve did not become ready")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=60)
    return out


def create(url: str, target: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/jobs", json={**JOB, "target": target}, headers=AUTH, timeout=10)


def test_loopback_is_refused_until_allowed_and_the_startup_line_says_which(tmp_path: Path) -> None:
    proc, url = serve(tmp_path / "strict")
    try:
        r = create(url, "http://127.0.0.1:9000/hook")
        assert r.status_code == 422 and r.json()["field"] == "target"
        assert "egress policy" in r.json()["message"]
        assert "--allow-targets" in r.json()["message"]  # what the operator would change
    finally:
        out = stop(proc)
    assert "egress policy: public addresses" in out and "allowed (none)" in out
    assert "kafka:// targets: " not in out  # none granted: every one refused, no promise to state

    config = tmp_path / "egress.toml"
    config.write_text(
        'allow_targets = ["127.0.0.0/8"]\nerror_excerpt_bytes = 0\n'
        '[allow_topics]\n"*" = ["{tenant}."]\n'
    )
    proc, url = serve(tmp_path / "open", "--egress-config", str(config))
    try:
        assert create(url, "http://127.0.0.1:9000/hook").status_code == 201
        assert create(url, "kafka://team-a.results").status_code == 201
        for refused in (
            "http://169.254.169.254/",
            f"{url}/v1/jobs",  # the node's own API, though loopback is allowed
            f"http://localhost:{url.rsplit(':', 1)[1]}/metrics",
            "kafka://cronlog.events",
            "kafka://team-b.results",
        ):
            r = create(url, refused)
            assert r.status_code == 422, refused
            assert r.json()["message"].startswith("egress policy: "), r.json()
    finally:
        out = stop(proc)
    assert "allowed (127.0.0.0/8)" in out and "*={tenant}." in out
    assert "kafka:// targets: at least once" in out  # embedded: a call, not a transaction


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--allow-targets", "10.0.0.0/33"], "10.0.0.0/33"),
        (["--deny-targets", "exa mple.com"], "exa mple.com"),
        (["--allow-topics", "team-a"], "TENANT=PREFIX"),
        (["--error-excerpt-bytes", "5000"], "--error-excerpt-bytes"),
    ],
)
def test_an_entry_serve_cannot_read_ends_it_with_a_message_naming_it(
    tmp_path: Path, options: list[str], says: str
) -> None:
    done = subprocess.run(
        [*SERVE, "--data-dir", str(tmp_path), *options],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CRONLOG_TOKENS": "team-a=token-a"},
    )
    assert done.returncode != 0
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_config_file_with_an_unknown_setting_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "egress.toml"
    config.write_text('allow_target = ["127.0.0.0/8"]\n')  # a typo is an error, not ignored
    done = subprocess.run(
        [*SERVE, "--data-dir", str(tmp_path), "--egress-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CRONLOG_TOKENS": "team-a=token-a"},
    )
    assert done.returncode != 0 and "allow_target" in done.stderr, done.stderr
