"""``cronlog serve --log-format json``: every line parses, and each decision carries its ids."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli.test_serve import A, Serve
from tests.node.targets import Call, Target

pytestmark = pytest.mark.slow


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _lines(node: Serve) -> list[dict[str, Any]]:
    text = (node.data_dir / "serve.log").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_lines_carry_the_ids_of_each_decision(tmp_path: Path) -> None:
    # "slow" takes 2.5 s a call, so its per-second slots find a run still going (overlap skip);
    # "fail" answers 503, so one retry and then the dead letters.
    def answer(call: Call) -> tuple[int, dict[str, str], float]:
        return (503, {}, 0.0) if call.path.endswith("/fail") else (200, {}, 2.5)

    target = Target(answer=answer).start()
    base = target.url.rsplit("/", 1)[0]
    node = Serve(tmp_path, args=("--log-level", "info", "--log-format", "json")).start()
    try:
        with httpx.Client(base_url=node.url, headers=A) as api:
            soon = int(time.time() * 1000) + 500
            failing = {
                "job_id": "failing", "name": "f", "run_at": _iso(soon), "target": f"{base}/fail",
                "retries": 1, "backoff": {"base_sec": 0.1, "jitter": False},
            }  # fmt: skip
            assert api.post("/v1/jobs", json=failing).status_code == 201
            slow = {"job_id": "slow", "name": "s", "interval_sec": 1, "overlap_policy": "skip",
                    "target": f"{base}/slow"}  # fmt: skip
            assert api.post("/v1/jobs", json=slow).status_code == 201
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # an external process: ask its API
                dead = api.get("/v1/runs", params={"state": "dead"}).json()["runs"]
                if dead and _decided(node, "skipped"):
                    break
                time.sleep(0.2)
            api.patch("/v1/jobs/slow", json={"status": "paused"})
    finally:
        assert node.stop() == 0
        target.stop()

    lines = _lines(node)  # every line is JSON, uvicorn's too
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    decided: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if "decision" in line:
            assert line["logger"] == "cronlog.decisions"
            decided.setdefault(line["decision"], []).append(line)

    fired = {d["job_id"]: d for d in decided["fired"]}
    assert fired["failing"]["run_id"] == f"failing.{soon}"
    assert fired["failing"]["tenant"] == "team-a" and fired["failing"]["trigger"] == "schedule"
    assert isinstance(fired["failing"]["partition"], int)
    assert fired["failing"]["scheduled_for"] == soon
    (retried,) = decided["retried"]
    assert (retried["job_id"], retried["run_id"], retried["attempt"]) == (
        "failing",
        f"failing.{soon}",
        2,
    )
    (dead,) = decided["dead-lettered"]
    assert (dead["run_id"], dead["reason"], dead["tenant"]) == (
        f"failing.{soon}",
        "attempts_exhausted",
        "team-a",
    )
    assert dead["partition"] == retried["partition"] == fired["failing"]["partition"]
    skipped = decided["skipped"][0]
    assert (skipped["job_id"], skipped["reason"]) == ("slow", "overlap")
    assert skipped["tenant"] == "team-a"
    assert skipped["partition"] == fired["slow"]["partition"]
    moved = decided["partition moved"]
    assert [m["direction"] for m in moved] == ["assigned", "revoked"]
    assert moved[0]["partitions"] == moved[1]["partitions"] == [0, 1, 2, 3]
    assert moved[0]["message"].endswith("owns partitions [0, 1, 2, 3]")
    assert (moved[0]["owned"], moved[1]["owned"]) == ([0, 1, 2, 3], [])
    assert moved[1]["reason"] == "the node is stopping"
    assert not any("fenced" in line["message"] for line in lines)


def _decided(node: Serve, decision: str) -> bool:
    return any(line.get("decision") == decision for line in _lines(node))
