"""Admission with a fake clock: room, each team's turn and share, each downstream's rate."""

from __future__ import annotations

import pytest

from node.admission import Admission, RateLimit, Ticket


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ticket(name: str, urgency: int = 0, rate: float | None = None, origin: str = "a") -> Ticket:
    tenant = name[0]  # "a1" is team a's
    limit = None if rate is None else RateLimit((tenant, f"https://{origin}"), rate)
    return Ticket("runner", name, tenant, urgency, limit)


def names(granted: list[Ticket]) -> list[str]:
    return [t.run_id for t in granted]


def test_room_goes_to_the_teams_in_turn() -> None:
    room = Admission(2)
    reserved = [room.reserve(ticket(n)) for n in ("a1", "a2", "a3", "a4", "b1", "b2")]
    assert reserved == [True, True, False, False, False, False]
    assert room.waiting_for_room == 4
    order = [names(room.release("a")) for _ in range(4)]
    assert order == [["a3"], ["b1"], ["a4"], ["b2"]]
    assert room.in_flight == 2 and room.release("b") == [] and room.in_flight == 1


def test_a_team_waits_behind_itself_not_behind_a_newcomer_of_its_own() -> None:
    room = Admission(1)
    assert room.reserve(ticket("a1"))
    assert not room.reserve(ticket("a2"))
    room.release("a")  # a2 granted
    # Room is full again; a3 queues even when room frees, a2's team-mates first.
    assert not room.reserve(ticket("a3"))
    assert names(room.release("a")) == ["a3"]


def test_each_team_most_urgent_first() -> None:
    room = Admission(1)
    assert room.reserve(ticket("a0"))
    for name, urgency in (("a1", 30), ("a2", 10), ("a3", 20)):
        room.reserve(ticket(name, urgency))
    assert [names(room.release("a")) for _ in range(3)] == [["a2"], ["a3"], ["a1"]]


def test_a_team_never_holds_more_than_its_share() -> None:
    room = Admission(3, max_per_tenant=1)
    assert room.reserve(ticket("a1"))
    assert not room.reserve(ticket("a2"))  # room for it, but team a holds its one
    assert room.reserve(ticket("b1"))
    assert room.release("b") == []  # freed room is not team a's to take
    assert names(room.release("a")) == ["a2"]


def test_a_downstream_gets_no_more_than_its_rate() -> None:
    clock = Clock()
    room = Admission(100, clock=clock)
    # 2 a second: a burst of two, then one every half second.
    got = [room.reserve(ticket(f"a{i}", rate=2)) for i in range(5)]
    assert got == [True, True, False, False, False]
    assert room.waiting_for_rate == 3 and room.waiting_for_room == 0
    assert room.next_due_s() == pytest.approx(0.5)
    clock.now += 0.25
    assert room.due() == []
    clock.now += 0.25
    assert names(room.due()) == ["a2"]
    clock.now += 1.0  # two tokens' worth: the last two go together
    assert names(room.due()) == ["a3", "a4"]
    assert room.next_due_s() is None and room.in_flight == 5


def test_a_throttled_downstream_does_not_hold_up_the_teams_other_calls() -> None:
    room = Admission(100, clock=Clock())
    assert room.reserve(ticket("a1", rate=1))
    assert not room.reserve(ticket("a2", rate=1))
    assert room.reserve(ticket("a3", rate=1, origin="elsewhere"))  # another origin
    assert room.reserve(ticket("a4"))  # no limit
    assert room.reserve(ticket("b1", rate=1))  # another team's calls to the same origin


def test_a_throttled_run_with_a_token_but_no_room_waits_for_room() -> None:
    clock = Clock()
    room = Admission(1, clock=clock)
    assert room.reserve(ticket("a1", rate=1))
    assert not room.reserve(ticket("a2", rate=1))  # throttled
    clock.now += 1.0
    assert room.due() == []  # its token came, the room did not
    assert room.waiting_for_room == 1 and room.waiting_for_rate == 0
    assert names(room.release("a")) == ["a2"]


def test_an_idle_downstream_saves_up_at_most_one_seconds_burst() -> None:
    clock = Clock()
    room = Admission(100, clock=clock)
    assert room.reserve(ticket("a0", rate=3))
    clock.now += 3600
    got = [room.reserve(ticket(f"a{i}", rate=3)) for i in range(1, 6)]
    assert got == [True, True, True, False, False]


def test_draining_starts_nothing_more() -> None:
    clock = Clock()
    room = Admission(1, clock=clock)
    assert room.reserve(ticket("a1"))
    assert not room.reserve(ticket("a2"))
    assert not room.reserve(ticket("b1", rate=1))
    assert not room.reserve(ticket("b2", rate=1))
    room.drain()
    assert not room.reserve(ticket("a3"))
    assert room.release("a") == []
    clock.now += 10
    assert room.due() == [] and room.next_due_s() is None and room.in_flight == 0


def test_limits_leave_room() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Admission(0)
    with pytest.raises(ValueError, match="at least 1"):
        Admission(1, max_per_tenant=0)


def test_the_room_kept_goes_only_to_teams_with_few_calls() -> None:
    room = Admission(10, reserved=4, reserved_per_team=2)
    # Team a fills the open room (six calls) and no more, however long its calls run.
    assert [room.reserve(ticket(f"a{i}")) for i in range(8)] == [True] * 6 + [False] * 2
    # Team b finds room at once, up to its share of what is kept; so does team c.
    assert [room.reserve(ticket(f"b{i}")) for i in range(3)] == [True, True, False]
    assert [room.reserve(ticket(f"c{i}")) for i in range(3)] == [True, True, False]
    assert room.in_flight == 10
    # A call of b's ends: the room goes to b's next run, not to a's queue (a is past its
    # share of what is kept) nor to c (at its share).
    assert names(room.release("b")) == ["b2"]
    # One of a's calls ends: the one call free is part of what is kept, and a holds more
    # than a share of it, so a waits; c's next run takes it when one of c's calls ends.
    assert room.release("a") == []
    assert names(room.release("c")) == ["c2"]
    # Once b and c are done, open room is free again and a's queue takes it, no more.
    freed = [room.release(team) for team in "bbc"]
    assert freed == [[], [], []] and room.in_flight == 6
    assert names(room.release("c")) == ["a6"] and room.in_flight == 6


def test_the_kept_room_fills_the_open_room_first() -> None:
    room = Admission(10, reserved=4, reserved_per_team=1)
    # A team with few calls uses the open room like any other while it is there.
    assert [room.reserve(ticket(f"b{i}")) for i in range(6)] == [True] * 6
    assert not room.reserve(ticket("b6"))  # the rest is kept, and b holds more than a share
    assert room.reserve(ticket("a0")) and not room.reserve(ticket("a1"))
    assert room.in_flight == 7 and room.waiting_for_room == 2


def test_a_team_holds_few_calls_up_to_its_share_of_the_room_kept() -> None:
    room = Admission(10, reserved=4, reserved_per_team=2)
    assert room.holds_few("a")  # none yet
    room.reserve(ticket("a0"))
    room.reserve(ticket("a1"))
    assert room.holds_few("a")  # two, its share of what is kept
    room.reserve(ticket("a2"))
    assert not room.holds_few("a") and room.holds_few("b")
    room.release("a")
    assert room.holds_few("a")
    # With no room kept, few is a hundredth of the room (at least one).
    bare = Admission(300)
    for i in range(4):
        bare.reserve(ticket(f"a{i}"))
    assert not bare.holds_few("a")
    assert Admission(5).holds_few("a")


def test_the_default_reserve_is_a_tenth_in_hundredths() -> None:
    from node.admission import default_reserve

    assert default_reserve(10_000) == (1_000, 100)
    assert default_reserve(512) == (51, 5)
    assert default_reserve(10) == (1, 1)
    assert default_reserve(9) == (0, 0)
    with pytest.raises(ValueError):
        Admission(4, reserved=4, reserved_per_team=1)
    with pytest.raises(ValueError):
        Admission(4, reserved=1)


def test_on_a_node_of_several_a_downstream_s_rate_is_its_share_of_the_cluster_s() -> None:
    from core.shares import Shares

    clock = Clock()
    room = Admission(100, clock=clock)
    room.shares = Shares(lambda: 0.5)  # half the partitions: half the rate until granted
    got = [room.reserve(ticket(f"a{i}", rate=8)) for i in range(6)]
    assert got == [True] * 4 + [False] * 2  # a burst of four, at four a second
    [ask] = room.shares.due(round(clock.now * 1000))
    assert (ask.key, ask.wanted, ask.in_force) == ("a/calls-to/https://a", 6, 4)
    room.shares.granted([ask], [0.0])  # the others call it at the whole rate for now
    assert room.due() == []  # the bucket takes its new share when it is next looked at
    clock.now += 0.5
    assert room.due() == []
    assert room.next_due_s() == pytest.approx(1.0)  # looks again when its share may be back
    room.shares.granted([ask], [8.0])
    assert room.due() == []
    clock.now += 0.25  # two tokens at eight a second
    assert names(room.due()) == ["a4", "a5"]


def test_on_a_node_of_several_a_team_s_cap_is_its_share_of_the_cluster_s() -> None:
    from core.shares import Shares

    clock = Clock()
    room = Admission(100, max_per_tenant=6, clock=clock)
    shares = room.shares = Shares(lambda: 0.5)
    looked: list[bool] = []
    room.on_share = lambda: looked.append(True)
    asked_now: list[bool] = []
    shares.asks_now_with(lambda: asked_now.append(True))
    got = [room.reserve(ticket(f"a{i}")) for i in range(5)]
    assert got == [False] * 5  # none until the owner answers
    assert asked_now  # asked at once
    [first] = shares.urgent_asks()
    assert first.key == "a/running-calls/" and first.wanted == 5 and first.used == 0
    shares.granted([first], [3.0])  # the other node holds three of the team's six
    assert looked == [True]
    assert names(room.due()) == ["a0", "a1", "a2"]
    assert room.due() == []  # at its share
    assert room.next_due_s() == pytest.approx(1.0)  # its queued runs are looked at again
    shares.granted([first], [5.0])  # the other node's calls ended but one
    assert names(room.due()) == ["a3", "a4"]
    [ask] = shares.due(round(clock.now * 1000))
    assert ask.used == 5


def test_a_team_s_cap_falls_back_to_the_node_s_part_when_the_owner_is_silent() -> None:
    from core.shares import Shares

    clock = Clock()
    room = Admission(100, max_per_tenant=6, clock=clock)
    room.shares = Shares(lambda: 0.5)
    assert [room.reserve(ticket(f"a{i}")) for i in range(4)] == [False] * 4
    clock.now += 1.0  # a period without an answer
    assert names(room.due()) == ["a0", "a1", "a2"]  # half the cap: its part of the partitions
