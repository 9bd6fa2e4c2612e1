"""Commands of one batch for partitions another node owns (a batch of heartbeats or
completions that reached the other worker process, or another node of a cluster) go to each
owner as one request through the log, not a record and a reply each; every command is still
answered with its own events or refusal, in order. An owner built before such requests
answers the first command alone, and the asker sends it the others one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.commands import AnyCommand, HeartbeatRun, PutJob
from core.errors import Conflict
from core.events import JobRegistered
from core.jobs import JobSpec, PullTarget
from eventlog.port import partition_for
from node import wire
from node.node import Node
from node.runner import PartitionRunner, Request
from tests.node.two_workers import two_workers

pytestmark = pytest.mark.slow
PARTITIONS = 4


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    with two_workers(tmp_path, PARTITIONS) as pair:
        yield pair


def put(job_id: str, name: str = "job") -> PutJob:
    spec = JobSpec(name=name, tenant="team-a", schedule="0 0 29 2 *", target=PullTarget("p"))
    return PutJob(job_id=f"team-a/{job_id}", spec=spec, create_only=True)


def owned_by(node: Node, count: int, prefix: str) -> list[str]:
    """``count`` job ids whose partitions ``node`` owns."""
    owned = node.owned()
    ids = (f"{prefix}{i}" for i in range(100_000))
    picked = [j for j in ids if partition_for(f"team-a/{j}", PARTITIONS) in owned]
    return picked[:count] if len(picked) >= count else pytest.fail("not enough ids")


def count_submits(node: Node, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The partitions of the records ``node`` submits to the commands stream, as it sends them."""
    sent: list[int] = []
    submit = node._log.submit

    def counted(partition: int, value: bytes, key: bytes | None = None) -> int:
        sent.append(partition)
        return submit(partition, value, key)

    monkeypatch.setattr(node._log, "submit", counted)
    return sent


def test_another_owner_is_asked_once_a_partition_and_answers_each_command(
    nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = nodes
    ids = owned_by(b, 40, "j")
    asyncio.run(a.execute(put(ids[5])))
    sent = count_submits(a, monkeypatch)
    commands = [put(j) for j in ids]
    commands[5] = put(ids[5], name="other")  # a new definition of a job made first: refused
    results = asyncio.run(a.execute_many(commands))
    partitions = {partition_for(c.job_id, PARTITIONS) for c in commands}
    assert sorted(sent) == sorted(partitions)  # one record each, not 40
    assert isinstance(results[5], Conflict)
    rest = results[:5] + results[6:]
    assert all(isinstance(r, list) and isinstance(r[0], JobRegistered) for r in rest), rest
    assert [r[0].job_id for r in rest if isinstance(r, list)] == [
        c.job_id for i, c in enumerate(commands) if i != 5
    ]


def test_an_owner_that_answers_the_first_alone_is_asked_the_rest_one_by_one(
    nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = nodes
    partition = b.owned()[0]
    same = [
        j for j in owned_by(b, 400, "o") if partition_for(f"team-a/{j}", PARTITIONS) == partition
    ]
    ids = same[:4]

    def before_more(runner: PartitionRunner, offset: int, envelope: wire.Envelope) -> None:
        # what a node built before ``more`` did: decide the command, ignore the field
        assert envelope.command is not None and envelope.request_id and envelope.reply_to
        reply = b._replier(envelope.reply_to, envelope.request_id)
        runner.submit(Request(envelope.command, reply=reply, offset=offset))

    monkeypatch.setattr(b, "_decide_together", before_more)
    sent = count_submits(a, monkeypatch)
    results: list[Any] = asyncio.run(a.execute_many([put(j) for j in ids]))
    assert sent == [partition] * 4  # the request of four, then the three it left
    assert [r[0].job_id for r in results] == [f"team-a/{j}" for j in ids]


def test_a_check_the_owner_may_hold_is_asked_alone(
    nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's check of a run leased ahead is held by its owner until the run's start is
    near (seconds): in a request of several, the one reply would hold every other answer with
    it (a pull herd's starts came 8 s late when it did)."""
    a, b = nodes
    [job] = owned_by(b, 1, "c")
    run_id = f"team-a/{job}.1796000000000"
    check = HeartbeatRun(run_id=run_id, fencing_token=1, tenant="team-a", check=True)
    beat = HeartbeatRun(run_id=run_id, fencing_token=1, tenant="team-a")
    commands: list[AnyCommand] = [put(job), check, beat, put(job, name="again")]
    asked: list[list[AnyCommand]] = []

    async def together(p: int, indices: list[int], cs: Any, results: Any, **_: Any) -> None:
        asked.append([cs[i] for i in indices])
        for i in indices:
            results[i] = []

    async def alone(p: int, i: int, cs: Any, results: Any, **_: Any) -> None:
        asked.append([cs[i]])
        results[i] = []

    monkeypatch.setattr(a, "_ask_together", together)
    monkeypatch.setattr(a, "_ask", alone)
    asyncio.run(a.execute_many(commands))
    assert [check] in asked
    assert not [request for request in asked if check in request and len(request) > 1]
