"""``Node.execute_many`` on the embedded log: each partition's commands in one append, each
command answered with its own events or refusal, all readable on return."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.commands import PauseJob, PutJob
from core.errors import Conflict, NotFound, NotYetReadable, Unavailable
from core.events import JobRegistered
from core.jobs import JobSpec, PullTarget
from eventlog.embedded import EmbeddedLog
from eventlog.port import partition_for
from node.executors import Executors
from node.node import Node

pytestmark = pytest.mark.slow
PARTITIONS = 4


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EmbeddedLog]:
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    yield log
    log.close()


@pytest.fixture
def node(log: EmbeddedLog, tmp_path: Path) -> Iterator[Node]:
    n = Node(log, tmp_path / "node", node_id="n1", executors=Executors("n1"))
    n.start()
    assert n.wait_ready(10)
    yield n
    n.stop()


def put(job_id: str, name: str = "job") -> PutJob:
    spec = JobSpec(name=name, tenant="team-a", schedule="0 0 29 2 *", target=PullTarget("p"))
    return PutJob(job_id=f"team-a/{job_id}", spec=spec, create_only=True)


def test_a_partitions_commands_share_one_append(node: Node, log: EmbeddedLog) -> None:
    commands = [put(f"j{i}") for i in range(400)]
    partitions = {partition_for(c.job_id, PARTITIONS) for c in commands}
    before = log._synced_batches
    results = asyncio.run(node.execute_many(commands))
    appends = log._synced_batches - before
    assert 1 <= appends <= len(partitions)
    assert all(isinstance(r, list) and isinstance(r[0], JobRegistered) for r in results), results
    # Readable on return: the answer waited for the read model.
    assert all(node.history.job("team-a", c.job_id) is not None for c in commands)


def test_each_command_gets_its_own_answer_in_order(node: Node) -> None:
    asyncio.run(node.execute(put("there")))
    commands = [
        put("new"),
        put("there"),  # the same definition: nothing to decide
        put("there", name="other"),  # another: refused, and only this one
        PauseJob(job_id="team-a/missing", tenant="team-a"),
        put("new"),  # the first item's job, decided after it in the same batch
    ]
    results = asyncio.run(node.execute_many(commands))
    assert isinstance(results[0], list) and isinstance(results[0][0], JobRegistered)
    assert results[1] == []
    assert isinstance(results[2], Conflict)
    assert isinstance(results[3], NotFound)
    assert results[4] == []
    assert node.history.job("team-a", "team-a/there").spec.name == "job"  # type: ignore[union-attr]


def test_single_commands_sent_together_are_decided_in_one_batch_per_partition(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Concurrent requests (one each, as the API's handlers send them) that reach the node in
    # the same turn of its event loop are decided together: one batch, and so one append, per
    # partition, not a batch for whatever had arrived when the runner's thread woke.
    commands = [put(f"s{i}") for i in range(2000)]
    partitions = {partition_for(c.job_id, PARTITIONS) for c in commands}
    batches: list[int] = []
    appended = node.metrics.appended

    def count(partition: int, offsets: list[int], events: list[Any]) -> None:
        batches.append(partition)
        appended(partition, offsets, events)

    monkeypatch.setattr(node.metrics, "appended", count)

    async def all_at_once() -> list[list[Any]]:
        return await asyncio.gather(*(node.execute(c) for c in commands))

    results = asyncio.run(all_at_once())
    assert sorted(batches) == sorted(partitions)
    assert all(isinstance(r[0], JobRegistered) for r in results)
    assert all(node.history.job("team-a", c.job_id) is not None for c in commands)


def test_a_runner_that_never_answers_makes_the_request_unavailable_in_time(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A runner answers every request it takes; should one ever not, the caller is told
    # "unavailable" at the deadline instead of waiting forever, singly and in a batch.
    monkeypatch.setattr("node.node.LOCAL_TIMEOUT_S", 0.3)
    for runner in node._runners.values():
        monkeypatch.setattr(runner, "submit_many", lambda requests: None)
    with pytest.raises(Unavailable):
        asyncio.run(asyncio.wait_for(node.execute(put("lost")), 10))
    results = asyncio.run(asyncio.wait_for(node.execute_many([put("a"), put("b")]), 10))
    assert all(isinstance(r, Unavailable) for r in results), results


def test_unwaited_answers_do_not_wait_for_the_read_model(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch of heartbeats answers from its events alone: durable, and not held up by a read
    # model that lags (here, one that would never catch up).
    async def never(partition: int, offsets: list[int], events: Any = ()) -> None:
        raise Unavailable("the read model is far behind")

    monkeypatch.setattr(node, "_visible", never)
    results = asyncio.run(
        node.execute_many([put("quick"), put("quick", name="other")], visible=False)
    )
    assert isinstance(results[0], list) and isinstance(results[0][0], JobRegistered)
    assert isinstance(results[1], Conflict)
    waited = asyncio.run(node.execute_many([put("slow")]))
    assert isinstance(waited[0], NotYetReadable)  # as before: durable, not yet readable
