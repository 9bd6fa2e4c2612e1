"""Claims spread over partitions: shares that never add up to more than the limit, hints of
where runs are ready, and a claim that asks another node's partitions all at once, each for a
short time, so a lost owner delays it once instead of once per partition."""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import node.node as node_module
from core import events as ev
from core.clock import FakeClock
from core.commands import ClaimRuns, HeartbeatRun, PutJob, TriggerRun
from core.errors import LeaseLost
from core.jobs import JobSpec, PullTarget
from eventlog.memory import MemoryLog
from eventlog.port import partition_for
from node import wire
from node.claims import RECHECK_MS, ReadyHints, split
from node.node import Node
from projections.read_model import ReadyRun

PARTITIONS = 4
POOL = "p"
TENANT = "team-a"

capacities = st.dictionaries(
    st.integers(0, 15), st.one_of(st.none(), st.integers(0, 50)), max_size=16
)


@given(st.integers(1, 500), capacities)
def test_shares_never_exceed_the_limit_or_a_capacity_and_fill_what_they_can(
    limit: int, capacity: dict[int, int | None]
) -> None:
    shares = split(limit, capacity)
    assert sum(shares.values()) <= limit
    assert all(n > 0 for n in shares.values())
    for p, n in shares.items():
        cap = capacity[p]
        assert cap is None or n <= cap
    known = [c for c in capacity.values() if c is not None]
    can = limit if None in capacity.values() else min(limit, sum(known))
    assert sum(shares.values()) == can


def test_shares_take_the_fewest_partitions_that_hold_the_claim() -> None:
    """A herd's claim is one partition's one batch, not a sliver of every partition's."""
    shares = split(100, {p: 250 for p in range(8)})
    assert list(shares.values()) == [100]
    assert sorted(split(100, {0: 30, 1: 30, 2: 30, 3: 30}).values()) == [10, 30, 30, 30]
    # which partition goes first is random, so none is always favoured
    assert {next(iter(split(1, dict.fromkeys(range(4), 5)))) for _ in range(200)} == {0, 1, 2, 3}


def test_what_known_partitions_cannot_hold_is_shared_evenly_by_unknown_ones() -> None:
    assert sorted(split(10, dict.fromkeys(range(5))).values()) == [2, 2, 2, 2, 2]
    assert sorted(split(10, {0: 1, 1: None, 2: None}).values()) == [1, 4, 5]


def test_hints_follow_the_worked_example() -> None:
    hints = ReadyHints()
    hints.folded({}, [ReadyRun(TENANT, POOL, 1_000, 3), ReadyRun(TENANT, POOL, 9_000, 3)])
    seen = hints.worth_asking(TENANT, POOL, [3], 2_000)
    assert list(seen) == [3]
    hints.drained(TENANT, POOL, 3, seen[3], asked_at=2_000)
    assert hints.worth_asking(TENANT, POOL, [3], 4_000) == {}
    assert list(hints.worth_asking(TENANT, POOL, [3], 2_000 + RECHECK_MS)) == [3]
    assert list(hints.worth_asking(TENANT, POOL, [3], 9_000)) == [3]
    # another pool, or another team, knows nothing of these runs: asked once, then drained
    assert list(hints.worth_asking("team-b", POOL, [3], 2_000)) == [3]
    hints.drained("team-b", POOL, 3, 0, asked_at=2_000)
    assert hints.worth_asking("team-b", POOL, [3], 4_000) == {}


def test_a_run_made_ready_while_the_ask_was_on_its_way_keeps_the_partition_worth_asking() -> None:
    hints = ReadyHints()
    hints.folded({}, [ReadyRun(TENANT, POOL, 1_000, 2)])
    seen = hints.worth_asking(TENANT, POOL, [2], 1_500)
    hints.folded({}, [ReadyRun(TENANT, POOL, 1_400, 2)])  # folded after the ask was sent
    hints.drained(TENANT, POOL, 2, seen[2], asked_at=1_500)
    assert list(hints.worth_asking(TENANT, POOL, [2], 1_600)) == [2]


# -- a claim at a node that owns none of the partitions ------------------------------------------


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Node, Node]]:
    monkeypatch.setattr(node_module, "REMOTE_CLAIM_TIMEOUT_S", 0.5)
    log = MemoryLog(PARTITIONS, gaps=True)
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


def job_in(partition: int, n: int) -> str:
    """The ``n``-th job id (in order) that routes to ``partition``."""
    ids = (f"job-{i}" for i in range(10_000))
    return [j for j in ids if partition_for(j, PARTITIONS) == partition][n]


def make_ready(node: Node, runs_per_partition: dict[int, int]) -> None:
    spec = JobSpec(
        name="j",
        tenant=TENANT,
        target=PullTarget(pool=POOL),  # type: ignore[arg-type]
        schedule="0 0 1 1 *",
    )

    async def go() -> None:
        for partition, count in runs_per_partition.items():
            for n in range(count):
                job_id = job_in(partition, n)
                await node.execute(PutJob(job_id=job_id, spec=spec))
                await node.execute(TriggerRun(job_id=job_id, tenant=TENANT))

    asyncio.run(go())


class OwnerAsked:
    """Wraps the owner's intake of forwarded commands: counts the claims each partition is
    asked, and holds back those of the partitions in ``held`` (an owner that does not answer)
    until :meth:`release`."""

    def __init__(self, owner: Node, held: set[int]) -> None:
        self.asked: Counter[int] = Counter()
        self.held = held
        self.kept: list[tuple[int, int, bytes]] = []
        self._take: Callable[[int, int, bytes], None] = owner._from_log
        self._owner = owner
        owner._from_log = self._from_log  # type: ignore[method-assign]

    def _from_log(self, partition: int, offset: int, value: bytes) -> None:
        if isinstance(wire.decode_envelope(value).command, ClaimRuns):
            self.asked[partition] += 1
            if partition in self.held:
                self.kept.append((partition, offset, value))
                return
        self._take(partition, offset, value)

    def release(self) -> None:
        kept, self.kept = self.kept, []
        for partition, offset, value in kept:
            self._take(partition, offset, value)


def events_of(node: Node, kind: type[ev.AnyEvent], partition: int) -> list[Any]:
    """The events of ``kind`` in ``partition``'s log, in order."""
    return [
        event
        for record in node.read_events(partition, 0, 10_000)
        if isinstance(event := ev.decode(record.value), kind)
    ]


def leases_in_log(node: Node) -> list[ev.LeaseGranted]:
    return [e for p in range(PARTITIONS) for e in events_of(node, ev.LeaseGranted, p)]


def test_an_owner_that_does_not_answer_delays_a_claim_once_not_once_per_partition(
    pair: tuple[Node, Node],
) -> None:
    old, new = pair
    make_ready(old, {0: 2, 1: 2, 2: 2})
    OwnerAsked(new, held={0, 1})  # two partitions whose owner is lost to the asker
    started = time.monotonic()
    leases = asyncio.run(old.claim(TENANT, POOL, "w", 10))
    took = time.monotonic() - started
    # Asked one after another, each for FORWARD_TIMEOUT_S (10 s), this took 20 s; at once, each
    # for REMOTE_CLAIM_TIMEOUT_S (0.5 s here), it takes about that (a loaded machine's margin).
    assert took < 5.0, took
    assert sorted(partition_for(lease.job_id, PARTITIONS) for lease in leases) == [2, 2]


def test_a_claim_never_leases_more_than_its_limit_even_when_answers_come_late(
    pair: tuple[Node, Node],
) -> None:
    old, new = pair
    make_ready(old, {0: 4, 1: 4, 2: 4})
    owner = OwnerAsked(new, held={0})
    leases = asyncio.run(old.claim(TENANT, POOL, "w", 5))
    assert len(leases) <= 5
    assert all(partition_for(lease.job_id, PARTITIONS) != 0 for lease in leases)
    owner.release()  # the late ask is decided after all: its leases go to nobody (given back)
    deadline = time.monotonic() + 5
    while not [e for e in leases_in_log(new) if partition_for(e.job_id, PARTITIONS) == 0]:
        assert time.monotonic() < deadline, "the released claim was never decided"
        time.sleep(0.02)
    assert len(leases_in_log(new)) <= 5


async def logged(node: Node, kind: type[ev.AnyEvent], partition: int, count: int) -> list[Any]:
    """The first ``count`` events of ``kind`` on ``partition`` once the log holds them (the
    log's reader has nothing to wait on: it is read again every 20 ms, for up to 10 s)."""
    deadline = time.monotonic() + 10
    while len(found := events_of(node, kind, partition)) < count:
        assert time.monotonic() < deadline, f"{count} {kind.__name__} never appended: {found}"
        await asyncio.sleep(0.02)
    return found[:count]


def test_the_leases_of_an_answer_that_came_after_the_claim_gave_up_are_given_back(
    pair: tuple[Node, Node],
) -> None:
    """An owner that answers a claim's ask after ``REMOTE_CLAIM_TIMEOUT_S`` granted leases the
    worker never hears of. Left alone they ran out, and a critical run's was set aside as
    ``outcome_unknown`` (the chaos run's ``never_delivered``, with no fault near); the node
    that asked gives them back, and the runs are claimed again at once under new tokens."""
    old, new = pair
    make_ready(old, {0: 2})
    owner = OwnerAsked(new, held={0})

    async def go() -> tuple[list[ev.LeaseGranted], list[ev.LeaseReturned], list[ev.LeaseGranted]]:
        # 8: a share of 2 for each of the 4 partitions (none known yet)
        first = await old.claim(TENANT, POOL, "w", 8)  # partition 0 does not answer in time
        owner.release()  # ... and then grants two leases to nobody
        returned = await logged(new, ev.LeaseReturned, 0, 2)
        owner.held.clear()  # the owner answers in time again
        again = await old.claim(TENANT, POOL, "w", 8)
        for e in returned:  # the tokens given back hold nothing
            with pytest.raises(LeaseLost):
                await old.execute(HeartbeatRun(run_id=e.run_id, fencing_token=e.fencing_token))
        return first, returned, again

    first, returned, again = asyncio.run(go())
    assert first == []
    granted = events_of(new, ev.LeaseGranted, 0)[:2]
    assert {(e.run_id, e.fencing_token) for e in returned} == {
        (e.run_id, e.fencing_token) for e in granted
    }
    assert {e.run_id for e in again} == {e.run_id for e in returned}
    assert min(e.fencing_token for e in again) > max(e.fencing_token for e in returned)
    assert all(e.attempt == 1 for e in again)  # no attempt was spent


@pytest.fixture
def alone(tmp_path: Path) -> Iterator[Node]:
    """A node owning every partition of a memory log, started."""
    log = MemoryLog(PARTITIONS, gaps=True)
    node = Node(log, tmp_path / "node", node_id="only")
    node.start()
    assert node.wait_ready(10)
    yield node
    node.stop()
    log.close()


def test_the_leases_of_a_local_answer_that_came_too_late_are_given_back(
    alone: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_module, "LOCAL_TIMEOUT_S", 0.3)
    node = alone
    make_ready(node, {1: 1})
    runner = node._runners[1]
    held: list[Any] = []
    take = runner.submit_many

    def hold_claims(requests: list[Any]) -> None:
        claims = [r for r in requests if isinstance(r.command, ClaimRuns)]
        held.extend(claims)
        take([r for r in requests if r not in claims])

    monkeypatch.setattr(runner, "submit_many", hold_claims)

    async def go() -> list[ev.LeaseReturned]:
        assert await node.claim(TENANT, POOL, "w", 1) == []  # unanswered in 0.3 s
        assert held
        take(held)  # decided after all: a lease for nobody
        return await logged(node, ev.LeaseReturned, 1, 1)

    [returned] = asyncio.run(go())
    [granted] = events_of(node, ev.LeaseGranted, 1)
    assert (returned.run_id, returned.fencing_token) == (granted.run_id, granted.fencing_token)
    monkeypatch.setattr(runner, "submit_many", take)
    [again] = asyncio.run(node.claim(TENANT, POOL, "w", 1))
    assert again.run_id == granted.run_id and again.fencing_token > granted.fencing_token


def test_another_nodes_partitions_are_asked_only_where_runs_of_the_pool_became_ready(
    pair: tuple[Node, Node],
) -> None:
    old, new = pair
    make_ready(old, {1: 3})
    owner = OwnerAsked(new, held=set())
    first = asyncio.run(old.claim(TENANT, POOL, "w", 10))
    assert len(first) == 3
    # A first claim asks every partition once (runs made ready before this node started are
    # not told again); those that answered short are known drained.
    asked_first = dict(owner.asked)
    assert set(asked_first) == {0, 1, 2, 3}
    assert asyncio.run(old.claim(TENANT, POOL, "w", 10)) == []
    assert owner.asked == asked_first  # nothing ready anywhere: nobody asked
    make_ready(old, {2: 1})
    assert old.history.wait_until(lambda: old.history.counts(TENANT).get("pending", 0) >= 1, 5)
    [lease] = asyncio.run(old.claim(TENANT, POOL, "w", 10))
    assert partition_for(lease.job_id, PARTITIONS) == 2
    assert owner.asked - Counter(asked_first) == Counter({2: 1})


def test_a_partition_that_held_less_than_its_index_said_leaves_the_rest_to_the_others(
    alone: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition's ready index may hold stale entries (leased runs, tidied by the next claim
    there), so it can grant less than its share; the partitions not asked then get the rest."""
    import node.claims as claims_module

    monkeypatch.setattr(claims_module.random, "shuffle", lambda xs: xs.sort())  # 0 first
    node = alone
    make_ready(node, {0: 5})
    assert len(asyncio.run(node.claim(TENANT, POOL, "w", 5))) == 5  # 5 stale entries left
    make_ready(node, {1: 3})
    leases = asyncio.run(node.claim(TENANT, POOL, "w", 5))
    assert sorted(partition_for(lease.job_id, PARTITIONS) for lease in leases) == [1, 1, 1]


def alone_on_a_fake_clock(tmp_path: Path) -> tuple[int, FakeClock, MemoryLog, Node]:
    """A node owning every partition of a memory log, started, on a fake clock at ``start``."""
    start = 1_800_000_000_000
    clock = FakeClock(start)
    log = MemoryLog(PARTITIONS, gaps=True)
    node = Node(log, tmp_path / "node", node_id="only", clock=clock)
    node.start()
    return start, clock, log, node


def test_a_claim_before_the_slot_leaves_alone_the_partition_holding_the_run_made_ahead(
    tmp_path: Path,
) -> None:
    """A run materialised a lead time ahead waits in its partition's ``later`` heap until its
    slot: a claim before then does not ask that partition's runner (with lead time, every
    partition of a busy pool holds such runs, and every claim asked every runner); once the
    slot has come, the claim asks it and gets the run."""
    start, clock, log, node = alone_on_a_fake_clock(tmp_path)
    asked: list[int] = []
    claim_one = node._claim_one

    async def counted(partition: int, *args: Any) -> list[ev.LeaseGranted] | None:
        asked.append(partition)
        return await claim_one(partition, *args)

    node._claim_one = counted  # type: ignore[method-assign]
    try:
        assert node.wait_ready(10)
        job_id = job_in(2, 0)
        spec = JobSpec(name="j", tenant=TENANT, target=PullTarget(pool=POOL), run_at=start + 10_000)
        asyncio.run(node.execute(PutJob(job_id=job_id, spec=spec)))
        assert node._runners[2].state.later.get(POOL)  # made ahead, waiting for its slot
        assert node.next_ready(TENANT, POOL) == start + 10_000

        assert asyncio.run(node.claim(TENANT, POOL, "w", 10)) == []
        assert asked == []

        clock.advance(10_000)
        [lease] = asyncio.run(node.claim(TENANT, POOL, "w", 10))
        assert lease.job_id == job_id
        assert asked == [2]
    finally:
        node.stop()
        log.close()


def test_a_waiting_claim_finds_the_next_instant_without_looking_at_every_run_made_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a steady rate the root of a partition's ``later`` heap is nearly always a run that
    came due since the last claim (moved to ``ready`` only by the next one): below it, every
    run made a lead time ahead was looked at for each claim that waited. The next instant is
    found looking at a few."""
    start, clock, log, node = alone_on_a_fake_clock(tmp_path)
    looked: list[str] = []
    not_yet_ready = node_module._not_yet_ready

    def counted(state: Any, entry: Any, *args: Any) -> int | None:
        looked.append(entry[2])
        return not_yet_ready(state, entry, *args)

    monkeypatch.setattr(node_module, "_not_yet_ready", counted)
    try:
        assert node.wait_ready(10)
        for n in range(60):  # one due in 1 s, then one every 0.3 s from 10.3 s on
            at = start + (1000 if n == 0 else 10_000 + n * 300)
            spec = JobSpec(name=f"j{n}", tenant=TENANT, target=PullTarget(pool=POOL), run_at=at)
            asyncio.run(node.execute(PutJob(job_id=job_in(2, n), spec=spec)))
        assert len(node._runners[2].state.later[POOL]) == 60
        clock.advance(1500)  # the first came due; no claim has moved it yet
        looked.clear()
        assert node.next_ready(TENANT, POOL) == start + 10_300
        assert 0 < len(looked) <= 5, len(looked)
    finally:
        node.stop()
        log.close()


@given(st.lists(st.integers(0, 50)), st.integers(0, 60))
def test_a_heap_walked_in_order_gives_its_entries_smallest_first(
    values: list[int], prefix: int
) -> None:
    heap = list(values)
    heapq.heapify(heap)
    assert list(node_module._in_order(heap)) == sorted(heap)
    assert list(node_module._in_order(heap[:prefix])) == sorted(heap[:prefix])  # a prefix too
