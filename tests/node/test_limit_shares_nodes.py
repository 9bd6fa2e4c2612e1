"""Two nodes of one embedded log's group (worker processes' way, in this process), asking each
other for their shares of a team's limits through the log: the asks reach the team's owner and
its grants come back; an ask read long after it was made is passed over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.shares import Ask, key_of
from eventlog.port import partition_for
from node import limit_shares, wire
from node.node import Node
from tests.node.two_workers import two_workers

PARTITIONS = 4


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    with two_workers(tmp_path, PARTITIONS, cluster_limits=True) as pair:
        yield pair


def team_owned_by(node: Node) -> str:
    owned = node.owned()
    return next(f"team-{i}" for i in range(1000) if partition_for(f"team-{i}", PARTITIONS) in owned)


def test_a_node_is_granted_its_share_by_the_team_s_owner_through_the_log(
    nodes: tuple[Node, Node],
) -> None:
    a, b = nodes
    assert a.shares is not None and b.shares is not None
    team = team_owned_by(b)
    key = key_of(team, "requests", "t")

    def now_ms() -> int:  # the clock the node's asking thread reads
        return round(time.monotonic() * 1000)

    assert a.shares.rate(key, 90, now_ms()) == 45  # half the partitions: half until granted
    deadline = time.monotonic() + 10
    while a.shares.in_force(key) == 45:  # a's next period asks b, through the log
        a.shares.rate(key, 90, now_ms(), asked=10)
        assert time.monotonic() < deadline, "no grant came"
        time.sleep(0.05)
    asked = b.metrics.history_questions.labels(limit_shares.QUERY, "answered")._value.get()
    assert asked >= 1
    assert 0 < (a.shares.in_force(key) or 0) <= 90


def test_an_old_ask_is_passed_over_by_the_owner(nodes: tuple[Node, Node]) -> None:
    _, b = nodes
    p = b.owned()[0]
    old_ms = b.now_ms() - limit_shares.STALE_MS - 1
    team = next(f"team-{i}" for i in range(1000) if partition_for(f"team-{i}", PARTITIONS) == p)
    for asked_at in (old_ms, b.now_ms()):
        ask = Ask(key_of(team, "requests", "t"), 90, 10, 45, part=0.5)
        query = wire.Query(name=limit_shares.QUERY, args=[[ask]], asked_at=asked_at)
        envelope = wire.Envelope(query=query, request_id="r", reply_to="nobody")
        b._log.submit(p, wire.encode(envelope))
    counted = b.metrics.history_questions
    deadline = time.monotonic() + 10
    while counted.labels(limit_shares.QUERY, "answered")._value.get() < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert counted.labels(limit_shares.QUERY, "stale")._value.get() == 1


def test_an_ask_the_owner_fails_to_answer_is_counted_not_lost_on_its_thread(
    nodes: tuple[Node, Node],
) -> None:
    _, b = nodes

    def broken(*_: object) -> list[float]:
        raise RuntimeError("a bug in the book")

    b._share_book.grant = broken  # type: ignore[method-assign]
    p = b.owned()[0]
    team = next(f"team-{i}" for i in range(1000) if partition_for(f"team-{i}", PARTITIONS) == p)
    ask = Ask(key_of(team, "requests", "t"), 90, 10, 45, part=0.5)
    query = wire.Query(name=limit_shares.QUERY, args=[[ask]], asked_at=b.now_ms())
    b._log.submit(p, wire.encode(wire.Envelope(query=query, request_id="r", reply_to="nobody")))
    failures = b.metrics.thread_failures.labels("limit-shares")
    deadline = time.monotonic() + 10
    while failures._value.get() < 1:
        assert time.monotonic() < deadline, "the failure was not said"
        time.sleep(0.01)
