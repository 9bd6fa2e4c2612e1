"""A team's limits across the cluster: the owner's division and the members' shares, on a fake
clock (milliseconds passed in)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.shares import (
    FORGET_PERIODS,
    IDLE_ASK_PERIODS,
    PERIOD_MS,
    SILENT_PERIODS,
    YOUNG_PERIODS,
    Ask,
    ShareBook,
    Shares,
    fair_division,
    key_of,
    tenant_of,
)

RATE = key_of("team-a", "requests", "t1")
STREAMS = key_of("team-a", "event-streams")


def test_a_key_names_its_team_first() -> None:
    assert tenant_of(RATE) == "team-a"
    assert tenant_of(STREAMS) == "team-a"


def test_fair_division_gives_the_small_wants_and_splits_the_rest() -> None:
    assert fair_division(100, {"a": 200, "b": 10, "c": 10}) == {"a": 80, "b": 10, "c": 10}
    assert fair_division(90, {"a": 200, "b": 200, "c": 200}) == {"a": 30, "b": 30, "c": 30}
    assert fair_division(100, {"a": 5, "b": 5}) == {"a": 5, "b": 5}


@given(
    st.floats(min_value=0, max_value=1e5),
    st.dictionaries(st.text(max_size=3), st.floats(min_value=0, max_value=1e5), max_size=8),
)
def test_fair_division_never_gives_more_than_the_limit_or_a_want(
    limit: float, wanted: dict[str, float]
) -> None:
    shares = fair_division(limit, wanted)
    assert sum(shares.values()) <= limit * (1 + 1e-9) + 1e-9
    for member, share in shares.items():
        assert 0 <= share <= wanted[member] + 1e-9
    if sum(wanted.values()) <= limit:
        assert shares == wanted  # everybody has what it wants
    else:  # a member left short has at least what any other got
        short = [m for m in shares if shares[m] < wanted[m] - 1e-6]
        for m in short:
            assert shares[m] >= max(shares.values()) - 1e-6


def ask(book: ShareBook, member: str, now: int, *asks: Ask) -> list[float]:
    return book.grant(member, asks, now)


def test_three_members_pushing_alike_settle_on_a_third_each_and_never_sum_above() -> None:
    book = ShareBook()
    in_force = {"a": 100 / 3, "b": 100 / 3, "c": 100 / 3}  # each member's default fraction
    for period in range(4):
        now = period * PERIOD_MS
        for m in "abc":
            [in_force[m]] = ask(book, m, now, Ask(RATE, 100, 250, in_force[m], part=1 / 3))
            assert sum(in_force.values()) <= 100 + 1e-6
    assert in_force == pytest.approx({"a": 100 / 3, "b": 100 / 3, "c": 100 / 3})


def test_a_share_moves_to_the_member_that_wants_it_once_the_other_has_taken_less() -> None:
    book = ShareBook()
    a = b = 50.0
    for period in range(3):
        [a] = ask(book, "a", period * PERIOD_MS, Ask(RATE, 100, 300, a))
        [b] = ask(book, "b", period * PERIOD_MS, Ask(RATE, 100, 300, b))
    assert (a, b) == (50, 50)
    # b's clients went quiet: its share shrinks at once, to its half of the spare
    [b] = ask(book, "b", 3 * PERIOD_MS, Ask(RATE, 100, 0, b))
    assert b == 0
    [a] = ask(book, "a", 3 * PERIOD_MS, Ask(RATE, 100, 300, a))
    assert a == 50  # b's next ask has not said it enforces the smaller share yet
    [b] = ask(book, "b", 4 * PERIOD_MS, Ask(RATE, 100, 0, b))
    [a] = ask(book, "a", 4 * PERIOD_MS, Ask(RATE, 100, 300, a))
    assert (a, b) == (100, 0)


def test_uneven_demand_gets_what_it_wants_and_the_rest_goes_to_the_big_one() -> None:
    book = ShareBook()
    in_force = {"a": 0.0, "b": 0.0, "c": 0.0}
    wants = {"a": 400.0, "b": 10.0, "c": 10.0}
    for period in range(4):
        for m in "abc":
            [in_force[m]] = ask(book, m, period * PERIOD_MS, Ask(RATE, 100, wants[m], in_force[m]))
    assert in_force == {"a": 80, "b": 10, "c": 10}


def test_a_count_held_elsewhere_is_not_handed_out_until_it_ends() -> None:
    book = ShareBook()
    [a] = ask(book, "a", 0, Ask(STREAMS, 8, 8, 8, used=8, whole=True))
    assert a == 8
    [b] = ask(book, "b", 0, Ask(STREAMS, 8, 1, 0, used=0, whole=True))
    assert b == 0  # all eight are held by a
    [a] = ask(book, "a", PERIOD_MS, Ask(STREAMS, 8, 8, 8, used=8, whole=True))
    assert a == 7  # a's fair part, while b wants one
    [b] = ask(book, "b", PERIOD_MS, Ask(STREAMS, 8, 1, 0, used=0, whole=True))
    assert b == 0  # a still holds eight
    [a] = ask(book, "a", 2 * PERIOD_MS, Ask(STREAMS, 8, 7, 7, used=7, whole=True))
    [b] = ask(book, "b", 2 * PERIOD_MS, Ask(STREAMS, 8, 1, 0, used=0, whole=True))
    assert (a, b) == (7, 1)


def test_the_first_member_to_ask_leaves_the_others_their_parts_of_the_headroom() -> None:
    # Two worker processes of a node, half the partitions each, the team's first claims on
    # both at once: the first asker once took all 255 spare claims as headroom, and the
    # second was granted none, refusing its first claim (429) until the first asked again.
    book = ShareBook()
    claims = key_of("team-a", "waiting-claims")
    [a] = ask(book, "a", 0, Ask(claims, 256, 1, 0, used=0, whole=True, part=0.5))
    [b] = ask(book, "b", 0, Ask(claims, 256, 1, 0, used=0, whole=True, part=0.5))
    assert (a, b) == (128, 128)
    # a member that does not say its part (older) has an equal part among those seen
    [c] = ask(book, "c", 0, Ask(STREAMS, 8, 1, 0, used=0, whole=True))
    assert c == 8


def test_whole_shares_of_a_small_count_never_sum_above_it() -> None:
    book = ShareBook()
    got = [ask(book, m, 0, Ask(STREAMS, 8, 5, 0, whole=True))[0] for m in "abc"]
    again = zip("abc", got, strict=True)
    got = [ask(book, m, PERIOD_MS, Ask(STREAMS, 8, 5, g, whole=True))[0] for m, g in again]
    assert all(g == int(g) for g in got)
    assert sum(got) <= 8


def test_a_silent_member_s_share_is_freed_after_the_silence() -> None:
    book = ShareBook()
    ask(book, "a", 0, Ask(RATE, 100, 300, 100))
    [b] = ask(book, "b", PERIOD_MS, Ask(RATE, 100, 300, 0))
    assert b == 0  # a enforces the whole rate
    later = PERIOD_MS + SILENT_PERIODS * PERIOD_MS + 1
    [b] = ask(book, "b", later, Ask(RATE, 100, 300, b))
    assert b == 100
    assert book.members(RATE) == 1
    book.forget_silent(later + (SILENT_PERIODS + 1) * PERIOD_MS)
    assert book.members(RATE) == 0


def test_a_member_alone_has_the_whole_limit_and_asks_nobody() -> None:
    shares = Shares()
    assert shares.alone()
    assert shares.rate(RATE, 100, 0) == 100
    assert shares.count(STREAMS, 8, 7, 0) == 8


def test_a_member_enforces_its_part_of_the_partitions_until_granted() -> None:
    shares = Shares(lambda: 2 / 6)
    assert shares.rate(RATE, 90, 0) == 30
    assert shares.count(STREAMS, 8, 0, 0) == 2  # whole: 8 x 1/3, rounded down
    asks = shares.due(PERIOD_MS)
    assert {a.key for a in asks} == {RATE, STREAMS}
    shares.granted(asks, [75.0 if a.key == RATE else 5.0 for a in asks])
    assert shares.rate(RATE, 90, PERIOD_MS) == 75
    assert shares.count(STREAMS, 8, 0, PERIOD_MS) == 5


def test_a_member_that_owns_nothing_yet_enforces_one_partition_s_part_until_granted() -> None:
    # A worker started again after a kill owns no partition until the group hands it some, and
    # the team's owner may be the member that died: nothing granted may stay unanswered for
    # seconds. Its requests are not all refused meanwhile: it counts one partition's part.
    owned = [0.0]
    shares = Shares(lambda: owned[0], least=1 / 6)
    assert not shares.alone()
    assert shares.rate(RATE, 60, 0) == 10
    assert shares.count(STREAMS, 12, 0, 0) == 2
    [streams, rate] = sorted(shares.due(PERIOD_MS), key=lambda a: a.key)
    assert (rate.part, rate.in_force) == (0.0, 10.0)  # the owner is told the true part
    assert (streams.part, streams.in_force) == (0.0, 2.0)
    owned[0] = 3 / 6  # partitions came: the default follows them
    assert shares.rate(RATE, 60, PERIOD_MS) == 30
    shares.granted([rate], [22.0])
    assert shares.rate(RATE, 60, PERIOD_MS) == 22  # and a grant replaces it
    owned[0] = 1.0  # alone: the whole rate, and the grant is gone with the others
    assert shares.rate(RATE, 60, PERIOD_MS) == 60
    owned[0] = 0.5  # another member came: the part, not a grant from before it was alone
    assert shares.rate(RATE, 60, PERIOD_MS) == 30


def test_an_ask_says_what_was_wanted_over_the_period() -> None:
    shares = Shares(lambda: 0.5)
    shares.due(0)  # the period starts
    for i in range(30):
        shares.rate(RATE, 100, i * 10)
    shares.rate(RATE, 100, 400, asked=20)  # a batch of 20 items
    shares.count(STREAMS, 8, 3, 100)
    shares.count(STREAMS, 8, 1, 200)
    shares.held(STREAMS, 2)
    by_key = {a.key: a for a in shares.due(2 * PERIOD_MS)}
    assert by_key[RATE].wanted == 25  # 50 requests over two seconds
    assert by_key[RATE].in_force == 50
    assert by_key[STREAMS].wanted == 4  # three held and one more asked
    assert by_key[STREAMS].used == 2
    assert by_key[STREAMS].whole


def test_a_limit_not_used_lately_is_asked_for_seldom_then_forgotten() -> None:
    shares = Shares(lambda: 0.5)
    shares.rate(RATE, 100, 0)
    assert [a.key for a in shares.due(PERIOD_MS)] == [RATE]
    [fell] = shares.due(2 * PERIOD_MS)  # wanted nothing: said once, for the others to take
    assert fell.wanted == 0
    assert shares.due(3 * PERIOD_MS) == []  # and not again soon
    later = (2 + IDLE_ASK_PERIODS) * PERIOD_MS
    [idle] = shares.due(later)
    assert idle.wanted == 0
    shares.due((FORGET_PERIODS + 2) * PERIOD_MS)
    assert shares.in_force(RATE) is None


def test_a_grant_for_a_changed_limit_is_not_taken() -> None:
    shares = Shares(lambda: 0.5)
    shares.rate(RATE, 100, 0)
    asks = shares.due(PERIOD_MS)
    shares.rate(RATE, 200, PERIOD_MS)  # the limits file changed under the ask
    shares.granted(asks, [10.0])
    assert shares.in_force(RATE) == 100  # the new limit's default, not the old grant


def test_a_share_that_moved_is_said_at_the_next_period_so_the_owner_can_hand_it_on() -> None:
    shares = Shares(lambda: 0.5)
    shares.rate(RATE, 100, 0)
    asks = shares.due(PERIOD_MS)
    shares.due(2 * PERIOD_MS)  # the fall to nothing wanted is said
    shares.granted(asks, [0.0])  # the owner took the share back
    [confirm] = shares.due(3 * PERIOD_MS)
    assert confirm.in_force == 0
    assert shares.due(4 * PERIOD_MS) == []


def test_a_count_without_a_grant_asks_at_once_and_tells_who_waits() -> None:
    shares = Shares(lambda: 0.5)
    woken: list[bool] = []
    told: list[str] = []
    shares.asks_now_with(lambda: woken.append(True))
    assert shares.first_grant(STREAMS, 8, 0, lambda: told.append("first"))
    assert shares.first_grant(STREAMS, 8, 0, lambda: told.append("second"))
    assert woken == [True, True]
    [first] = shares.urgent_asks()
    assert (first.key, first.wanted, first.in_force, first.whole) == (STREAMS, 1, 0, True)
    shares.granted([first], [6.0])
    assert told == ["first", "second"]
    assert shares.urgent_asks() == []
    assert not shares.first_grant(STREAMS, 8, 0, lambda: told.append("third"))  # granted
    assert shares.count(STREAMS, 8, 5, 0) == 6


def test_one_that_gave_up_waiting_is_not_told() -> None:
    shares = Shares(lambda: 0.5)
    told: list[str] = []

    def tell() -> None:
        told.append("late")

    assert shares.first_grant(STREAMS, 8, 0, tell)
    shares.stop_waiting(STREAMS, tell)
    assert shares.urgent_asks() == []
    assert not Shares().first_grant(STREAMS, 8, 0, tell)  # alone: nothing to wait for


def test_a_new_limit_keeps_the_default_parts_of_the_members_not_heard_from_yet() -> None:
    book = ShareBook()
    [a] = ask(book, "a", 0, Ask(RATE, 90, 500, 30, part=1 / 3))
    assert a == pytest.approx(30)  # b and c enforce their thirds until they ask
    [b] = ask(book, "b", 10, Ask(RATE, 90, 0, 30, part=1 / 3))
    [a] = ask(book, "a", PERIOD_MS, Ask(RATE, 90, 500, a, part=1 / 3))
    assert a == pytest.approx(30)  # b said it enforces a third: not handed on yet
    # Past the young periods, a member that never asked is taken to serve none of the team.
    later = YOUNG_PERIODS * PERIOD_MS
    [b] = ask(book, "b", later, Ask(RATE, 90, 0, b, part=1 / 3))
    [a] = ask(book, "a", later + 1, Ask(RATE, 90, 500, a, part=1 / 3))
    assert (a, b) == (pytest.approx(90 - b), pytest.approx(b))
    assert b < 90 / 3


def test_a_refused_member_grows_as_it_asks_again_and_the_other_keeps_headroom() -> None:
    book = ShareBook()
    for m in "ab":  # a holds four of eight streams, b none yet and wants four
        ask(book, m, 0, Ask(STREAMS, 8, 0, 0, whole=True))
    a, b = 4.0, 0.0
    rounds = 0
    while b < 4:  # each refusal of b asks again at once; a says what it enforces
        rounds += 1
        [a] = ask(book, "a", rounds, Ask(STREAMS, 8, 4, a, used=4, whole=True))
        wants = min(4.0, b + 1)
        [b] = ask(book, "b", rounds, Ask(STREAMS, 8, wants, b, used=b, whole=True))
        assert a + b <= 8 and a >= 4
        assert rounds < 8
    assert (a, b) == (4, 4)


def test_a_count_is_said_at_once_when_it_fell_was_refused_or_shrank() -> None:
    shares = Shares(lambda: 0.25)  # two of eight until granted
    woken: list[bool] = []
    shares.asks_now_with(lambda: woken.append(True))
    shares.count(STREAMS, 8, 0, 0)
    [ask] = shares.due(PERIOD_MS)
    shares.granted([ask], [3.0])
    assert shares.urgent_asks() == [] and woken == []  # it grew: the owner counts it already
    for holding in (1, 2, 3):
        shares.held(STREAMS, holding)
    assert woken == []
    shares.held(STREAMS, 1)  # two given up: the owner may hand them on
    [fell] = shares.urgent_asks()
    assert (fell.used, fell.in_force, len(woken)) == (1, 3, 1)
    shares.held(STREAMS, 3)
    assert shares.count(STREAMS, 8, 3, 0) == 3  # refused: one more is wanted
    [refused] = shares.urgent_asks()
    assert (refused.wanted, len(woken)) == (4, 2)
    shares.granted([refused], [2.0])  # shrank under what was in force
    [shrank] = shares.urgent_asks()
    assert (shrank.in_force, len(woken)) == (2, 3)
    assert shares.urgent_asks() == []


def test_a_first_grant_is_waited_for_a_period_at_most_then_the_default_part_holds() -> None:
    shares = Shares(lambda: 0.5)
    assert shares.first_grant(STREAMS, 8, 0, lambda: None)
    assert shares.first_grant(STREAMS, 8, PERIOD_MS - 1, lambda: None)  # still worth waiting
    assert not shares.first_grant(STREAMS, 8, PERIOD_MS, lambda: None)  # the owner is silent
    assert shares.count(STREAMS, 8, 0, PERIOD_MS) == 4
