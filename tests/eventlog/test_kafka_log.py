"""What only the Kafka log does: group rebalances between live members, its topic checks, and
the replies topic behind the mailboxes.

The port's contract (fencing included) runs against Kafka in ``test_log_contract.py``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from core.errors import CronlogError, Fenced
from eventlog import kafka as kafka_log
from eventlog.kafka import (
    REPLY_PARTITIONS,
    REPLY_RETENTION_MS,
    SETTLE_WAIT_S,
    AppendAborted,
    KafkaLog,
    KafkaPartitionWriter,
)
from eventlog.port import Membership, Outbound, partition_for

pytestmark = pytest.mark.kafka

OWNERSHIP_TIMEOUT_S = 30.0


class Recorder:
    def __init__(self) -> None:
        self.gained: list[int] = []
        self.lost: list[int] = []

    def assigned(self, partitions: list[int]) -> None:
        self.gained.extend(partitions)

    def revoked(self, partitions: list[int]) -> None:
        self.lost.extend(partitions)


def _open(
    bootstrap: str, num_partitions: int, prefix: str | None = None, **settings: Any
) -> KafkaLog:
    return KafkaLog.open(
        bootstrap,
        num_partitions,
        prefix=prefix or f"kafkalog-{uuid.uuid4().hex[:12]}",
        replication_factor=-1,
        min_insync_replicas=None,
        **settings,
    )


def _wait_for(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + OWNERSHIP_TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _poll_until(members: list[Membership], done: object, what: str) -> None:
    deadline = time.monotonic() + OWNERSHIP_TIMEOUT_S
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        for member in members:
            member.poll(0.05)


def test_a_rebalance_hands_partitions_over_with_their_command_positions(
    kafka_bootstrap: str,
) -> None:
    log = _open(kafka_bootstrap, 4)
    try:
        first_listener = Recorder()
        first = log.join(first_listener)
        _poll_until([first], lambda: first.owned() == {0, 1, 2, 3}, "first never owned all")
        commands = {p: log.submit(p, f"c{p}".encode()) for p in range(4)}
        for p in range(4):
            first.writer(p).append([f"e{p}".encode()], commands_through=commands[p] + 1)

        # Both keep polling, as live nodes do: the group splits the partitions between them.
        second = log.join(Recorder())
        _poll_until(
            [first, second],
            lambda: second.owned() and first.owned() | second.owned() == {0, 1, 2, 3},
            "the second member never got a share",
        )
        moved = second.owned()
        assert not moved & first.owned()
        assert sorted(first_listener.lost) == sorted(moved)
        for p in moved:
            with pytest.raises(Fenced):
                first.writer(p)
            # The new owner resumes after what the old one recorded, and appends after it.
            writer = second.writer(p)
            assert writer.command_position() == commands[p] + 1
            writer.append([f"e{p}-moved".encode()])
            assert [r.value for r in log.read_events(p, 0)] == [
                f"e{p}".encode(),
                f"e{p}-moved".encode(),
            ]
        first.close()
        _poll_until([second], lambda: second.owned() == {0, 1, 2, 3}, "partitions not handed back")
        second.close()
    finally:
        log.close()


def test_an_append_commits_its_command_position_while_the_group_rebalances(
    kafka_bootstrap: str,
) -> None:
    # A member joining moves the group to a new generation in librdkafka's own thread, before
    # the other member polls and hears of it. An append in between used to send its command
    # position with the old generation, and the broker refused the commit (ILLEGAL_GENERATION):
    # aborted, on a partition that was not even moving. The position is a record of the
    # partition's own transaction now, with no offset commit to the group at all; the
    # partition's transactional id is what fences a former owner.
    log = _open(kafka_bootstrap, 4)
    stop = threading.Event()
    try:
        first = log.join(Recorder())
        _poll_until([first], lambda: first.owned() == {0, 1, 2, 3}, "first never owned all")
        commands = {p: log.submit(p, f"c{p}".encode()) for p in range(4)}
        first.writer(0).append([b"e0"], commands_through=commands[0] + 1)
        generation = first._consumer.consumer_group_metadata()  # type: ignore[attr-defined]
        second = log.join(Recorder())

        def poll_second() -> None:
            while not stop.is_set():
                second.poll(0.05)

        polling = threading.Thread(target=poll_second, daemon=True)
        polling.start()
        deadline = time.monotonic() + OWNERSHIP_TIMEOUT_S
        while first._consumer.consumer_group_metadata() == generation:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the group never moved to a new generation"
            time.sleep(0.05)
        # first has not polled since: partition 0 is still its own, its writer open
        more = log.submit(0, b"c0-more")
        first.writer(0).append([b"e0-more"], commands_through=more + 1)
        assert [r.value for r in log.read_events(0, 0)] == [b"e0", b"e0-more"]
        assert log.command_position(0) == more + 1
        stop.set()
        polling.join()
        first.close()
        second.close()
    finally:
        stop.set()
        log.close()


def test_a_log_from_before_the_positions_topic_starts_from_the_groups_offsets(
    kafka_bootstrap: str,
) -> None:
    """A log whose command positions went in as the scheduler group's offsets (before the
    positions topic) is read from the group while its positions partition has no record, and
    from the partition once an append wrote one there."""
    log = _open(kafka_bootstrap, 2)
    try:
        commands = [log.submit(0, f"c{i}".encode()) for i in range(5)]
        assert log.command_position(0) == 0 == log.command_position(1)  # nothing anywhere
        # As an owner before the positions topic left it: the group's offset of commands[0].
        old = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": log.group,
                "enable.auto.commit": False,
            }
        )
        old.commit(
            offsets=[TopicPartition(log.topics["commands"], 0, commands[2] + 1)],
            asynchronous=False,
        )
        old.close()
        assert log.command_position(0) == commands[2] + 1

        member = log.join(Recorder())
        _poll_until([member], lambda: member.owned() == {0, 1}, "never owned both")
        writer = member.writer(0)
        assert writer.command_position() == commands[2] + 1  # where the owner starts
        left: list[int] = []
        deadline = time.monotonic() + OWNERSHIP_TIMEOUT_S
        while len(left) < 2 and time.monotonic() < deadline:
            left += [r.offset for r in member.poll(0.5)]
        assert left == commands[3:]  # what is left to decide
        writer.append([b"e"], commands_through=commands[4] + 1)
        assert log.command_position(0) == commands[4] + 1  # read from positions[0] now
        assert log.command_position(1) == 0
        member.close()
    finally:
        log.close()


def test_the_position_is_the_last_committed_record_however_many_aborted_ones_follow_it(
    kafka_bootstrap: str,
) -> None:
    """Aborted transactions leave records and markers after the last committed position: the
    reader looks further back until it finds it (past ``POSITION_LOOKBACK`` here)."""
    log = _open(kafka_bootstrap, 1)
    try:
        member = log.join(Recorder())
        _poll_until([member], lambda: member.owned() == {0}, "never owned partition 0")
        command = log.submit(0, b"c")
        member.writer(0).append([b"e"], commands_through=command + 1)
        member.close()
        # A writer of the partition's transactional id that aborts every time (its positions
        # are never committed): two offsets each, a record and its abort marker.
        aborting = Producer(
            {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{log.prefix}.p0"}
        )
        aborting.init_transactions(30)
        for n in range(kafka_log.POSITION_LOOKBACK):
            aborting.begin_transaction()
            aborting.produce(
                log.topics["positions"],
                str(1000 + n).encode(),
                key=kafka_log.POSITION_KEY,  # a compacted topic takes no record without one
                partition=0,
            )
            assert aborting.flush(30) == 0  # written, then aborted (unsent ones are purged)
            aborting.abort_transaction(30)
        # the committed record is further back than the first look reaches
        assert log.end_offset("positions", 0) > kafka_log.POSITION_LOOKBACK + 2
        assert log.command_position(0) == command + 1
    finally:
        log.close()


def test_a_member_counts_the_others_through_the_reader_it_was_given(kafka_bootstrap: str) -> None:
    # A graceful stop asks whether others remain to take its partitions. librdkafka's admin
    # client can abort the process when a broker dies with such a request in flight, so a node
    # has the log count the members with kafka-python's (node.peer_watch.GroupAdmin).
    from node.peer_watch import GroupAdmin, member_name

    log = _open(kafka_bootstrap, 2)
    log.member_name = member_name("n1", "b00t", "127.0.0.1:8080")  # as cronlog serve names them
    admin = GroupAdmin(kafka_bootstrap, log.group)
    asked: list[int] = []

    def members() -> list[object]:
        asked.append(1)
        return list(admin.members())

    log.read_members_with(members)
    try:
        first = log.join(Recorder())
        _poll_until([first], lambda: first.owned() == {0, 1}, "first never owned both")
        assert first.others(2.0) == 0
        second = log.join(Recorder())
        _poll_until(
            [first, second], lambda: bool(second.owned()), "the second member never got a share"
        )
        assert first.others(2.0) == 1
        assert len(asked) == 2

        def broken() -> list[object]:
            raise RuntimeError("no coordinator")

        log.read_members_with(broken)
        assert first.others(2.0) is None  # unknown: the stop takes the cautious way
        second.close()
        first.close()
    finally:
        admin.close()
        log.close()


def test_existing_topics_must_have_the_same_partition_count(kafka_bootstrap: str) -> None:
    prefix = f"kafkalog-{uuid.uuid4().hex[:12]}"
    _open(kafka_bootstrap, 2, prefix).close()
    _open(kafka_bootstrap, 2, prefix).close()  # an existing, matching topic is fine
    with pytest.raises(CronlogError, match="has 2 partitions, the log expects 3"):
        _open(kafka_bootstrap, 3, prefix)


def test_replies_have_their_own_short_lived_topic(kafka_bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    log = _open(kafka_bootstrap, 2)
    try:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        meta = admin.list_topics(log.replies_topic, timeout=10).topics[log.replies_topic]
        assert len(meta.partitions) == REPLY_PARTITIONS
        resource = ConfigResource(ConfigResource.Type.TOPIC, log.replies_topic)
        config = admin.describe_configs([resource])[resource].result(timeout=10)
        assert config["retention.ms"].value == str(REPLY_RETENTION_MS)
        # Two node ids in one partition: each mailbox keeps only its own replies.
        a, b = "n1", next(f"n{i}" for i in range(2, 99) if partition_for(f"n{i}", 4) == 0)
        assert partition_for(a, REPLY_PARTITIONS) == partition_for(b, REPLY_PARTITIONS)
        box_a, box_b = log.mailbox(a), log.mailbox(b)
        log.send_reply(b, b"to b")
        log.send_reply(a, b"to a")
        assert box_a.poll(10.0) == [b"to a"]
        assert box_b.poll(10.0) == [b"to b"]
    finally:
        log.close()


def test_a_reader_at_the_tail_keeps_its_consumer_and_reads_only_from_where_it_stopped(
    kafka_bootstrap: str,
) -> None:
    log = _open(kafka_bootstrap, 1, None)
    try:
        member = log.join(Recorder())
        _poll_until([member], lambda: 0 in member.owned(), "never owned partition 0")
        writer = member.writer(0)
        first = writer.append([b"e0", b"e1"])
        got = log.read_events(0, 0, 100, 5.0)
        assert [r.value for r in got] == [b"e0", b"e1"]
        # It stopped at the end: its consumer stays assigned just past e1, for the next read.
        topic = log.topics["events"]
        [(parked, at)] = log._parked[(topic, 0)]
        assert at == first[-1] + 1
        second = writer.append([b"e2"])
        got = log.read_events(0, at, 100, 5.0)
        assert [(r.offset, r.value) for r in got] == [(second[0], b"e2")]
        assert log._parked[(topic, 0)] == [(parked, second[0] + 1)]  # the same consumer
        # A read from anywhere else never takes it: it starts where it is asked to.
        assert [r.value for r in log.read_events(0, first[1], 100, 5.0)] == [b"e1", b"e2"]
        assert [r.value for r in log.read_events(0, 0, 100, 5.0)] == [b"e0", b"e1", b"e2"]
        # Waiting at the tail returns nothing in time, and then the next append.
        end = second[0] + 1
        assert log.read_events(0, end, 100, 0.2) == []
        [third] = writer.append([b"e3"])
        assert [(r.offset, r.value) for r in log.read_events(0, end, 100, 5.0)] == [(third, b"e3")]
        # A read that does not wait wants everything up to the end as it is now: a consumer
        # parked at the end a moment ago cannot tell, so it is not taken (a recovery's catch-up
        # stopping short of the tail would lose events).
        assert (third + 1) in [at for _, at in log._parked[(topic, 0)]]
        [fourth] = writer.append([b"e4"])
        got = log.read_events(0, third + 1, 100)
        assert [(r.offset, r.value) for r in got] == [(fourth, b"e4")]
        member.close()
    finally:
        log.close()


def test_a_follower_waits_long_at_the_tail_yet_gets_a_commit_at_once(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower parked at the tail lets the broker hold its fetches (``TAIL_WAIT_MS``), so
    idle followers ask rarely; the broker answers the held fetch when a commit makes records
    readable, so the follower hears of an append no later. Two followers of a partition each
    keep their own consumer there. A read that does not wait uses a reader of the short wait:
    at the end, it learns so from the first empty answer."""
    wait_s = 3.0  # were the follower's fetch waited out, 3 s; a commit is heard in milliseconds
    monkeypatch.setattr(kafka_log, "TAIL_WAIT_MS", int(wait_s * 1000))
    log = _open(kafka_bootstrap, 1, None)
    try:
        member = log.join(Recorder())
        _poll_until([member], lambda: 0 in member.owned(), "never owned partition 0")
        writer = member.writer(0)
        [first] = writer.append([b"e0"])
        for _ in range(2):  # two followers from the start, each parked at the end
            assert [r.value for r in log.read_events(0, 0, 100, 5.0)] == [b"e0"]
        parked = log._parked[(log.topics["events"], 0)]
        assert [at for _, at in parked] == [first + 1] * 2
        oldest = parked[0][0]
        assert oldest is not parked[1][0]
        # A third follower parks there too: the oldest goes back to the followers' pool.
        assert [r.value for r in log.read_events(0, 0, 100, 5.0)] == [b"e0"]
        assert len(parked) == 2 and oldest not in [c for c, _ in parked]
        assert log._followers == [oldest] and oldest not in log._readers

        got: list[list[Any]] = []

        def follow() -> None:
            got.append(log.read_events(0, first + 1, 100, 15.0))

        readers = [threading.Thread(target=follow) for _ in range(2)]
        for reader in readers:
            reader.start()
        _wait_for(lambda: not parked, "the followers never took their parked consumers")
        [second] = writer.append([b"e1"])
        appended = time.monotonic()
        for reader in readers:
            reader.join(20.0)
        heard_after_s = time.monotonic() - appended
        assert [[(r.offset, r.value) for r in records] for records in got] == [
            [(second, b"e1")]
        ] * 2
        assert heard_after_s < wait_s / 2, f"heard of the commit {heard_after_s:.1f} s after"

        began = time.monotonic()
        assert log.read_events(0, second + 1, 100) == []  # at the end, not waiting
        assert time.monotonic() - began < wait_s / 2
        member.close()
    finally:
        log.close()


class Concurrent(logging.Handler):
    """Counts the requests of a transaction that the coordinator refused because the last one
    was still completing (``CONCURRENT_TRANSACTIONS``, which librdkafka's ``debug=eos`` log
    words as "another concurrent operation"): each is asked again 20 ms later (adding the
    partition) or after ``retry.backoff.ms`` (adding the command position)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "concurrent operation" in record.getMessage():
            self.refused += 1


def test_a_writer_begins_its_next_transaction_once_the_last_is_readable(
    kafka_bootstrap: str,
) -> None:
    # The node's log: appends return at the commit, before the markers are written.
    counted = Concurrent()
    librdkafka = logging.getLogger(f"librdkafka-{uuid.uuid4().hex[:6]}")
    librdkafka.addHandler(counted)
    librdkafka.setLevel(logging.DEBUG)
    librdkafka.propagate = False
    log = KafkaLog.open(
        kafka_bootstrap,
        1,
        prefix=f"kafkalog-{uuid.uuid4().hex[:12]}",
        replication_factor=-1,
        min_insync_replicas=None,
        client_config={"debug": "eos", "logger": librdkafka},
        readable_appends=False,
    )
    try:
        member = log.join(Recorder())
        _poll_until([member], lambda: 0 in member.owned(), "never owned partition 0")
        writer = member.writer(0)
        writer.wait_until_readable()  # nothing appended yet: returns at once
        for i in range(5):
            offsets = writer.append([f"e{i}".encode(), f"f{i}".encode()])
            writer.wait_until_readable()
            # Readable now: a read that does not wait reads to the stable end as it is now.
            assert [r.offset for r in log.read_events(0, offsets[0], 10)] == offsets
        # Back to back, as a busy runner appends, each with the command position it reached.
        appends = 40
        commands = [log.submit(0, f"c{i}".encode()) for i in range(appends)]
        counted.refused = 0
        for i, command in enumerate(commands):
            writer.append([f"g{i}".encode()], commands_through=command + 1)
            writer.wait_until_readable()
        # Begun once the last commit's markers were readable, few transactions were sent back
        # by the coordinator (3-5 of 40 on one local broker: some still meet it between the
        # markers and its own record of the commit); begun at once, 27 of 40 were.
        assert counted.refused <= appends // 4
        assert log.command_position(0) == commands[-1] + 1
        member.close()
    finally:
        log.close()


class Unanswered:
    """A reader whose every question about a partition's end goes unanswered (its leader gone),
    each time after the timeout it was given, which it records."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        self.timeouts.append(timeout)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no leader", retriable=True))

    def list_topics(self, topic: str, timeout: float) -> None:
        self.timeouts.append(timeout)  # the metadata asked anew goes unanswered too
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no leader", retriable=True))


def test_a_writer_waiting_for_its_last_append_asks_the_broker_no_longer_than_it_waits(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a chaos run a partition whose leader had died waited 30 s (the log's timeout) for the
    # stable end before each transaction, for minutes: the wait before a transaction only buys
    # speed, so its question to the broker has the wait's bound, not the log's.
    log = _open(kafka_bootstrap, 1, readable_appends=False)
    try:
        member = log.join(Recorder())
        _poll_until([member], lambda: 0 in member.owned(), "never owned partition 0")
        writer = member.writer(0)
        writer.append([b"e"])
        reader = Unanswered()

        @contextmanager
        def unanswered() -> Iterator[Unanswered]:
            yield reader

        monkeypatch.setattr(log, "_reader", unanswered)
        writer.wait_until_readable()
        assert reader.timeouts, "the broker was never asked"
        assert max(reader.timeouts) <= SETTLE_WAIT_S
        monkeypatch.undo()
        writer.append([b"f"])  # the writer goes on
        member.close()
    finally:
        log.close()


def test_an_append_whose_delivery_fails_is_aborted_and_nothing_of_it_is_read(
    kafka_bootstrap: str,
) -> None:
    # The broker refuses a record above the topic's max.message.bytes: the commit fails as
    # abortable, the writer aborts, and the append raises AppendAborted with nothing written.
    log = KafkaLog.open(
        kafka_bootstrap,
        1,
        prefix=f"kafkalog-{uuid.uuid4().hex[:12]}",
        replication_factor=-1,
        min_insync_replicas=None,
        topic_config={"max.message.bytes": "2000"},
        readable_appends=False,
    )
    try:
        member = log.join(Recorder())
        _poll_until([member], lambda: 0 in member.owned(), "never owned partition 0")
        writer = member.writer(0)
        [before] = writer.append([b"before"])
        with pytest.raises(AppendAborted):
            writer.append([b"small", b"x" * 5000])
        # The writer stays usable (the abort may leave one more append to bump its epoch).
        for _ in range(3):
            try:
                after = writer.append([b"after"])
                break
            except AppendAborted:
                continue
        writer.wait_until_readable()
        got = log.read_events(0, 0, 100)
        assert [(r.offset, r.value) for r in got] == [(before, b"before"), (after[0], b"after")]
        member.close()
    finally:
        log.close()


def test_records_for_others_commit_with_the_events_and_never_from_a_fenced_writer(
    kafka_bootstrap: str,
) -> None:
    """Invariant 9: an append's records for another topic are read (read_committed) exactly
    when its events are; a writer fenced by the partition's next one gets none of its records
    read, though it produced them."""
    prefix = f"kafkalog-{uuid.uuid4().hex[:12]}"
    team_topic = f"team-a.out.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(team_topic, 1, 1)])[team_topic].result(30)
    log = KafkaLog.open(
        kafka_bootstrap, 1, prefix=prefix, replication_factor=-1, min_insync_replicas=None
    )
    try:
        assert team_topic in log.topic_names(10)
        member = log.join(Recorder())
        _poll_until([member], lambda: 0 in member.owned(), "never owned partition 0")
        first = member.writer(0)

        def out(n: int) -> Outbound:
            return Outbound(team_topic, b"job", b"run-%d" % n, (("Idempotency-Key", f"k{n}"),))

        [kept] = first.append([b"completed-1"], outbound=[out(1)])
        # the partition's next writer (a new owner) fences the first
        second = KafkaPartitionWriter.open(log, 0)
        with pytest.raises(Fenced):
            first.append([b"completed-2"], outbound=[out(2)])
        [taken] = second.append([b"completed-3"], outbound=[out(3)])
        got = log.read_events(0, 0, 100)
        assert [(r.offset, r.value) for r in got] == [
            (kept, b"completed-1"),
            (taken, b"completed-3"),
        ]
        assert _committed_values(kafka_bootstrap, team_topic, 2) == [b"run-1", b"run-3"]
        second.close()
        member.close()
    finally:
        log.close()


def _committed_values(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    """The values a read_committed consumer reads from ``topic``'s partition 0, once it has
    ``expected`` of them and has reached the partition's end (nothing more behind them)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while True:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value())
                continue
            _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
            [position] = consumer.position([TopicPartition(topic, 0)])
            if len(values) >= expected and position.offset >= end:
                return values
            assert time.monotonic() < deadline, f"read {values}; at {position.offset} of {end}"
    finally:
        consumer.close()
