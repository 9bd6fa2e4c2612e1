"""Read-your-writes waits: settled by the read model's fold, in the caller's loop, without a
worker thread per waiter."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.events import JobPaused, encode
from eventlog.port import Record
from node.visibility import Visibility
from projections.read_model import ReadModel


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ReadModel]:
    with ReadModel(tmp_path / "read_model") as model:
        yield model


def fold(model: ReadModel, partition: int, offsets: range) -> None:
    """Fold events at ``offsets`` (their content does not matter here)."""
    event = encode(JobPaused(job_id="t/j", tenant="t", at=0, version=2))
    model.process_records(partition, [Record(partition, o, event) for o in offsets])


def test_a_wait_ends_when_the_model_folds_past_its_offset(model: ReadModel) -> None:
    visibility = Visibility(model)
    model.observe(visibility)

    async def scenario() -> list[bool]:
        waits = [asyncio.ensure_future(visibility.wait(0, 4, 10.0)) for _ in range(100)]
        other = asyncio.ensure_future(visibility.wait(1, 0, 0.2))  # another partition
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waits)
        threading.Thread(target=fold, args=(model, 0, range(3))).start()
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waits)  # offset 4 is not folded yet
        threading.Thread(target=fold, args=(model, 0, range(3, 5))).start()
        return [*await asyncio.gather(*waits), await other]

    results = asyncio.run(scenario())
    assert results[:100] == [True] * 100
    assert results[100] is False  # timed out: nothing of partition 1 was folded
    assert visibility.waiting() == 0


def test_a_fold_before_the_wait_is_not_lost(model: ReadModel) -> None:
    visibility = Visibility(model)
    model.observe(visibility)
    fold(model, 0, range(2))
    assert asyncio.run(visibility.wait(0, 1, 0.01)) is True
    assert asyncio.run(visibility.wait(0, 2, 0.01)) is False
    assert visibility.waiting() == 0


def test_waiting_takes_no_worker_thread(model: ReadModel) -> None:
    """The loop's only worker is busy the whole time: waits that needed it would time out."""
    visibility = Visibility(model)
    model.observe(visibility)
    release = threading.Event()

    async def scenario() -> list[bool]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        blocker = loop.run_in_executor(None, lambda: release.wait(30))
        try:
            waits = [asyncio.ensure_future(visibility.wait(0, 0, 2.0)) for _ in range(64)]
            await asyncio.sleep(0.01)
            threading.Thread(target=fold, args=(model, 0, range(1))).start()
            return list(await asyncio.wait_for(asyncio.gather(*waits), 2.0))
        finally:
            release.set()
            await blocker

    assert asyncio.run(scenario()) == [True] * 64
