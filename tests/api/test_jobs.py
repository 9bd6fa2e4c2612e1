"""Jobs: create, upsert, read, list, patch (pause, resume, change, versions), cancel, preview."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api import jobs as api_jobs
from api.translate import job_id_for_key
from core.ids import log_job_id
from projections.read_model import ReadModel
from tests.api.conftest import Api

pytestmark = pytest.mark.anyio

REPORT: dict[str, Any] = {
    "name": "daily report",
    "schedule": "0 9 * * *",
    "timezone": "Europe/Paris",
    "target": "https://reports.internal/run",
    "payload": {"kind": "daily"},
    "retries": 2,
}


async def test_create_answers_201_with_the_id_the_next_run_and_the_version(api: Api) -> None:
    r = await api.a.post("/v1/jobs", json=REPORT)
    assert r.status_code == 201
    job = r.json()
    assert job["job_id"].startswith("j_")
    assert job["version"] == 1
    # 09:00 in Paris is 08:00 UTC, and it is 08:00 now: the next one is tomorrow
    assert job["next_run_at"] == "2026-11-30T08:00:00.000Z"
    assert job["retries"] == 2
    assert job["status"] == "active"
    assert job["target"] == {
        "type": "http",
        "url": "https://reports.internal/run",
        "headers": {},
        "max_calls_per_sec": None,
        "status_url": None,
    }
    spec = api.fake.history.job("team-a", log_job_id("team-a", job["job_id"]))
    assert spec is not None and spec.spec.max_attempts == 3  # retries N: N + 1 attempts
    assert spec.spec.tenant == "team-a"  # from the token, never the body


async def test_without_a_key_every_post_is_a_new_job(api: Api) -> None:
    first = (await api.a.post("/v1/jobs", json=REPORT)).json()["job_id"]
    second = (await api.a.post("/v1/jobs", json=REPORT)).json()["job_id"]
    assert first != second


async def test_the_same_idempotency_key_returns_the_same_job(api: Api) -> None:
    body = {**REPORT, "idempotency_key": "deploy-42"}
    first = await api.a.post("/v1/jobs", json=body)
    again = await api.a.post("/v1/jobs", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    assert first.json()["job_id"] == job_id_for_key("team-a", "deploy-42")
    # another tenant's same key is another job
    theirs = await api.b.post("/v1/jobs", json=body)
    assert theirs.status_code == 201
    assert theirs.json()["job_id"] != first.json()["job_id"]


async def test_the_same_key_with_another_body_is_a_conflict(api: Api) -> None:
    await api.a.post("/v1/jobs", json={**REPORT, "idempotency_key": "k"})
    before = api.everything()
    r = await api.a.post("/v1/jobs", json={**REPORT, "idempotency_key": "k", "retries": 5})
    assert r.status_code == 409
    assert r.json()["error"] == "conflict"
    assert api.everything() == before


async def test_a_chosen_job_id_and_a_key_together_are_refused(api: Api) -> None:
    r = await api.a.post("/v1/jobs", json={**REPORT, "job_id": "mine", "idempotency_key": "k"})
    assert r.status_code == 422
    assert r.json()["field"] == "idempotency_key"


async def test_target_forms(api: Api) -> None:
    forms = {
        "kafka://billing.events": {"type": "kafka", "topic": "billing.events"},
        "pull://reports": {"type": "pull", "pool": "reports"},
        "http://svc/x": {
            "type": "http",
            "url": "http://svc/x",
            "headers": {},
            "max_calls_per_sec": None,
            "status_url": None,
        },
    }
    for given, stored in forms.items():
        r = await api.a.post("/v1/jobs", json={**REPORT, "target": given})
        assert r.status_code == 201, r.text
        assert r.json()["target"] == stored
    obj = {
        "type": "http",
        "url": "https://svc/y",
        "headers": {"X-Team": "a"},
        "max_calls_per_sec": 50,
        "status_url": "https://svc/y/cronlog-status",
    }
    r = await api.a.post("/v1/jobs", json={**REPORT, "target": obj})
    assert r.json()["target"] == obj


async def test_one_shot_and_interval_jobs(api: Api) -> None:
    once = {"name": "pay", "run_at": "2026-11-30T15:00:00+01:00", "target": "pull://payments"}
    r = await api.a.post("/v1/jobs", json=once)
    assert r.status_code == 201
    assert r.json()["run_at"] == r.json()["next_run_at"] == "2026-11-30T14:00:00.000Z"
    every = {"name": "tick", "interval_sec": 300, "target": "pull://ticks"}
    r = await api.a.post("/v1/jobs", json=every)
    assert r.status_code == 201
    assert r.json()["next_run_at"] == "2026-11-29T08:00:00.000Z"  # from registration


async def test_put_creates_then_is_idempotent_then_replaces(api: Api) -> None:
    r = await api.a.put("/v1/jobs/nightly-billing", json=REPORT)
    assert (r.status_code, r.json()["version"]) == (201, 1)
    events = len(api.fake.events)
    again = await api.a.put("/v1/jobs/nightly-billing", json=REPORT)
    assert (again.status_code, again.json()) == (200, r.json())
    assert len(api.fake.events) == events  # nothing decided
    changed = await api.a.put("/v1/jobs/nightly-billing", json={**REPORT, "schedule": "0 10 * * *"})
    assert changed.status_code == 200
    assert changed.json()["version"] == 2
    assert changed.json()["next_run_at"] == "2026-11-29T09:00:00.000Z"
    # PUT is a whole definition: what is left out goes back to its default
    assert changed.json()["retries"] == 2
    bare = await api.a.put("/v1/jobs/nightly-billing", json={**REPORT, "retries": 3})
    assert bare.json()["retries"] == 3


async def test_put_with_a_stale_if_match_is_a_conflict(api: Api) -> None:
    await api.a.put("/v1/jobs/j1", json=REPORT)
    r = await api.a.put("/v1/jobs/j1", json={**REPORT, "retries": 9}, headers={"If-Match": "7"})
    assert r.status_code == 409
    ok = await api.a.put("/v1/jobs/j1", json={**REPORT, "retries": 9}, headers={"If-Match": '"1"'})
    assert ok.status_code == 200 and ok.json()["version"] == 2


async def test_get_and_list_with_status_filter_and_pages(api: Api) -> None:
    ids = []
    for i in range(5):
        r = await api.a.put(f"/v1/jobs/job-{i}", json=REPORT)
        ids.append(r.json()["job_id"])
    await api.a.patch("/v1/jobs/job-3", json={"status": "paused"})
    got = await api.a.get("/v1/jobs/job-1")
    assert got.status_code == 200 and got.json()["job_id"] == "job-1"

    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await api.a.get("/v1/jobs", params=params)).json()
        assert len(page["jobs"]) <= 2
        seen += [j["job_id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids)
    paused = (await api.a.get("/v1/jobs", params={"status": "paused"})).json()
    assert [j["job_id"] for j in paused["jobs"]] == ["job-3"]
    assert paused["next_cursor"] is None


async def test_patch_pauses_and_resumes(api: Api) -> None:
    await api.a.put("/v1/jobs/j1", json=REPORT)
    r = await api.a.patch("/v1/jobs/j1", json={"status": "paused"})
    assert (r.status_code, r.json()["status"], r.json()["version"]) == (200, "paused", 2)
    r = await api.a.patch("/v1/jobs/j1", json={"status": "paused"})
    assert r.json()["version"] == 2  # already paused: nothing changes
    r = await api.a.patch("/v1/jobs/j1", json={"status": "active"})
    assert (r.json()["status"], r.json()["version"]) == ("active", 3)


async def test_patch_merges_definition_fields(api: Api) -> None:
    await api.a.put("/v1/jobs/j1", json=REPORT)
    r = await api.a.patch("/v1/jobs/j1", json={"retries": 7, "backoff": {"factor": 3}})
    job = r.json()
    assert (job["retries"], job["version"], job["backoff"]["factor"]) == (7, 2, 3.0)
    assert job["schedule"] == "0 9 * * *" and job["payload"] == {"kind": "daily"}
    assert job["backoff"]["base_sec"] == 10.0  # the rest of the backoff is kept
    # a new timing replaces the old one: no need to clear schedule by hand
    r = await api.a.patch("/v1/jobs/j1", json={"run_at": "2026-12-01T00:00:00Z"})
    assert r.status_code == 200, r.text
    assert (r.json()["schedule"], r.json()["run_at"]) == (None, "2026-12-01T00:00:00.000Z")


async def test_patch_changes_and_pauses_in_one_call(api: Api) -> None:
    await api.a.put("/v1/jobs/j1", json=REPORT)
    r = await api.a.patch("/v1/jobs/j1", json={"priority": 9, "status": "paused", "version": 1})
    assert r.status_code == 200
    assert (r.json()["priority"], r.json()["status"], r.json()["version"]) == (9, "paused", 3)


async def test_patch_with_a_stale_version_is_a_conflict_and_changes_nothing(api: Api) -> None:
    await api.a.put("/v1/jobs/j1", json=REPORT)
    await api.a.patch("/v1/jobs/j1", json={"status": "paused"})  # now version 2
    before = api.everything()
    for call in (
        api.a.patch("/v1/jobs/j1", json={"retries": 5}, headers={"If-Match": "1"}),
        api.a.patch("/v1/jobs/j1", json={"status": "active", "version": 1}),
        api.a.delete("/v1/jobs/j1", headers={"If-Match": "1"}),
    ):
        r = await call
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "conflict"
    assert api.everything() == before
    r = await api.a.patch("/v1/jobs/j1", json={"retries": 5}, headers={"If-Match": "2"})
    assert (r.status_code, r.json()["version"]) == (200, 3)


async def test_delete_cancels(api: Api) -> None:
    await api.a.put("/v1/jobs/j1", json=REPORT)
    r = await api.a.delete("/v1/jobs/j1")
    assert (r.status_code, r.json()["status"], r.json()["next_run_at"]) == (200, "cancelled", None)
    again = await api.a.delete("/v1/jobs/j1")
    assert again.status_code == 200 and again.json()["version"] == r.json()["version"]
    r = await api.a.patch("/v1/jobs/j1", json={"status": "active"})
    assert r.status_code == 409  # a cancelled job stays cancelled


async def test_preview_of_a_job_and_of_a_bare_schedule(api: Api) -> None:
    await api.a.put("/v1/jobs/j1", json={**REPORT, "timezone": "America/New_York"})
    r = await api.a.get("/v1/jobs/j1/preview", params={"n": "3"})
    assert r.status_code == 200
    fires = r.json()["fires"]
    assert [f["at"] for f in fires] == [
        "2026-11-29T14:00:00.000Z",
        "2026-11-30T14:00:00.000Z",
        "2026-12-01T14:00:00.000Z",
    ]
    assert fires[0]["local"] == "2026-11-29T09:00:00-05:00"

    # the spring-forward gap: 02:30 does not exist on 2026-03-08 in New York
    r = await api.a.post(
        "/v1/schedules/preview",
        json={
            "schedule": "30 2 * * *",
            "timezone": "America/New_York",
            "n": 3,
            "after": "2026-03-07T12:00:00Z",
        },
    )
    assert r.status_code == 200, r.text
    local = [f["local"] for f in r.json()["fires"]]
    assert local[0] == "2026-03-08T03:00:00-04:00"  # fires once at the transition
    assert local[1] == "2026-03-09T02:30:00-04:00"


async def test_preview_of_an_interval_job(api: Api) -> None:
    await api.a.put("/v1/jobs/j1", json={"name": "t", "interval_sec": 60, "target": "pull://p"})
    api.fake.advance(90_000)
    r = await api.a.get("/v1/jobs/j1/preview", params={"n": "2"})
    assert [f["at"] for f in r.json()["fires"]] == [
        "2026-11-29T08:02:00.000Z",
        "2026-11-29T08:03:00.000Z",
    ]


async def test_a_repeated_create_the_read_model_has_not_caught_up_with_is_unavailable(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first try was decided, but its answer was lost (the client saw a 503) and the read
    # model of the node asked next has not folded the registration yet. The repeat decides
    # nothing (the same definition exists); answering it from that read model said 404.
    monkeypatch.setattr(api_jobs, "CATCH_UP_S", 0.2, raising=False)
    body = {**REPORT, "job_id": "again"}
    behind = api.fake.history
    with ReadModel(tmp_path / "elsewhere") as elsewhere:
        api.fake._history = elsewhere  # the first try's answer came from another node
        assert (await api.a.post("/v1/jobs", json=body)).status_code == 201
    api.fake._history = behind
    assert behind.job("team-a", log_job_id("team-a", "again")) is None
    repeat = await api.a.post("/v1/jobs", json=body)
    assert repeat.status_code == 503, repeat.text
    for p, offset, event in caught_up(api):  # the read model catches up
        behind.process(event, p, offset)
    again = await api.a.post("/v1/jobs", json=body)
    assert again.status_code == 200 and again.json()["job_id"] == "again"


def caught_up(api: Api) -> list[tuple[int, int, Any]]:
    """Every event the fake decided, with its partition and offset, as a read model reads them."""
    from eventlog.port import partition_for

    offsets: dict[int, int] = {}
    out = []
    for event in api.fake.events:
        p = partition_for(event.job_id, 4)
        out.append((p, offsets.get(p, 0), event))
        offsets[p] = offsets.get(p, 0) + 1
    return out


async def test_a_job_its_partition_forgot_is_answered_from_its_history(api: Api) -> None:
    from core.events import JobForgotten, JobRegistered
    from core.partition import DEFAULT_RETENTION_MS

    await api.a.put("/v1/jobs/j1", json=REPORT)
    deleted = await api.a.delete("/v1/jobs/j1")
    once = {"name": "pay", "run_at": "2026-11-29T08:01:00Z", "target": "pull://payments"}
    created = await api.a.post("/v1/jobs", json={**once, "idempotency_key": "pay-1"})
    assert created.status_code == 201
    api.fake.advance(60_000)
    claim = {"pool": "payments", "worker_id": "w1"}
    [lease] = (await api.a.post("/v1/workers/claim", json=claim)).json()["runs"]
    done = {"fencing_token": lease["fencing_token"], "status": "succeeded"}
    assert (await api.a.post(f"/v1/runs/{lease['run_id']}/complete", json=done)).status_code == 200
    api.fake.advance(DEFAULT_RETENTION_MS)
    forgotten = [e for e in api.fake.events if isinstance(e, JobForgotten)]
    assert len(forgotten) == 2  # both are out of their partitions' state
    registered = sum(isinstance(e, JobRegistered) for e in api.fake.events)

    again = await api.a.delete("/v1/jobs/j1")  # a repeated delete: the job, as before
    assert (again.status_code, again.json()["status"]) == (200, "cancelled")
    assert again.json()["version"] == deleted.json()["version"]
    r = await api.a.patch("/v1/jobs/j1", json={"status": "paused"})
    assert r.status_code == 409 and "no longer scheduled" in r.json()["message"]
    r = await api.a.post("/v1/jobs/j1/runs")
    assert r.status_code == 409
    r = await api.a.post("/v1/jobs", json={**REPORT, "job_id": "j1"})
    assert r.status_code == 409  # a repeat of a create of a job that was cancelled

    # A late repeat of the one-shot's create is the same job, not a second run of it.
    repeat = await api.a.post("/v1/jobs", json={**once, "idempotency_key": "pay-1"})
    assert (repeat.status_code, repeat.json()["status"]) == (200, "finished")
    assert repeat.json()["job_id"] == created.json()["job_id"]
    other = await api.a.post("/v1/jobs", json={**once, "name": "x", "idempotency_key": "pay-1"})
    assert other.status_code == 409
    assert sum(isinstance(e, JobRegistered) for e in api.fake.events) == registered
    runs = await api.a.get(f"/v1/jobs/{created.json()['job_id']}/runs")
    assert [r["run_id"] for r in runs.json()["runs"]] == [lease["run_id"]]
