"""The node's asks for its shares of teams' limits: one question a period to each owning
partition, the answers taken, the teams it owns answered at home; and the owner's answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
import pytest

from core.errors import Unavailable
from core.shares import PERIOD_MS, Ask, ShareBook, Shares, key_of
from eventlog.port import partition_for
from node import wire
from node.limit_shares import QUERY, ShareAsking, _Pending, answer, asks_of

PARTITIONS = 4


def team_on(partition: int) -> str:
    return next(
        f"team-{i}" for i in range(1000) if partition_for(f"team-{i}", PARTITIONS) == partition
    )


class Owners:
    """The other nodes: each partition's owner answers from one book, on a thread of its own
    (as the mailbox thread would deliver it), unless it is silent."""

    def __init__(self, silent: frozenset[int] = frozenset()) -> None:
        self.book = ShareBook()
        self.silent = silent
        self.asked: list[tuple[int, wire.Query]] = []
        self.stopped = 0

    def ask(
        self, partition: int, query: wire.Query, on_reply: Callable[[wire.Reply], None]
    ) -> Callable[[], None]:
        self.asked.append((partition, query))
        if partition not in self.silent:
            reply = wire.Reply(request_id="r", answer=answer(self.book, "n1", query, 0))
            threading.Thread(target=on_reply, args=(reply,)).start()

        def stop() -> None:
            self.stopped += 1

        return stop


def asking(
    shares: Shares,
    owners: Owners,
    owned: frozenset[int],
    period_ms: int = PERIOD_MS,
    unanswered: list[int] | None = None,
) -> ShareAsking:
    return ShareAsking(
        "n1",
        shares,
        ShareBook(),
        num_partitions=PARTITIONS,
        owned=lambda: owned,
        ask=owners.ask,
        now_ms=lambda: 5_000,
        wall_ms=lambda: 1_700_000_000_000,
        on_unanswered=(unanswered if unanswered is not None else []).append,
        period_ms=period_ms,
    )


def test_one_question_per_owning_partition_and_the_teams_owned_here_answered_at_home() -> None:
    there, home = team_on(1), team_on(2)
    shares = Shares(lambda: 0.25)
    for name in ("t1", "t2"):
        shares.rate(key_of(there, "requests", name), 100, 0)
    shares.rate(key_of(home, "requests", "t3"), 100, 0)
    owners = Owners()
    asker = asking(shares, owners, owned=frozenset({2}))
    asker._pass()  # sends, and never waits for the answers
    [pending] = asker._pending
    assert pending.answered.wait(5.0)  # on the owner's thread, as the mailbox's would
    assert [(p, q.name) for p, q in owners.asked] == [(1, QUERY)]
    assert len(asks_of(owners.asked[0][1])) == 2  # both tokens in one question
    # Each alone in its owner's book, new there: its part of the partitions, the others'
    # parts kept for them until they have asked or the limit is no longer new.
    assert shares.in_force(key_of(there, "requests", "t1")) == 25
    assert shares.in_force(key_of(home, "requests", "t3")) == 25
    asker._expire(time.monotonic() + 60)
    assert asker._pending == [] and asker.unanswered == 0
    assert owners.stopped == 0  # an answered ask left the node's waiting list with its answer


def test_an_owner_that_does_not_answer_leaves_the_shares_as_they_were(
    caplog: pytest.LogCaptureFixture,
) -> None:
    team = team_on(3)
    shares = Shares(lambda: 0.25)
    shares.rate(key_of(team, "requests", "t1"), 100, 0)
    owners = Owners(silent=frozenset({3}))
    counted: list[int] = []
    asker = asking(shares, owners, owned=frozenset(), period_ms=50, unanswered=counted)
    asker._pass()
    asker._expire(time.monotonic())
    assert asker.unanswered == 0  # not yet: most of a period to answer
    asker._expire(time.monotonic() + 0.05)
    assert asker.unanswered == 1 and owners.stopped == 1
    assert counted == [1]  # said, as cronlog_history_questions_total{side="unanswered"}
    assert shares.in_force(key_of(team, "requests", "t1")) == 25  # the default still
    asker._pass()
    asker._expire(time.monotonic() + 0.05)
    assert counted == [1, 1]
    said = [r for r in caplog.records if "went unanswered" in r.getMessage()]
    assert len(said) == 1  # logged once a spell of silence, counted every time


def test_a_log_that_refuses_the_question_leaves_the_shares_as_they_were() -> None:
    team = team_on(0)
    shares = Shares(lambda: 0.5)
    shares.rate(key_of(team, "requests", "t1"), 100, 0)

    def refuse(*_: object) -> Callable[[], None]:
        raise Unavailable("the log is down")

    asker = ShareAsking(
        "n1",
        shares,
        ShareBook(),
        num_partitions=PARTITIONS,
        owned=frozenset,
        ask=refuse,
        now_ms=lambda: 0,
        wall_ms=lambda: 0,
    )
    asker._pass()
    assert asker.unanswered == 1
    assert shares.in_force(key_of(team, "requests", "t1")) == 50


def test_a_member_alone_asks_nobody() -> None:
    shares = Shares()
    shares.rate(key_of(team_on(1), "requests", "t1"), 100, 0)
    owners = Owners()
    asking(shares, owners, owned=frozenset(range(PARTITIONS)))._pass()
    assert owners.asked == []


def test_a_malformed_question_is_refused_by_its_owner() -> None:
    with pytest.raises(msgspec.ValidationError):
        answer(ShareBook(), "n1", wire.Query(name=QUERY, args=[[["k", "much"]]]), 0)
    with pytest.raises(msgspec.ValidationError):
        answer(ShareBook(), "n1", wire.Query(name=QUERY, args=[]), 0)
    asks = [Ask("a/requests/t", 10, 3, 5, part=1.0), Ask("a/s/", 8, 1, 2, whole=True)]
    asked = wire.Query(name=QUERY, args=[asks])
    travelled = wire.decode_envelope(wire.encode(wire.Envelope(query=asked, reply_to="n1")))
    assert travelled.query is not None
    assert msgspec.json.decode(answer(ShareBook(), "n1", travelled.query, 0)) == [10.0, 8.0]


def test_a_count_waiting_for_its_first_grant_is_asked_at_once_not_at_the_period() -> None:
    team = team_on(1)
    shares = Shares(lambda: 0.25)
    owners = Owners()
    asker = asking(shares, owners, owned=frozenset(), period_ms=60_000)
    asker.start()
    try:
        told = threading.Event()
        assert shares.first_grant(key_of(team, "event-streams"), 8, 0, told.set)
        assert told.wait(5.0)
        [(partition, query)] = owners.asked
        assert partition == 1 and [a.key for a in asks_of(query)] == [key_of(team, "event-streams")]
        # the one it wants and its quarter of the seven nobody wants, as headroom
        assert shares.count(key_of(team, "event-streams"), 8, 0, 0) == 2
    finally:
        asker.stop()
    assert not asker.alive


def test_asks_wanted_at_once_within_the_gap_wait_for_it_without_spinning() -> None:
    team = team_on(1)
    shares = Shares(lambda: 0.25)
    owners = Owners()
    asker = asking(shares, owners, owned=frozenset(), period_ms=60_000)
    turns: list[float] = []
    expire = asker._expire

    def counted(now_s: float) -> None:  # one call a turn of the asking thread's loop
        turns.append(now_s)
        expire(now_s)

    asker._expire = counted  # type: ignore[method-assign]
    asker.start()
    try:
        first = threading.Event()
        assert shares.first_grant(key_of(team, "event-streams"), 8, 0, first.set)
        assert first.wait(5.0)
        sent = len(owners.asked)
        again = threading.Event()
        assert shares.first_grant(key_of(team, "waiting-claims"), 8, 0, again.set)
        assert again.wait(5.0)  # asked once the gap since the last at-once ask was over
        assert len(owners.asked) == sent + 1
        assert len(turns) < 10, f"{len(turns)} turns of the loop: it spun through the gap"
    finally:
        asker.stop()


def test_an_answer_that_cannot_be_taken_is_said_not_raised_on_the_mailbox_thread() -> None:
    class Broken(Shares):
        def granted(self, asks: object, shares: object) -> None:
            raise RuntimeError("a bug in taking a grant")

    failed: list[bool] = []
    asker = ShareAsking(
        "n1",
        Broken(lambda: 0.5),
        ShareBook(),
        num_partitions=PARTITIONS,
        owned=frozenset,
        ask=Owners().ask,
        now_ms=lambda: 0,
        wall_ms=lambda: 0,
        on_failed=lambda: failed.append(True),
    )
    pending = _Pending(expires=0.0)
    reply = wire.Reply(request_id="r", answer=msgspec.Raw(b"[1.0]"))
    asker._on_reply([Ask("a/requests/t", 10, 1, 5)], pending)(reply)  # does not raise
    assert failed == [True] and pending.answered.is_set()
