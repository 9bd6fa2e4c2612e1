"""Nothing a node owns stays dead: a partition whose writer failed for good on a real broker is
given a new writer and decides again, and the node says it is not ready meanwhile."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from core.commands import PutJob
from core.errors import Unavailable
from core.jobs import JobSpec, PullTarget
from eventlog.kafka import KafkaLog
from eventlog.port import partition_for
from node.node import Node

pytestmark = pytest.mark.kafka


def test_a_partition_whose_writer_failed_gets_a_new_one(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    log = KafkaLog.open(
        kafka_bootstrap,
        2,
        prefix=f"supervise-{uuid.uuid4().hex[:12]}",
        replication_factor=-1,
        min_insync_replicas=None,
    )
    node = Node(log, tmp_path / "node", node_id="n1", fence_grace_s=1.0)
    node.start()
    try:
        assert node.wait_ready(60)
        p = partition_for("j1", 2)
        spec = JobSpec(name="j", tenant="team-a", target=PullTarget(pool="p"), schedule="0 0 * * *")
        # The writer gives up as it does when a transaction fails in a way it cannot undo (its
        # outcome unknown, say): closed, and every later append raises Fenced. The group still
        # assigns the partition here, so no revocation will come.
        assert node._membership is not None
        node._membership.writer(p).close()
        with pytest.raises(Unavailable):
            asyncio.run(node.execute(PutJob(job_id="j1", spec=spec)))
        assert p in node.not_deciding() and not node.ready()
        deadline = time.monotonic() + 30
        while not node.ready():
            assert time.monotonic() < deadline, "the partition never decided again"
            time.sleep(0.05)
        events = asyncio.run(node.execute(PutJob(job_id="j1", spec=spec)))
        assert [type(e).__name__ for e in events] == ["JobRegistered"]
        assert node.metrics.runner_failures._value.get() == 1
    finally:
        node.stop()
        log.close()
