"""Runs past the history window: they leave the read model, and the API answers for them from
the archive (the fake's events stream, never pruned, stands for archive + log), saying so."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from api.limits import Limits, TenantLimits
from node.hot_window import DEFAULT_WINDOW_MS, HotWindow
from projections.read_model import ReadModel
from tests.api.conftest import ANY_TOPIC, Api, serve
from tests.api.fakes import FakeScheduler

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


async def _one_shot(api: Api, name: str) -> tuple[str, str]:
    """A one-shot created now, run a minute later and succeeded: (its job id, its run id)."""
    at = api.fake.clock.now_ms() + 60_000
    body = {"name": name, "run_at": _rfc3339(at), "target": "pull://exports"}
    created = await api.a.post("/v1/jobs", json={**body, "job_id": name})
    assert created.status_code == 201, created.text
    api.fake.advance(61_000)
    [run] = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
    done = {"fencing_token": run["fencing_token"], "status": "succeeded"}
    assert (await api.a.post(f"/v1/runs/{run['run_id']}/complete", json=done)).is_success
    return name, run["run_id"]


def _rfc3339(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _job_records(model: ReadModel) -> int:
    return sum(1 for k, _ in model.dump() if k.startswith(b"j/"))


async def _answers(api: Api, job_id: str, run_id: str) -> dict[str, Any]:
    paths = [f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/runs", f"/v1/runs/{run_id}"]
    got = {p: await api.a.get(p) for p in paths}
    listed = (await api.a.get("/v1/jobs", params={"limit": 1000})).json()["jobs"]
    return {
        **{p: (r.status_code, r.json()) for p, r in got.items()},
        "listed": job_id in [j["job_id"] for j in listed],
    }


@pytest.fixture
async def busy(fake: FakeScheduler) -> AsyncIterator[Api]:
    """The API with room for a month of requests in a second of the test."""
    limits = Limits(defaults=TenantLimits(requests_per_sec=10_000.0, request_burst=10_000))
    async with serve(fake, egress=ANY_TOPIC, limits=limits) as transport:
        clients = [
            httpx.AsyncClient(
                transport=transport,
                base_url="http://cronlog",
                headers={"Authorization": f"Bearer {token}"} if token else {},
            )
            for token in ("token-of-team-a", "token-of-team-b", None)
        ]
        try:
            yield Api(fake, *clients)
        finally:
            for client in clients:
                await client.aclose()


async def test_finished_one_shots_leave_the_read_model_once_their_runs_have(busy: Api) -> None:
    """A model fed one-shots day after day holds the jobs of the window, not every job ever;
    a one-shot is answered as it was until its run leaves the window, and then its run still
    is, from the archive."""
    api = busy
    window = HotWindow(api.fake.history, DEFAULT_WINDOW_MS, api.fake.clock)
    first, first_run = await _one_shot(api, "once-0")
    api.fake.advance(1_000)
    as_it_was = await _answers(api, first, first_run)
    assert as_it_was[f"/v1/jobs/{first}"][1]["status"] == "finished" and as_it_was["listed"]
    days, per_day = 40, 3
    records, left_on = [], None
    for day in range(days):
        for i in range(per_day):
            await _one_shot(api, f"once-{day + 1}-{i}")
        api.fake.advance(DAY - per_day * 61_000)
        window.run_once()
        records.append(_job_records(api.fake.history))
        now = await _answers(api, first, first_run)
        if left_on is None and now == as_it_was:
            continue
        if left_on is None:
            left_on = day
            assert day >= DEFAULT_WINDOW_MS // DAY - 1  # not before its run left the window
        assert now[f"/v1/jobs/{first}"][0] == 404 and not now["listed"]
        assert now[f"/v1/jobs/{first}/runs"][0] == 404
        status, run = now[f"/v1/runs/{first_run}"]  # its run: from the archive, as it was
        archived = {**as_it_was[f"/v1/runs/{first_run}"][1], "source": "archive"}
        assert (status, run) == (200, archived)
    assert left_on is not None
    # Bounded: the window's jobs (a day's one-shots are forgotten a day after they ran).
    bound = (DEFAULT_WINDOW_MS // DAY + 2) * per_day
    assert max(records) <= bound < days * per_day
    assert records[-1] == records[-2]  # flat: as many leave as arrive
    assert api.fake.history.job_count("team-a") == records[-1]  # the quota counts what is held


async def test_a_deleted_job_is_not_listed_and_is_answered_until_it_leaves(api: Api) -> None:
    assert (await api.a.put("/v1/jobs/export", json=JOB)).status_code == 201
    deleted = await api.a.delete("/v1/jobs/export")
    assert deleted.json()["status"] == "cancelled"
    listed = (await api.a.get("/v1/jobs")).json()["jobs"]
    assert listed == []
    by_status = (await api.a.get("/v1/jobs", params={"status": "cancelled"})).json()["jobs"]
    assert [j["job_id"] for j in by_status] == ["export"]
    window = HotWindow(api.fake.history, DEFAULT_WINDOW_MS, api.fake.clock)
    for _ in range(DEFAULT_WINDOW_MS // DAY):  # forgotten by its partition after a day
        api.fake.advance(DAY)
        window.run_once()
        again = await api.a.get("/v1/jobs/export")
        assert (again.status_code, again.json()) == (200, deleted.json())
    api.fake.advance(DAY)
    assert window.run_once().jobs == 1
    assert (await api.a.get("/v1/jobs/export")).status_code == 404
    assert [k for k, _ in api.fake.history.dump() if b"export" in k] == []
