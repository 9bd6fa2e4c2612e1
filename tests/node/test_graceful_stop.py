"""A node that stops gracefully lets its calls in flight finish and records their outcomes;
what comes due while it drains is left pending for the partition's next owner."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from core import events as ev
from core.commands import PutJob
from eventlog.embedded import EmbeddedLog
from node.executors import Executors
from node.node import Node
from tests.node.targets import LOOPBACK_ALLOWED, Target
from tests.node.test_node_embedded import now_ms, spec
from tests.node.test_node_embedded import target as target  # the fixture

pytestmark = pytest.mark.slow
PARTITIONS = 4


def events_of(log: EmbeddedLog, run_id: str) -> list[str]:
    names = []
    for p in range(PARTITIONS):
        for record in log.read_events(p, 0, 100_000):
            event = ev.decode(record.value)
            if getattr(event, "run_id", None) == run_id:
                names.append(type(event).__name__)
    return names


def test_a_stopping_node_finishes_its_calls_and_starts_no_more(
    tmp_path: Path, target: Target
) -> None:
    target.answer = lambda call: (200, {}, 1.0)  # every call takes a second
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    node = Node(
        log,
        tmp_path / "node",
        node_id="n1",
        executors=Executors("n1", egress=LOOPBACK_ALLOWED),
        arm_ms=0,  # every call leased at its slot: none armed before the stop
    )
    node.start()
    assert node.wait_ready(10)
    first_slot = now_ms() + 200
    later_slot = first_slot + 500  # due while the node drains
    critical = spec(target.url, run_at=first_slot, critical=True)
    asyncio.run(node.execute(PutJob(job_id="first", spec=critical)))
    asyncio.run(node.execute(PutJob(job_id="later", spec=spec(target.url, run_at=later_slot))))
    target.wait_for(1, timeout_s=5)
    node.stop(drain_s=10)  # returns once the first call has ended and been recorded
    assert [c.body["job_id"] for c in target.calls] == ["first"]
    first = events_of(log, f"first.{first_slot}")
    assert first[-2:] == ["LeaseGranted", "RunCompleted"], first  # not cut short: no unknown
    assert events_of(log, f"later.{later_slot}") == ["RunMaterialised"]  # never started here

    # The partition's next owner (here the same node, restarted) starts what was left.
    again = Node(
        log,
        tmp_path / "node",
        node_id="n1",
        executors=Executors("n1", egress=LOOPBACK_ALLOWED),
        arm_ms=0,
    )
    again.start()
    try:
        assert again.wait_ready(10)
        calls = target.wait_for(2, timeout_s=5)
        assert [c.body["job_id"] for c in calls] == ["first", "later"]
    finally:
        again.stop(drain_s=10)
        log.close()


def test_a_stopping_node_makes_the_calls_it_armed_before_the_stop(
    tmp_path: Path, target: Target
) -> None:
    target.answer = lambda call: (200, {}, 0.3)
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    node = Node(
        log,
        tmp_path / "node",
        node_id="n1",
        executors=Executors("n1", egress=LOOPBACK_ALLOWED),
        arm_ms=2_000,
    )
    node.start()
    try:
        assert node.wait_ready(10)
        slot = now_ms() + 1_500  # armed at once: its lease is granted before the stop
        asyncio.run(node.execute(PutJob(job_id="armed", spec=spec(target.url, run_at=slot))))
        assert node.executors.wait_idle(0.2) is False  # the armed call holds its room
        node.stop(drain_s=10)  # the drain waits for it: it starts at its slot and ends
        (call,) = target.calls
        assert call.received_at * 1000 >= slot
        assert events_of(log, f"armed.{slot}")[-2:] == ["RunStarted", "RunCompleted"]
    finally:
        log.close()


def test_a_graceful_stop_says_it_is_stopping_not_fenced(
    tmp_path: Path, target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    node = Node(
        log, tmp_path / "node", node_id="n1", executors=Executors("n1", egress=LOOPBACK_ALLOWED)
    )
    node.start()
    try:
        assert node.wait_ready(10)
        # Work on every partition, so each runner is deciding when the node stops.
        for i in range(16):
            job = spec(target.url, interval_sec=1.0)
            asyncio.run(node.execute(PutJob(job_id=f"busy-{i}", spec=job)))
        assert node.wait_owned(lambda owned: len(owned) == PARTITIONS, 5)
        target.wait_for(8, timeout_s=10)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            node.stop(drain_s=10)
    finally:
        log.close()
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "fenced" in m], said
    stopped = sorted(m for m in said if "stopped deciding: the node is stopping" in m)
    assert stopped == [f"partition {p}: stopped deciding: the node is stopping" for p in range(4)]
