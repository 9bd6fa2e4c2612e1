"""The guard's answer to cronlog's "what became of this attempt?" (``RunGuard.answer``), in
both stores: every answer, and the fence a "never seen" sets (the late request refused, the
retry's newer token handled). The ASGI middleware serves it at its status path, authorized."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from cronlog_client import CronlogTargetMiddleware, Reply, RunGuard, bearer_token
from cronlog_client.target import (
    AnsweringStore,
    Decision,
    GuardStore,
    MemoryStore,
    Outcome,
    SQLiteStore,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

KEY = "team-a/pay:1000"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> GuardStore:
    if request.param == "memory":
        return MemoryStore(ttl_s=100, busy_s=50)
    return SQLiteStore(tmp_path / "guard.db", ttl_s=100, busy_s=50)


def call(token: int) -> dict[str, str]:
    return {"Idempotency-Key": KEY, "X-Cronlog-Fencing-Token": str(token)}


def ask(token: int, key: str = KEY) -> dict[str, str]:
    return {"X-Cronlog-Ask-Key": key, "X-Cronlog-Ask-Token": str(token)}


def answered(guard: RunGuard, token: int) -> tuple[str, int | None]:
    reply = guard.answer(ask(token))
    assert reply.status == 200
    body = json.loads(reply.body)
    return body["outcome"], body["status"]


def test_both_stores_can_answer(store: GuardStore) -> None:
    assert isinstance(store, AnsweringStore)


def test_never_seen_fences_the_attempt_and_the_retry_is_handled(store: GuardStore) -> None:
    guard = RunGuard(store, clock=Clock())
    assert answered(guard, 7) == ("never_seen", None)
    assert answered(guard, 7) == ("never_seen", None)  # asked again: the same, still fenced
    work: list[int] = []

    def do(token: int) -> Reply:
        def handle() -> Reply:
            work.append(token)
            return Reply.json({"paid": token})

        return guard.run(call(token), handle)

    late = do(7)  # the original request arrives after all: refused, nothing done
    assert late.status == 409 and json.loads(late.body)["error"] == "stale_fencing_token"
    assert do(3).status == 409  # an older one too
    assert do(9).status == 200 and work == [9]  # cronlog's retry, a newer token
    assert answered(guard, 7) == ("succeeded", 200)


def test_succeeded_with_the_status_it_answered(store: GuardStore) -> None:
    guard = RunGuard(store, clock=Clock())
    guard.run(call(5), lambda: Reply.json({"ok": True}, 201))
    assert answered(guard, 5) == ("succeeded", 201)


def test_a_success_too_large_to_keep_still_answers_succeeded(store: GuardStore) -> None:
    guard = RunGuard(store, clock=Clock(), max_body=4)
    guard.run(call(5), lambda: Reply(202, b"far too long to keep"))
    assert answered(guard, 5) == ("succeeded", 202)


def test_failed_when_the_handling_answered_no_success_or_raised(store: GuardStore) -> None:
    guard = RunGuard(store, clock=Clock())
    guard.run(call(5), lambda: Reply(500, b"no"))
    assert answered(guard, 5) == ("failed", None)

    def boom() -> Reply:
        raise RuntimeError("database down")

    with pytest.raises(RuntimeError):
        guard.run(call(6), boom)
    assert answered(guard, 6) == ("failed", None)


def test_in_progress_while_handled_and_unknown_once_the_handling_died(store: GuardStore) -> None:
    clock = Clock()
    guard = RunGuard(store, clock=clock)
    admission = guard.admit(call(5))
    assert admission.decision is Decision.PROCEED
    assert answered(guard, 5) == ("in_progress", None)
    clock.now += 60  # past busy_s: its process died mid-handling, it may have taken effect
    assert answered(guard, 5) == ("unknown", None)


def test_a_handling_cut_short_after_a_success_began_is_unknown(store: GuardStore) -> None:
    guard = RunGuard(store, clock=Clock())
    admission = guard.admit(call(5))
    guard.finish(admission, None, ended=None)
    assert answered(guard, 5) == ("unknown", None)


def test_an_earlier_failure_does_not_speak_for_a_later_handling(store: GuardStore) -> None:
    clock = Clock()
    guard = RunGuard(store, clock=clock)
    guard.run(call(5), lambda: Reply(503, b"busy"))
    guard.admit(call(6))  # handled, and its process died
    clock.now += 60
    assert answered(guard, 6) == ("unknown", None)


def test_a_store_that_cannot_answer_says_unknown() -> None:
    class Plain:  # a GuardStore of a team's own making, from before answers
        def __init__(self) -> None:
            self.inner = MemoryStore()

        def begin(self, key: str, token: int | None, now: float) -> tuple[Decision, Reply | None]:
            return self.inner.begin(key, token, now)

        def finish(self, key: str, reply: Reply | None, now: float) -> None:
            self.inner.finish(key, reply, now)

        def newest(self, key: str) -> int | None:
            return self.inner.newest(key)

    guard = RunGuard(Plain())
    guard.run(call(5), lambda: Reply(200, b"ok"))  # its finish is called as before
    assert answered(guard, 5) == ("unknown", None)


def test_an_ask_without_key_or_numeric_token_is_refused() -> None:
    guard = RunGuard()
    assert guard.answer({"X-Cronlog-Ask-Token": "5"}).status == 400
    assert guard.answer({"X-Cronlog-Ask-Key": KEY, "X-Cronlog-Ask-Token": "-1"}).status == 400


def test_an_sqlite_file_of_an_earlier_version_gains_the_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE runs (key TEXT PRIMARY KEY, newest INTEGER,"
            " busy_since REAL, status INTEGER, headers TEXT, body BLOB, stamp REAL)"
        )
        db.execute("INSERT INTO runs VALUES (?, 5, NULL, 200, '[]', x'6f6b', 1000.0)", (KEY,))
    guard = RunGuard(SQLiteStore(path), clock=Clock())
    assert answered(guard, 5) == ("succeeded", 200)


# -- the middleware's status path --------------------------------------------------------------


def _service(guard: RunGuard) -> tuple[CronlogTargetMiddleware, list[int]]:
    done: list[int] = []

    async def pay(request: Request) -> JSONResponse:
        done.append(int(request.headers["x-cronlog-fencing-token"]))
        return JSONResponse({"paid": True})

    async def other(request: Request) -> PlainTextResponse:
        return PlainTextResponse("the app's own route")

    app = Starlette(routes=[Route("/pay", pay, methods=["POST"]), Route("/other", other)])
    middleware = CronlogTargetMiddleware(
        app, guard, status_path="/cronlog/status", authorize=bearer_token("s3cret")
    )
    return middleware, done


@pytest.mark.anyio
async def test_the_middleware_answers_at_its_status_path_once_authorized() -> None:
    middleware, done = _service(RunGuard())
    auth = {"Authorization": "Bearer s3cret"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=middleware), base_url="http://svc"
    ) as client:
        refused = await client.get("/cronlog/status", headers=ask(7))
        assert refused.status_code == 401
        wrong = await client.get("/cronlog/status", headers={**ask(7), "Authorization": "Bearer x"})
        assert wrong.status_code == 401
        r = await client.get("/cronlog/status", headers={**ask(7), **auth})
        assert r.status_code == 200 and r.json() == {"outcome": "never_seen", "status": None}
        late = await client.post("/pay", headers={**call(7), **auth})
        assert late.status_code == 409 and done == []  # fenced: the late call does nothing
        retry = await client.post("/pay", headers={**call(8), **auth})
        assert retry.status_code == 200 and done == [8]
        r = await client.get("/cronlog/status", headers={**ask(8), **auth})
        assert r.json() == {"outcome": "succeeded", "status": 200}
        assert (await client.post("/cronlog/status", headers={**ask(8), **auth})).status_code == 405
        assert (await client.get("/other")).text == "the app's own route"


def test_a_status_path_needs_authorize() -> None:
    with pytest.raises(ValueError, match="authorize"):
        CronlogTargetMiddleware(Starlette(), status_path="/cronlog/status")


def test_outcomes_are_the_words_cronlog_reads() -> None:
    from core.events import OutcomeAnswer

    assert {o.value for o in Outcome} == {a.value for a in OutcomeAnswer} - {"no_answer"}
