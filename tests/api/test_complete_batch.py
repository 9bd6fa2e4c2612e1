"""POST /v1/runs:complete: many outcomes in one request, each answered as a single completion
would be, one refused item refusing only itself."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.anyio

JOB = {
    "name": "export",
    "interval_sec": 60,
    "target": "pull://exports",
    "lease_sec": 30,
}
CLAIM = {"pool": "exports", "worker_id": "worker-1", "limit": 10}


async def _claim(api: Api, n: int) -> list[dict[str, Any]]:
    for i in range(n):
        r = await api.a.put(f"/v1/jobs/export-{i}", json=JOB)
        assert r.status_code == 201
    api.fake.advance(1)  # each one's first slot is its registration
    runs = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
    assert len(runs) == n
    return sorted(runs, key=lambda r: str(r["job_id"]))


def _done(run: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"run_id": run["run_id"], "fencing_token": run["fencing_token"], **more}


async def test_every_outcome_is_recorded_as_a_single_completion_would_record_it(
    api: Api,
) -> None:
    ok, retry, dead = await _claim(api, 3)
    r = await api.a.post(
        "/v1/runs:complete",
        json={
            "runs": [
                _done(ok, status="succeeded"),
                _done(retry, status="failed", error="429 from the target", retry_after_sec=600),
                _done(dead, status="failed", permanent=True),
            ]
        },
    )
    assert r.status_code == 200
    assert r.json() == {
        "results": [
            {"index": 0, "status": 200, "run_id": ok["run_id"]},
            {"index": 1, "status": 200, "run_id": retry["run_id"]},
            {"index": 2, "status": 200, "run_id": dead["run_id"]},
        ],
        "completed": 3,
        "failed": 0,
    }
    views = [(await api.a.get(f"/v1/runs/{run['run_id']}")).json() for run in (ok, retry, dead)]
    assert [v["state"] for v in views] == ["succeeded", "retrying", "dead"]
    assert views[1]["attempts"][0]["error"] == "429 from the target"
    assert views[2]["dead_reason"] == "permanent_failure"


async def test_a_stale_token_a_bad_item_and_another_team_s_run_refuse_only_themselves(
    api: Api,
) -> None:
    first, second = await _claim(api, 2)
    cancelled = await api.a.post(f"/v1/runs/{second['run_id']}/cancel")
    assert cancelled.status_code == 200
    before_b = api.everything()
    r = await api.b.post(
        "/v1/runs:complete", json={"runs": [_done(first, status="succeeded")]}
    )  # team-b names team-a's run: not found, nothing changed
    assert r.status_code == 200
    [other] = r.json()["results"]
    assert (other["status"], other["error"]["error"]) == (404, "not_found")
    assert api.everything() == before_b
    r = await api.a.post(
        "/v1/runs:complete",
        json={
            "runs": [
                _done(first, status="succeeded"),
                _done(second, status="succeeded"),
                {"run_id": first["run_id"], "fencing_token": -1, "status": "succeeded"},
                _done(first, status="failed"),  # the other outcome: the lease is gone
            ]
        },
    )
    assert r.status_code == 200
    body = r.json()
    ok, lost, bad, other = body["results"]
    assert (ok["status"], body["completed"], body["failed"]) == (200, 1, 3)
    assert (lost["status"], lost["error"]["error"], lost["error"]["cancelled"]) == (
        409,
        "lease_lost",
        True,
    )
    assert (bad["status"], bad["error"]["field"]) == (400, "runs[2].fencing_token")
    assert (other["status"], other["error"]["error"]) == (409, "lease_lost")
    assert other["error"]["cancelled"] is False
    states = [(await api.a.get(f"/v1/runs/{r['run_id']}")).json()["state"] for r in (first, second)]
    assert states == ["succeeded", "cancelled"]


async def test_a_batch_sent_again_is_answered_as_the_first_was(api: Api) -> None:
    # Its answer was lost on the way: the worker sends the whole batch again. Each outcome was
    # recorded by the first, and is answered so; nothing is recorded twice.
    ok, retry, lapsed = await _claim(api, 3)
    batch = [
        _done(ok, status="succeeded"),
        _done(retry, status="failed", error="503 from the target", retry_after_sec=600),
    ]
    first = await api.a.post("/v1/runs:complete", json={"runs": batch})
    assert first.json()["completed"] == 2
    api.fake.advance(31_000)  # lapsed's lease runs out meanwhile
    events = len(api.fake.events)
    more = [_done(ok, status="failed"), _done(lapsed, status="succeeded")]
    again = await api.a.post("/v1/runs:complete", json={"runs": batch + more})
    body = again.json()
    assert [r["status"] for r in body["results"]] == [200, 200, 409, 409]
    assert body["results"][:2] == first.json()["results"]
    assert (body["completed"], body["failed"]) == (2, 2)
    assert len(api.fake.events) == events
    views = [(await api.a.get(f"/v1/runs/{run['run_id']}")).json() for run in (ok, retry)]
    assert [v["state"] for v in views] == ["succeeded", "retrying"]
    assert [len(v["attempts"]) for v in views] == [1, 1]


@pytest.mark.parametrize(
    ("body", "field"),
    [({"runs": []}, "runs"), ({"runs": [{}] * 1001}, "runs"), ({"outcomes": []}, "outcomes")],
)
async def test_what_is_not_a_batch_is_a_400_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    before = api.everything()
    r = await api.a.post("/v1/runs:complete", json=body)
    assert (r.status_code, r.json()["field"]) == (400, field)
    assert api.everything() == before


async def test_an_outcome_the_read_model_has_not_folded_yet_is_recorded(api: Api) -> None:
    # Under a herd the read model lags the partitions: a worker can finish a run before the
    # history knows of it. The partition holds the lease and says whose run it is.
    for i in range(2):
        assert (await api.a.put(f"/v1/jobs/export-{i}", json=JOB)).status_code == 201
    api.fake.folding = False
    api.fake.advance(1)
    runs = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
    assert len(runs) == 2
    assert (await api.a.get(f"/v1/runs/{runs[0]['run_id']}")).status_code == 404  # not yet
    beat = await api.a.post(
        f"/v1/runs/{runs[1]['run_id']}/heartbeat", json={"fencing_token": runs[1]["fencing_token"]}
    )
    assert beat.status_code == 200
    stranger = await api.b.post(
        "/v1/runs:complete", json={"runs": [_done(runs[0], status="succeeded")]}
    )
    assert stranger.json()["results"][0]["status"] == 404  # still no way into team-a's runs
    r = await api.a.post(
        "/v1/runs:complete", json={"runs": [_done(run, status="succeeded") for run in runs]}
    )
    assert r.json()["completed"] == 2, r.json()
    api.fake.fold()
    states = [(await api.a.get(f"/v1/runs/{run['run_id']}")).json()["state"] for run in runs]
    assert states == ["succeeded", "succeeded"]
