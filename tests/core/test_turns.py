"""Work kept per team and taken one team after another (core.turns)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.turns import Turns


def test_a_teams_single_piece_waits_behind_one_of_each_other_team() -> None:
    turns: Turns[str] = Turns()
    for i in range(3):
        turns.append("a", f"a{i}")
    turns.append("b", "b0")
    assert [turns.popleft() for _ in range(2)] == ["a0", "b0"]
    turns.append("c", "c0")  # arrives while a still has two queued
    assert [turns.popleft() for _ in range(3)] == ["a1", "c0", "a2"]
    assert not turns and len(turns) == 0
    with pytest.raises(IndexError):
        turns.popleft()


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers())))
def test_each_team_keeps_its_order_and_nothing_is_lost(pieces: list[tuple[str, int]]) -> None:
    turns: Turns[tuple[str, int]] = Turns()
    for team, n in pieces:
        turns.append(team, (team, n))
    assert len(turns) == len(pieces)
    out = [turns.popleft() for _ in range(len(pieces))]
    assert sorted(out) == sorted(pieces)
    for team in "abc":
        assert [p for p in out if p[0] == team] == [p for p in pieces if p[0] == team]
    # while two teams both have work left, neither is taken twice in a row
    for i in range(len(out) - 1):
        if out[i][0] == out[i + 1][0]:
            assert all(p[0] == out[i][0] for p in out[i + 1 :])
