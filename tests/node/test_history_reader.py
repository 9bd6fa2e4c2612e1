"""HistoryReader's questions of partitions kept elsewhere: one question a node for a team's
listings and sums, once it knows which node answers for which partition, and a partition
that moved asked again of its new owner (a fake owner stands for the log and the nodes)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from core.errors import HistoryMoved, HistoryRefilling
from node import wire
from node.history_reader import HistoryReader

PARTITIONS = 6


class Owners:
    """Who keeps each partition's history, answering ``job_count`` as partition + 1 jobs (a
    sum that tells a partition missing or counted twice apart). Every question is kept."""

    def __init__(self, owners: dict[int, str]) -> None:
        self.owners = owners
        self.asked: list[tuple[int, tuple[int, ...]]] = []  # (partition, also)
        self.refilling: set[int] = set()

    def _one(self, p: int, node: str) -> msgspec.Raw:
        if self.owners[p] != node:
            raise HistoryMoved(f"partition {p} is not kept here")
        if p in self.refilling:
            raise HistoryRefilling(f"partition {p} is refilling")
        return msgspec.Raw(msgspec.json.encode(p + 1))

    async def ask(
        self, p: int, name: str, args: list[Any], after: int, also: dict[int, int]
    ) -> wire.Reply:
        assert name == "job_count"
        self.asked.append((p, tuple(sorted(also))))
        node = self.owners[p]  # the log takes the question to the partition's owner now
        if not also:
            return wire.Reply(request_id="r", by=node, answer=self._one(p, node))
        answers: dict[int, msgspec.Raw] = {}
        refused: dict[int, wire.Refused] = {}
        for q in (p, *also):
            try:
                answers[q] = self._one(q, node)
            except (HistoryMoved, HistoryRefilling) as err:
                refused[q] = wire.refused(err)
        return wire.Reply(request_id="r", by=node, answers=answers, refused=refused)


def reader(owners: Owners) -> HistoryReader:
    return HistoryReader(
        PARTITIONS,
        held=lambda p: None,  # every partition is kept elsewhere
        models=list,
        ask=owners.ask,
        archived=lambda: False,
        past_window=lambda key: False,
    )


EXPECTED = sum(p + 1 for p in range(PARTITIONS))


def test_once_the_owners_are_known_a_sum_asks_each_node_once() -> None:
    owners = Owners({0: "x", 1: "x", 2: "x", 3: "y", 4: "y", 5: "y"})
    history = reader(owners)

    async def scenario() -> None:
        assert await history.job_count("t") == EXPECTED  # learns who answers for what
        assert len(owners.asked) == PARTITIONS
        owners.asked.clear()
        assert await history.job_count("t") == EXPECTED
        assert sorted(owners.asked) == [(0, (1, 2)), (3, (4, 5))]

    asyncio.run(scenario())


def test_a_partition_that_moved_within_a_group_is_asked_of_its_new_owner() -> None:
    owners = Owners({0: "x", 1: "x", 2: "x", 3: "y", 4: "y", 5: "y"})
    history = reader(owners)

    async def scenario() -> None:
        await history.job_count("t")
        owners.owners[1] = "z"  # 1 moved from x to z; and 3, the first of y's, to x
        owners.owners[3] = "x"
        owners.asked.clear()
        assert await history.job_count("t") == EXPECTED  # nothing missing, nothing twice
        # x answered 0 and 2 and refused 1, asked alone then (of z); y's question went to x,
        # the new owner of 3, which answered 3 and refused 4 and 5, each asked alone then
        assert sorted(owners.asked) == [(0, (1, 2)), (1, ()), (3, (4, 5)), (4, ()), (5, ())]
        owners.asked.clear()
        assert await history.job_count("t") == EXPECTED
        assert sorted(owners.asked) == [(0, (2, 3)), (1, ()), (4, (5,))]

    asyncio.run(scenario())


def test_a_partition_refilling_within_a_group_fails_the_whole_answer() -> None:
    owners = Owners({p: "x" for p in range(PARTITIONS)})
    history = reader(owners)

    async def scenario() -> None:
        await history.job_count("t")
        owners.refilling.add(4)
        with pytest.raises(HistoryRefilling, match="partition 4"):  # a 503, never a gap
            await history.job_count("t")

    asyncio.run(scenario())
