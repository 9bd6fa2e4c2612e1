"""Requests per token: the bucket on a fake clock, and the API's 429 with Retry-After."""

from __future__ import annotations

import httpx
import pytest

from api.limits import Limits, TenantLimits
from api.rate import RequestRates, TokenBucket
from tests.api.conftest import serve
from tests.api.fakes import FakeScheduler

pytestmark = pytest.mark.anyio


class Seconds:
    """A fake monotonic clock in seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_worked_example_of_the_module() -> None:
    bucket = TokenBucket.full(per_sec=2, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.25) == pytest.approx(0.25)  # half a token back: half the wait left
    assert bucket.take(0.5) == 0.0
    assert bucket.take(0.5) == pytest.approx(0.5)
    # Refilled to the burst, never more.
    assert [bucket.take(100.0) for _ in range(4)][-1] == pytest.approx(0.5)


def test_a_clock_that_steps_back_refills_nothing() -> None:
    bucket = TokenBucket.full(per_sec=1, burst=1, now=10.0)
    assert bucket.take(10.0) == 0.0
    assert bucket.take(5.0) == pytest.approx(1.0)
    assert bucket.take(10.0) == pytest.approx(1.0)
    assert bucket.take(11.0) == 0.0


def test_each_token_has_its_own_bucket() -> None:
    rates = RequestRates()
    assert rates.take("t1", 1, 1, 0.0) == 0.0
    assert rates.take("t1", 1, 1, 0.0) > 0
    assert rates.take("t2", 1, 1, 0.0) == 0.0


async def test_a_token_past_its_rate_gets_429_with_retry_after(fake: FakeScheduler) -> None:
    clock = Seconds()
    limits = Limits(tenants={"team-a": TenantLimits(requests_per_sec=0.5, request_burst=2)})
    async with serve(fake, limits=limits, clock=clock) as transport:
        a = httpx.AsyncClient(
            transport=transport,
            base_url="http://cronlog",
            headers={"Authorization": "Bearer token-of-team-a"},
        )
        b = httpx.AsyncClient(
            transport=transport,
            base_url="http://cronlog",
            headers={"Authorization": "Bearer token-of-team-b"},
        )
        assert [(await a.get("/v1/jobs")).status_code for _ in range(2)] == [200, 200]
        r = await a.get("/v1/jobs")
        assert r.status_code == 429
        assert r.headers["Retry-After"] == "2"  # one token comes back in 2 s at 0.5/s
        assert r.json()["error"] == "rate_limited"
        refused = await a.post(
            "/v1/jobs", json={"name": "x", "schedule": "@daily", "target": "pull://p"}
        )
        assert refused.status_code == 429
        assert fake.events == []  # a refused request changes nothing
        # Another team's token, the probes and the document are not held back.
        assert (await b.get("/v1/jobs")).status_code == 200
        assert (await a.get("/healthz")).status_code == 200
        assert (await a.get("/openapi.json")).status_code == 200
        clock.now += 1.0
        r = await a.get("/v1/jobs")
        assert (r.status_code, r.headers["Retry-After"]) == (429, "1")
        clock.now += 1.0
        assert (await a.get("/v1/jobs")).status_code == 200
        await a.aclose()
        await b.aclose()


async def test_a_bad_token_is_401_before_any_bucket(fake: FakeScheduler) -> None:
    limits = Limits(defaults=TenantLimits(requests_per_sec=0.001, request_burst=1))
    async with serve(fake, limits=limits, clock=Seconds()) as transport:
        anon = httpx.AsyncClient(transport=transport, base_url="http://cronlog")
        for _ in range(3):
            r = await anon.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401
        await anon.aclose()
