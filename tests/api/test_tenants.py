"""A tenant sees and changes only its own jobs and runs: another tenant's ids are not found, and
job ids are each team's own (two teams may both own ``nightly-report``)."""

from __future__ import annotations

import msgspec
import pytest

from api.translate import spec_of
from api.wire import JobFields
from core.commands import PutJob
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
        empty = {"runs": [], "next_cursor": None, "source": "hot", "gone_before": None}
        assert listed.json() == empty
    # its workers do not get team-a's runs from a pool of the same name
    api.fake.advance(60_000)
    claim = {"pool": "shared-pool", "worker_id": "b-worker", "limit": 10}
    assert (await api.b.post("/v1/workers/claim", json=claim)).json() == {"runs": []}
    assert (await api.a.post("/v1/workers/claim", json=claim)).json()["runs"] != []


async def test_two_teams_may_own_jobs_of_the_same_id(api: Api) -> None:
    a = await api.a.put("/v1/jobs/nightly-report", json=JOB)
    b = await api.b.put("/v1/jobs/nightly-report", json={**JOB, "name": "b's export"})
    assert (a.status_code, b.status_code) == (201, 201)
    assert (a.json()["job_id"], b.json()["job_id"]) == ("nightly-report", "nightly-report")
    # Each sees its own, and changing one leaves the other alone.
    assert (await api.b.patch("/v1/jobs/nightly-report", json={"status": "paused"})).is_success
    got_a = (await api.a.get("/v1/jobs/nightly-report")).json()
    got_b = (await api.b.get("/v1/jobs/nightly-report")).json()
    assert (got_a["tenant"], got_a["name"], got_a["status"]) == ("team-a", "export", "active")
    assert (got_b["tenant"], got_b["name"], got_b["status"]) == ("team-b", "b's export", "paused")
    # Their runs are apart too: team-a's workers get team-a's run under the team's own ids.
    api.fake.advance(60_000)
    claim = {"pool": "shared-pool", "worker_id": "w", "limit": 10}
    [run] = (await api.a.post("/v1/workers/claim", json=claim)).json()["runs"]
    assert run["job_id"] == "nightly-report" and run["run_id"].startswith("nightly-report.")
    assert run["idempotency_key"].startswith("team-a/nightly-report:")
    assert (await api.b.post("/v1/workers/claim", json=claim)).json() == {"runs": []}  # paused
    assert (await api.b.get(f"/v1/runs/{run['run_id']}")).status_code == 404


async def test_another_teams_id_cannot_be_told_from_one_that_does_not_exist(api: Api) -> None:
    await api.a.put("/v1/jobs/secret-plan", json=JOB)
    taken = await api.b.get("/v1/jobs/secret-plan")
    free = await api.b.get("/v1/jobs/no-such-job")
    assert taken.status_code == free.status_code == 404
    assert taken.json()["message"].replace("secret-plan", "X") == free.json()["message"].replace(
        "no-such-job", "X"
    )
    # ... and creating it is simply creating team-b's own.
    assert (await api.b.post("/v1/jobs", json={**JOB, "job_id": "secret-plan"})).status_code == 201


async def test_a_job_from_before_ids_were_scoped_is_still_its_teams(api: Api) -> None:
    # A log written before scoping holds the job under its bare id (core.ids).
    spec = spec_of(msgspec.json.decode(msgspec.json.encode(JOB), type=JobFields), "team-a")
    await api.fake.execute(PutJob(job_id="legacy-export", spec=spec))
    assert api.fake.history.has_unscoped_ids()
    got = await api.a.get("/v1/jobs/legacy-export")
    assert (got.status_code, got.json()["job_id"]) == (200, "legacy-export")
    paused = await api.a.patch("/v1/jobs/legacy-export", json={"status": "paused"})
    assert paused.json()["status"] == "paused"
    assert api.fake.history.job("team-a", "legacy-export").status == "paused"  # type: ignore[union-attr]
    # The same request again names the same job, not a new scoped one.
    again = await api.a.put("/v1/jobs/legacy-export", json=JOB)
    assert again.status_code == 200
    assert api.fake.history.job("team-a", "team-a/legacy-export") is None
    # Another team's job of that id is its own, scoped.
    assert (await api.b.put("/v1/jobs/legacy-export", json=JOB)).status_code == 201
    assert api.fake.history.job("team-b", "team-b/legacy-export") is not None
    assert (await api.a.get("/v1/jobs/legacy-export")).json()["tenant"] == "team-a"
