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
