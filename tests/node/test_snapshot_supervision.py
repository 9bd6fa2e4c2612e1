"""The node's snapshotter is supervised like its other threads: a snapshot that fails is
counted and the thread goes on; a thread that ends all the same is started again."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.commands import PutJob
from core.jobs import JobSpec, PullTarget
from eventlog.embedded import EmbeddedLog
from eventlog.snapshots import MemorySnapshots
from node.node import Node
from node.snapshotter import SnapshotPolicy


class Failing(MemorySnapshots):
    """Writes fail the way given, once; then the store works."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error: BaseException | None = error

    def write(self, partition: int, offset: int, data: bytes) -> bool:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return super().write(partition, offset, data)


@pytest.fixture
def thread_deaths() -> Iterator[list[BaseException]]:
    """Threads that end on an exception, caught here rather than reported as a test failure."""
    seen: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)  # type: ignore[arg-type]
    yield seen
    threading.excepthook = previous


def put(node: Node, job_id: str) -> None:
    spec = JobSpec(name=job_id, tenant="team-a", target=PullTarget(pool="p"), schedule="0 0 1 1 *")
    asyncio.run(node.execute(PutJob(job_id=job_id, spec=spec)))


def wait_for(what: str, check: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)  # another thread's progress, observed from outside


@pytest.mark.parametrize(
    ("error", "dies"), [(OSError("disk full"), False), (SystemExit("killed"), True)]
)
def test_a_failed_snapshot_is_counted_and_snapshots_go_on(
    tmp_path: Path, thread_deaths: list[BaseException], error: BaseException, dies: bool
) -> None:
    store = Failing(error)
    with EmbeddedLog.open(tmp_path / "log", 1) as log:
        node = Node(
            log, tmp_path / "node", snapshots=store,
            snapshot_policy=SnapshotPolicy(every_events=1, every_s=3600),
        )  # fmt: skip
        node.start()
        try:
            assert node.wait_ready(30)
            assert node.snapshotter is not None
            put(node, "first")  # its snapshot fails
            failures = node.metrics.snapshot_failures if not dies else None
            if dies:
                wait_for("the thread's end was not noticed", lambda: thread_deaths)
                wait_for(
                    "the snapshotter was not started again",
                    lambda: node.metrics.thread_failures.labels("snapshots")._value.get() == 1,
                )
            else:
                assert failures is not None
                wait_for("the failure was not counted", lambda: failures._value.get() == 1)
            wait_for("no snapshotter thread", lambda: node.snapshotter.alive)
            put(node, "second")  # the next one is written
            wait_for("no snapshot after the failure", lambda: store.latest(0) is not None)
        finally:
            node.stop()


def test_the_nodes_recovery_floor_keeps_what_its_snapshots_need(tmp_path: Path) -> None:
    """Retention asks the node what recovery still needs: with snapshots, the oldest snapshot
    a recovery may fall back to counts, below the state store's and read model's checkpoints."""
    store = MemorySnapshots()
    with EmbeddedLog.open(tmp_path / "log", 1) as log:
        node = Node(
            log, tmp_path / "node", snapshots=store,
            snapshot_policy=SnapshotPolicy(every_events=2, every_s=3600),
        )  # fmt: skip
        node.start()
        try:
            assert node.wait_ready(30)
            assert node.recovery_floor(0) == 0  # nothing yet: the checkpoints are at 0
            for i in range(5):
                put(node, f"job-{i}")
            assert node.snapshotter is not None
            wait_for("no snapshot", lambda: store.latest(0) is not None)
            assert node.snapshotter.wait_idle(0, 10)
            newest = store.latest(0)
            assert newest is not None and 0 < newest.offset < 5
            # The state store is at 5 (and the read model soon); the snapshot is older.
            wait_for(
                "the floor never reached the snapshot",
                lambda: node.recovery_floor(0) == store.floor(0),
            )
        finally:
            node.stop()
