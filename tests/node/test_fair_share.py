"""A node's executors share their room between teams: one team's burst waits behind itself.

The target holds every call until the test lets one go, so the test decides when room frees up
and sees, call by call, whose run got it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.commands import PutJob
from core.jobs import HttpTarget
from eventlog.embedded import EmbeddedLog
from node.executors import Executors
from node.node import Node
from tests.node.targets import LOOPBACK_ALLOWED, Call, Target
from tests.node.test_node_embedded import now_ms, spec

pytestmark = pytest.mark.slow


class Gate:
    """Holds each call until :meth:`let_go` names its job; records the job ids in the order the
    calls came, and the most calls each team (the id's first letter) had held at once."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.most_held: dict[str, int] = {}
        self._held: list[str] = []
        self._cv = threading.Condition()
        self._go: dict[str, threading.Event] = {}
        self.target = Target(answer=self._answer).start()

    def _answer(self, call: Call) -> tuple[int, dict[str, str], float]:
        name = call.body["job_id"]
        with self._cv:
            self.arrived.append(name)
            self._held.append(name)
            team = name[0]
            held = sum(1 for h in self._held if h[0] == team)
            self.most_held[team] = max(self.most_held.get(team, 0), held)
            go = self._go.setdefault(name, threading.Event())
            self._cv.notify_all()
        go.wait(30)
        with self._cv:
            self._held.remove(name)
        return 200, {}, 0.0

    def wait_for(self, n: int) -> list[str]:
        with self._cv:
            assert self._cv.wait_for(lambda: len(self.arrived) >= n, 10), self.arrived
            return list(self.arrived)

    def let_go(self, name: str) -> None:
        with self._cv:
            self._go.setdefault(name, threading.Event()).set()

    def close(self) -> None:
        with self._cv:
            for event in self._go.values():
                event.set()
        self.target.stop()


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.close()


def start_node(tmp_path: Path, **limits: int) -> tuple[Node, EmbeddedLog]:
    log = EmbeddedLog.open(tmp_path / "log", 4)
    node = Node(
        log,
        tmp_path / "node",
        node_id="n1",
        executors=Executors("n1", egress=LOOPBACK_ALLOWED, **limits),
        # Each run materialised at its slot, so that a run that exists has asked for room
        # (``wait_pending``); with a lead time it would exist before its slot, not yet queued.
        lead_ms=0,
    )
    node.start()
    assert node.wait_ready(10)
    return node, log


def register(node: Node, url: str, tenant: str, names: list[str], slot: int) -> None:
    for name in names:
        job = spec(url, run_at=slot, tenant=tenant)
        asyncio.run(node.execute(PutJob(job_id=name, spec=job)))


def wait_pending(node: Node, tenant: str, names: list[str], slot: int) -> None:
    """Until the runs exist: by then their owner has asked for room and queued them (the node
    has no lead time: a run is materialised at its slot, and asks for room in that batch)."""

    def materialised() -> bool:
        return all(node.history.run(tenant, f"{name}.{slot}") is not None for name in names)

    assert node.history.wait_until(materialised, 10)


def test_room_goes_to_each_team_in_turn(tmp_path: Path, gate: Gate) -> None:
    node, log = start_node(tmp_path, max_in_flight=2)
    try:
        burst = [f"a{i}" for i in range(6)]
        late = ["b0", "b1"]
        slot = now_ms() + 500
        register(node, gate.target.url, "team-a", burst, slot)
        register(node, gate.target.url, "team-b", late, slot + 300)
        first = gate.wait_for(2)
        assert set(first) <= set(burst)  # team-a's burst took all the room
        wait_pending(node, "team-b", late, slot + 300)  # team-b queued behind 4 of team-a's
        for n in range(3, 9):
            gate.let_go(gate.arrived[n - 3])  # the oldest call still held ends
            gate.wait_for(n)
        order = gate.wait_for(8)
        positions = [order.index(name) + 1 for name in late]
        # In turn: a b a b, then the rest of a. First come, first served would give [7, 8].
        assert sorted(positions) == [4, 6], order
        assert sorted(order) == sorted(burst + late)
        for name in order[-2:]:
            gate.let_go(name)
        assert node.executors.wait_idle(10)
    finally:
        node.stop()
        log.close()


def test_a_team_never_holds_more_than_its_share(tmp_path: Path, gate: Gate) -> None:
    node, log = start_node(tmp_path, max_in_flight=3, max_in_flight_per_tenant=1)
    try:
        burst = ["a0", "a1", "a2"]
        slot = now_ms() + 300
        register(node, gate.target.url, "team-a", burst, slot)
        register(node, gate.target.url, "team-b", ["b0"], slot)
        both = gate.wait_for(2)
        wait_pending(node, "team-a", burst, slot)
        # Room for a third call, but team-a holds its one: its other runs wait.
        assert sorted(x[0] for x in both) == ["a", "b"] and node.executors.in_flight == 2
        assert len(gate.arrived) == 2
        for name in [*burst, "b0"]:
            gate.let_go(name)
        assert node.executors.wait_idle(10)
        assert sorted(gate.arrived) == ["a0", "a1", "a2", "b0"]
        assert gate.most_held == {"a": 1, "b": 1}
    finally:
        node.stop()
        log.close()


def test_the_limits_must_leave_room() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Executors("n1", max_in_flight=0)
    with pytest.raises(ValueError, match="at least 1"):
        Executors("n1", max_in_flight_per_tenant=0)


def test_a_downstream_gets_no_more_than_its_rate(tmp_path: Path) -> None:
    limited, free = Target().start(), Target().start()
    node, log = start_node(tmp_path)
    try:
        slot = now_ms() + 300
        for i in range(8):
            target = HttpTarget(url=limited.url, max_calls_per_sec=4)  # a burst of 4, then 4/s
            job = spec(limited.url, run_at=slot, target=target)
            asyncio.run(node.execute(PutJob(job_id=f"limited-{i}", spec=job)))
        asyncio.run(node.execute(PutJob(job_id="free", spec=spec(free.url, run_at=slot))))
        calls = limited.wait_for(8, timeout_s=10)
        (other,) = free.wait_for(1, timeout_s=5)
        assert len(calls) == 8
        arrived = sorted(c.received_at for c in calls)
        # Four at once, then one every quarter second: the eighth a second after the fourth.
        assert arrived[3] - arrived[0] < 0.5
        # Four more tokens take a second from the first call's start. Arrivals are noted by the
        # target once its thread runs: a first arrival delayed on a busy machine shortens the
        # span, so the bound leaves room for that. Unlimited, all eight arrive within
        # milliseconds of each other.
        assert arrived[7] - arrived[0] >= 0.6
        for earlier, later in itertools.pairwise(arrived[3:]):
            assert later - earlier >= 0.15, arrived  # a quarter second, less dispatch jitter
        # The same team's call to another origin did not wait behind the throttled ones.
        assert other.received_at * 1000 - slot < 1000
    finally:
        node.stop()
        log.close()
        limited.stop()
        free.stop()
