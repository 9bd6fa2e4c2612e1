"""The live audit stream against a real ``cronlog serve`` on the embedded log, read while the
node runs: following, resuming, the operator's view, and a consumer that does not read."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from cronlog_client import Client, Event, JobDefinition, JobPatch

from tests.cli.test_serve import Serve
from tests.sdk.conftest import OPERATOR, unique

pytestmark = pytest.mark.slow
FAR = "0 0 1 1 *"  # jobs that do not fire while a test runs


def follow(client: Client, out: list[Event], started: threading.Event, **params: object) -> None:
    """Read ``client.events(follow=True)`` into ``out`` until ``max_events`` (a thread)."""
    stream = client.events(follow=True, **params)  # type: ignore[arg-type]
    started.set()
    out.extend(stream)


def test_a_follower_sees_each_event_as_it_is_decided(node: Serve, a: Client) -> None:
    job_id = unique("live")
    got: list[Event] = []
    started = threading.Event()
    # From the start of the log: nothing the job does can come before the stream looks.
    reader = threading.Thread(
        target=follow,
        args=(a, got, started),
        kwargs={"job": job_id, "max_events": 3, "start": "start"},
    )
    reader.start()
    a.put_job(job_id, JobDefinition(name="l", schedule=FAR, target="pull://live"))
    a.trigger(job_id)
    a.pause_job(job_id)
    reader.join(10)
    assert not reader.is_alive()
    assert [e.type for e in got] == ["JobRegistered", "RunMaterialised", "JobPaused"]
    assert {e.event["job_id"] for e in got} == {f"team-a/{job_id}"}
    assert all(e.cursor for e in got)


def test_resuming_from_a_cursor_or_an_instant(node: Serve, a: Client, b: Client) -> None:
    first, second = unique("resume"), unique("resume")
    a.put_job(first, JobDefinition(name="r", schedule=FAR, target="pull://r"))
    b.put_job(unique("other-team"), JobDefinition(name="o", schedule=FAR, target="pull://r"))
    mine = list(a.events(start="start"))
    assert mine and {e.event["tenant"] for e in mine} == {"team-a"}
    cursor = mine[-1].cursor
    midway = time.time()
    time.sleep(0.01)
    a.put_job(second, JobDefinition(name="r", schedule=FAR, target="pull://r"))
    after = list(a.events(cursor=cursor))
    assert [e.event["job_id"] for e in after] == [f"team-a/{second}"]
    since = list(a.events(start=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(midway))
                          + f".{int(midway % 1 * 1000):03d}Z"))  # fmt: skip
    assert [e.event["job_id"] for e in since] == [f"team-a/{second}"]
    with Client(node.url, OPERATOR) as operator:
        everyone = {e.event["tenant"] for e in operator.events(start="start")}
    assert everyone == {"team-a", "team-b"}


def test_a_consumer_that_does_not_read_stalls_nothing(node: Serve, a: Client) -> None:
    """A follower that reads nothing holds back its own stream only: the node answers, another
    follower keeps up, and the slow one, when it reads at last, has missed nothing."""
    job_id = unique("flood")
    request = (
        f"GET /v1/events?follow=true&from=start&job={job_id} HTTP/1.1\r\nHost: x\r\n"
        "Authorization: Bearer token-a\r\n\r\n"
    )
    slow = socket.create_connection(("127.0.0.1", node.port))
    slow.sendall(request.encode())
    got: list[Event] = []
    started = threading.Event()
    total = 120
    fast = threading.Thread(
        target=follow,
        args=(a, got, started),
        kwargs={"job": job_id, "max_events": total, "start": "start"},
    )
    fast.start()
    big = "x" * 60_000  # 7 MB in all: far more than the sockets' buffers hold
    a.put_job(job_id, JobDefinition(name="f", schedule=FAR, target="pull://f", payload=big))
    for i in range(total - 1):
        began = time.monotonic()
        a.patch_job(job_id, JobPatch(priority=i % 10, name=f"f{i}"))
        assert time.monotonic() - began < 2  # the node answers as ever
    fast.join(20)
    assert len(got) == total  # the other follower kept up
    # Now the slow one reads: everything is there, in order.
    slow.settimeout(10)
    buffered = b""
    deadline = time.monotonic() + 20
    while buffered.count(b"\nid: ") < total and time.monotonic() < deadline:
        buffered += slow.recv(1 << 20)
    slow.close()
    blocks = buffered.split(b"data: ")[1:]
    offsets = [int(block.split(b'"offset":')[1].split(b",")[0]) for block in blocks]
    assert len(offsets) == total and offsets == sorted(offsets)


def test_refusals(node: Serve, a: Client) -> None:
    r = httpx.get(f"{node.url}/v1/events", params={"tenant": "team-b"},
                  headers={"Authorization": "Bearer token-a"})  # fmt: skip
    assert r.status_code == 403
    r = httpx.get(f"{node.url}/v1/events", params={"cursor": "1-2-3"},
                  headers={"Authorization": "Bearer token-a"})  # fmt: skip
    assert (r.status_code, r.json()["field"]) == (422, "cursor")  # this node has 4 partitions
