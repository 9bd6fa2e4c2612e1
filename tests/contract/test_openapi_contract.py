"""The OpenAPI document is the contract: schemathesis holds a real ``cronlog serve`` to its own
``/openapi.json``, with a tenant's token and without one.

Both run inside a network namespace of their own (``unshare --net``) whose only interface is
loopback, so a job target the fuzzer makes up (``http://10.1.2.3/``, a cloud metadata address,
a public name) can reach nothing: the calls the server makes fail as unreachable. This does not
lean on the egress policy. Where a namespace cannot be made (not root, no ``unshare``) the test
fails and says why; it is never skipped, as a contract nobody checks is no contract.

Under ``./scripts/test`` (``HYPOTHESIS_PROFILE=ci``) the seed is fixed, so a run is
reproducible; elsewhere each run draws a new one and prints it. ``CRONLOG_CONTRACT_EXAMPLES``
sets the examples per operation with the token (default 100, about three minutes on two cores;
``./scripts/test`` sets 50); the run without one takes a fifth as many, as every operation
that needs one answers 401 before reading the request.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.contract.inside import REPO, unauthenticated_examples

pytestmark = pytest.mark.slow

CI_SEED = 20261201
DRIVER_TIMEOUT_S = 900


def _namespace_or_why() -> str | None:
    """None when this process can make a network namespace, else the reason it cannot."""
    if shutil.which("unshare") is None:
        return "`unshare` (util-linux) is not installed"
    try:
        probe = subprocess.run(
            ["unshare", "--net", "--", "true"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`unshare --net` could not run: {e}"
    if probe.returncode != 0:
        return (
            f"`unshare --net` failed (uid {os.getuid()}; it needs root or CAP_SYS_ADMIN):"
            f" {probe.stderr.strip()}"
        )
    return None


@pytest.mark.timeout(DRIVER_TIMEOUT_S + 60)
def test_the_service_keeps_to_its_openapi_document(tmp_path: Path) -> None:
    why = _namespace_or_why()
    if why is not None:
        pytest.fail(f"cannot isolate the fuzzed server's network: {why}")
    seed = CI_SEED if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else random.randrange(2**31)
    examples = int(os.environ.get("CRONLOG_CONTRACT_EXAMPLES", "100"))
    done = subprocess.run(
        [
            "unshare",
            "--net",
            "--",
            sys.executable,
            "-m",
            "tests.contract.inside",
            str(tmp_path),
            str(seed),
            str(examples),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        check=False,
    )
    summary_path = tmp_path / "summary.json"
    assert done.returncode == 0 and summary_path.exists(), done.stdout + done.stderr
    summary = json.loads(summary_path.read_text())
    print(json.dumps(summary, indent=2))  # the figures, shown with -rP or when it fails

    def report(name: str) -> str:
        return (tmp_path / f"{name}.txt").read_text()[-20_000:]

    assert summary["interfaces"] == ["lo"], "the namespace has more than loopback"
    for run, name in (("with_token", "with-token"), ("without_token", "without-token")):
        result = summary[run]
        assert result["exit_code"] == 0, f"seed {seed}, {run}:\n{report(name)}"
        assert result["failed_checks"] == 0, report(name)
        assert not [s for s in result["statuses"] if s.startswith("5")], result["statuses"]
        ran = examples if run == "with_token" else unauthenticated_examples(examples)
        assert result["cases"] >= 10 * ran, result  # it really ran
    assert summary["with_token"]["statuses"].get("201", 0) > 0  # it got past validation
    assert summary["without_token"]["statuses"]["401"] > 0
    assert summary["server_tracebacks"] == 0, (tmp_path / "server.log").read_text()[-20_000:]
    assert summary["server_exit_code"] == 0
