"""A tenant sees and changes only its own jobs and runs: another tenant's ids are not found."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.anyio

JOB = {"name": "export", "schedule": "* * * * *", "target": "pull://shared-pool"}


async def test_team_b_gets_404_on_every_verb_and_changes_nothing(api: Api) -> None:
    await api.a.put("/v1/jobs/a-job", json=JOB)
    api.fake.advance(60_000)
    lease = (
        await api.a.post("/v1/workers/claim", json={"pool": "shared-pool", "worker_id": "w"})
    ).json()["runs"][0]
    run_id, token = lease["run_id"], lease["fencing_token"]
    backfill = {"scheduled_for": "2026-11-29T07:00:00Z"}
    assert (await api.a.post("/v1/jobs/a-job/runs", json=backfill)).status_code == 201

    before = api.everything()
    calls = [
        ("GET", "/v1/jobs/a-job", None),
        ("PUT", "/v1/jobs/a-job", JOB),
        ("PATCH", "/v1/jobs/a-job", {"status": "paused"}),
        ("PATCH", "/v1/jobs/a-job", {"retries": 1}),
        ("DELETE", "/v1/jobs/a-job", None),
        ("GET", "/v1/jobs/a-job/runs", None),
        ("POST", "/v1/jobs/a-job/runs", {}),
        ("GET", "/v1/jobs/a-job/preview", None),
        ("GET", f"/v1/runs/{run_id}", None),
        ("POST", f"/v1/runs/{run_id}/cancel", None),
        ("POST", f"/v1/runs/{run_id}/replay", None),
        ("POST", f"/v1/runs/{run_id}/heartbeat", {"fencing_token": token}),
        ("POST", f"/v1/runs/{run_id}/complete", {"fencing_token": token, "status": "failed"}),
    ]
    for method, path, body in calls:
        r = await api.b.request(method, path, json=body)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert r.json()["error"] == "not_found"
    assert api.everything() == before

    # and its listings are empty
    assert (await api.b.get("/v1/jobs")).json() == {"jobs": [], "next_cursor": None}
    for state in ("running", "pending", "dead"):
        listed = await api.b.get("/v1/runs", params={"state": state})
        assert listed.json() == {"runs": [], "next_cursor": None}
    # its workers do not get team-a's runs from a pool of the same name
    api.fake.advance(60_000)
    claim = {"pool": "shared-pool", "worker_id": "b-worker", "limit": 10}
    assert (await api.b.post("/v1/workers/claim", json=claim)).json() == {"runs": []}
    assert (await api.a.post("/v1/workers/claim", json=claim)).json()["runs"] != []


async def test_a_job_id_is_one_namespace_across_tenants(api: Api) -> None:
    """Job ids are global (they pick the partition); taking another tenant's id is refused
    as not found, without showing the job."""
    await api.a.put("/v1/jobs/shared-name", json=JOB)
    r = await api.b.put("/v1/jobs/shared-name", json=JOB)
    assert r.status_code == 404
    assert (await api.a.get("/v1/jobs/shared-name")).json()["tenant"] == "team-a"
