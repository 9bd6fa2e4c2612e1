"""The worker's heartbeats in batches, against a node made of ``httpx.MockTransport``: beats
that come due together share a request, each answered for its run alone; a batch that could
not be sent goes again; items the node could not decide now go again in a later batch; and a
node without ``POST /v1/runs:heartbeat`` is asked one run a request, for good, said once."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import pytest
from cronlog_client import AsyncClient
from cronlog_client.beats import BEAT_TRIES, IN_FLIGHT, Answer, Beater

BATCH = "/v1/runs:heartbeat"
EXPIRES = "2026-11-01T00:00:30Z"
Item = dict[str, Any]


def extended(i: int, beat: Item) -> Item:
    return {"index": i, "status": 200, "run_id": beat["run_id"], "lease_expires_at": EXPIRES}


def refused(i: int, beat: Item, status: int, error: str, **more: Any) -> Item:
    body = {"error": error, "message": f"{error} for {beat['run_id']}", **more}
    return {"index": i, "status": status, "run_id": beat["run_id"], "error": body}


class Node:
    """Answers each batch with ``answer(index, beat)`` per item (or ``whole``, a status for the
    request itself, while any are left); notes every request's path and runs."""

    def __init__(self, answer: Callable[[int, Item], Item] = extended) -> None:
        self.answer = answer
        self.whole: list[int] = []
        self.sent: list[tuple[str, list[str]]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path != BATCH:
            run_id = path.split("/")[3]
            self.sent.append((path, [run_id]))
            return httpx.Response(200, json={"run_id": run_id, "lease_expires_at": EXPIRES})
        beats = json.loads(request.content)["runs"]
        self.sent.append((path, [b["run_id"] for b in beats]))
        if self.whole:
            status = self.whole.pop(0)
            return httpx.Response(status, json={"error": "unavailable", "message": "moving"})
        results = [self.answer(i, b) for i, b in enumerate(beats)]
        ok = sum(1 for r in results if r["status"] == 200)
        return httpx.Response(
            200, json={"results": results, "extended": ok, "failed": len(results) - ok}
        )

    @property
    def batches(self) -> list[list[str]]:
        return [runs for path, runs in self.sent if path == BATCH]

    @property
    def singles(self) -> list[str]:
        return [runs[0] for path, runs in self.sent if path != BATCH]


class NoSleep:
    """The beater's backoffs, noted and not waited (one turn of the loop)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(0)


def beating(
    node: Node,
    body: Callable[[Beater], Coroutine[Any, Any, None]],
    *,
    linger_sec: float = 0.02,
    sleep: NoSleep | None = None,
) -> None:
    """Run a beater over ``node`` while ``body`` runs; close it after."""

    async def scenario() -> None:
        transport = httpx.MockTransport(node.handle)
        async with AsyncClient("http://node", "t", transport=transport, retries=0) as client:
            beater = Beater(client, linger_sec=linger_sec, sleep=sleep or NoSleep())
            sending = asyncio.ensure_future(beater.run())
            try:
                await body(beater)
            finally:
                await asyncio.wait_for(beater.close(sending), 5)

    asyncio.run(scenario())


def far() -> float:
    """A lease that lasts the whole test."""
    return asyncio.get_running_loop().time() + 60


def test_beats_that_come_due_together_go_in_one_request_each_answered_alone() -> None:
    def answer(i: int, beat: Item) -> Item:
        if beat["run_id"] == "cancelled.1":
            return refused(i, beat, 409, "lease_lost", cancelled=True)
        if beat["run_id"] == "reclaimed.1":
            return refused(i, beat, 409, "lease_lost", cancelled=False)
        if beat["run_id"] == "gone.1":
            return refused(i, beat, 404, "not_found")
        return extended(i, beat)

    node = Node(answer)
    runs = ["a.1", "cancelled.1", "b.1", "reclaimed.1", "gone.1"]

    async def body(beater: Beater) -> None:
        answers = await asyncio.gather(*(beater.beat(r, 7, until=far()) for r in runs))
        assert answers == [
            Answer("extended"),
            Answer("lost", "lease_lost for cancelled.1", cancelled=True),
            Answer("extended"),
            Answer("lost", "lease_lost for reclaimed.1", cancelled=False),
            Answer("lost", "not_found for gone.1"),  # gone: no lease to keep
        ]
        assert beater.requests == 1

    beating(node, body)
    assert node.batches == [runs] and node.singles == []


def test_a_batch_holds_at_most_max_batch_beats_and_few_requests_are_in_flight() -> None:
    node = Node()
    in_flight: list[int] = []
    at: list[float] = []
    handle = node.handle

    async def slow(request: httpx.Request) -> httpx.Response:
        in_flight.append(1)
        assert len(in_flight) <= IN_FLIGHT  # never more at once
        at.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.01)  # others may start meanwhile, up to IN_FLIGHT
        in_flight.pop()
        return handle(request)

    node.handle = slow  # type: ignore[assignment,method-assign]

    async def body(beater: Beater) -> None:
        beater.max_batch = 3
        began = asyncio.get_running_loop().time()
        answers = await asyncio.gather(*(beater.beat(f"r{i}.1", 1, until=far()) for i in range(7)))
        assert {a.how for a in answers} == {"extended"}
        assert at[1] - began < 0.5  # full batches go at once
        assert at[1] + 0.01 <= at[2] < began + 0.5  # the rest waits for their answers only

    beating(node, body, linger_sec=0.5)
    assert [len(b) for b in node.batches] == [3, 3, 1]


def test_a_beat_with_no_request_in_flight_goes_without_the_linger() -> None:
    """Nothing in flight to wait behind: the linger (a minute here) is never waited."""
    node = Node()

    async def body(beater: Beater) -> None:
        answer = await asyncio.wait_for(beater.beat("a.1", 1, until=far()), 5)
        assert answer == Answer("extended")

    beating(node, body, linger_sec=60)
    assert node.batches == [["a.1"]]


def test_beats_due_while_a_request_is_in_flight_go_together_when_it_is_answered() -> None:
    node = Node()
    handle = node.handle
    gate: dict[str, asyncio.Event] = {}

    async def gated(request: httpx.Request) -> httpx.Response:
        if not node.batches:  # the first request waits to be let through
            gate["in"].set()
            await asyncio.wait_for(gate["out"].wait(), 5)
        return handle(request)

    node.handle = gated  # type: ignore[assignment,method-assign]

    async def body(beater: Beater) -> None:
        gate.update({"in": asyncio.Event(), "out": asyncio.Event()})
        first = asyncio.ensure_future(beater.beat("a.1", 1, until=far()))
        await asyncio.wait_for(gate["in"].wait(), 5)
        later = [asyncio.ensure_future(beater.beat(f"b{i}.1", 1, until=far())) for i in range(3)]
        for _ in range(20):  # the sender runs meanwhile, and must not send them yet
            await asyncio.sleep(0)
        assert beater.requests == 1
        gate["out"].set()
        answers = await asyncio.wait_for(asyncio.gather(first, *later), 5)  # not the linger
        assert {a.how for a in answers} == {"extended"}

    beating(node, body, linger_sec=60)
    assert node.batches == [["a.1"], ["b0.1", "b1.1", "b2.1"]]


def test_a_batch_that_could_not_be_sent_goes_again_after_a_backoff() -> None:
    node = Node()
    node.whole = [503, 429]
    sleep = NoSleep()

    async def body(beater: Beater) -> None:
        assert (await beater.beat("a.1", 1, until=far())).how == "extended"

    beating(node, body, sleep=sleep)
    assert node.batches == [["a.1"]] * 3
    assert sleep.waits == [0.25, 1.0]  # the first backoff, then the 429's own wait


def test_a_batch_never_sent_is_undelivered_after_its_tries() -> None:
    node = Node()
    node.whole = [503] * BEAT_TRIES

    async def body(beater: Beater) -> None:
        answer = await beater.beat("a.1", 1, until=far())
        assert answer.how == "undelivered" and "503" in answer.reason

    beating(node, body)
    assert len(node.batches) == BEAT_TRIES


def test_an_item_not_decided_now_goes_again_in_a_later_batch_while_its_lease_lasts() -> None:
    tries: dict[str, int] = {}

    def answer(i: int, beat: Item) -> Item:
        run_id = beat["run_id"]
        tries[run_id] = tries.get(run_id, 0) + 1
        if run_id != "ok.1" and tries[run_id] <= 2:
            return refused(i, beat, 429 if run_id == "busy.1" else 503, "later")
        return extended(i, beat)

    node = Node(answer)

    async def body(beater: Beater) -> None:
        loop = asyncio.get_running_loop()
        answers = await asyncio.gather(
            beater.beat("ok.1", 1, until=far()),
            beater.beat("busy.1", 1, until=far()),
            beater.beat("moving.1", 1, until=far()),
            beater.beat("late.1", 1, until=loop.time() + 0.1),  # its lease ends first
        )
        assert [a.how for a in answers] == ["extended", "extended", "extended", "undelivered"]
        assert "503 later" in answers[3].reason

    beating(node, body)
    assert node.batches[0] == ["ok.1", "busy.1", "moving.1", "late.1"]
    assert ["busy.1", "moving.1"] in node.batches[1:]  # again, together, after a pause
    assert tries == {"ok.1": 1, "busy.1": 3, "moving.1": 3, "late.1": 1}


def test_a_beat_whose_run_ended_is_not_sent() -> None:
    node = Node()

    async def body(beater: Beater) -> None:
        gone = asyncio.ensure_future(beater.beat("done.1", 1, until=far()))
        kept = asyncio.ensure_future(beater.beat("held.1", 1, until=far()))
        await asyncio.sleep(0)  # both wait for the linger
        gone.cancel()  # its handler finished: the run's heartbeat loop ended
        assert (await kept).how == "extended"

    beating(node, body, linger_sec=0.05)
    assert node.batches == [["held.1"]]


@pytest.mark.parametrize("status", [404, 405])
def test_a_node_without_the_endpoint_is_asked_one_run_a_request_for_good(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    def older(request: httpx.Request) -> httpx.Response:
        if request.url.path == BATCH:
            node.sent.append((BATCH, []))
            return httpx.Response(status, text="Not Found" if status == 404 else "")
        if request.url.path == "/v1/runs/lost.1/heartbeat":
            node.sent.append((request.url.path, ["lost.1"]))
            body = {"error": "lease_lost", "message": "reclaimed", "cancelled": False}
            return httpx.Response(409, json=body)
        return Node.handle(node, request)

    node = Node()
    node.handle = older  # type: ignore[method-assign]

    async def body(beater: Beater) -> None:
        first = await asyncio.gather(*(beater.beat(r, 1, until=far()) for r in ("a.1", "b.1")))
        assert [a.how for a in first] == ["extended", "extended"]  # answered, one by one
        later = await asyncio.gather(*(beater.beat(r, 1, until=far()) for r in ("a.1", "lost.1")))
        assert later == [Answer("extended"), Answer("lost", "reclaimed", cancelled=False)]
        assert beater.requests == 1

    with caplog.at_level(logging.INFO, logger="cronlog_client.worker"):
        beating(node, body)
    assert [path for path, _ in node.sent].count(BATCH) == 1  # asked once, never again
    assert sorted(node.singles) == ["a.1", "a.1", "b.1", "lost.1"]
    said = [r for r in caplog.records if "batches" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


def test_checks_the_node_holds_go_in_all_their_batches_at_once_beside_the_beats() -> None:
    """A node that holds early checks answers each batch only at the cut-off: sent through the
    queue's few requests in flight, the later batches (and every heartbeat behind them) would
    wait for the first ones' answers, so they all go at once."""
    node = Node()
    handle = node.handle
    batches = 2 * IN_FLIGHT
    events: dict[str, asyncio.Event] = {}
    in_flight: list[int] = []

    async def held(request: httpx.Request) -> httpx.Response:
        beats = json.loads(request.content)["runs"]
        if all(b.get("check") for b in beats):
            in_flight.append(1)
            if len(in_flight) == batches:
                events["all in"].set()
            await asyncio.wait_for(events["cut-off"].wait(), 5)  # held by the node
        return handle(request)

    node.handle = held  # type: ignore[assignment,method-assign]

    async def body(beater: Beater) -> None:
        events.update({"all in": asyncio.Event(), "cut-off": asyncio.Event()})
        beater.max_batch = 3
        leases = [(f"r{i}.1", 1, far()) for i in range(3 * batches)]
        checks = asyncio.ensure_future(beater.check_many(leases, held=True))
        await asyncio.wait_for(events["all in"].wait(), 5)  # every batch in flight at once
        beat = await beater.beat("running.1", 1, until=far())  # not behind the held checks
        assert beat == Answer("extended") and not checks.done()
        events["cut-off"].set()
        answers = await checks
        assert [a.how for a in answers] == ["extended"] * len(leases)

    beating(node, body)
    assert len(node.batches) == batches + 1
