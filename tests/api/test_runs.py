"""Runs: history with pages, ad-hoc and backfill triggers, cancel, the dead-letter list, replay."""

from __future__ import annotations

import pytest

from api.instants import parse_rfc3339
from tests.api.conftest import Api

pytestmark = pytest.mark.anyio


def ms(text: str) -> int:
    return parse_rfc3339(text, "test")


MINUTELY = {"name": "rollup", "schedule": "* * * * *", "target": "pull://rollups", "retries": 0}


async def test_runs_of_a_job_newest_first_in_pages(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    api.fake.advance(5 * 60_000)  # slots 08:01 .. 08:05
    first = await api.a.get("/v1/jobs/rollup/runs", params={"limit": "2"})
    assert first.status_code == 200
    page = first.json()
    slots = [r["scheduled_for"] for r in page["runs"]]
    assert slots == ["2026-11-29T08:05:00.000Z", "2026-11-29T08:04:00.000Z"]
    run = page["runs"][0]
    assert run["run_id"] == f"rollup.{ms('2026-11-29T08:05:00Z')}"
    assert (run["state"], run["attempt"], run["started_at"], run["lateness_ms"]) == (
        "pending",
        1,
        None,
        None,
    )
    while page["next_cursor"]:
        page = (
            await api.a.get(
                "/v1/jobs/rollup/runs", params={"limit": "2", "cursor": page["next_cursor"]}
            )
        ).json()
        slots += [r["scheduled_for"] for r in page["runs"]]
    assert slots == [f"2026-11-29T08:0{m}:00.000Z" for m in (5, 4, 3, 2, 1)]


async def test_runs_of_an_unknown_job_is_404(api: Api) -> None:
    assert (await api.a.get("/v1/jobs/nope/runs")).status_code == 404


async def test_trigger_now_then_the_same_idempotency_key_is_the_same_run(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    headers = {"Idempotency-Key": "backfill-1"}
    body = {"scheduled_for": "2026-11-28T23:00:00-05:00"}
    made = await api.a.post("/v1/jobs/rollup/runs", json=body, headers=headers)
    assert made.status_code == 201
    run = made.json()
    assert (run["state"], run["trigger"], run["scheduled_for"]) == (
        "pending",
        "manual",
        "2026-11-29T04:00:00.000Z",
    )
    events = len(api.fake.events)
    again = await api.a.post("/v1/jobs/rollup/runs", json=body, headers=headers)
    assert again.status_code == 200
    assert again.json()["run_id"] == run["run_id"]
    assert len(api.fake.events) == events


async def test_trigger_without_a_body_runs_now(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    r = await api.a.post("/v1/jobs/rollup/runs")
    assert r.status_code == 201
    assert r.json()["scheduled_for"] == "2026-11-29T08:00:00.000Z"
    assert (await api.a.get(f"/v1/runs/{r.json()['run_id']}")).json() == r.json()


async def test_the_same_slot_twice_is_one_run(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    body = {"scheduled_for": "2026-11-29T07:00:00Z"}
    first = await api.a.post("/v1/jobs/rollup/runs", json=body)
    second = await api.a.post("/v1/jobs/rollup/runs", json=body)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["run_id"] == second.json()["run_id"]


async def test_cancel_a_pending_run(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    run_id = (await api.a.post("/v1/jobs/rollup/runs")).json()["run_id"]
    r = await api.a.post(f"/v1/runs/{run_id}/cancel")
    assert (r.status_code, r.json()["state"]) == (200, "cancelled")
    again = await api.a.post(f"/v1/runs/{run_id}/cancel")
    assert (again.status_code, again.json()["state"]) == (200, "cancelled")


async def _dead_run(api: Api) -> str:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    run_id: str = (await api.a.post("/v1/jobs/rollup/runs")).json()["run_id"]
    claim = {"pool": "rollups", "worker_id": "w1"}
    lease = (await api.a.post("/v1/workers/claim", json=claim)).json()["runs"][0]
    done = {"fencing_token": lease["fencing_token"], "status": "failed", "error": "boom"}
    r = await api.a.post(f"/v1/runs/{run_id}/complete", json=done)
    assert r.json()["state"] == "dead"  # retries 0: the first failure is the last
    return run_id


async def test_dead_letters_list_and_replay(api: Api) -> None:
    run_id = await _dead_run(api)
    dead = (await api.a.get("/v1/runs", params={"state": "dead"})).json()
    assert [r["run_id"] for r in dead["runs"]] == [run_id]
    assert dead["runs"][0]["error"] == "boom"
    assert dead["runs"][0]["dead_reason"] == "attempts_exhausted"
    assert (await api.a.get("/v1/runs")).json() == dead  # dead is the default listing
    r = await api.a.post(f"/v1/runs/{run_id}/replay")
    assert r.status_code == 200
    assert (r.json()["state"], r.json()["attempt"]) == ("pending", 2)
    assert (await api.a.get("/v1/runs", params={"state": "dead"})).json()["runs"] == []
    pending = (await api.a.get("/v1/runs", params={"state": "pending"})).json()["runs"]
    assert [r["run_id"] for r in pending] == [run_id]


async def test_replay_of_a_run_that_is_not_dead_is_a_conflict(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    run_id = (await api.a.post("/v1/jobs/rollup/runs")).json()["run_id"]
    r = await api.a.post(f"/v1/runs/{run_id}/replay")
    assert (r.status_code, r.json()["error"]) == (409, "conflict")


async def test_an_unknown_state_is_a_bad_request(api: Api) -> None:
    r = await api.a.get("/v1/runs", params={"state": "zombie"})
    assert (r.status_code, r.json()["field"]) == (400, "state")


async def test_a_key_reused_without_a_slot_makes_no_second_run(api: Api) -> None:
    """A repeat of a keyed "run now" decides nothing; the read model cannot yet name the run a
    key made (RunView has no idempotency key), so the API says the key was used: 409."""
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    headers = {"Idempotency-Key": "now-1"}
    first = await api.a.post("/v1/jobs/rollup/runs", headers=headers)
    assert first.status_code == 201
    api.fake.advance(5_000)
    events = len(api.fake.events)
    again = await api.a.post("/v1/jobs/rollup/runs", headers=headers)
    assert (again.status_code, again.json()["error"]) == (409, "conflict")
    assert "now-1" in again.json()["message"]
    assert len(api.fake.events) == events
