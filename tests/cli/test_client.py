"""The ``cronlog`` client at a terminal, against a real ``cronlog serve``.

The node runs without configured tokens, so it creates one for the ``default`` team in its data
directory; the client, pointed at the same directory, finds it there as a newcomer's would.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.main import main
from tests.cli.test_serve import Serve, data_dir  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow


def cronlog(capsys: pytest.CaptureFixture[str], node: Serve, *argv: str) -> tuple[int, Any]:
    """Run the client; its exit status and the JSON it printed."""
    status = main([*argv, "--url", node.url, "--data-dir", str(node.data_dir)])
    out = capsys.readouterr().out
    return status, json.loads(out)


def test_the_client_drives_a_job_through_its_life(
    data_dir: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CRONLOG_TOKEN", raising=False)
    node = Serve(data_dir, tokens=None).start()
    try:
        assert (data_dir / "tokens").exists()
        run_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        status, job = cronlog(
            capsys, node, "jobs", "create", "--name", "report", "--run-at", run_at,
            "--target", "pull://reports", "--payload", '{"day": 1}', "--retries", "2",
        )  # fmt: skip
        assert status == 0, job
        assert job["tenant"] == "default" and job["payload"] == {"day": 1}
        assert job["retries"] == 2 and job["next_run_at"] == run_at.replace("Z", ".000Z")
        job_id = job["job_id"]

        status, listed = cronlog(capsys, node, "jobs", "list")
        assert status == 0 and [j["job_id"] for j in listed["jobs"]] == [job_id]
        status, paused = cronlog(capsys, node, "jobs", "pause", job_id)
        assert status == 0 and paused["status"] == "paused"
        status, listed = cronlog(capsys, node, "jobs", "list", "--status", "active")
        assert status == 0 and listed["jobs"] == []
        status, resumed = cronlog(capsys, node, "jobs", "resume", job_id)
        assert status == 0 and resumed["status"] == "active"
        status, runs = cronlog(capsys, node, "runs", job_id)
        assert status == 0 and runs["runs"] == []
        status, cancelled = cronlog(capsys, node, "jobs", "cancel", job_id)
        assert status == 0 and cancelled["status"] == "cancelled"
        status, got = cronlog(capsys, node, "jobs", "get", job_id)
        assert status == 0 and got["status"] == "cancelled"
        status, dead = cronlog(capsys, node, "dead")
        assert status == 0 and dead["runs"] == []

        # A refusal is the API's error, shown as it came, with a failing exit status.
        status, error = cronlog(
            capsys, node, "jobs", "create", "--name", "bad", "--schedule", "61 * * * *",
            "--target", "pull://reports",
        )  # fmt: skip
        assert status == 1 and "schedule" in json.dumps(error)
        status, missing = cronlog(capsys, node, "jobs", "get", "j_nosuchjob")
        assert status == 1 and missing["error"] == "not_found", missing

        # The operator's token for GET /metrics was made beside the tenants' tokens.
        operator = (data_dir / "metrics_token").read_text().strip()
        tenant = (data_dir / "tokens").read_text().split("default=")[1].strip()
        scrape = httpx.get(f"{node.url}/metrics", headers={"Authorization": f"Bearer {operator}"})
        assert scrape.status_code == 200
        assert 'cronlog_jobs{status="cancelled"} 1.0' in scrape.text.splitlines()
        refused = httpx.get(f"{node.url}/metrics", headers={"Authorization": f"Bearer {tenant}"})
        assert refused.status_code == 401
    finally:
        assert node.stop() == 0


def test_the_client_explains_what_it_cannot_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CRONLOG_TOKEN", raising=False)
    with pytest.raises(SystemExit, match="no token"):
        main(["jobs", "list", "--data-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match=re.escape("cannot reach http://127.0.0.1:9 (")):
        main(["jobs", "list", "--url", "http://127.0.0.1:9", "--token", "t"])
    with pytest.raises(SystemExit, match="--payload is not JSON"):
        main(
            ["jobs", "create", "--name", "x", "--every", "60", "--target", "pull://p",
             "--payload", "{nope", "--token", "t"]
        )  # fmt: skip
