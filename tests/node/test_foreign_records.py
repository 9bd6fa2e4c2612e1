"""A node whose events stream holds a record that is not an event: every reader (recovery, the
read model, the dependency relay) passes over it, logs it and counts it, and the node goes on.

The issue's case, on the embedded log: a non-event record in a partition's events stream froze
that partition's read model for every tenant, killed the relay on restart, and made a later
create answer a false 404.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core import events as ev
from core.commands import PutJob, TriggerRun
from core.jobs import JobSpec, PullTarget
from eventlog.embedded import EmbeddedLog
from eventlog.port import partition_for
from node.node import Node
from tests.node.test_metrics import scrape
from tests.node.test_relay import completed
from tests.projections.histories import Writers

pytestmark = pytest.mark.slow
PARTITIONS = 2
FOREIGN = b'{"job_id": "up", "run_id": "up.1", "payload": {"hello": "events topic"}}'


def pull_job(**kw: object) -> JobSpec:
    return JobSpec(name="job", tenant="t1", target=PullTarget(pool="p"), **kw)  # type: ignore[arg-type]


def started(log: EmbeddedLog, data: Path, node_id: str) -> Node:
    node = Node(log, data, node_id=node_id)
    node.start()
    assert node.wait_ready(20)
    return node


def test_every_reader_of_a_node_passes_over_a_foreign_record_and_counts_it(
    tmp_path: Path,
) -> None:
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    first = started(log, tmp_path / "node", "n1")
    asyncio.run(first.execute(PutJob(job_id="up", spec=pull_job(schedule="0 0 1 1 *"))))
    asyncio.run(first.execute(PutJob(job_id="down", spec=pull_job(depends_on=("up",)))))
    asyncio.run(first.execute(TriggerRun(job_id="up", tenant="t1", scheduled_for=60_000)))
    [lease] = asyncio.run(first.claim("t1", "p", "worker", 1))
    first.stop()
    # While no node runs, up's partition gets a record that is not an event, and then up's
    # success, which the relay must still pass on to down when the next node rereads them.
    partition = partition_for("up", PARTITIONS)
    writers = Writers(log)
    [foreign] = writers.append(partition, [FOREIGN])
    [success] = writers.append(partition, [completed("up", 60_000, lease.fencing_token)])
    writers.close()

    node = started(log, tmp_path / "node", "n2")
    try:
        history = node.history
        assert history.wait_for(partition, success, 20), "the read model froze on the record"
        # The relay's reread went past the record and triggered the dependant.
        assert history.wait_until(lambda: bool(history.runs_of("t1", "down").items), 20)
        [run] = history.runs_of("t1", "down").items
        assert (run.trigger, run.scheduled_for) == ("dependency", 60_000)
        got = scrape(node.metrics)
        for reader in ("recovery", "read_model", "relay"):
            assert got["cronlog_foreign_records_total", (("reader", reader),)] == 1, reader
        # A create afterwards answers with its job, not a false 404.
        later = PutJob(job_id="later", spec=pull_job(run_at=9_000_000_000_000))
        events = asyncio.run(node.execute(later))
        assert isinstance(events[0], ev.JobRegistered)
        assert history.job("t1", "later") is not None
        assert history.lag(log) == dict.fromkeys(range(PARTITIONS), 0)
        assert foreign < success
    finally:
        node.stop()
        log.close()
