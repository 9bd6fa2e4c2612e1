"""A real node's background services, under its supervisor: listed in one place and started in
that order; one whose thread ends is counted, named by readiness (``/readyz`` answers 503
saying which) while it waits for its restart, then started again and the node is ready."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.types import Receive, Scope, Send

from api.app import create_app
from eventlog.embedded import EmbeddedLog
from eventlog.port import Mailbox
from node.node import Node
from node.worker import Worker
from tests.node.test_snapshot_supervision import thread_deaths

__all__ = ["thread_deaths"]  # a fixture


class Seconds:
    """The supervisor's monotonic clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _DiesOnce:
    """A mailbox whose first poll ends the thread polling it (as a BaseException does: the
    mailbox thread retries every Exception by itself)."""

    def __init__(self, inner: Mailbox) -> None:
        self.inner = inner
        self.polls = 0

    def poll(self, timeout_s: float) -> list[bytes]:
        self.polls += 1
        if self.polls == 1:
            raise SystemExit("the mailbox thread was killed")
        return self.inner.poll(timeout_s)

    def close(self) -> None:
        self.inner.close()


class _Log:
    """The embedded log, whose mailbox kills its thread once."""

    def __init__(self, log: EmbeddedLog) -> None:
        self._log = log

    def mailbox(self, node_id: str) -> Mailbox:
        return _DiesOnce(self._log.mailbox(node_id))

    def __getattr__(self, name: str) -> object:
        return getattr(self._log, name)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EmbeddedLog]:
    with EmbeddedLog.open(tmp_path / "log", 2) as log:
        yield log


def test_the_nodes_background_services_are_listed_in_one_place_in_start_order(
    log: EmbeddedLog, tmp_path: Path
) -> None:
    node = Node(log, tmp_path / "node")
    assert [s.name for s in node.services.services] == [
        "decision-log",
        "stall-watch",
        "executors",
        "read-model",
        "history-window",
        "relay",
        "mailbox",
        "membership",
        "standby",
    ]
    required = [s.name for s in node.services.services if s.required]
    assert required == ["mailbox", "membership"]
    node.start()
    try:
        assert node.wait_ready(30)
        assert all(s.alive for s in node.services.services if s.name != "standby")
        assert node.services.watch.alive
    finally:
        node.stop()
    assert not any(s.alive for s in node.services.services)
    assert not node.services.watch.alive


@asynccontextmanager
async def _api(node: Node) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(node, {"token-a": "team-a"})
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
            yield client


def _readyz(node: Node) -> httpx.Response:
    async def ask() -> httpx.Response:
        async with _api(node) as client:
            return await client.get("/readyz")

    return anyio.run(ask)


def test_a_required_service_that_dies_is_counted_named_by_readyz_and_started_again(
    log: EmbeddedLog, tmp_path: Path, thread_deaths: list[BaseException]
) -> None:
    clock = Seconds()
    node = Node(_Log(log), tmp_path / "node", monotonic=clock)  # type: ignore[arg-type]
    [mailbox] = [s for s in node.services.services if s.name == "mailbox"]
    assert isinstance(mailbox, Worker)
    failures = node.metrics.thread_failures.labels("mailbox")
    node.start()
    try:
        assert mailbox.join(10), "the mailbox thread did not end"
        assert [type(e) for e in thread_deaths] == [SystemExit]
        assert node.wait_recovered(30)
        node.services.check()  # (or the supervisor's own pass did: the same at this instant)
        assert failures._value.get() == 1
        assert not node.ready()
        assert node.not_ready() == ["services down: mailbox (restarting)"]
        answer = _readyz(node)
        assert answer.status_code == 503
        assert answer.json()["message"] == "not ready: services down: mailbox (restarting)"
        clock.now += 1  # its backoff is over
        node.services.check()
        assert mailbox.alive and node.wait_ready(10)
        assert _readyz(node).status_code == 200
        assert failures._value.get() == 1
    finally:
        node.stop()


def test_a_thread_the_node_started_itself_is_kept_going_through_its_supervisor(
    log: EmbeddedLog, tmp_path: Path, thread_deaths: list[BaseException]
) -> None:
    """The stall watch is not required: it is started again, and readiness never waited."""
    clock = Seconds()
    node = Node(log, tmp_path / "node", monotonic=clock)
    watch = node.stall_watch
    passes = threading.Semaphore(0)
    killed = threading.Event()
    real_pass = watch._pass

    def one_pass() -> None:
        if not killed.is_set():
            killed.set()
            raise SystemExit("killed")  # not an Exception: the thread ends
        real_pass()
        passes.release()

    watch._pass = one_pass  # type: ignore[method-assign]
    node.start()
    try:
        assert killed.wait(10) and watch.join(10)
        assert node.wait_ready(30)  # not required: the node is ready all the same
        node.services.check()
        assert node.metrics.thread_failures.labels("stall-watch")._value.get() == 1
        clock.now += 1
        node.services.check()
        assert passes.acquire(timeout=10)  # the new thread makes its passes
    finally:
        node.stop()
