"""A warm standby on a real broker: a member follows the partition another member owns, from
the group's assignment, and when the owner leaves, the takeover starts from the standby."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from core.clock import FakeClock
from eventlog.kafka import KafkaLog
from eventlog.port import Membership
from node.runner import PartitionRunner
from node.standby import StandbyFollower
from projections.state_store import RocksStateStore
from tests.eventlog.test_kafka_snapshot_takeover import folded
from tests.node.test_runner import START, NoExecutors, put

pytestmark = pytest.mark.kafka

TIMEOUT_S = 60.0


class Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def poll_until(members: list[Membership], done: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        for member in members:
            member.poll(0.05)


def test_the_standby_follows_the_other_members_partition_and_takes_it_over_warm(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    log = KafkaLog.open(
        kafka_bootstrap, 2, prefix=f"standby-{uuid.uuid4().hex[:12]}",
        replication_factor=-1, min_insync_replicas=None,
    )  # fmt: skip
    try:
        a = log.join(Quiet())
        poll_until([a], lambda: a.owned() == {0, 1}, "a never owned both")
        b = log.join(Quiet())
        poll_until([a, b], lambda: len(a.owned()) == 1 and len(b.owned()) == 1, "no split")
        theirs = next(iter(a.owned()))
        follower = StandbyFollower(
            log, lambda p: RocksStateStore.open(tmp_path / "b", p), b.owned, 1
        )
        owner = PartitionRunner(
            theirs, log, a.writer(theirs), lambda: RocksStateStore.open(tmp_path / "a", theirs),
            FakeClock(START), NoExecutors(),
        )  # fmt: skip
        owner.start()
        try:
            for i in range(12):
                put(owner, f"job-{i}").result(timeout=30)
            follower.follow_once()
            follower.follow_once(wait_s=1.0)
            assert set(follower.following()) == {theirs}
            put(owner, "late").result(timeout=30)  # not yet seen by the standby
        finally:
            owner.stop()
        a.close()  # the owner leaves: its partition moves to b
        poll_until([b], lambda: b.owned() == {0, 1}, "b never took the partition")
        warm = follower.hand_over(theirs)
        assert warm is not None
        new_owner = PartitionRunner(
            theirs, log, b.writer(theirs), lambda: RocksStateStore.open(tmp_path / "b", theirs),
            FakeClock(START), NoExecutors(), warm=warm,
        )  # fmt: skip
        new_owner.start()
        try:
            assert new_owner.deciding.wait(30)
            assert new_owner.warm_from == warm.offset
            assert 0 < len(log.read_events(theirs, warm.offset, 100)) <= 2  # the tail it read
            assert new_owner.state.snapshot() == folded(log, theirs).snapshot()
        finally:
            new_owner.stop()
            follower.stop()
            b.close()
    finally:
        log.close()
