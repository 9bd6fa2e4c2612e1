"""Claims that long-poll (``wait_sec``): answered when a run becomes ready, not at a poll.

The waiting is real (the event loop's), the runs are decided at the fake clock's time: a claim
waits until the read model folds a ready run of its pool. Waking at a run's later
``available_at`` is tested against a real node (``tests/sdk``), where the clocks agree.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from api.limits import Limits, TenantLimits
from tests.api.conftest import TOKENS, Api, serve
from tests.api.fakes import FakeScheduler

pytestmark = pytest.mark.anyio

JOB = {"name": "crunch", "schedule": "0 9 * * *", "target": "pull://crunchers"}
WAIT = {"pool": "crunchers", "worker_id": "w1", "wait_sec": 10}


async def test_a_waiting_claim_is_answered_when_a_run_becomes_ready(api: Api) -> None:
    await api.a.put("/v1/jobs/crunch", json=JOB)
    started = time.monotonic()
    waiting = asyncio.ensure_future(api.a.post("/v1/workers/claim", json=WAIT))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # nothing is ready: it waits
    trigger = await api.a.post("/v1/jobs/crunch/runs")
    assert trigger.status_code == 201
    answer = await asyncio.wait_for(waiting, 5)
    [run] = answer.json()["runs"]
    assert run["run_id"] == trigger.json()["run_id"]
    assert time.monotonic() - started < 2  # woken, not at the end of wait_sec


async def test_another_pool_or_team_does_not_answer_it(api: Api) -> None:
    await api.a.put("/v1/jobs/crunch", json=JOB)
    await api.b.put("/v1/jobs/crunch", json=JOB)  # team-b's pool of the same name
    await api.a.put("/v1/jobs/other", json={**JOB, "target": "pull://others"})
    body = {**WAIT, "wait_sec": 1}
    waiting = asyncio.ensure_future(api.a.post("/v1/workers/claim", json=body))
    await asyncio.sleep(0.2)
    assert (await api.b.post("/v1/jobs/crunch/runs")).status_code == 201
    assert (await api.a.post("/v1/jobs/other/runs")).status_code == 201
    started = time.monotonic()
    answer = await asyncio.wait_for(waiting, 5)
    assert answer.json() == {"runs": []}
    assert time.monotonic() - started > 0.5  # it waited out its second


async def test_with_nothing_ready_it_answers_empty_after_wait_sec(api: Api) -> None:
    started = time.monotonic()
    answer = await api.a.post("/v1/workers/claim", json={**WAIT, "wait_sec": 0.5})
    assert answer.status_code == 200 and answer.json() == {"runs": []}
    assert 0.5 <= time.monotonic() - started < 2


async def test_wait_sec_is_bounded(api: Api) -> None:
    for bad in (-1, 31, "10"):
        r = await api.a.post("/v1/workers/claim", json={**WAIT, "wait_sec": bad})
        assert r.status_code == 400 and r.json()["field"] == "wait_sec", r.text


async def test_a_team_holds_at_most_its_waiting_claims(fake: FakeScheduler) -> None:
    limits = Limits(tenants={"team-a": TenantLimits(max_waiting_claims=1)})
    async with serve(fake, limits=limits) as transport:
        import httpx

        headers = {"Authorization": f"Bearer {next(iter(TOKENS))}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://cronlog", headers=headers
        ) as a:
            first = asyncio.ensure_future(a.post("/v1/workers/claim", json={**WAIT, "wait_sec": 1}))
            await asyncio.sleep(0.2)
            second = await a.post("/v1/workers/claim", json=WAIT)
            assert second.status_code == 429, second.text
            assert second.json()["error"] == "too_many_open"
            assert second.headers["Retry-After"] == "1"
            assert (await first).status_code == 200
            # Once the first has ended, the next may wait.
            third = await a.post("/v1/workers/claim", json={**WAIT, "wait_sec": 0.1})
            assert third.status_code == 200


async def test_closing_ends_a_waiting_claim(api: Api) -> None:
    waiting = asyncio.ensure_future(api.a.post("/v1/workers/claim", json=WAIT))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    api.fake.wakeups.close()  # the server is stopping
    answer = await asyncio.wait_for(waiting, 5)
    assert answer.json() == {"runs": []}
    assert time.monotonic() - started < 1
