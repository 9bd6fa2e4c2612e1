"""What users hit in their first hour: start and end dates on every kind of schedule, a
``run_at`` in the past, when an interval job first fires, and six-field expressions."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.anyio

# The fake clock starts at 2026-11-29T08:00:00Z.
PULL = "pull://crunchers"


async def test_a_cron_job_runs_between_start_at_and_end_at(api: Api) -> None:
    body = {
        "name": "w",
        "schedule": "0 * * * *",
        "start_at": "2026-11-29T10:30:00Z",
        "end_at": "2026-11-29T12:00:00Z",
        "target": PULL,
    }
    r = await api.a.put("/v1/jobs/w", json=body)
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["start_at"], job["end_at"]) == (
        "2026-11-29T10:30:00.000Z",
        "2026-11-29T12:00:00.000Z",
    )
    assert job["next_run_at"] == "2026-11-29T11:00:00.000Z"
    api.fake.advance(6 * 3600_000)
    runs = (await api.a.get("/v1/jobs/w/runs")).json()["runs"]
    assert sorted(r["scheduled_for"] for r in runs) == [
        "2026-11-29T11:00:00.000Z",
        "2026-11-29T12:00:00.000Z",
    ]
    job = (await api.a.get("/v1/jobs/w")).json()
    assert job["next_run_at"] is None
    # Nothing live and no slot left: finished once its runs are done.
    for run in runs:
        await api.a.post(f"/v1/runs/{run['run_id']}/cancel")
    assert (await api.a.get("/v1/jobs/w")).json()["status"] == "finished"
    finished = (await api.a.get("/v1/jobs", params={"status": "finished"})).json()["jobs"]
    assert [j["job_id"] for j in finished] == ["w"]


async def test_end_before_start_and_run_at_outside_the_window_are_refused(api: Api) -> None:
    before = api.everything()
    r = await api.a.put(
        "/v1/jobs/w",
        json={
            "name": "w",
            "interval_sec": 60,
            "start_at": "2026-12-01T00:00:00Z",
            "end_at": "2026-11-30T00:00:00Z",
            "target": PULL,
        },
    )
    assert (r.status_code, r.json()["field"]) == (422, "end_at")
    r = await api.a.put(
        "/v1/jobs/w",
        json={
            "name": "w",
            "run_at": "2026-12-02T00:00:00Z",
            "end_at": "2026-12-01T00:00:00Z",
            "target": PULL,
        },
    )
    assert (r.status_code, r.json()["field"]) == (422, "run_at")
    assert api.everything() == before


async def test_a_run_at_in_the_past_is_refused_unless_asked_for(api: Api) -> None:
    past = {"name": "late", "run_at": "2026-11-29T07:00:00Z", "target": PULL}
    before = api.everything()
    r = await api.a.post("/v1/jobs", json=past)
    assert (r.status_code, r.json()["field"]) == (422, "run_at")
    assert "allow_past" in r.json()["message"] and "has passed" in r.json()["message"]
    assert api.everything() == before
    # A few seconds ago is "now" between two clocks: accepted.
    r = await api.a.post("/v1/jobs", json={**past, "run_at": "2026-11-29T07:59:30Z"})
    assert r.status_code == 201
    r = await api.a.put("/v1/jobs/late", json={**past, "allow_past": True})
    assert r.status_code == 201, r.text
    assert "allow_past" not in r.json()  # an option of the request, not kept with the job
    # The same definition again is the same job, past or not.
    assert (await api.a.put("/v1/jobs/late", json=past)).status_code == 200
    api.fake.advance(1)
    [run] = (await api.a.get("/v1/jobs/late/runs")).json()["runs"]
    assert run["scheduled_for"] == "2026-11-29T07:00:00.000Z"


async def test_an_end_at_in_the_past_is_refused_unless_asked_for(api: Api) -> None:
    body = {"name": "e", "schedule": "* * * * *", "end_at": "2026-11-01T00:00:00Z", "target": PULL}
    r = await api.a.put("/v1/jobs/e", json=body)
    assert (r.status_code, r.json()["field"]) == (422, "end_at")
    r = await api.a.put("/v1/jobs/e", json={**body, "allow_past": True})
    assert r.status_code == 201 and r.json()["next_run_at"] is None


async def test_an_interval_job_says_when_it_first_fires(api: Api) -> None:
    body = {"name": "i", "interval_sec": 3600, "allow_jitter_sec": 300, "target": PULL}
    job = (await api.a.put("/v1/jobs/i", json=body)).json()
    # Its first slot is its creation; the jitter moves the run within five minutes of it.
    assert job["next_run_at"] == job["created_at"] == "2026-11-29T08:00:00.000Z"
    fire = job["next_fire_at"]
    assert "2026-11-29T08:00:00.000Z" <= fire < "2026-11-29T08:05:00.000Z"
    api.fake.advance(1)
    [run] = (await api.a.get("/v1/jobs/i/runs")).json()["runs"]
    assert run["available_at"] == fire  # it is when the run really becomes ready
    later = (
        await api.a.put(
            "/v1/jobs/later",
            json={**body, "allow_jitter_sec": 0, "start_at": "2026-11-29T09:15:00Z"},
        )
    ).json()
    assert later["next_run_at"] == later["next_fire_at"] == "2026-11-29T09:15:00.000Z"


async def test_six_fields_are_refused_and_seconds_is_its_own_field(api: Api) -> None:
    quartz = {"name": "q", "schedule": "*/10 * * * * *", "target": PULL}
    r = await api.a.put("/v1/jobs/q", json=quartz)
    assert (r.status_code, r.json()["field"]) == (422, "schedule")
    assert "Quartz" in r.json()["message"] and '"seconds"' in r.json()["message"]
    r = await api.a.post("/v1/schedules/preview", json={"schedule": "*/10 * * * * *"})
    assert (r.status_code, r.json()["field"]) == (422, "schedule")

    every_ten = {"name": "q", "schedule": "* * * * *", "seconds": "*/10", "target": PULL}
    job = (await api.a.put("/v1/jobs/q", json=every_ten)).json()
    assert (job["schedule"], job["seconds"]) == ("* * * * *", "*/10")
    assert job["next_run_at"] == "2026-11-29T08:00:10.000Z"
    preview = (await api.a.get("/v1/jobs/q/preview", params={"n": 3})).json()
    assert [f["at"] for f in preview["fires"]] == [
        "2026-11-29T08:00:10.000Z",
        "2026-11-29T08:00:20.000Z",
        "2026-11-29T08:00:30.000Z",
    ]
    assert (preview["schedule"], preview["seconds"]) == ("* * * * *", "*/10")
    # The same body again changes nothing; seconds alone changes only the seconds.
    assert (await api.a.put("/v1/jobs/q", json=every_ten)).json()["version"] == 1
    patched = (await api.a.patch("/v1/jobs/q", json={"seconds": "30"})).json()
    assert (patched["schedule"], patched["seconds"]) == ("* * * * *", "30")
    # A schedule without seconds fires at second 0.
    patched = (await api.a.patch("/v1/jobs/q", json={"schedule": "@hourly"})).json()
    assert (patched["schedule"], patched["seconds"]) == ("@hourly", None)
    fires = await api.a.post(
        "/v1/schedules/preview", json={"schedule": "@hourly", "seconds": "15", "n": 1}
    )
    assert fires.json()["fires"][0]["at"] == "2026-11-29T08:00:15.000Z"


async def test_seconds_needs_a_schedule_and_says_so(api: Api) -> None:
    r = await api.a.put(
        "/v1/jobs/s", json={"name": "s", "interval_sec": 60, "seconds": "5", "target": PULL}
    )
    assert (r.status_code, r.json()["field"]) == (422, "seconds")
    r = await api.a.put(
        "/v1/jobs/s", json={"name": "s", "schedule": "* * * * *", "seconds": "61", "target": PULL}
    )
    assert (r.status_code, r.json()["field"]) == (422, "schedule")
    r = await api.a.put(
        "/v1/jobs/s", json={"name": "s", "schedule": "* * * * *", "seconds": "x", "target": PULL}
    )
    assert (r.status_code, r.json()["field"]) == (400, "seconds")
