"""What a create costs besides its answer: a job id drawn for it is not looked up, a batch asks
the egress policy once per target, and the ids stay the ids they always were."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest

from api.translate import job_id_for_key, random_job_id
from core.cron import day_rule_matters
from core.egress import EgressPolicy
from core.errors import InvalidDefinition
from tests.api.conftest import Api, serve
from tests.api.fakes import FakeScheduler

pytestmark = pytest.mark.anyio

JOB = {"name": "report", "schedule": "0 9 * * 1-5", "target": "http://93.184.215.14/hook"}


def count_lookups(fake: FakeScheduler, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The read model's job lookups from here on, by job id."""
    looked_up: Counter[str] = Counter()
    lookup = fake.history.job

    def job(tenant: str, job_id: str) -> Any:
        looked_up[job_id] += 1
        return lookup(tenant, job_id)

    monkeypatch.setattr(fake.history, "job", job)
    return looked_up


async def test_a_create_that_names_no_job_reads_its_job_only_to_answer(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up = count_lookups(api.fake, monkeypatch)
    response = await api.a.post("/v1/jobs", json=JOB)
    assert response.status_code == 201
    job_id = response.json()["job_id"]
    assert job_id.startswith("j_")
    # Once, for the answer (read your writes); not before the create to find an earlier one,
    # nor again for the team's quota: nobody can have the id drawn for this create.
    [(log_id, lookups)] = looked_up.items()
    assert log_id.endswith(job_id)
    assert lookups == 1


async def test_a_create_that_names_its_job_still_finds_the_one_there(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await api.a.post("/v1/jobs", json={**JOB, "job_id": "nightly"})
    assert first.status_code == 201
    looked_up = count_lookups(api.fake, monkeypatch)
    again = await api.a.post("/v1/jobs", json={**JOB, "job_id": "nightly"})
    assert again.status_code == 200
    assert sum(looked_up.values()) >= 2  # found before deciding, and read for the answer
    other = await api.a.post("/v1/jobs", json={**JOB, "job_id": "nightly", "name": "other"})
    assert other.status_code == 409


async def test_a_batch_reads_no_job_for_the_items_that_name_none(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up = count_lookups(api.fake, monkeypatch)
    response = await api.a.post("/v1/jobs:batch", json={"jobs": [JOB] * 20})
    assert response.status_code == 200
    assert response.json()["created"] == 20
    assert sum(looked_up.values()) == 0


class CountingPolicy(EgressPolicy):
    asked: Counter[str]

    def check_url(self, url: str) -> str | None:
        self.asked[url] += 1
        return super().check_url(url)


async def test_a_batch_asks_the_egress_policy_once_per_target(fake: FakeScheduler) -> None:
    policy = CountingPolicy.build()
    policy.asked = Counter()
    refused = "http://169.254.169.254/latest"
    items = [JOB if i % 3 else {**JOB, "target": refused} for i in range(30)]
    async with (
        serve(fake, egress=policy) as transport,
        httpx.AsyncClient(
            transport=transport,
            base_url="http://cronlog",
            headers={"Authorization": "Bearer token-of-team-a"},
        ) as client,
    ):
        response = await client.post("/v1/jobs:batch", json={"jobs": items})
    assert response.status_code == 200
    results = response.json()["results"]
    # Every item still gets the verdict its own target deserves, with its reason.
    for i, result in enumerate(results):
        if i % 3:
            assert result["status"] == 201
        else:
            assert result["status"] == 422
            assert result["error"]["field"] == f"jobs[{i}].target"
            assert "metadata" in result["error"]["message"]
    assert policy.asked == {JOB["target"]: 1, refused: 1}


def test_ids_keep_their_shape_and_idempotency_keys_their_jobs() -> None:
    # Ids a key named before must name the same job after an upgrade: pinned values.
    assert job_id_for_key("acme", "nightly-report") == "j_zwukvt2kjhii73ocyjjrgaogzyuqjfvc"
    assert job_id_for_key("acme", "x" * 256) == "j_v22wxvjehmvlbl62majpbyftyokvb2of"
    drawn = {random_job_id() for _ in range(1000)}
    assert len(drawn) == 1000
    for job_id in drawn:
        assert len(job_id) == 26 and job_id.startswith("j_")
        assert set(job_id[2:]) <= set("abcdefghijklmnopqrstuvwxyz234567")


def test_a_remembered_schedule_is_still_refused_every_time_it_is_bad() -> None:
    assert day_rule_matters("30 1 3 12 */2") is True
    assert day_rule_matters("30 1 3 12 */2") is True
    assert day_rule_matters("0 9 * * 1-5") is False
    for _ in range(2):
        with pytest.raises(InvalidDefinition):
            day_rule_matters("61 * * * *")
