"""The log port's contract (``eventlog/port.py``), run against every adapter in ``ADAPTERS``.

Nothing here assumes contiguous offsets: the memory adapter leaves gaps on purpose, as Kafka
does. Waiting is always on the log (a poll or read with a timeout), never a sleep.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest

from core.errors import Fenced
from eventlog.port import EventLog, Mailbox, Membership, Record

if TYPE_CHECKING:
    from tests.eventlog.conftest import LogFactory

OWNERSHIP_TIMEOUT_S = 30.0


class Recorder:
    """An ownership listener that remembers every callback."""

    def __init__(self) -> None:
        self.gained: list[int] = []
        self.lost: list[int] = []

    def assigned(self, partitions: list[int]) -> None:
        self.gained.extend(partitions)

    def revoked(self, partitions: list[int]) -> None:
        self.lost.extend(partitions)


def own(log: EventLog, partitions: set[int] | None = None) -> tuple[Membership, list[Record]]:
    """Join and poll until the member owns ``partitions`` (all by default).

    Returns the member and whatever commands the polls returned on the way.
    """
    wanted = set(range(log.num_partitions)) if partitions is None else partitions
    member = log.join(Recorder())
    polled: list[Record] = []
    deadline = time.monotonic() + OWNERSHIP_TIMEOUT_S
    while not wanted <= member.owned():
        assert time.monotonic() < deadline, f"never owned {sorted(wanted - member.owned())}"
        polled.extend(member.poll(0.1))
    return member, polled


def poll_exactly(member: Membership, count: int, timeout_s: float = 10.0) -> list[Record]:
    """Poll until ``count`` records came back (failing on more), then check nothing follows."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count:
        assert time.monotonic() < deadline, f"got {len(records)} of {count} commands"
        records.extend(member.poll(0.1))
    assert len(records) == count
    assert member.poll(0.2) == []
    return records


def assert_increasing(offsets: list[int]) -> None:
    assert all(a < b for a, b in itertools.pairwise(offsets)), offsets


# -- offsets and reads ----------------------------------------------------------------------


def test_command_offsets_strictly_increase_and_read_back(log_factory: LogFactory) -> None:
    log = log_factory.open()
    sent: dict[int, list[tuple[int, bytes, bytes | None]]] = defaultdict(list)
    for i in range(40):
        partition = i % log.num_partitions
        value, key = f"cmd-{i}".encode(), (f"job-{i}".encode() if i % 3 else None)
        sent[partition].append((log.submit(partition, value, key), value, key))

    for partition, expected in sent.items():
        assert_increasing([offset for offset, _, _ in expected])
        got = log.read_commands(partition, 0)
        assert [(r.offset, r.value, r.key) for r in got] == expected
        assert all(r.partition == partition for r in got)
        assert log.end_offset("commands", partition) > expected[-1][0]
        assert log.read_commands(partition, expected[-1][0] + 1) == []
        middle = expected[4][0]
        assert [r.offset for r in log.read_commands(partition, middle, max_records=3)] == [
            offset for offset, _, _ in expected[4:7]
        ]


def test_event_offsets_strictly_increase_and_read_back(log_factory: LogFactory) -> None:
    log = log_factory.open(num_partitions=2)
    member, _ = own(log)
    writer = member.writer(1)
    assert writer.partition == 1
    offsets: list[int] = []
    values: list[bytes] = []
    for size in (1, 3, 0, 5, 2):
        batch = [f"event-{len(values) + i}".encode() for i in range(size)]
        got = writer.append(batch)
        assert len(got) == size
        offsets += got
        values += batch
    assert_increasing(offsets)
    records = log.read_events(1, 0)
    assert [(r.offset, r.value) for r in records] == list(zip(offsets, values, strict=True))
    assert log.read_events(0, 0) == []
    assert log.end_offset("events", 1) > offsets[-1]
    member.close()


def test_an_append_waited_readable_is_read_by_a_read_that_does_not_wait(
    log_factory: LogFactory,
) -> None:
    log = log_factory.open(num_partitions=1)
    member, _ = own(log)
    writer = member.writer(0)
    writer.wait_until_readable()  # nothing appended: returns at once
    for i in range(3):
        offsets = writer.append([f"e{i}".encode(), f"f{i}".encode()])
        writer.wait_until_readable()
        assert [r.offset for r in log.read_events(0, offsets[0])] == offsets
    writer.append([], commands_through=None)  # appends nothing: nothing to wait for
    writer.wait_until_readable()
    member.close()


def test_reopen_keeps_every_acknowledged_record(reopenable_log_factory: LogFactory) -> None:
    log_factory = reopenable_log_factory
    log = log_factory.open()
    commands = [log.submit(2, f"c{i}".encode(), b"k") for i in range(5)]
    member, _ = own(log)
    events = member.writer(2).append([b"e0", b"e1", b"e2"])
    member.close()

    log = log_factory.restart(log)
    assert [(r.offset, r.value, r.key) for r in log.read_commands(2, 0)] == [
        (offset, f"c{i}".encode(), b"k") for i, offset in enumerate(commands)
    ]
    assert [(r.offset, r.value) for r in log.read_events(2, 0)] == list(
        zip(events, [b"e0", b"e1", b"e2"], strict=True)
    )
    assert log.submit(2, b"after") > commands[-1]
    member, _ = own(log)
    assert member.writer(2).append([b"e3"])[0] > events[-1]
    member.close()


def test_read_waits_for_an_append_and_returns_early(log_factory: LogFactory) -> None:
    log = log_factory.open()
    member, _ = own(log)
    start = log.end_offset("events", 0)
    result: list[Record] = []
    reader = threading.Thread(target=lambda: result.extend(log.read_events(0, start, 10, 20.0)))
    began = time.monotonic()
    reader.start()
    [offset] = member.writer(0).append([b"wake"])
    reader.join(timeout=20.0)
    assert [(r.offset, r.value) for r in result] == [(offset, b"wake")]
    assert time.monotonic() - began < 10.0
    member.close()


def test_read_past_the_end_times_out_empty(log_factory: LogFactory) -> None:
    log = log_factory.open()
    log.submit(0, b"only")
    end = log.end_offset("commands", 0)
    began = time.monotonic()
    assert log.read_commands(0, end, timeout_s=0.2) == []
    assert time.monotonic() - began >= 0.2
    assert log.read_events(0, 0) == []


def test_a_log_retention_has_not_touched_starts_at_its_first_record(
    log_factory: LogFactory,
) -> None:
    log = log_factory.open()
    assert log.start_offset("events", 0) == 0 and log.start_offset("commands", 1) == 0
    first = log.submit(1, b"one")
    log.submit(1, b"two")
    assert log.start_offset("commands", 1) == first  # nothing was pruned (invariant 8)
    assert [r.value for r in log.read_commands(1, log.start_offset("commands", 1))] == [
        b"one",
        b"two",
    ]


# -- one writer -------------------------------------------------------------------------------


def test_a_new_writer_fences_the_old_one(log_factory: LogFactory) -> None:
    log = log_factory.open(num_partitions=1)
    c0 = log.submit(0, b"c0")
    old, _ = own(log)
    zombie = old.writer(0)
    [first] = zombie.append([b"before"], commands_through=c0 + 1)

    # The old member stops polling, as a stalled node does; a new member takes the partition.
    new, _ = own(log)
    with pytest.raises(Fenced):
        zombie.append([b"zombie-1", b"zombie-2"], commands_through=99)
    [second] = new.writer(0).append([b"after"])

    assert [(r.offset, r.value) for r in log.read_events(0, 0)] == [
        (first, b"before"),
        (second, b"after"),
    ]
    assert new.writer(0).command_position() == c0 + 1
    with pytest.raises(Fenced):
        zombie.append([b"zombie-3"])

    # The old member learns of it on its next polls.
    deadline = time.monotonic() + OWNERSHIP_TIMEOUT_S
    while 0 in old.owned():
        assert time.monotonic() < deadline, "the old member never lost partition 0"
        old.poll(0.1)
    with pytest.raises(Fenced):
        old.writer(0)
    new.close()
    old.close()


def test_ownership_callbacks_fire_inside_poll_and_on_close(log_factory: LogFactory) -> None:
    log = log_factory.open()
    recorder = Recorder()
    member = log.join(recorder)
    assert recorder.gained == []
    deadline = time.monotonic() + OWNERSHIP_TIMEOUT_S
    while member.owned() != frozenset(range(log.num_partitions)):
        assert time.monotonic() < deadline
        member.poll(0.1)
    assert sorted(recorder.gained) == list(range(log.num_partitions))
    member.close()
    assert sorted(recorder.lost) == list(range(log.num_partitions))
    assert member.owned() == frozenset()


# -- events and command progress together ----------------------------------------------------


def test_command_position_is_stored_with_the_events(log_factory: LogFactory) -> None:
    log = log_factory.open()
    member, _ = own(log)
    commands = [log.submit(3, f"c{i}".encode()) for i in range(4)]
    assert [r.offset for r in poll_exactly(member, 4)] == commands

    writer = member.writer(3)
    assert writer.command_position() == 0
    writer.append([b"decided c0 and c1"], commands_through=commands[1] + 1)
    assert writer.command_position() == commands[1] + 1
    writer.append([], commands_through=commands[1] + 1)  # progress alone is allowed
    member.close()

    log = log_factory.restart(log)
    successor, polled = own(log)
    assert successor.writer(3).command_position() == commands[1] + 1
    resumed = polled + poll_exactly(successor, 4 - 2 - len(polled))
    assert [(r.offset, r.value) for r in resumed] == [(commands[2], b"c2"), (commands[3], b"c3")]
    assert [r.value for r in log.read_events(3, 0)] == [b"decided c0 and c1"]
    successor.close()


# -- membership poll --------------------------------------------------------------------------


def test_poll_returns_each_command_once(log_factory: LogFactory) -> None:
    log = log_factory.open()
    member, _ = own(log)
    sent = {(p, log.submit(p, f"c{p}-{i}".encode())) for i in range(5) for p in range(4)}
    got = poll_exactly(member, len(sent))
    assert {(r.partition, r.offset) for r in got} == sent
    for partition in range(4):
        assert_increasing([r.offset for r in got if r.partition == partition])

    for i in range(10):
        log.submit(i % 4, b"more")
    batch = member.poll(5.0, max_records=3)
    assert 1 <= len(batch) <= 3
    assert len(batch) + len(poll_exactly(member, 10 - len(batch))) == 10
    member.close()


def test_idle_poll_blocks_for_its_timeout(log_factory: LogFactory) -> None:
    log = log_factory.open()
    member, _ = own(log)
    began = time.monotonic()
    assert member.poll(0.3) == []
    assert time.monotonic() - began >= 0.25
    member.close()


def test_poll_returns_early_when_a_command_arrives(log_factory: LogFactory) -> None:
    log = log_factory.open()
    member, _ = own(log)
    result: list[Record] = []
    poller = threading.Thread(target=lambda: result.extend(member.poll(20.0)))
    began = time.monotonic()
    poller.start()
    offset = log.submit(1, b"wake up")
    poller.join(timeout=20.0)
    assert [(r.partition, r.offset, r.value) for r in result] == [(1, offset, b"wake up")]
    assert time.monotonic() - began < 10.0
    member.close()


# -- concurrency ------------------------------------------------------------------------------


def test_concurrent_appends_get_distinct_increasing_offsets(log_factory: LogFactory) -> None:
    log = log_factory.open()
    member, _ = own(log)
    submitters, commands_each, batches_each = 16, 40, 30
    acked: dict[tuple[str, int], dict[int, bytes]] = defaultdict(dict)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def record(stream: str, partition: int, offsets: list[int], values: list[bytes]) -> None:
        with lock:
            seen = acked[stream, partition]
            for offset, value in zip(offsets, values, strict=True):
                assert offset not in seen, f"{stream} {partition} offset {offset} given twice"
                seen[offset] = value

    def submitter(n: int) -> None:
        partition, mine = n % 4, []
        for i in range(commands_each):
            value = f"s{n}-{i}".encode()
            mine.append(log.submit(partition, value))
            record("commands", partition, mine[-1:], [value])
        assert_increasing(mine)

    def appender(partition: int) -> None:
        writer, mine = member.writer(partition), []
        for i in range(batches_each):
            values = [f"w{partition}-{i}-{j}".encode() for j in range(i % 3 + 1)]
            offsets = writer.append(values)
            mine += offsets
            record("events", partition, offsets, values)
        assert_increasing(mine)

    tailed: list[Record] = []
    total_events = sum(i % 3 + 1 for i in range(batches_each))

    def tail_events() -> None:
        position = 0
        while len(tailed) < total_events:
            got = log.read_events(0, position, 7, timeout_s=10.0)
            assert got, "the tailing reader timed out"
            tailed.extend(got)
            position = got[-1].offset + 1

    def guarded(target: object, *args: object) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)  # type: ignore[operator]
            except BaseException as exc:
                errors.append(exc)

        return threading.Thread(target=run)

    threads = [guarded(tail_events)]
    threads += [guarded(submitter, n) for n in range(submitters)]
    threads += [guarded(appender, p) for p in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60.0)
    assert not errors, errors

    for (stream, partition), seen in acked.items():
        read = log.read_commands if stream == "commands" else log.read_events
        records = read(partition, 0, max_records=10_000)
        assert {r.offset: r.value for r in records} == seen
        assert_increasing([r.offset for r in records])
    assert len(acked["events", 0]) == total_events
    # The tailing reader saw the final log, in order, while it was being written.
    assert [(r.offset, r.value) for r in tailed] == sorted(acked["events", 0].items())
    member.close()


# -- mailboxes ----------------------------------------------------------------------------------


def receive_exactly(box: Mailbox, count: int, timeout_s: float = 10.0) -> list[bytes]:
    """Poll until ``count`` replies came back (failing on more), then check nothing follows."""
    replies: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(replies) < count:
        assert time.monotonic() < deadline, f"got {len(replies)} of {count} replies"
        replies.extend(box.poll(0.1))
    assert len(replies) == count, replies
    assert box.poll(0.3) == []
    return replies


def test_a_reply_reaches_the_open_mailbox_once(log_factory: LogFactory) -> None:
    log = log_factory.open()
    box = log.mailbox("n1")
    log.send_reply("n1", b"first")
    log.send_reply("n1", b"second")
    assert receive_exactly(box, 2) == [b"first", b"second"]
    box.close()


def test_replies_to_other_nodes_do_not_arrive(log_factory: LogFactory) -> None:
    log = log_factory.open()
    box, other = log.mailbox("n1"), log.mailbox("n2")
    # Sixteen other ids: where mailboxes share partitions, some of them share n1's.
    for i in range(3, 19):
        log.send_reply(f"n{i}", b"for someone else")
    log.send_reply("n2", b"for n2")
    log.send_reply("n1", b"for n1")
    assert receive_exactly(box, 1) == [b"for n1"]
    assert receive_exactly(other, 1) == [b"for n2"]
    box.close()
    other.close()


def test_replies_sent_before_the_mailbox_opened_do_not_arrive(log_factory: LogFactory) -> None:
    log = log_factory.open()
    earlier = log.mailbox("n1")
    log.send_reply("n1", b"before")
    assert receive_exactly(earlier, 1) == [b"before"]  # it is in the log, whatever the adapter
    earlier.close()
    # The node restarts and opens its mailbox again: only what is sent from now on arrives.
    box = log.mailbox("n1")
    log.send_reply("n1", b"after")
    assert receive_exactly(box, 1) == [b"after"]
    box.close()
