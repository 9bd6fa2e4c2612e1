"""Watches of ready runs between owners (node.ready_watch), on their own, with a fake clock."""

from __future__ import annotations

from node.ready_watch import (
    AHEAD_MS,
    MAX_INSTANTS,
    MAX_WATCHES,
    MIN_REWATCH_S,
    REFRESH_MS,
    ReadyWatches,
    Told,
    Watching,
)
from projections.model_fold import ReadyRun


def test_a_watch_is_answered_at_once_from_what_the_partition_holds() -> None:
    watches = ReadyWatches(lambda: 1_000)
    got: list[list[int] | None] = []
    watches.add("t", "p", 3, 5_000, got.append, [1_500, 2_000])
    assert got == [[1_500, 2_000]] and len(watches) == 0


def test_a_held_watch_is_answered_by_the_first_fold_of_its_pool_on_its_partition() -> None:
    now = [1_000]
    watches = ReadyWatches(lambda: now[0])
    got: list[list[int] | None] = []
    watches.add("t", "p", 3, 5_000, got.append, [])
    watches.folded({}, [ReadyRun("t", "p", 1_200, 2), ReadyRun("t", "q", 1_200, 3)])
    assert got == [] and len(watches) == 1  # another partition's, another pool's
    many = [ReadyRun("t", "p", 2_000 - i, 3) for i in range(MAX_INSTANTS + 5)]
    watches.folded({}, many)
    assert len(got) == 1 and got[0] == sorted(r.available_at for r in many)[:MAX_INSTANTS]
    assert len(watches) == 0


def test_watches_past_their_end_are_dropped_and_a_partition_lost_ends_its_watches() -> None:
    now = [1_000]
    watches = ReadyWatches(lambda: now[0])
    got: list[list[int] | None] = []
    watches.add("t", "p", 3, 2_000, got.append, [])
    now[0] = 2_500
    watches.folded({}, [ReadyRun("t", "p", 2_600, 3)])
    assert got == []  # its asker stopped waiting at 2,000
    watches.add("t", "p", 4, 9_000, got.append, [])
    watches.lost(4)
    assert got == [None] and len(watches) == 0  # ended saying it moved: watch it again now


def test_the_oldest_watches_are_answered_empty_past_the_bound() -> None:
    watches = ReadyWatches(lambda: 0)
    got: list[list[int] | None] = []
    for _ in range(MAX_WATCHES + 2):
        watches.add("t", "p", 0, 10_000, got.append, [])
    assert got == [[], []] and len(watches) == MAX_WATCHES


def test_one_watch_in_flight_per_partition_and_none_again_right_after_an_answer() -> None:
    clock = [100.0]
    watching = Watching(lambda: clock[0])
    assert watching.start("t", "p", [0, 1, 2]) == [(0, 0.0, None), (1, 0.0, None), (2, 0.0, None)]
    assert watching.start("t", "p", [0, 1, 2]) == []  # all in flight
    told = Told.of_answer(1_000, [1_500])
    watching.ended("t", "p", 0, answered=True, told=told)
    watching.ended("t", "p", 1, answered=False)  # no answer: watched again at once
    clock[0] += MIN_REWATCH_S / 4
    # partition 0 answered moments ago: watched again, but only once MIN_REWATCH_S has passed,
    # saying what its answer told
    assert watching.start("t", "p", [0, 1, 2]) == [
        (0, MIN_REWATCH_S * 3 / 4, told),
        (1, 0.0, None),
    ]
    watching.ended("t", "p", 0, answered=True, told=told)
    clock[0] += MIN_REWATCH_S
    assert watching.start("t", "p", [0]) == [(0, 0.0, told)]
    assert watching.start("t", "q", [0]) == [(0, 0.0, None)]  # another pool


def test_what_an_answer_told_covers_its_horizon_or_up_to_its_last_instant_when_cut() -> None:
    assert Told.of_answer(1_000, [3_000, 2_000]) == Told(1_000 + AHEAD_MS, (2_000, 3_000))
    many = list(range(2_000, 2_000 + MAX_INSTANTS))
    assert Told.of_answer(1_000, many).covered_ms == many[-1]  # nothing known past it


def test_a_standing_watch_is_answered_at_once_only_with_news_or_a_stale_horizon() -> None:
    now = [1_000]
    watches = ReadyWatches(lambda: now[0])
    got: list[list[int] | None] = []
    told = Told.of_answer(1_000, [2_000, 3_000])  # every instant up to 11,000
    refresh = [[2_000, 3_000]]
    # what the partition holds now is what the asker was told: held, not answered
    watches.add("t", "p", 3, 60_000, got.append, [2_000, 3_000], told, lambda: refresh[0])
    assert got == [] and len(watches) == 1
    # a run materialised beyond the told horizon is no news yet
    watches.folded({}, [ReadyRun("t", "p", 31_000, 3)])
    assert got == [] and len(watches) == 1
    # a run ready within it that the asker was not told (a retry, a trigger) is: answered
    # with all the partition knows now
    refresh[0] = [1_500, 2_000, 3_000]
    watches.folded({}, [ReadyRun("t", "p", 1_500, 3)])
    assert got == [[1_500, 2_000, 3_000]] and len(watches) == 0
    # news in what the partition holds answers at once, as does a horizon grown stale
    watches.add("t", "p", 3, 60_000, got.append, [2_500], told, lambda: [2_500])
    assert got[-1] == [2_500]
    now[0] = 1_000 + REFRESH_MS
    watches.add("t", "p", 3, 60_000, got.append, [2_000, 3_000], told, lambda: [2_000, 3_000])
    assert got[-1] == [2_000, 3_000] and len(watches) == 0


def test_a_held_standing_watch_is_answered_at_a_fold_once_half_of_what_it_told_has_passed() -> None:
    now = [1_000]
    watches = ReadyWatches(lambda: now[0])
    got: list[list[int] | None] = []
    told = Told.of_answer(1_000, [1_200, 1_400, 1_600, 1_800])
    watches.add("t", "p", 3, 60_000, got.append, [1_200, 1_400, 1_600, 1_800], told, lambda: [9])
    now[0] = 1_500
    watches.folded({}, [ReadyRun("t", "p", 31_500, 3)])
    assert got == []
    now[0] = 1_600  # the told instants' middle has passed: the asker hears what is known now
    watches.folded({}, [ReadyRun("t", "p", 31_600, 3)])
    assert got == [[9]]


def test_a_fold_of_any_partition_answers_a_held_watch_grown_stale() -> None:
    now = [1_000]
    watches = ReadyWatches(lambda: now[0])
    got: list[list[int] | None] = []
    told = Told.of_answer(1_000, [2_000])
    watches.add("t", "p", 3, 60_000, got.append, [2_000], told, lambda: [7_000])
    watches.folded({}, [ReadyRun("t", "p", 40_000, 5)])
    assert got == []  # not stale yet, and nothing of its partition folded
    now[0] = told.refresh_at()
    watches.folded({}, [ReadyRun("t", "p", 40_500, 5)])  # another partition's fold
    assert got == [[7_000]] and len(watches) == 0
