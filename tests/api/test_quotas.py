"""Jobs per tenant (across partitions, under racing requests), depends_on, names and page sizes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from api.limits import Limits, TenantLimits
from core.commands import AnyCommand
from core.events import AnyEvent
from core.ids import log_job_id
from eventlog.port import partition_for
from tests.api.conftest import serve
from tests.api.fakes import PARTITIONS, FakeScheduler

pytestmark = pytest.mark.anyio

JOB: dict[str, Any] = {"name": "report", "schedule": "0 9 * * *", "target": "pull://p"}


def ids_on_every_partition(prefix: str) -> list[str]:
    """Team-a's job ids, one on each partition (which hashes the log's id, ``core.ids``)."""
    found: dict[int, str] = {}
    for i in range(1000):
        job_id = f"{prefix}-{i}"
        found.setdefault(partition_for(log_job_id("team-a", job_id), PARTITIONS), job_id)
    return [found[p] for p in range(PARTITIONS)]


@asynccontextmanager
async def clients(
    fake: FakeScheduler, limits: Limits
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with serve(fake, limits=limits) as transport:
        made = [
            httpx.AsyncClient(
                transport=transport,
                base_url="http://cronlog",
                headers={"Authorization": f"Bearer {token}"},
            )
            for token in ("token-of-team-a", "token-of-team-b")
        ]
        try:
            yield made[0], made[1]
        finally:
            for client in made:
                await client.aclose()


def limited(**given: Any) -> Limits:
    return Limits(tenants={"team-a": TenantLimits(**given)})


async def test_jobs_on_every_partition_count_toward_one_quota(fake: FakeScheduler) -> None:
    async with clients(fake, limited(max_jobs=PARTITIONS)) as (a, b):
        for job_id in ids_on_every_partition("q"):
            assert (await a.put(f"/v1/jobs/{job_id}", json=JOB)).status_code == 201
        assert fake.history.job_count("team-a") == PARTITIONS
        before = len(fake.events)
        for extra in ids_on_every_partition("over"):
            r = await a.put(f"/v1/jobs/{extra}", json=JOB)
            assert (r.status_code, r.json()["error"]) == (403, "quota_exceeded"), r.text
            r = await a.post("/v1/jobs", json={**JOB, "job_id": extra})
            assert r.status_code == 403
        assert (await a.post("/v1/jobs", json=JOB)).status_code == 403  # a fresh id too
        assert len(fake.events) == before  # refused: nothing decided
        # Another team has its own count.
        assert (await b.post("/v1/jobs", json=JOB)).status_code == 201


async def test_what_creates_nothing_is_not_refused_at_the_limit(fake: FakeScheduler) -> None:
    async with clients(fake, limited(max_jobs=1)) as (a, _b):
        assert (await a.post("/v1/jobs", json={**JOB, "idempotency_key": "k"})).status_code == 201
        # The retry of the create, a replace and a patch of the job the tenant has: no new job.
        assert (await a.post("/v1/jobs", json={**JOB, "idempotency_key": "k"})).status_code == 200
        job_id = (await a.get("/v1/jobs")).json()["jobs"][0]["job_id"]
        assert (await a.put(f"/v1/jobs/{job_id}", json={**JOB, "retries": 1})).status_code == 200
        assert (await a.patch(f"/v1/jobs/{job_id}", json={"status": "paused"})).status_code == 200


async def test_a_cancelled_job_frees_its_place(fake: FakeScheduler) -> None:
    async with clients(fake, limited(max_jobs=1)) as (a, _b):
        assert (await a.put("/v1/jobs/first", json=JOB)).status_code == 201
        assert (await a.put("/v1/jobs/second", json=JOB)).status_code == 403
        assert (await a.delete("/v1/jobs/first")).status_code == 200
        assert fake.history.job_count("team-a") == 0
        assert (await a.put("/v1/jobs/second", json=JOB)).status_code == 201


class GatedScheduler(FakeScheduler):
    """Holds every command at a gate, so racing requests are all past admission before any
    is decided; ``settled`` is set when ``expected`` requests arrived or were answered."""

    def __init__(self, fake: FakeScheduler, expected: int) -> None:
        super().__init__(fake.history, fake.clock)
        self.gate = asyncio.Event()
        self.settled = asyncio.Event()
        self.arrived = 0
        self.answered = 0
        self.expected = expected

    def note(self, arrived: int = 0, answered: int = 0) -> None:
        self.arrived += arrived
        self.answered += answered
        if self.arrived + self.answered >= self.expected:
            self.settled.set()

    async def execute(self, command: AnyCommand) -> list[AnyEvent]:
        self.note(arrived=1)
        await self.gate.wait()
        return await super().execute(command)


async def test_racing_creates_on_one_node_never_pass_the_quota(fake: FakeScheduler) -> None:
    racers = 5
    gated = GatedScheduler(fake, racers)
    async with clients(gated, limited(max_jobs=3)) as (a, _b):
        gated.gate.set()
        for job_id in ("one", "two"):
            assert (await a.put(f"/v1/jobs/{job_id}", json=JOB)).status_code == 201
        gated.gate.clear()
        gated.arrived = 0

        async def create(i: int) -> int:
            r = await a.put(f"/v1/jobs/racer-{i}", json=JOB)
            if r.status_code == 403:
                gated.note(answered=1)
            return r.status_code

        tasks = [asyncio.create_task(create(i)) for i in range(racers)]
        await asyncio.wait_for(gated.settled.wait(), 10)
        assert gated.arrived == 1  # one place left: one create reached the partitions
        gated.gate.set()
        assert sorted(await asyncio.gather(*tasks)) == [201, 403, 403, 403, 403]
        assert fake.history.job_count("team-a") == 3


async def test_depends_on_is_bounded_and_names_jobs_the_tenant_has(fake: FakeScheduler) -> None:
    async with clients(fake, limited(max_depends_on=2)) as (a, b):
        for job_id in ("up-1", "up-2", "gone"):
            assert (await a.put(f"/v1/jobs/{job_id}", json=JOB)).status_code == 201
        assert (await b.put("/v1/jobs/theirs", json=JOB)).status_code == 201
        assert (await a.delete("/v1/jobs/gone")).status_code == 200
        dependant = {"name": "d", "target": "pull://p"}
        before = len(fake.events)
        cases = [
            (["up-1", "up-2", "up-1x"], "depends_on"),  # more than the tenant's 2
            (["up-1", "nope"], "depends_on[1]"),
            (["theirs"], "depends_on[0]"),  # another tenant's job is not one the tenant has
            (["gone"], "depends_on[0]"),  # cancelled: it will never succeed
            (["dep"], "depends_on[0]"),  # itself
        ]
        for upstream, field in cases:
            r = await a.put("/v1/jobs/dep", json={**dependant, "depends_on": upstream})
            assert (r.status_code, r.json()["field"]) == (422, field), r.text
        assert len(fake.events) == before
        r = await a.put("/v1/jobs/dep", json={**dependant, "depends_on": ["up-1", "up-2"]})
        assert r.status_code == 201
        r = await a.patch("/v1/jobs/dep", json={"depends_on": ["up-1", "missing"]})
        assert (r.status_code, r.json()["field"]) == (422, "depends_on[1]")
        # An upstream job cancelled after the dependant named it: repeating the definition
        # is not refused (only ids a request adds are looked up).
        assert (await a.delete("/v1/jobs/up-2")).status_code == 200
        r = await a.put("/v1/jobs/dep", json={**dependant, "depends_on": ["up-1", "up-2"]})
        assert r.status_code == 200


async def test_sixty_thousand_upstream_ids_are_refused(fake: FakeScheduler) -> None:
    async with clients(fake, Limits()) as (a, _b):
        many = [f"j{i}" for i in range(60_000)]
        dependant = {"name": "d", "target": "pull://p"}
        r = await a.post("/v1/jobs", json={**dependant, "depends_on": many})
        assert (r.status_code, r.json()["field"]) == (400, "depends_on")
        r = await a.post("/v1/jobs", json={**dependant, "depends_on": many[:51]})
        assert (r.status_code, r.json()["field"]) == (422, "depends_on")  # the default: 50
        assert fake.events == []


async def test_a_tenants_name_length(fake: FakeScheduler) -> None:
    async with clients(fake, limited(max_name_chars=10)) as (a, b):
        r = await a.post("/v1/jobs", json={**JOB, "name": "x" * 11})
        assert (r.status_code, r.json()["field"]) == (422, "name")
        assert (await a.post("/v1/jobs", json={**JOB, "name": "x" * 10})).status_code == 201
        assert (await b.post("/v1/jobs", json={**JOB, "name": "x" * 200})).status_code == 201
        r = await b.post("/v1/jobs", json={**JOB, "name": "x" * 201})
        assert (r.status_code, r.json()["field"]) == (400, "name")


async def test_a_page_holds_at_most_the_tenants_page_size(fake: FakeScheduler) -> None:
    async with clients(fake, limited(max_page_size=2)) as (a, _b):
        for job_id in ("j1", "j2", "j3"):
            assert (await a.put(f"/v1/jobs/{job_id}", json=JOB)).status_code == 201
        page = (await a.get("/v1/jobs", params={"limit": 100})).json()
        assert [j["job_id"] for j in page["jobs"]] == ["j1", "j2"]
        rest = (await a.get("/v1/jobs", params={"cursor": page["next_cursor"]})).json()
        assert [j["job_id"] for j in rest["jobs"]] == ["j3"]
        r = await a.get("/v1/jobs", params={"limit": 1001})
        assert (r.status_code, r.json()["field"]) == (400, "limit")
        r = await a.get("/v1/runs", params={"limit": 100})
        assert r.status_code == 200
