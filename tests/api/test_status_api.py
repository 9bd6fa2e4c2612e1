"""What the status UI asks of the API beyond the basics, through the public API only: a team's
figures, replaying dead runs by filter, previewing a change, finding jobs, a job's newest run,
and every attempt's fencing token."""

from __future__ import annotations

from typing import Any

import pytest

from api.instants import parse_rfc3339
from projections import model_queries as read_model
from tests.api.conftest import Api

pytestmark = pytest.mark.anyio


def ms(text: str) -> int:
    return parse_rfc3339(text, "test")


def job(name: str, schedule: str = "* * * * *", **more: Any) -> dict[str, Any]:
    return {"name": name, "schedule": schedule, "target": "pull://work", "retries": 0, **more}


async def claim_all(api: Api, worker: str = "w1") -> list[dict[str, Any]]:
    claim = {"pool": "work", "worker_id": worker, "limit": 100}
    runs: list[dict[str, Any]] = (await api.a.post("/v1/workers/claim", json=claim)).json()["runs"]
    return runs


async def finish(api: Api, lease: dict[str, Any], status: str, **more: Any) -> dict[str, Any]:
    body = {"fencing_token": lease["fencing_token"], "status": status, **more}
    r = await api.a.post(f"/v1/runs/{lease['run_id']}/complete", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


# -- figures -----------------------------------------------------------------------------------


async def test_stats_show_the_teams_delay_and_outcomes_by_minute(api: Api) -> None:
    await api.a.put("/v1/jobs/every-minute", json=job("every-minute"))
    api.fake.advance(60_000 + 3_000)  # the 08:01 slot is due; a worker comes 3 s late
    [first] = await claim_all(api)
    await finish(api, first, "succeeded")
    api.fake.advance(60_000 - 3_000 + 250)  # the 08:02 slot, claimed 250 ms late, fails
    [second] = await claim_all(api)
    await finish(api, second, "failed", error="boom")
    # A manual trigger of a past slot is hours late by its slot: it is no scheduling delay.
    past = {"scheduled_for": "2026-11-29T05:00:00Z"}
    assert (await api.a.post("/v1/jobs/every-minute/runs", json=past)).status_code == 201
    [backfill] = await claim_all(api)
    await finish(api, backfill, "succeeded")

    r = await api.a.get("/v1/stats", params={"window_min": "5", "step_min": "1"})
    assert r.status_code == 200, r.text
    stats = r.json()
    assert (stats["since"], stats["until"], stats["step_min"]) == (
        "2026-11-29T07:58:00.000Z",
        "2026-11-29T08:03:00.000Z",
        1,
    )
    by_minute = {p["at"][11:16]: p for p in stats["points"]}
    assert list(by_minute) == ["07:58", "07:59", "08:00", "08:01", "08:02"]
    assert (by_minute["08:01"]["started"], by_minute["08:01"]["delay_max_ms"]) == (1, 3000)
    assert 2000 <= by_minute["08:01"]["delay_p50_ms"] <= 3000
    assert by_minute["08:01"]["succeeded"] == 1
    point = by_minute["08:02"]
    assert (point["started"], point["delay_max_ms"], point["failed"], point["dead"]) == (
        1,
        250,
        1,
        1,
    )
    assert point["succeeded"] == 1  # the backfill's run, decided in this minute
    assert by_minute["07:58"]["started"] == 0 and by_minute["07:58"]["delay_p50_ms"] is None
    total = stats["total"]
    assert (total["started"], total["succeeded"], total["dead"]) == (2, 2, 1)
    assert total["delay_max_ms"] == 3000  # the backfill's hours are not in it
    assert stats["runs_by_state"]["dead"] == 1

    theirs = (await api.b.get("/v1/stats", params={"window_min": "5"})).json()
    assert theirs["total"]["started"] == 0 and theirs["runs_by_state"]["dead"] == 0


async def test_stats_steps_add_minutes_up(api: Api) -> None:
    await api.a.put("/v1/jobs/every-minute", json=job("every-minute"))
    for _ in range(4):
        api.fake.advance(60_000)
        for lease in await claim_all(api):
            await finish(api, lease, "succeeded")
    stats = (await api.a.get("/v1/stats", params={"window_min": "6", "step_min": "3"})).json()
    assert [p["at"][11:16] for p in stats["points"]] == ["07:59", "08:02"]
    # starts at 08:01 .. 08:04: one in 07:59-08:01, three in 08:02-08:04
    assert [p["started"] for p in stats["points"]] == [1, 3]
    assert stats["total"]["succeeded"] == 4


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"window_min": "0"}, 400, "window_min"),
        ({"window_min": "20161"}, 400, "window_min"),
        ({"step_min": "x"}, 400, "step_min"),
        ({"window_min": "20160", "step_min": "1"}, 422, "step_min"),  # 20,160 points
    ],
)
async def test_stats_refuse_a_bad_window(
    api: Api, params: dict[str, str], status: int, field: str
) -> None:
    r = await api.a.get("/v1/stats", params=params)
    assert (r.status_code, r.json()["field"]) == (status, field)


async def test_stats_need_a_token(api: Api) -> None:
    assert (await api.anon.get("/v1/stats")).status_code == 401


# -- replaying dead runs by filter ---------------------------------------------------------------


async def dead_runs(api: Api) -> dict[str, list[str]]:
    """Dead runs of two jobs at the 08:01-08:03 slots: 'a' failed for good (permanent) at
    08:02, every other run ran out of attempts. Team b has a dead run too."""
    await api.a.put("/v1/jobs/a", json=job("a"))
    await api.a.put("/v1/jobs/b", json=job("b"))
    await api.b.put("/v1/jobs/a", json=job("a"))
    dead: dict[str, list[str]] = {"a": [], "b": []}
    for minute in (1, 2, 3):
        api.fake.advance(60_000)
        for lease in await claim_all(api):
            permanent = minute == 2 and lease["job_id"] == "a"
            await finish(api, lease, "failed", error="no", permanent=permanent)
            dead[lease["job_id"]].append(lease["run_id"])
    claim = {"pool": "work", "worker_id": "wb", "limit": 100}
    for lease in (await api.b.post("/v1/workers/claim", json=claim)).json()["runs"]:
        body = {"fencing_token": lease["fencing_token"], "status": "failed"}
        await api.b.post(f"/v1/runs/{lease['run_id']}/complete", json=body)
    return dead


async def states(api: Api, run_ids: list[str]) -> set[str]:
    return {(await api.a.get(f"/v1/runs/{r}")).json()["state"] for r in run_ids}


async def test_a_dry_run_counts_and_changes_nothing(api: Api) -> None:
    dead = await dead_runs(api)
    before = api.everything()
    r = await api.a.post("/v1/runs/replay", json={"dry_run": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["dry_run"], out["matched"], out["replayed"], out["next_cursor"]) == (
        True,
        6,
        [],
        None,
    )
    assert api.everything() == before
    assert await states(api, dead["a"] + dead["b"]) == {"dead"}


async def test_replay_by_job_reason_and_slots(api: Api) -> None:
    dead = await dead_runs(api)
    r = await api.a.post("/v1/runs/replay", json={"job_id": "a", "reason": "permanent_failure"})
    assert r.json()["replayed"] == [dead["a"][1]]
    assert await states(api, [dead["a"][1]]) == {"pending"}
    window = {"scheduled_after": "2026-11-29T08:02:00Z", "scheduled_before": "2026-11-29T08:03:00Z"}
    r = await api.a.post("/v1/runs/replay", json={"job_id": "b", **window})
    assert r.json()["replayed"] == [dead["b"][1]]
    assert await states(api, [dead["a"][0], dead["a"][2], dead["b"][0], dead["b"][2]]) == {"dead"}
    # team b's dead run is its own: no filter of team a reaches it
    r = await api.a.post("/v1/runs/replay", json={})
    assert sorted(r.json()["replayed"]) == sorted(
        [dead["a"][0], dead["a"][2], dead["b"][0], dead["b"][2]]
    )
    assert (await api.b.get("/v1/runs", params={"state": "dead"})).json()["runs"] != []


async def test_replay_goes_on_from_its_cursor(api: Api) -> None:
    dead = await dead_runs(api)
    seen: list[str] = []
    body: dict[str, Any] = {"limit": 4}
    for _ in range(3):
        out = (await api.a.post("/v1/runs/replay", json=body)).json()
        seen += out["replayed"]
        if out["next_cursor"] is None:
            break
        body["cursor"] = out["next_cursor"]
    assert sorted(seen) == sorted(dead["a"] + dead["b"])
    assert await states(api, seen) == {"pending"}


async def test_a_run_that_stopped_being_dead_is_reported_not_replayed(api: Api) -> None:
    dead = await dead_runs(api)
    assert (await api.a.post(f"/v1/runs/{dead['a'][0]}/replay")).status_code == 200
    out = (await api.a.post("/v1/runs/replay", json={"job_id": "a"})).json()
    assert sorted(out["replayed"]) == sorted(dead["a"][1:])


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"reason": "bored"}, 400, "reason"),
        ({"limit": 0}, 400, "limit"),
        ({"limit": 1001}, 400, "limit"),
        ({"job_id": "no/slash"}, 400, "job_id"),
        ({"scheduled_after": "yesterday"}, 400, "scheduled_after"),
        ({"status": "dead"}, 400, "status"),
        (
            {"scheduled_after": "2026-11-29T08:02:00Z", "scheduled_before": "2026-11-29T08:01:00Z"},
            422,
            "scheduled_before",
        ),
        ({"cursor": "!!"}, 422, "cursor"),
    ],
)
async def test_a_bad_filter_is_refused_naming_the_field_and_changes_nothing(
    api: Api, body: dict[str, Any], status: int, field: str
) -> None:
    await dead_runs(api)
    before = api.everything()
    r = await api.a.post("/v1/runs/replay", json=body)
    assert (r.status_code, r.json()["field"]) == (status, field)
    assert api.everything() == before


# -- previewing a change ---------------------------------------------------------------------------


async def test_a_change_preview_shows_before_after_added_and_dropped(api: Api) -> None:
    await api.a.put("/v1/jobs/hourly", json=job("hourly", "0 * * * *", timezone="Europe/London"))
    before = api.everything()
    r = await api.a.post("/v1/jobs/hourly/preview?n=4", json={"schedule": "0 */2 * * *"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert api.everything() == before  # nothing written
    assert out["job_id"] == "hourly"
    assert [f["at"][11:16] for f in out["before"]["fires"]] == ["09:00", "10:00", "11:00", "12:00"]
    assert [f["at"][11:16] for f in out["after"]["fires"]] == ["10:00", "12:00", "14:00", "16:00"]
    assert [f["at"][11:16] for f in out["dropped"]] == ["09:00", "11:00"]
    assert out["added"] == []  # 14:00 and 16:00 lie past what the before list shows
    assert out["compared_until"] == "2026-11-29T12:00:00.000Z"
    assert out["after"]["fires"][0]["local"] == "2026-11-29T10:00:00+00:00"


async def test_a_timezone_change_moves_every_slot(api: Api) -> None:
    await api.a.put("/v1/jobs/daily", json=job("daily", "0 9 * * *"))
    out = (
        await api.a.post("/v1/jobs/daily/preview?n=2", json={"timezone": "America/New_York"})
    ).json()
    # compared up to the 30th at 09:00 UTC, where the before list ends
    assert [f["at"] for f in out["added"]] == ["2026-11-29T14:00:00.000Z"]
    assert [f["at"] for f in out["dropped"]] == [
        "2026-11-29T09:00:00.000Z",
        "2026-11-30T09:00:00.000Z",
    ]
    assert out["after"]["fires"][0]["local"] == "2026-11-29T09:00:00-05:00"


async def test_a_change_that_keeps_the_timing_adds_and_drops_nothing(api: Api) -> None:
    await api.a.put(
        "/v1/jobs/every", json={"name": "every", "interval_sec": 90, "target": "pull://w"}
    )
    out = (await api.a.post("/v1/jobs/every/preview", json={"priority": 9})).json()
    assert out["before"]["fires"] == out["after"]["fires"]
    assert (out["added"], out["dropped"]) == ([], [])


async def test_a_change_preview_refuses_what_the_patch_would(api: Api) -> None:
    await api.a.put("/v1/jobs/hourly", json=job("hourly", "0 * * * *"))
    r = await api.a.post("/v1/jobs/hourly/preview", json={"schedule": "0 0 31 2 *"})
    assert (r.status_code, r.json()["field"]) == (422, "schedule")
    r = await api.a.post("/v1/jobs/hourly/preview", json={"retires": 3})
    assert (r.status_code, r.json()["field"]) == (400, "retires")
    assert (await api.b.post("/v1/jobs/hourly/preview", json={})).status_code == 404


# -- finding jobs, their newest run, attempts ------------------------------------------------------


async def test_q_finds_jobs_by_name_or_id_in_any_case(api: Api) -> None:
    await api.a.put("/v1/jobs/nightly-report", json=job("Nightly Report"))
    await api.a.put("/v1/jobs/cleanup", json=job("tidy the REPORTS folder"))
    await api.a.put("/v1/jobs/other", json=job("other"))
    await api.b.put("/v1/jobs/report", json=job("report"))
    found = (await api.a.get("/v1/jobs", params={"q": "report"})).json()
    assert [j["job_id"] for j in found["jobs"]] == ["cleanup", "nightly-report"]
    found = (await api.a.get("/v1/jobs", params={"q": "NIGHTLY", "status": "active"})).json()
    assert [j["job_id"] for j in found["jobs"]] == ["nightly-report"]
    long = await api.a.get("/v1/jobs", params={"q": "x" * 201})
    assert (long.status_code, long.json()["field"]) == (400, "q")


async def test_name_finds_the_jobs_called_exactly_that(api: Api) -> None:
    await api.a.put("/v1/jobs/report", json=job("report"))
    await api.a.put("/v1/jobs/report-2", json=job("report"))
    await api.a.put("/v1/jobs/weekly", json=job("weekly report"))
    await api.a.put("/v1/jobs/upper", json=job("Report"))
    await api.b.put("/v1/jobs/theirs", json=job("report"))
    found = (await api.a.get("/v1/jobs", params={"name": "report"})).json()
    assert [j["job_id"] for j in found["jobs"]] == ["report", "report-2"]
    found = (await api.a.get("/v1/jobs", params={"name": "report", "q": "-2"})).json()
    assert [j["job_id"] for j in found["jobs"]] == ["report-2"]
    found = (await api.a.get("/v1/jobs", params={"name": "nightly"})).json()
    assert found["jobs"] == []
    long = await api.a.get("/v1/jobs", params={"name": "x" * 201})
    assert (long.status_code, long.json()["field"]) == (400, "name")


async def test_a_missing_job_is_named_as_the_team_names_it(api: Api) -> None:
    r = await api.a.post("/v1/jobs/report/runs", json={})
    assert r.status_code == 404
    assert r.json()["message"] == "job report not found"


async def test_a_search_page_looks_at_a_bounded_number_of_jobs(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_model, "MAX_SEARCH_SCAN", 3)
    for i in range(7):
        await api.a.put(f"/v1/jobs/j{i}", json=job("match" if i in (1, 5) else "other"))
    pages = []
    params = {"q": "match"}
    for _ in range(5):
        page = (await api.a.get("/v1/jobs", params=params)).json()
        pages.append([j["job_id"] for j in page["jobs"]])
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert pages == [["j1"], ["j5"], []]


async def test_jobs_carry_their_newest_run(api: Api) -> None:
    await api.a.put("/v1/jobs/m", json=job("m"))
    assert (await api.a.get("/v1/jobs/m")).json()["last_run"] is None
    api.fake.advance(60_000)
    [lease] = await claim_all(api)
    await finish(api, lease, "failed", error="exit 3")
    listed = (await api.a.get("/v1/jobs")).json()["jobs"][0]["last_run"]
    assert (listed["run_id"], listed["state"], listed["error"], listed["dead_reason"]) == (
        lease["run_id"],
        "dead",
        "exit 3",
        "attempts_exhausted",
    )
    assert (await api.a.get("/v1/jobs/m")).json()["last_run"] == listed


async def test_every_attempt_shows_its_fencing_token_and_worker(api: Api) -> None:
    await api.a.put(
        "/v1/jobs/m", json=job("m", retries=1, backoff={"base_sec": 1, "jitter": False})
    )
    api.fake.advance(60_000)
    [first] = await claim_all(api, "w1")
    await finish(api, first, "failed", error="flaky")
    api.fake.advance(1_000)
    [second] = await claim_all(api, "w2")
    await finish(api, second, "succeeded")
    run = (await api.a.get(f"/v1/runs/{first['run_id']}")).json()
    assert [
        (a["worker_id"], a["fencing_token"], a["outcome"], a["error"]) for a in run["attempts"]
    ] == [
        ("w1", first["fencing_token"], "failed", "flaky"),
        ("w2", second["fencing_token"], "succeeded", ""),
    ]
    assert second["fencing_token"] > first["fencing_token"]


async def test_a_jobs_preview_names_it_by_the_teams_id(api: Api) -> None:
    await api.a.put("/v1/jobs/m", json=job("m"))
    assert (await api.a.get("/v1/jobs/m/preview")).json()["job_id"] == "m"
