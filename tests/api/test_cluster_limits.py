"""A team's limits when the node is one member of several: the requests per token and the
requests held open are this member's share of the team's limit (``core.shares``), on a fake
clock."""

from __future__ import annotations

import contextlib

import httpx
import pytest

from api.errors import ApiError
from api.held import Held
from api.limits import Limits, TenantLimits
from api.rate import NO_SHARE_WAIT_S, RequestRates
from core.shares import Shares
from tests.api.conftest import serve
from tests.api.fakes import FakeScheduler
from tests.api.test_rate import Seconds

pytestmark = pytest.mark.anyio


def test_a_member_s_bucket_is_its_share_of_the_rate_and_burst() -> None:
    shares = Shares(lambda: 0.25)  # a quarter of the partitions: a quarter until granted
    rates = RequestRates(shares)
    passed = sum(rates.take("t1", 40, 40, 0.0, "team-a") == 0.0 for _ in range(20))
    assert passed == 10  # a quarter of the burst
    assert rates.take("t1", 40, 40, 0.0, "team-a") == pytest.approx(0.1)  # 10 a second
    [ask] = shares.due(1000)
    assert ask.limit == 40 and ask.in_force == 10 and ask.wanted == 21
    shares.granted([ask], [30.0])
    # the second since was refilled at the old rate (10), the next at the new one (30)
    assert sum(rates.take("t1", 40, 40, 1.0, "team-a") == 0.0 for _ in range(40)) == 10
    assert sum(rates.take("t1", 40, 40, 2.0, "team-a") == 0.0 for _ in range(40)) == 30
    shares.granted([ask], [0.0])
    assert rates.take("t1", 40, 40, 100.0, "team-a") == NO_SHARE_WAIT_S  # none here for now


def test_the_token_is_named_to_the_owner_by_a_digest_only() -> None:
    shares = Shares(lambda: 0.5)
    RequestRates(shares).take("secret-token-value", 10, 10, 0.0, "team-a")
    [ask] = shares.due(1000)
    assert "secret-token-value" not in ask.key
    assert ask.key.startswith("team-a/requests/")


def test_a_batch_counts_each_item_as_wanted() -> None:
    shares = Shares(lambda: 0.5)
    rates = RequestRates(shares)
    assert rates.take_up_to("t1", 30, 40, 40, 0.0, "team-a") == 20
    [ask] = shares.due(1000)
    assert ask.wanted == 30


def test_a_member_holds_its_share_of_a_team_s_open_requests() -> None:
    shares = Shares(lambda: 0.5)
    held = Held(shares, clock=lambda: 0.0)
    with held.hold("event streams", "team-a", 5), held.hold("event streams", "team-a", 5):
        with pytest.raises(ApiError) as refused, held.hold("event streams", "team-a", 5):
            pass
        assert refused.value.status == 429
        assert "of the 5 it may hold across the cluster" in refused.value.body.message
        [ask] = shares.due(1000)
        assert (ask.wanted, ask.used, ask.in_force, ask.whole) == (3, 2, 2, True)
        shares.granted([ask], [4.0])
        with held.hold("event streams", "team-a", 5):
            [ask] = shares.due(2000)
            assert ask.used == 3
    [ask] = shares.due(3000)
    assert ask.used == 0  # each one that ended is said


async def test_through_the_api_a_member_refuses_past_its_share(fake: FakeScheduler) -> None:
    clock = Seconds()
    shares = Shares(lambda: 0.5)
    limits = Limits(tenants={"team-a": TenantLimits(requests_per_sec=4, request_burst=4)})
    async with serve(fake, limits=limits, clock=clock, shares=shares) as transport:
        a = httpx.AsyncClient(
            transport=transport,
            base_url="http://cronlog",
            headers={"Authorization": "Bearer token-of-team-a"},
        )
        codes = [(await a.get("/v1/jobs")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]  # half the burst of four
        asks = shares.due(round(clock.now * 1000))
        shares.granted(asks, [4.0])
        assert (await a.get("/v1/jobs")).status_code == 429  # the bucket takes the new share
        clock.now += 1.0  # a second at four a second
        codes = [(await a.get("/v1/jobs")).status_code for _ in range(5)]
        assert codes == [200, 200, 200, 200, 429]


async def test_the_first_hold_waits_for_the_node_s_share_rather_than_guessing() -> None:
    import asyncio
    import threading

    shares = Shares(lambda: 0.5)  # the default part would be 2 of 5
    held = Held(shares, clock=lambda: 0.0)

    def owner_answers() -> None:  # the asking thread, answered by the owner
        def answer() -> None:
            shares.granted(shares.urgent_asks(), [5.0])

        threading.Thread(target=answer).start()

    shares.asks_now_with(owner_answers)
    await asyncio.wait_for(held.first_share("event streams", "team-a", 5), 2.0)
    with contextlib.ExitStack() as stack:
        for _ in range(5):
            stack.enter_context(held.hold("event streams", "team-a", 5))
    await held.first_share("event streams", "team-a", 5)  # granted already: no wait


async def test_an_owner_that_does_not_answer_leaves_the_default_after_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import api.held

    monkeypatch.setattr(api.held, "FIRST_GRANT_WAIT_S", 0.05)
    shares = Shares(lambda: 0.5)
    held = Held(shares, clock=lambda: 0.0)
    await held.first_share("event streams", "team-a", 5)
    assert shares.urgent_asks() == []  # it stopped waiting
    with contextlib.ExitStack() as stack:
        for _ in range(2):
            stack.enter_context(held.hold("event streams", "team-a", 5))
        with pytest.raises(ApiError):
            held.hold("event streams", "team-a", 5).__enter__()
