"""Runs past the history window: they leave the read model, and the API answers for them from
the archive (the fake's events stream, never pruned, stands for archive + log), saying so."""

from __future__ import annotations

from typing import Any

import pytest

from node.hot_window import DEFAULT_WINDOW_MS, HotWindow
from projections.read_model import ReadModel
from tests.api.conftest import Api

pytestmark = pytest.mark.anyio

JOB = {"name": "export", "schedule": "*/5 * * * *", "target": "pull://exports", "lease_sec": 30}
CLAIM = {"pool": "exports", "worker_id": "worker-1", "limit": 10}
DAY = 86_400_000


async def _history(api: Api, slots: int) -> list[str]:
    """``slots`` runs of the job, all succeeded but the last, which stays pending."""
    assert (await api.a.put("/v1/jobs/export", json=JOB)).status_code in (200, 201)
    run_ids = []
    for i in range(slots):
        api.fake.advance(5 * 60_000)
        if i == slots - 1:
            break
        [run] = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
        api.fake.advance(1_000)
        done = {"fencing_token": run["fencing_token"], "status": "succeeded"}
        assert (await api.a.post(f"/v1/runs/{run['run_id']}/complete", json=done)).is_success
        run_ids.append(run["run_id"])
    await api.a.post("/v1/jobs/export/pause")  # no more slots while the clock moves on
    pending = [r["run_id"] for r in await _all_runs(api, 100) if r["state"] == "pending"]
    return run_ids + pending


async def _all_runs(api: Api, limit: int) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        page = (await api.a.get("/v1/jobs/export/runs", params=params)).json()
        runs += page["runs"]
        cursor = page["next_cursor"]
        if cursor is None:
            return runs
    raise AssertionError("the pages never ended")


def _forget(api: Api, days: int) -> int:
    api.fake.clock.set(api.fake.clock.now_ms() + days * DAY)
    window = HotWindow(api.fake.history, DEFAULT_WINDOW_MS, api.fake.clock, batch=2)
    return window.run_once().runs


def _keys(model: ReadModel, run_id: str) -> list[bytes]:
    return [k for k, _ in model.dump() if run_id.encode() in k]


async def test_a_forgotten_run_is_answered_from_the_archive_as_it_was(api: Api) -> None:
    run_ids = await _history(api, 4)
    done, live = run_ids[:-1], run_ids[-1]
    hot = {r: (await api.a.get(f"/v1/runs/{r}")).json() for r in run_ids}
    assert {v["source"] for v in hot.values()} == {"hot"}
    quota = api.fake.history.job_count("team-a")
    counts = api.fake.history.counts("team-a")

    assert _forget(api, 31) == 3
    model = api.fake.history
    for run_id in done:  # left the read model with every index key naming it
        assert _keys(model, f"team-a/{run_id}") == []
        assert model.run("team-a", f"team-a/{run_id}") is None
    assert model.run("team-a", f"team-a/{live}") is not None  # a live run of that age stays
    assert model.job_count("team-a") == quota  # the jobs quota does not change
    assert model.counts("team-a") == {**counts, "succeeded": 0}  # counts: the hot window

    for run_id in done:
        r = await api.a.get(f"/v1/runs/{run_id}")
        assert r.status_code == 200
        assert r.json() == {**hot[run_id], "source": "archive"}
    live_now = (await api.a.get(f"/v1/runs/{live}")).json()
    assert live_now == hot[live]


async def test_paging_crosses_the_window_with_every_run_once_in_order(api: Api) -> None:
    run_ids = await _history(api, 6)
    before = await _all_runs(api, 100)
    _forget(api, 31)
    for limit in (1, 2, 3, 100):
        after = await _all_runs(api, limit)
        assert [r["run_id"] for r in after] == [r["run_id"] for r in before]
        assert [{**r, "source": "hot"} for r in after] == before
    assert sorted(r["run_id"] for r in before) == sorted(run_ids)
    # the live run is still hot, the rest came from the archive
    sources = {r["run_id"]: r["source"] for r in await _all_runs(api, 100)}
    assert sources[run_ids[-1]] == "hot"
    assert {sources[r] for r in run_ids[:-1]} == {"archive"}
    first = (await api.a.get("/v1/jobs/export/runs", params={"limit": 1})).json()
    assert first["source"] == "hot"
    last = (await api.a.get("/v1/jobs/export/runs", params={"limit": 100})).json()
    assert last["source"] == "archive"


async def test_another_team_cannot_reach_a_forgotten_run(api: Api) -> None:
    run_ids = await _history(api, 3)
    _forget(api, 31)
    assert (await api.a.get(f"/v1/runs/{run_ids[0]}")).status_code == 200
    assert (await api.b.get(f"/v1/runs/{run_ids[0]}")).status_code == 404
    assert (await api.b.get("/v1/jobs/export/runs")).status_code == 404


async def test_with_no_archive_the_answer_says_history_past_the_window_is_gone(api: Api) -> None:
    run_ids = await _history(api, 3)
    _forget(api, 31)
    api.fake.run_history.archived = None
    r = await api.a.get(f"/v1/runs/{run_ids[0]}")
    assert r.status_code == 404
    assert "--no-archive" in r.json()["message"]
    page = (await api.a.get("/v1/jobs/export/runs")).json()
    assert [x["run_id"] for x in page["runs"]] == [run_ids[-1]]
    assert page["gone_before"] is not None


async def test_a_slot_that_ran_past_the_window_is_not_run_again(api: Api) -> None:
    run_ids = await _history(api, 3)
    hot = (await api.a.get(f"/v1/runs/{run_ids[0]}")).json()
    _forget(api, 31)
    events = len(api.fake.events)
    again = await api.a.post("/v1/jobs/export/runs", json={"scheduled_for": hot["scheduled_for"]})
    assert again.status_code == 200, again.text
    assert again.json()["run_id"] == run_ids[0] and again.json()["state"] == "succeeded"
    assert len(api.fake.events) == events  # nothing decided
