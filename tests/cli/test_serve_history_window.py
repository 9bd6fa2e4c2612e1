"""``cronlog serve --history-window``: runs past the window leave the node's read model and are
answered from archive + log, the same run as before, saying so; a job's pages cross over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli.test_serve import A, B, Serve, _iso
from tests.cli.test_serve_retention import FAST, _metric
from tests.node.targets import Target

pytestmark = pytest.mark.slow
WINDOW_S = 10


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target().start()
    yield t
    t.stop()


def _get(node: Serve, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{node.url}{path}", params=params, headers=A, timeout=30)


def _until(what: str, check: Any, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # an external process: poll what it answers
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(what)


def test_runs_past_the_window_are_answered_from_the_archive(tmp_path: Path, target: Target) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    node = Serve(data_dir, args=[*FAST, "--history-window", f"{WINDOW_S}s"]).start()
    try:
        body = {
            "name": "tick",
            "schedule": "* * * * *",
            "seconds": "*",
            "target": target.url,
            "start_at": _iso(time.time()),
        }
        made = httpx.post(f"{node.url}/v1/jobs", json=body, headers=A, timeout=10)
        assert made.status_code == 201, made.text
        job = made.json()["job_id"]

        def first_succeeded() -> dict[str, Any] | None:
            runs = _get(node, f"/v1/jobs/{job}/runs", limit=500).json()["runs"]
            done = [r for r in runs if r["state"] == "succeeded"]
            return min(done, key=lambda r: r["scheduled_for"]) if done else None

        first = _until("no run succeeded", first_succeeded)
        hot = _get(node, f"/v1/runs/{first['run_id']}").json()
        assert hot["source"] == "hot"

        def archived() -> dict[str, Any] | None:
            answer = _get(node, f"/v1/runs/{first['run_id']}").json()
            return answer if answer.get("source") == "archive" else None

        assert _until("the run never left the window", archived) == {**hot, "source": "archive"}
        assert _metric(node, "cronlog_history_window_forgotten_runs_total") >= 1
        assert _metric(node, "cronlog_history_window_failures_total") == 0
        other = httpx.get(f"{node.url}/v1/runs/{first['run_id']}", headers=B, timeout=30)
        assert other.status_code == 404

        httpx.post(f"{node.url}/v1/jobs/{job}/pause", headers=A, timeout=10)
        runs: list[dict[str, Any]] = []
        cursor = None
        for _ in range(1000):
            params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
            page = _get(node, f"/v1/jobs/{job}/runs", **params).json()
            runs += page["runs"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        slots = [r["scheduled_for"] for r in runs]
        assert slots == sorted(set(slots), reverse=True)  # each once, newest first
        assert slots[-1] == first["scheduled_for"]  # down to the first, across the window
        assert {r["source"] for r in runs} == {"hot", "archive"}
    finally:
        assert node.stop() == 0
