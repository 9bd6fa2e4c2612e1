"""The chaos run's health watch: it samples through the whole run, whatever one sample meets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.chaos.records import Recorder, read
from tools.chaos.watch import HealthWatch


def test_a_sample_that_fails_is_said_and_the_watch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    def sample(self: HealthWatch, client: httpx.Client, node: str, url: str) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("a gauge that is not a number")
        return {"node": node, "at": calls, "readyz": 200}

    monkeypatch.setattr(HealthWatch, "_sample", sample)
    monkeypatch.setattr("tools.chaos.watch.INTERVAL_S", 0.01)
    record = Recorder(tmp_path / "health.jsonl")
    watch = HealthWatch({"n1": "http://127.0.0.1:9"}, "token", record)
    watch.start()
    deadline = time.monotonic() + 10
    while calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    watch.stop()
    record.close()
    samples, _ = read(tmp_path / "health.jsonl")
    assert len(samples) >= 2 and all(s["node"] == "n1" for s in samples)
    assert "the sample of n1 was lost" in caplog.text
