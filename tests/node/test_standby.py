"""Warm standbys: a node follows partitions it does not own, and a takeover of one starts
from the follower's state, reading only the events it had not seen."""

from __future__ import annotations

from pathlib import Path

from eventlog.memory import MemoryLog
from eventlog.snapshots import MemorySnapshots
from node.standby import JOINING_KEEP_S, StandbyFollower, may_be_given, standby_targets
from projections.state_store import RocksStateStore
from tests.node.test_runner import put, started
from tests.node.test_snapshots import folded, owner_wrote


def after_last(log: MemoryLog) -> int:
    """The offset after partition 0's last event (the end may lie past a gap)."""
    return log.read_events(0, 0, 100_000)[-1].offset + 1


def test_each_partition_is_followed_by_the_owners_of_the_ones_before_it() -> None:
    assert standby_targets(frozenset({0}), 4, 1) == [1]
    assert standby_targets(frozenset({0, 1}), 4, 1) == [2]
    assert standby_targets(frozenset({3}), 4, 2) == [0, 1]
    assert standby_targets(frozenset({0, 1, 2, 3}), 4, 2) == []  # one node owns everything
    assert standby_targets(frozenset({1}), 4, 0) == []
    # Over any split of the partitions between two nodes, every partition has a standby on
    # the node that does not own it, when that node owns the partition before it.
    owners = {0: "a", 1: "b", 2: "b", 3: "a"}
    followed = {
        node: standby_targets(frozenset(p for p, o in owners.items() if o == node), 4, 1)
        for node in ("a", "b")
    }
    assert followed == {"a": [1], "b": [3]}


def test_a_takeover_of_a_followed_partition_reads_only_what_the_standby_had_not_seen(
    tmp_path: Path,
) -> None:
    log = MemoryLog(2, gaps=True)
    owner = started(log, lambda: RocksStateStore.open(tmp_path / "owner", 0))
    owned: frozenset[int] = frozenset({1})  # the standby's node owns partition 1
    follower = StandbyFollower(
        log, lambda p: RocksStateStore.open(tmp_path / "standby", p), lambda: owned, 1,
        MemorySnapshots(),
    )  # fmt: skip
    try:
        for i in range(30):
            put(owner, f"job-{i}").result(timeout=10)
        follower.follow_once()  # the first catch-up
        assert follower.following() == {0: after_last(log)}
        for i in range(30, 40):
            put(owner, f"job-{i}").result(timeout=10)
        follower.follow_once()  # folds the ten new events
        assert follower.following() == {0: after_last(log)}
        for i in range(40, 43):
            put(owner, f"job-{i}").result(timeout=10)  # not yet seen by the standby
    finally:
        owner.stop()

    owned = frozenset({0, 1})  # partition 0 moves to the standby's node
    warm = follower.hand_over(0)
    assert warm is not None and follower.following() == {}
    seen = warm.offset
    new_owner = started(log, lambda: RocksStateStore.open(tmp_path / "standby", 0), warm=warm)
    try:
        assert new_owner.deciding.wait(10)
        assert new_owner.warm_from == seen and new_owner.restored_from is None
        assert len(log.read_events(0, seen, 100)) == 3  # all the new owner read
        assert new_owner.state.snapshot() == folded(log).snapshot()
        follower.follow_once()
        assert follower.following() == {}  # owned now: not followed
    finally:
        new_owner.stop()
        follower.stop()


def test_a_partition_no_longer_followed_is_let_go(tmp_path: Path) -> None:
    log = MemoryLog(3)
    owned = frozenset({0})
    follower = StandbyFollower(
        log, lambda p: RocksStateStore.open(tmp_path / "s", p), lambda: owned, 1
    )
    try:
        follower.follow_once()
        assert set(follower.following()) == {1}
        owned = frozenset({1})
        follower.follow_once()
        assert set(follower.following()) == {2}
        # The store of partition 1 was closed: it opens again (RocksDB would refuse a second
        # opener of a store still open).
        RocksStateStore.open(tmp_path / "s", 1).close()
    finally:
        follower.stop()


# -- warm before joining -----------------------------------------------------------------------


def test_a_newcomer_may_be_given_what_nobody_holds_and_what_members_over_the_floor_hold() -> None:
    # Three members of two each, a fourth joining: each will keep 1 or 2, so any may give one;
    # one partition of each in turn.
    assert may_be_given([frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5})], 6, 4) == [
        0,
        2,
        4,
        1,
    ]
    # Partition 3 held by nobody comes first; the member at the floor (one of four over three
    # members) gives nothing.
    assert may_be_given([frozenset({0, 1}), frozenset({2})], 4, 4) == [3, 0, 1]
    # The member holding the most gives first.
    assert may_be_given([frozenset({0}), frozenset({1, 2, 3, 4, 5})], 6, 2) == [1, 2]
    # Members given nothing yet (joining too) count as members.
    assert may_be_given([frozenset({0, 1, 2, 3}), frozenset()], 4, 8) == [0, 1, 2, 3]
    assert may_be_given([frozenset({0, 1})], 2, 0) == []
    # 30 members of four partitions each, a 31st joining: its share is at most 4, and the
    # limit (twice that) bounds what it warms however many members may give.
    holdings = [frozenset(range(4 * m, 4 * m + 4)) for m in range(30)]
    got = may_be_given(holdings, 120, 8)
    assert len(got) == 8 and len(set(got)) == 8 and len({p // 4 for p in got}) == 8


def test_partitions_warmed_before_joining_are_followed_until_the_first_assignment(
    tmp_path: Path,
) -> None:
    log = MemoryLog(3, gaps=True)
    owner_wrote(log, tmp_path / "owner", 20)
    owned: frozenset[int] = frozenset()
    follower = StandbyFollower(
        log, lambda p: RocksStateStore.open(tmp_path / "joiner", p), lambda: owned, 0
    )
    try:
        assert follower.prewarm([0, 2], budget_s=30) == [0, 2]
        assert follower.following() == {0: after_last(log), 2: 0}
        follower.follow_once()  # not assigned yet: still followed, though replicas is 0
        assert set(follower.following()) == {0, 2}
        owned = frozenset({0})  # the first assignment: 0 is taken over warm, 2 let go
        warm = follower.hand_over(0)
        assert warm is not None and warm.offset == after_last(log)
        follower.follow_once()
        assert follower.following() == {}
        RocksStateStore.open(tmp_path / "joiner", 2).close()  # closed: it opens again
        warm.store.close()
    finally:
        follower.stop()


def test_partitions_warmed_before_joining_are_let_go_when_no_assignment_comes(
    tmp_path: Path,
) -> None:
    now = [100.0]
    follower = StandbyFollower(
        MemoryLog(2),
        lambda p: RocksStateStore.open(tmp_path / "joiner", p),
        frozenset,
        0,
        monotonic=lambda: now[0],
    )
    try:
        assert follower.prewarm([1], budget_s=30) == [1]
        now[0] += JOINING_KEEP_S - 1
        follower.follow_once()
        assert set(follower.following()) == {1}
        now[0] += 2
        follower.follow_once()
        assert follower.following() == {}
    finally:
        follower.stop()


def test_warming_before_joining_stops_at_its_budget(tmp_path: Path) -> None:
    now = [0.0]

    def open_store(p: int) -> RocksStateStore:
        now[0] += 10.0  # each catch-up takes 10 s of the budget
        return RocksStateStore.open(tmp_path / "joiner", p)

    follower = StandbyFollower(MemoryLog(4), open_store, frozenset, 0, monotonic=lambda: now[0])
    try:
        assert follower.prewarm([0, 1, 2, 3], budget_s=15) == [0, 1]
        assert set(follower.following()) == {0, 1}
    finally:
        follower.stop()
