"""The peer watch's rule, with the group and the probes in hand: a node whose address refuses
connections twice in a row, or answers as a later boot, has its members removed from the
group; a node that does not answer in time (paused, or its machine gone) is left to the
group's session; each node watches the next two in the ring of addresses."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading

import pytest

from node.peer_watch import (
    PROBE_S,
    REFUSED,
    GroupAdmin,
    Member,
    PeerWatch,
    _partitions_of,
    member_name,
    parse,
    probe,
    remove_process,
    watched,
)

ME = "10.0.0.1:8080"


def member(n: int, boot: str = "", worker: int = 0) -> Member:
    """A member of node ``n``, of its boot ``b<n>`` unless ``boot`` says another."""
    boot = boot or f"b{n}"
    return Member(f"m{n}-{boot}-{worker}", f"n{n}", boot, f"10.0.0.{n}:8080")


class Group:
    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.answers: dict[str, str | None] = {}
        self.asked: list[str] = []

    def ask(self, address: str) -> str | None:
        self.asked.append(address)
        return self.answers.get(address)

    def remove(self, dead: list[Member]) -> None:
        self.members = [m for m in self.members if m not in dead]

    def watch(self) -> PeerWatch:
        return PeerWatch(ME, "b1", lambda: list(self.members), self.remove, ask=self.ask)


def test_a_member_name_reads_back() -> None:
    name = member_name("n2", "0a1b", "10.0.0.2:8080")
    assert parse("m-1", name) == Member("m-1", "n2", "0a1b", "10.0.0.2:8080")
    assert parse("m-2", "rdkafka") is None  # another client in the group: never touched


def test_each_node_watches_the_next_two_addresses_in_the_ring() -> None:
    ring = ["a:1", "b:1", "c:1", "d:1", "e:1"]
    assert watched(ring, "d:1") == ["e:1", "a:1"]
    assert watched(ring, "e:1") == ["a:1", "b:1"]
    assert watched(["a:1"], "b:1") == ["a:1"]  # alone with one other: that one
    every = [address for own in ring for address in watched(ring, own)]
    assert sorted(every) == sorted(ring * 2)  # every node watched by two others


def test_a_node_refused_twice_in_a_row_loses_its_members() -> None:
    me, two, three = member(1), member(2), member(3)
    group = Group([me, two, three, member(2, worker=1)])
    group.answers = {two.address: "b2", three.address: "b3"}
    watch = group.watch()
    assert watch.round() == []  # both alive
    group.answers[two.address] = REFUSED
    assert watch.round() == []  # one refusal: not yet (a restart's instant)
    removed = watch.round()
    assert {m.member_id for m in removed} == {"m2-b2-0", "m2-b2-1"}  # both its workers
    assert group.members == [me, three]


def test_a_refusal_between_answers_is_forgiven() -> None:
    two = member(2)
    group = Group([member(1), two])
    watch = group.watch()
    group.answers = {two.address: "b2"}
    watch.round()
    group.answers = {two.address: REFUSED}
    watch.round()
    group.answers = {two.address: "b2"}
    watch.round()
    group.answers = {two.address: REFUSED}
    assert watch.round() == []


def test_a_node_started_again_loses_its_old_boots_members_only() -> None:
    old, new = member(2, "b2"), member(2, "b2-again")
    group = Group([member(1), old, new])
    group.answers = {old.address: "b2-again"}  # the node answers as its new boot
    assert group.watch().round() == [old]
    assert new in group.members


def test_a_node_starting_again_is_not_removed_before_its_port_listens() -> None:
    """A node started again joins the group before its port listens: its new boot was never
    seen answering, so refusals are not its death; the old boot, seen before, is removed."""
    old = member(2, "b2")
    group = Group([member(1), old])
    group.answers = {old.address: "b2"}
    watch = group.watch()
    watch.round()
    new = member(2, "b2-again")
    group.members.append(new)  # joined; its HTTP not up yet
    group.answers = {old.address: REFUSED}
    watch.round()
    assert watch.round() == [old]
    for _ in range(4):
        assert watch.round() == []
    assert new in group.members


def test_a_node_that_does_not_answer_is_left_to_the_session() -> None:
    paused = member(2)
    group = Group([member(1), paused])
    group.answers = {paused.address: None}  # no answer in time
    watch = group.watch()
    for _ in range(5):
        assert watch.round() == []
    assert paused in group.members


def test_this_nodes_own_members_and_unwatched_nodes_are_not_asked() -> None:
    group = Group([member(1), member(1, worker=1), member(2), member(3), member(4)])
    group.watch().round()
    assert group.asked == ["10.0.0.2:8080", "10.0.0.3:8080"]


def test_a_probe_tells_a_boot_a_refusal_and_no_answer_apart() -> None:
    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"status": "ok", "boot": "0a1b"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    silent = socket.socket()  # listens, never answers: a paused node
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    closed = socket.socket()  # bound, not listening: nothing there
    closed.bind(("127.0.0.1", 0))
    try:
        assert probe(f"127.0.0.1:{server.server_address[1]}") == "0a1b"
        assert probe(f"127.0.0.1:{closed.getsockname()[1]}") == REFUSED
        assert probe(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.2) is None
    finally:
        server.shutdown()
        server.server_close()
        silent.close()
        closed.close()


class FakeAdmin(GroupAdmin):
    """The group in hand, behind :class:`GroupAdmin`'s two calls."""

    def __init__(self, members: list[Member]) -> None:
        super().__init__("unused:9092", "g")
        self.group_members = members

    def members(self) -> list[Member]:
        return list(self.group_members)

    def remove(self, dead: list[Member]) -> None:
        self.group_members = [m for m in self.group_members if m not in dead]


def test_a_dead_worker_process_loses_its_own_members_only() -> None:
    w0 = Member("m-w0", "n1-w0", "b1", ME)
    w1 = Member("m-w1", "n1-w1", "b1", ME)
    old_w1 = Member("m-w1-old", "n1-w1", "b0", ME)  # an earlier boot's, not this parent's
    other = Member("m-n2", "n2-w1", "b2", "10.0.0.2:8080")  # another node's worker 1
    admin = FakeAdmin([w0, w1, old_w1, other])
    assert remove_process(admin, "n1-w1", "b1") == [w1]
    assert admin.group_members == [w0, old_w1, other]
    assert remove_process(admin, "n1-w1", "b1") == []  # gone already: nothing sent


def test_rounds_that_keep_failing_are_told_once_then_every_few_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker that is down fails every round, four a second: a traceback each round once
    made most of a node's log through a broker kill."""
    now = [0.0]
    down = [True]

    def members() -> list[Member]:
        if down[0]:
            raise ConnectionError("the coordinator's broker is down")
        return []

    watch = PeerWatch(
        ME, "b1", members, lambda dead: None, ask=lambda a: None, clock=lambda: now[0]
    )

    def one_round() -> None:  # as the worker's thread makes one
        try:
            watch._pass()
        except Exception:
            watch._failed()

    with caplog.at_level(logging.INFO, logger="node.peer_watch"):
        for _ in range(40):  # ten seconds of rounds, less one
            one_round()
            now[0] += PROBE_S
        told = [r for r in caplog.records if r.name == "node.peer_watch"]
        assert [(r.levelno, r.exc_info is not None) for r in told] == [(logging.ERROR, True)]
        one_round()  # ten seconds on
        assert "41 rounds in a row failed" in caplog.records[-1].getMessage()
        down[0] = False
        one_round()
    assert caplog.records[-1].getMessage() == "peer watch: rounds work again, after 41 failed"


def test_a_members_holdings_are_read_from_the_assignment_kafka_python_decodes() -> None:
    # As DescribeGroups came back from a 4.1 broker through kafka-python (a cronlog member
    # subscribes to the commands topic only); undecodable assignments stay bytes.
    assignment = {
        "assigned_partitions": [
            {"topic": "p.commands", "partitions": [0, 3]},
            {"topic": "p.other", "partitions": [1]},
        ],
        "user_data": "",
    }
    assert _partitions_of(assignment, "p.commands") == frozenset({0, 3})
    assert _partitions_of(assignment, "p.events") == frozenset()
    assert _partitions_of(b"\x00\x01", "p.commands") == frozenset()
    assert _partitions_of(None, "p.commands") == frozenset()
