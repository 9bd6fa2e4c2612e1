"""The Worker's defaults that need no node: how far its claims reach ahead."""

from __future__ import annotations

from typing import Any

import pytest
from cronlog_client import RunContext, Worker
from cronlog_client.worker import DEFAULT_AHEAD_SEC, HERD_AHEAD_SEC, HERD_CONCURRENCY


async def handle(run: RunContext) -> None:
    return None


def worker(**options: Any) -> Worker:
    return Worker(None, "p", handle, **options)  # type: ignore[arg-type]


def test_a_worker_with_room_for_a_herd_reaches_further_ahead() -> None:
    assert worker().ahead_sec == DEFAULT_AHEAD_SEC == 5.0
    assert worker(concurrency=HERD_CONCURRENCY - 1).ahead_sec == DEFAULT_AHEAD_SEC
    assert worker(concurrency=HERD_CONCURRENCY).ahead_sec == HERD_AHEAD_SEC == 15.0
    assert worker(concurrency=50_000, ahead_sec=2).ahead_sec == 2  # as asked
    assert worker(ahead_sec=0).ahead_sec == 0
    with pytest.raises(ValueError, match="ahead_sec"):
        worker(ahead_sec=301)
