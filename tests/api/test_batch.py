"""POST /v1/jobs:batch: each item answered as POST /v1/jobs would answer it, the request's own
shape and size checked, the team's rate and quota counted item by item, and replays safe."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from api.batch import MAX_BATCH_JOBS
from api.limits import Limits, TenantLimits
from tests.api.conftest import ANY_TOPIC, Api, serve
from tests.api.fakes import FakeScheduler

pytestmark = pytest.mark.anyio

JOB = {"name": "report", "schedule": "0 9 * * 1-5", "target": "pull://reports"}


def job(**fields: Any) -> dict[str, Any]:
    return {**JOB, **fields}


@asynccontextmanager
async def team_a(fake: FakeScheduler, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serve(fake, egress=ANY_TOPIC, **options) as transport,
        httpx.AsyncClient(
            transport=transport,
            base_url="http://cronlog",
            headers={"Authorization": "Bearer token-of-team-a"},
        ) as client,
    ):
        yield client


async def post(client: httpx.AsyncClient, body: Any) -> httpx.Response:
    return await client.post("/v1/jobs:batch", json=body)


async def test_each_item_is_answered_as_a_single_create_would_be(api: Api) -> None:
    await api.a.post("/v1/jobs", json=job(job_id="there"))
    response = await post(
        api.a,
        {
            "jobs": [
                job(job_id="new"),
                job(job_id="there"),  # the same definition again
                job(job_id="there", name="another"),  # another definition
                job(schedule="61 * * * *"),
                job(retries="three"),
                "not an object",
                job(target="http://169.254.169.254/latest"),  # outside the egress policy
            ]
        },
    )
    assert response.status_code == 200
    out = response.json()
    statuses = [r["status"] for r in out["results"]]
    assert statuses == [201, 200, 409, 422, 400, 400, 422]
    assert [r["index"] for r in out["results"]] == list(range(7))
    fields = [r.get("error", {}).get("field") for r in out["results"]]
    assert fields == [
        None,
        None,
        "jobs[2]",
        "jobs[3].schedule",
        "jobs[4].retries",
        "jobs[5]",
        "jobs[6].target",
    ]
    assert (out["created"], out["existing"], out["failed"]) == (1, 1, 5)
    assert out["results"][0]["job_id"] == "new" and out["results"][0]["version"] == 1
    # What a single create answers for the same item, the batch answers in its result.
    single = await api.a.post("/v1/jobs", json=job(schedule="61 * * * *"))
    assert single.status_code == 422
    assert single.json()["message"] == out["results"][3]["error"]["message"]
    assert (await api.a.get("/v1/jobs/new")).json()["name"] == "report"
    assert (await api.a.get("/v1/jobs/there")).json()["name"] == "report"


async def test_a_bad_item_changes_nothing_and_the_good_ones_are_created(api: Api) -> None:
    before = len(api.fake.events)
    out = (await post(api.a, {"jobs": [job(schedule="nope"), job(job_id="ok")]})).json()
    assert [r["status"] for r in out["results"]] == [422, 201]
    listed = (await api.a.get("/v1/jobs")).json()["jobs"]
    assert [j["job_id"] for j in listed] == ["ok"]
    assert len(api.fake.events) > before


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"jobs": []}, 400, "jobs"),
        ({"jobs": {"name": "x"}}, 400, "jobs"),
        ([JOB], 400, None),
        ({"jobs": [JOB], "extra": 1}, 400, "extra"),
        ({"jobs": [JOB], "idempotency_key": "k" * 241}, 400, "idempotency_key"),
        ({"jobs": [JOB] * (MAX_BATCH_JOBS + 1)}, 400, "jobs"),
    ],
)
async def test_a_request_that_is_not_a_batch_is_refused_whole(
    api: Api, body: Any, status: int, field: str | None
) -> None:
    before = api.everything()
    response = await post(api.a, body)
    assert response.status_code == status, response.text
    assert response.json().get("field") == field
    assert api.everything() == before


async def test_the_most_jobs_a_batch_holds_are_accepted(fake: FakeScheduler) -> None:
    limits = Limits(defaults=TenantLimits(requests_per_sec=10_000, request_burst=10_000))
    async with team_a(fake, limits=limits) as a:
        out = (await post(a, {"jobs": [JOB] * MAX_BATCH_JOBS})).json()
    assert out["created"] == MAX_BATCH_JOBS
    assert len({r["job_id"] for r in out["results"]}) == MAX_BATCH_JOBS


async def test_a_batch_key_makes_the_batch_safe_to_send_again(api: Api) -> None:
    body = {"idempotency_key": "migration-1", "jobs": [job(), job(name="b"), job(job_id="c")]}
    first = (await post(api.a, body)).json()
    assert [r["status"] for r in first["results"]] == [201, 201, 201]
    events = len(api.fake.events)
    again = (await post(api.a, body)).json()
    assert [r["status"] for r in again["results"]] == [200, 200, 200]
    assert [r["job_id"] for r in again["results"]] == [r["job_id"] for r in first["results"]]
    assert len(api.fake.events) == events
    # Another team's batch with the same key names its own jobs.
    other = (await post(api.b, body)).json()
    assert [r["status"] for r in other["results"]] == [201, 201, 201]


async def test_the_same_job_twice_in_a_batch_is_one_create(api: Api) -> None:
    out = (await post(api.a, {"jobs": [job(job_id="twice"), job(job_id="twice")]})).json()
    assert [r["status"] for r in out["results"]] == [201, 200]


async def test_a_payload_is_kept_exactly_as_sent(api: Api) -> None:
    out = (await post(api.a, {"jobs": [job(job_id="p", payload={"f": 1.0}, retries=2.0)]})).json()
    assert out["results"][0]["status"] == 201
    stored = (await api.a.get("/v1/jobs/p")).json()
    assert stored["payload"] == {"f": 1.0} and isinstance(stored["payload"]["f"], float)
    assert stored["retries"] == 2


async def test_each_item_counts_against_the_tokens_rate(fake: FakeScheduler) -> None:
    limits = Limits(tenants={"team-a": TenantLimits(requests_per_sec=0.001, request_burst=3)})
    async with team_a(fake, limits=limits, clock=lambda: 1000.0) as a:
        out = (await post(a, {"jobs": [job(job_id=f"j{i}") for i in range(5)]})).json()
        assert [r["status"] for r in out["results"]] == [201, 201, 201, 429, 429]
        assert out["results"][3]["error"]["field"] == "jobs[3]"
        # The bucket is spent: the next request is refused whole.
        refused = await post(a, {"jobs": [job(job_id="j3")]})
        assert refused.status_code == 429
        assert (await a.get("/v1/jobs/j3")).status_code == 429


async def test_each_new_job_takes_a_place_in_the_quota(fake: FakeScheduler) -> None:
    limits = Limits(tenants={"team-a": TenantLimits(max_jobs=3)})
    async with team_a(fake, limits=limits) as a:
        await a.post("/v1/jobs", json=job(job_id="old"))
        jobs = [job(job_id="old"), job(job_id="n1"), job(job_id="n1"), job(job_id="n2")]
        jobs.append(job(job_id="n3"))
        out = (await post(a, {"jobs": jobs})).json()
        assert [r["status"] for r in out["results"]] == [200, 201, 200, 201, 403]
        assert out["results"][4]["error"]["error"] == "quota_exceeded"
        assert (await a.get("/v1/jobs/n3")).status_code == 404
