"""A request for a partition another node owns travels through the log and back.

Two nodes share one in-process log. The newer one takes every partition (the older is
replaced, as a zombie would be), so every request made at the older node is forwarded through
the commands stream, decided by the owner, and answered through the older node's mailbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import events as ev
from core.commands import PauseJob, PutJob
from core.errors import InvalidDefinition, NotFound
from core.jobs import JobSpec, PullTarget
from eventlog.memory import MemoryLog
from node.node import Node


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    log = MemoryLog(4, gaps=True)
    old = Node(log, tmp_path / "old", node_id="old")
    old.start()
    assert old.wait_ready(10)
    new = Node(log, tmp_path / "new", node_id="new")
    new.start()
    assert new.wait_ready(10)
    assert old.wait_owned(lambda owned: owned == [], 10)
    yield old, new
    new.stop()
    old.stop()
    log.close()


def spec(**kw: object) -> JobSpec:
    return JobSpec(
        name="j",
        tenant="team-a",
        target=PullTarget(pool="p"),  # type: ignore[arg-type]
        schedule="0 0 * * *",
        **kw,
    )


def test_a_forwarded_request_is_decided_by_the_owner_and_answered(pair: tuple[Node, Node]) -> None:
    old, new = pair
    assert new.owned() == [0, 1, 2, 3] and old.owned() == []
    events = asyncio.run(old.execute(PutJob(job_id="j1", spec=spec())))
    assert [type(e) for e in events] == [ev.JobRegistered]
    # Both read models saw it before the answer came back to the asking node.
    assert old.history.job("team-a", "j1") is not None
    assert new.history.wait_until(lambda: new.history.job("team-a", "j1") is not None, 5)
    (paused,) = asyncio.run(old.execute(PauseJob(job_id="j1", tenant="team-a")))
    assert isinstance(paused, ev.JobPaused)


def test_a_refusal_comes_back_as_the_same_error(pair: tuple[Node, Node]) -> None:
    old, _ = pair
    with pytest.raises(NotFound):
        asyncio.run(old.execute(PauseJob(job_id="nope", tenant="team-a")))
    with pytest.raises(InvalidDefinition) as err:
        asyncio.run(old.execute(PutJob(job_id="j2", spec=spec(max_attempts=0))))
    assert err.value.field == "max_attempts"
