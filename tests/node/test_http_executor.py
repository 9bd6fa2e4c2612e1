"""One attempt's HTTP call, against a real target on loopback, and how its answer is classified.

2xx succeeds; 408, 429 and 5xx are transient (``Retry-After`` honoured); 504, a timeout or a
connection lost mid-call are ambiguous (the call may have taken effect); a target that could not
be reached is transient but not ambiguous; any other answer, redirects included, is permanent.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from core import events as ev
from core.commands import Outcome
from core.jobs import HttpTarget, JobSpec
from node.executors import Executors, Result, retry_after_ms
from tests.node.targets import LOOPBACK_ALLOWED, Target

pytestmark = pytest.mark.slow

LEASE = ev.LeaseGranted(
    at=1_000,
    job_id="report",
    tenant="team-a",
    run_id="report.60000",
    scheduled_for=60_000,
    attempt=2,
    fencing_token=7,
    worker_id="n1/executor",
    lease_expires_at=31_000,
    lateness_ms=5,
)


@pytest.fixture(scope="module")
def executors() -> Iterator[Executors]:
    ex = Executors("n1", egress=LOOPBACK_ALLOWED)
    ex.start()
    yield ex
    ex.stop()


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target().start()
    yield t
    t.stop()


def call(executors: Executors, url: str, timeout_sec: float = 5.0) -> Result:
    spec = JobSpec(
        name="report",
        tenant="team-a",
        target=HttpTarget(url=url, headers={"X-Team": "a"}),
        run_at=60_000,
        timeout_sec=timeout_sec,
        payload={"day": 1},
    )
    future = asyncio.run_coroutine_threadsafe(executors.call(LEASE, spec), executors._loop)
    return future.result(timeout=30)


def answering(target: Target, status: int, headers: dict[str, str] | None = None) -> Target:
    target.answer = lambda c: (status, headers or {}, 0.0)
    return target


def test_a_2xx_succeeds_and_the_target_sees_the_run(executors: Executors, target: Target) -> None:
    assert call(executors, answering(target, 201).url) == Result(Outcome.SUCCEEDED)
    (seen,) = target.calls
    assert seen.headers["Idempotency-Key"] == "report:60000"
    assert seen.headers["X-Cronlog-Run-Id"] == "report.60000"
    assert seen.headers["X-Cronlog-Attempt"] == "2"
    assert seen.headers["X-Cronlog-Fencing-Token"] == "7"
    assert seen.headers["X-Team"] == "a"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.body["payload"] == {"day": 1} and seen.body["attempt"] == 2
    assert seen.body["scheduled_for"] == "1970-01-01T00:01:00.000Z"


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
def test_transient_answers_are_retried(executors: Executors, target: Target, status: int) -> None:
    result = call(executors, answering(target, status).url)
    assert result.outcome is Outcome.FAILED
    assert not result.permanent and not result.ambiguous
    assert result.error.startswith(f"HTTP {status}")


def test_retry_after_in_seconds_is_honoured(executors: Executors, target: Target) -> None:
    result = call(executors, answering(target, 503, {"Retry-After": "7"}).url)
    assert result.retry_after_ms == 7000 and not result.permanent


def test_retry_after_as_an_http_date() -> None:
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    assert retry_after_ms("Mon, 30 Nov 2026 12:00:30 GMT", now) == 30_000
    assert retry_after_ms("Mon, 30 Nov 2026 11:00:00 GMT", now) == 0  # already past
    assert retry_after_ms("soon", now) is None and retry_after_ms(None, now) is None


def test_a_504_may_have_taken_effect(executors: Executors, target: Target) -> None:
    result = call(executors, answering(target, 504).url)
    assert result.ambiguous and not result.permanent


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
def test_other_4xx_are_permanent(executors: Executors, target: Target, status: int) -> None:
    result = call(executors, answering(target, status).url)
    assert result.permanent and not result.ambiguous
    assert result.error == f"HTTP {status}: ok"  # the target's body, cut to MAX_ERROR


def test_a_redirect_is_not_followed_and_is_permanent(executors: Executors, target: Target) -> None:
    result = call(executors, answering(target, 302, {"Location": target.url + "/elsewhere"}).url)
    assert result.permanent
    assert [c.path for c in target.calls] == ["/hook"]


def test_timeout_sec_is_enforced_and_the_outcome_is_unknown(
    executors: Executors, target: Target
) -> None:
    target.answer = lambda c: (200, {}, 2.0)  # slower than the job allows
    result = call(executors, target.url, timeout_sec=0.3)
    assert result.outcome is Outcome.FAILED and result.ambiguous
    assert "timed out" in result.error


def test_an_unreachable_target_never_saw_the_call(executors: Executors) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        result = call(executors, f"http://127.0.0.1:{port}/hook")
    assert result.outcome is Outcome.FAILED
    assert not result.ambiguous and not result.permanent
    assert result.error == "unreachable"
