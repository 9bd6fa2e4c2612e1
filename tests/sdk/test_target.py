"""The target guard: honours ``Idempotency-Key`` and refuses a fencing token older than the
newest seen for the run.

The store contract runs against both stores; the middleware runs in a loopback service that
a real ``cronlog serve`` calls, where an attempt the executor gave up on is still running when
the next one arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cronlog_client import (
    Client,
    CronlogTargetMiddleware,
    JobDefinition,
    NotFound,
    Reply,
    RunGuard,
)
from cronlog_client.models import BackoffIn
from cronlog_client.target import Admission, Decision, GuardStore, MemoryStore, SQLiteStore
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.cli.test_serve import Serve
from tests.sdk.conftest import Loopback, unique


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> GuardStore:
    if request.param == "memory":
        return MemoryStore(ttl_s=100, busy_s=50)
    return SQLiteStore(tmp_path / "guard.db", ttl_s=100, busy_s=50)


def headers(token: int | None, key: str = "team-a/job:1000") -> dict[str, str]:
    out = {"Idempotency-Key": key}
    if token is not None:
        out["X-Cronlog-Fencing-Token"] = str(token)
    return out


def test_a_success_is_kept_and_answered_again_without_the_work(store: GuardStore) -> None:
    guard = RunGuard(store, clock=Clock())
    calls: list[int] = []

    def work() -> Reply:
        calls.append(1)
        return Reply.json({"done": len(calls)}, 201)

    first = guard.run(headers(5), work)
    again = guard.run(headers(6), work)  # the next attempt of the same run
    assert (first.status, first.body) == (201, b'{"done": 1}')
    assert (again.status, again.body) == (201, b'{"done": 1}') and calls == [1]
    assert (b"Idempotent-Replayed", b"true") in again.headers
    other = guard.run(headers(1, key="team-b/job:1000"), work)  # another team's run
    assert other.body == b'{"done": 2}'


def test_an_older_token_is_refused(store: GuardStore) -> None:
    guard = RunGuard(store, clock=Clock())
    failed = guard.run(headers(7), lambda: Reply(503))
    assert failed.status == 503  # a failure is not kept: the next attempt runs again
    stale = guard.run(headers(6), lambda: Reply(200))
    assert stale.status == 409 and b"stale_fencing_token" in stale.body
    assert guard.run(headers(8), lambda: Reply(204)).status == 204


def test_while_an_attempt_runs_another_is_told_to_try_again(store: GuardStore) -> None:
    clock = Clock()
    guard = RunGuard(store, clock=clock)
    running = guard.admit(headers(1))
    assert running.decision is Decision.PROCEED
    busy = guard.admit(headers(2))
    assert busy.decision is Decision.BUSY and busy.reply is not None
    assert busy.reply.status == 503 and (b"retry-after", b"1") in busy.reply.headers
    assert running.superseded()  # a newer attempt arrived: the running one should not commit
    guard.finish(running, Reply(200, b"first"))
    replayed = guard.admit(headers(3))
    assert replayed.decision is Decision.REPLAY
    assert replayed.reply is not None and replayed.reply.body == b"first"


def test_an_abandoned_handling_and_an_old_answer_expire(store: GuardStore) -> None:
    clock = Clock()
    guard = RunGuard(store, clock=clock)
    assert guard.admit(headers(1)).decision is Decision.PROCEED  # its process then died
    clock.now += 51
    later = guard.admit(headers(2))
    assert later.decision is Decision.PROCEED
    guard.finish(later, Reply(200, b"kept"))
    clock.now += 101
    assert guard.admit(headers(3)).decision is Decision.PROCEED  # forgotten after the ttl


def test_requests_without_a_key_pass_and_a_bad_token_is_a_400() -> None:
    guard = RunGuard()
    assert guard.admit({}).decision is Decision.UNTRACKED
    assert guard.run({}, lambda: Reply(200, b"x")).body == b"x"
    bad = guard.admit({"idempotency-key": "k", "x-cronlog-fencing-token": "7; drop"})
    assert bad.decision is Decision.INVALID and bad.reply is not None and bad.reply.status == 400


def test_the_coroutine_form() -> None:
    guard = RunGuard()

    async def work() -> Reply:
        return Reply(202, b"queued")

    async def both() -> tuple[Reply, Reply]:
        return await guard.arun(headers(1), work), await guard.arun(headers(1), work)

    first, second = asyncio.run(both())
    assert first.body == second.body == b"queued"


# -- against the real executor -------------------------------------------------------------------


class Ledger:
    """The target service's side effects, and when each attempt came in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charges: list[str] = []
        self.arrivals: list[tuple[int, float]] = []  # (fencing token, time)


def billing_app(ledger: Ledger, slow_first_s: float) -> Starlette:
    async def charge(request: Request) -> JSONResponse:
        token = int(request.headers["X-Cronlog-Fencing-Token"])
        body = await request.json()
        with ledger.lock:
            first = not ledger.arrivals
            ledger.arrivals.append((token, time.time()))
        if first:
            await asyncio.sleep(slow_first_s)  # the first attempt outlives the job's timeout
        admission: Admission = request.scope["cronlog.run"]
        with ledger.lock:
            ledger.charges.append(body["run_id"])
        return JSONResponse({"charged": body["run_id"], "superseded": admission.superseded()})

    app = Starlette(routes=[Route("/charge", charge, methods=["POST"])])
    return CronlogTargetMiddleware(app)  # type: ignore[return-value]


@pytest.fixture
def service() -> Iterator[tuple[Ledger, Loopback]]:
    ledger = Ledger()
    server = Loopback(billing_app(ledger, slow_first_s=2.5))
    yield ledger, server
    server.stop()


@pytest.mark.slow
def test_an_attempt_the_executor_gave_up_on_is_not_done_twice(
    node: Serve, a: Client, service: tuple[Ledger, Loopback]
) -> None:
    """Attempt 1 times out at cronlog (1 s) but goes on in the service; attempt 2 arrives
    while it runs and is told to try again; attempt 3 gets attempt 1's answer. One charge."""
    ledger, server = service
    job_id = unique("charge")
    slot = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=1)
    a.put_job(
        job_id,
        JobDefinition(
            name="charge",
            run_at=slot,
            target=f"{server.url}/charge",
            timeout_sec=1,
            retries=5,
            backoff=BackoffIn(base_sec=0.5, factor=1, jitter=False),
        ),
    )
    run_id = f"{job_id}.{int(slot.timestamp() * 1000)}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # a separate process: read until the run is done
        with contextlib.suppress(NotFound):  # not before its slot
            if a.get_run(run_id).state == "succeeded":
                break
        time.sleep(0.1)
    run = a.get_run(run_id)
    assert run.state == "succeeded", run
    assert ledger.charges == [run_id]  # the work was done once
    outcomes = [(x.attempt, x.outcome, x.error[:8]) for x in run.attempts]
    assert outcomes[0] == (1, "failed", "timed ou")  # cronlog gave attempt 1 up
    assert outcomes[1][1:] == ("failed", "HTTP 503")  # attempt 2: "in progress, try again"
    assert outcomes[-1][1] == "succeeded"  # attempt 1's kept answer
    tokens = [token for token, _ in ledger.arrivals]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    # A late copy of attempt 1 (a proxy's retry, say) is refused: a newer attempt exists.
    late = httpx.post(
        f"{server.url}/charge",
        json={"run_id": run_id},
        headers={
            "Idempotency-Key": f"team-a/{job_id}:{int(slot.timestamp() * 1000)}",
            "X-Cronlog-Fencing-Token": str(tokens[0]),
        },
    )
    assert late.status_code == 409 and ledger.charges == [run_id]
