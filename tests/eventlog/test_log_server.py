"""The local log server's group of several members, its wire and its failures.

The log port's contract runs over the socket in ``test_log_contract.py`` (the ``remote``
adapters). Here: workers sharing the partitions (eventlog/group.py) through one server over an
embedded log, as a node of several processes will. Waiting is on the log (a member's poll waits
on the server for a change of its partitions), except where a test is about time passing.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core.errors import (
    CronlogError,
    Fenced,
    LogCorrupted,
    Pruned,
    StoreDamaged,
    Unavailable,
)
from eventlog import log_wire as wire
from eventlog.embedded import EmbeddedLog
from eventlog.log_server import LogServer
from eventlog.port import Membership, PartitionWriter
from eventlog.remote import RemoteLog

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("log_worker.py")
PARTITIONS = 8
SETTLE_S = 20.0

# Round robin over the members in id order (eventlog/group.py).
TWO = {"w1": {0, 2, 4, 6}, "w2": {1, 3, 5, 7}}
THREE = {"w1": {0, 3, 6}, "w2": {1, 4, 7}, "w3": {2, 5}}


class Callbacks:
    """An ownership listener that keeps its callbacks in order and checks them as they come:
    never a partition assigned twice without a revocation between, nor revoked unowned."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.owned: set[int] = set()

    def assigned(self, partitions: list[int]) -> None:
        assert not self.owned & set(partitions), (self.owned, partitions)
        self.calls.append(("assigned", partitions))
        self.owned |= set(partitions)

    def revoked(self, partitions: list[int]) -> None:
        assert set(partitions) <= self.owned, (self.owned, partitions)
        self.calls.append(("revoked", partitions))
        self.owned -= set(partitions)


@dataclass
class Member:
    log: RemoteLog
    membership: Membership
    callbacks: Callbacks

    def owned(self) -> set[int]:
        owned = set(self.membership.owned())
        assert owned == self.callbacks.owned, "owned() and the callbacks disagree"
        return owned


@dataclass
class Parent:
    """What the node's parent process holds: the embedded log and its server."""

    log: EmbeddedLog
    server: LogServer
    path: Path
    clients: list[RemoteLog] = field(default_factory=list)

    def worker(self, member_id: str) -> RemoteLog:
        client = RemoteLog(self.path, member_id)
        self.clients.append(client)
        return client

    def member(self, member_id: str) -> Member:
        callbacks = Callbacks()
        client = self.worker(member_id)
        return Member(client, client.join(callbacks), callbacks)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Parent]]:
    """``serve(session_timeout_s=10.0)``: an embedded log of 8 partitions and its server."""
    parents: list[Parent] = []
    names = itertools.count()

    def start(session_timeout_s: float = 10.0, **segments: int) -> Parent:
        n = next(names)
        log = EmbeddedLog.open(tmp_path / f"log-{n}", PARTITIONS, **segments)
        path = tmp_path / f"log-{n}.sock"
        parent = Parent(log, LogServer(log, path, session_timeout_s=session_timeout_s), path)
        parents.append(parent)
        return parent

    yield start
    for parent in parents:
        for client in parent.clients:
            client.close()
        parent.server.close()
        parent.log.close()


def settle(members: dict[str, Member], expected: dict[str, set[int]]) -> None:
    """Poll every member until each owns what ``expected`` says (a poll returns as soon as its
    member's partitions change)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        owned = {name: m.owned() for name, m in members.items()}
        if owned == expected:
            return
        assert time.monotonic() < deadline, f"owned {owned}, expected {expected}"
        for m in members.values():
            m.membership.poll(0.05)


def poll_until_owning(member: Member, wanted: set[int], timeout_s: float = SETTLE_S) -> float:
    """Poll one member until it owns ``wanted``; how long that took."""
    began = time.monotonic()
    while member.owned() != wanted:
        assert time.monotonic() - began < timeout_s, f"owns {sorted(member.owned())}"
        member.membership.poll(0.05)
    return time.monotonic() - began


def writers_of(member: Member) -> dict[int, PartitionWriter]:
    return {p: member.membership.writer(p) for p in member.owned()}


# -- sharing ------------------------------------------------------------------------------------


def test_two_then_three_members_share_the_partitions_evenly(
    serve: Callable[..., Parent],
) -> None:
    parent = serve()
    members = {"w2": parent.member("w2"), "w1": parent.member("w1")}  # joined out of id order
    settle(members, TWO)
    assert parent.server.group.assignment() == {k: sorted(v) for k, v in TWO.items()}

    members["w3"] = parent.member("w3")
    settle(members, THREE)
    assert parent.server.group.assignment() == {k: sorted(v) for k, v in THREE.items()}
    # Each member heard of its moves alone, revocations first.
    assert members["w1"].callbacks.calls[-2:] == [("revoked", [2, 4]), ("assigned", [3])]
    assert members["w2"].callbacks.calls[-2:] == [("revoked", [3, 5]), ("assigned", [4])]
    assert members["w3"].callbacks.calls == [("assigned", [2, 5])]
    for name, m in members.items():
        for partition, writer in writers_of(m).items():
            value = f"{name} owns {partition}".encode()
            [offset] = writer.append([value])
            assert m.log.read_events(partition, offset)[0].value == value


def test_a_member_that_closes_gives_its_partitions_to_the_others(
    serve: Callable[..., Parent],
) -> None:
    parent = serve()
    members = {name: parent.member(name) for name in ("w1", "w2", "w3")}
    settle(members, THREE)
    leaving = members.pop("w2")
    kept = writers_of(leaving)
    leaving.membership.close()
    assert leaving.callbacks.owned == set()
    # w1 and w3 share everything now, round robin over the two of them.
    settle(members, {"w1": {0, 2, 4, 6}, "w3": {1, 3, 5, 7}})
    for partition, writer in kept.items():
        with pytest.raises(Fenced):
            writer.append([b"from a member that left"])
        owner = members["w1"] if partition % 2 == 0 else members["w3"]
        owner.membership.writer(partition).append([b"from its new owner"])
        assert [r.value for r in parent.log.read_events(partition, 0)] == [b"from its new owner"]


def test_a_member_that_stops_polling_is_expired_and_fenced_and_rejoins(
    serve: Callable[..., Parent],
) -> None:
    timeout_s = 0.5
    parent = serve(session_timeout_s=timeout_s)
    w1, w2 = parent.member("w1"), parent.member("w2")
    settle({"w1": w1, "w2": w2}, TWO)
    stalled = writers_of(w1)

    # w1 stops polling (a stalled worker); w2's poll wakes when w1's session runs out.
    took = poll_until_owning(w2, set(range(PARTITIONS)))
    assert took >= timeout_s * 0.5  # not before the session ran out (less what settle spent)
    # w1 has not heard, and still holds its writers: the server fences every one of them.
    assert w1.owned() == TWO["w1"]
    for partition, writer in stalled.items():
        with pytest.raises(Fenced):
            writer.append([b"from the stalled member"], commands_through=1)
        w2.membership.writer(partition).append([b"from w2"])
    assert all([r.value for r in parent.log.read_events(p, 0)] == [b"from w2"] for p in TWO["w1"])

    # Back, w1 hears it lost everything, rejoins, and the two share again.
    w1.membership.poll(0.0)
    assert ("revoked", sorted(TWO["w1"])) in w1.callbacks.calls
    settle({"w1": w1, "w2": w2}, TWO)
    for partition, writer in writers_of(w1).items():
        writer.append([b"from w1 again"])
        assert parent.log.read_events(partition, 0)[-1].value == b"from w1 again"


def test_a_new_writer_from_renew_fences_the_old(serve: Callable[..., Parent]) -> None:
    parent = serve()
    w1 = parent.member("w1")
    poll_until_owning(w1, set(range(PARTITIONS)))
    old = w1.membership.writer(3)
    new = w1.membership.renew(3)
    assert w1.membership.writer(3) is new
    with pytest.raises(Fenced):
        old.append([b"old"])
    [offset] = new.append([b"new"], commands_through=0)
    assert [r.offset for r in parent.log.read_events(3, 0)] == [offset]
    assert new.command_position() == 0


# -- worker processes ---------------------------------------------------------------------------


class Worker:
    """A worker process (``log_worker.py``), one line of stdin and stdout a command."""

    def __init__(self, path: Path, member_id: str, stderr: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with stderr.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, str(WORKER), str(path), member_id],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )

    def ask(self, line: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def own(self, partitions: set[int]) -> None:
        listed = ",".join(map(str, sorted(partitions)))
        assert self.ask(f"own {listed}") == f"owned {listed}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[[Path, str], Worker]]:
    started: list[Worker] = []

    def start(path: Path, member_id: str) -> Worker:
        worker = Worker(path, member_id, tmp_path / f"{member_id}.stderr")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def own_shares(worker: Worker, member: Member, shares: dict[str, set[int]]) -> None:
    """The worker process (w2) and the member in this process (w1) settle on ``shares``."""
    polling = threading.Thread(target=worker.own, args=(shares["w2"],))
    polling.start()
    poll_until_owning(member, shares["w1"])
    while polling.is_alive():  # keep w1 polling, so it is not expired while w2 settles
        member.membership.poll(0.05)
    polling.join()


def test_a_worker_process_that_dies_loses_its_partitions_at_once(
    serve: Callable[..., Parent], workers: Callable[[Path, str], Worker]
) -> None:
    parent = serve(session_timeout_s=60.0)  # far longer than the test: the close is what counts
    w1 = parent.member("w1")
    child = workers(parent.path, "w2")
    own_shares(child, w1, TWO)
    assert child.ask("append") == "appended 1:ok 3:ok 5:ok 7:ok"

    child.process.send_signal(signal.SIGKILL)
    child.process.wait()
    took = poll_until_owning(w1, set(range(PARTITIONS)), timeout_s=10.0)
    assert took < 10.0
    for partition in TWO["w2"]:  # w2's event stays; w1 writes after it
        offset = w1.membership.writer(partition).append([b"w1"])[0]
        records = parent.log.read_events(partition, 0)
        assert [r.value for r in records] == [b"w2:%d" % partition, b"w1"]
        assert records[-1].offset == offset


def test_a_stopped_worker_process_is_fenced_when_it_comes_back(
    serve: Callable[..., Parent], workers: Callable[[Path, str], Worker]
) -> None:
    parent = serve(session_timeout_s=0.5)
    w1 = parent.member("w1")
    child = workers(parent.path, "w2")
    own_shares(child, w1, TWO)

    child.process.send_signal(signal.SIGSTOP)
    try:
        poll_until_owning(w1, set(range(PARTITIONS)))
    finally:
        child.process.send_signal(signal.SIGCONT)
    # Its writers, from before the stop, append nothing: the server fenced them.
    assert child.ask("append") == "appended 1:fenced 3:fenced 5:fenced 7:fenced"
    assert all(parent.log.read_events(p, 0) == [] for p in TWO["w2"])
    # Polling again, it rejoins and takes its share back.
    own_shares(child, w1, TWO)
    assert child.ask("append") == "appended 1:ok 3:ok 5:ok 7:ok"


# -- commands across moves ----------------------------------------------------------------------


def test_commands_are_decided_once_across_moves(serve: Callable[..., Parent]) -> None:
    """Members decide commands as a runner does (an append per command, carrying the command
    position), a few at a time so a backlog builds, while members join and leave: every
    command is decided exactly once, and partitions were decided by more than one member."""
    parent = serve()
    errors: list[BaseException] = []

    def decide(name: str, member: Member, until: threading.Event) -> None:
        try:
            while not until.is_set():
                fenced: set[int] = set()
                for record in member.membership.poll(0.05, max_records=4):
                    if record.partition in fenced:
                        continue  # a newer owner decides the rest, from the recorded position
                    try:
                        member.membership.writer(record.partition).append(
                            [f"{name} {record.partition} {record.offset}".encode()],
                            commands_through=record.offset + 1,
                        )
                    except Fenced:
                        fenced.add(record.partition)
        except BaseException as exc:
            errors.append(exc)

    running: dict[str, tuple[Member, threading.Event, threading.Thread]] = {}

    def start(name: str) -> None:
        member, until = parent.member(name), threading.Event()
        thread = threading.Thread(target=decide, args=(name, member, until))
        running[name] = (member, until, thread)
        thread.start()

    def stop(name: str) -> Member:
        member, until, thread = running.pop(name)
        until.set()
        thread.join()
        return member

    submitter = parent.worker("api")
    submitted: set[tuple[int, int]] = set()
    decided: list[tuple[str, int, int]] = []
    positions = dict.fromkeys(range(PARTITIONS), 0)

    def submit(count: int) -> None:
        for i in range(count):
            partition = i % PARTITIONS
            submitted.add((partition, submitter.submit(partition, b"command %d" % i)))

    def wait_until_all_decided() -> None:
        deadline = time.monotonic() + 30.0
        while len(decided) < len(submitted):
            assert time.monotonic() < deadline, f"{len(decided)} of {len(submitted)} decided"
            for p in range(PARTITIONS):
                for record in parent.log.read_events(p, positions[p], timeout_s=0.01):
                    name, partition, offset = record.value.decode().split()
                    decided.append((name, int(partition), int(offset)))
                    positions[p] = record.offset + 1

    start("w1")
    start("w2")
    submit(160)
    wait_until_all_decided()
    submit(160)
    start("w3")  # six of eight partitions move, with commands waiting in them
    submit(160)
    stop("w1").membership.close()  # w1 leaves: its partitions move again
    submit(160)
    wait_until_all_decided()
    for name in list(running):
        stop(name)
    assert not errors, errors
    assert sorted((p, offset) for _, p, offset in decided) == sorted(submitted)  # each once
    deciders = {p: {name for name, q, _ in decided if q == p} for p in range(PARTITIONS)}
    assert all(len(names) >= 2 for names in deciders.values()), deciders


# -- mailboxes ------------------------------------------------------------------------------------


def test_replies_reach_a_member_whichever_member_sends_them(
    serve: Callable[..., Parent],
) -> None:
    parent = serve()
    logs = {name: parent.worker(name) for name in ("w1", "w2", "w3")}
    boxes = {name: log.mailbox(name) for name, log in logs.items()}
    for sender, log in logs.items():
        for to in logs:
            log.send_reply(to, f"{sender}->{to}".encode())
    parent.log.send_reply("w2", b"parent->w2")  # the parent's own log reaches a worker too
    for name, box in boxes.items():
        expected = {f"{sender}->{name}".encode() for sender in logs}
        if name == "w2":
            expected.add(b"parent->w2")
        got: list[bytes] = []
        deadline = time.monotonic() + 10.0
        while len(got) < len(expected):
            assert time.monotonic() < deadline, got
            got += box.poll(0.5)
        assert set(got) == expected and len(got) == len(expected)
        assert box.poll(0.1) == []


# -- errors and failures --------------------------------------------------------------------------


def test_errors_cross_the_wire_as_their_own_class(serve: Callable[..., Parent]) -> None:
    parent = serve(segment_bytes=1)  # every append seals a segment: each can be pruned
    w1 = parent.member("w1")
    poll_until_owning(w1, set(range(PARTITIONS)))
    writer = w1.membership.writer(0)
    writer.append([b"a"])
    second = writer.append([b"b"])[0]
    parent.log.prune("events", 0, second)
    with pytest.raises(Pruned) as pruned:
        w1.log.read_events(0, 0)
    assert (pruned.value.stream, pruned.value.partition, pruned.value.start) == ("events", 0, 1)
    assert "starts at offset 1" in str(pruned.value)
    with pytest.raises(ValueError, match="out of range"):
        w1.log.submit(PARTITIONS, b"nowhere")
    with pytest.raises(ValueError, match="unknown stream"):
        w1.log.end_offset("elsewhere", 0)


@pytest.mark.parametrize(
    "error",
    [
        Fenced("writer of partition 3 has epoch 4"),
        Unavailable("log server gone"),
        StoreDamaged("store of partition 2"),
        CronlogError("something"),
        LogCorrupted("damaged", stream="events", partition=2, offset=7, file="/x/000009.sst"),
        Pruned("gone", stream="commands", partition=1, start=40),
        ValueError("partition 9 is out of range"),
    ],
)
def test_the_wire_gives_back_each_error_as_it_was(error: Exception) -> None:
    again = wire.raised(wire.failure(7, error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert vars(again) == vars(error)


def test_an_error_the_client_has_no_class_for_is_still_a_cronlog_error() -> None:
    class AppendAborted(CronlogError):
        pass

    assert type(wire.raised(wire.failure(1, AppendAborted("aborted")))) is CronlogError
    failed = wire.raised(wire.failure(1, KeyError("bug")))
    assert type(failed) is CronlogError and "KeyError" in str(failed)


def test_a_server_that_is_gone_is_unavailable_never_a_hang(
    serve: Callable[..., Parent],
) -> None:
    parent = serve()
    w1 = parent.member("w1")
    poll_until_owning(w1, set(range(PARTITIONS)))
    writer = w1.membership.writer(0)
    waiting: list[BaseException] = []

    def long_read() -> None:
        try:
            w1.log.read_events(5, 0, timeout_s=60.0)
        except BaseException as exc:
            waiting.append(exc)

    reader = threading.Thread(target=long_read)
    reader.start()
    began = time.monotonic()
    parent.server.close()
    reader.join(10.0)
    assert not reader.is_alive() and isinstance(waiting[0], Unavailable)
    assert time.monotonic() - began < 10.0
    with pytest.raises(Unavailable):
        w1.log.submit(0, b"nobody listens")
    with pytest.raises(Unavailable):
        writer.append([b"nobody listens"])
    with pytest.raises(Unavailable):
        w1.membership.poll(0.1)
    assert w1.owned() == set()  # a failed poll revokes what it owned: stop deciding
    with pytest.raises(Unavailable):
        RemoteLog(parent.path, "w9")


def test_the_socket_is_private_and_a_dead_servers_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "log.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a server that died left its socket file
    stale.close()
    with EmbeddedLog.open(tmp_path / "log", 2) as log, LogServer(log, path) as server:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with pytest.raises(CronlogError, match="already serving"):
            LogServer(log, path)
        with RemoteLog(server.path, "w1") as client:
            assert client.num_partitions == 2
    assert not path.exists()
    (tmp_path / "file").write_text("not a socket")
    with EmbeddedLog.open(tmp_path / "log", 2) as log, pytest.raises(CronlogError):
        LogServer(log, tmp_path / "file")
