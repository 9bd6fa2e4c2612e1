"""POST /v1/runs:heartbeat: many leases extended in one request, each item answered as a single
heartbeat would be, one refused item refusing only itself."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from api.instants import parse_rfc3339
from api.limits import Limits, TenantLimits
from tests.api.conftest import ANY_TOPIC, Api, serve
from tests.api.fakes import FakeScheduler

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


def _beat(run: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"run_id": run["run_id"], "fencing_token": run["fencing_token"], **more}


async def test_every_lease_is_extended_as_a_single_heartbeat_would_extend_it(api: Api) -> None:
    first, second = await _claim(api, 2)
    api.fake.advance(20_000)  # 20 s into a 30 s lease
    r = await api.a.post("/v1/runs:heartbeat", json={"runs": [_beat(first), _beat(second)]})
    assert r.status_code == 200
    body = r.json()
    until = "2026-11-29T08:00:50.001Z"  # now (20.001 s past the start) plus the 30 s lease
    assert body == {
        "results": [
            {"index": 0, "status": 200, "run_id": first["run_id"], "lease_expires_at": until},
            {"index": 1, "status": 200, "run_id": second["run_id"], "lease_expires_at": until},
        ],
        "extended": 2,
        "failed": 0,
    }
    single = await api.a.post(
        f"/v1/runs/{first['run_id']}/heartbeat", json={"fencing_token": first["fencing_token"]}
    )
    assert single.json()["lease_expires_at"] == until  # the same instant, the same lease
    api.fake.advance(25_000)  # past the claim's lease, not past the extended one
    states = [(await api.a.get(f"/v1/runs/{r['run_id']}")).json()["state"] for r in (first, second)]
    assert states == ["running", "running"]


async def test_a_lost_lease_a_bad_item_and_another_team_s_run_refuse_only_themselves(
    api: Api,
) -> None:
    kept, cancelled, stale = await _claim(api, 3)
    assert (await api.a.post(f"/v1/runs/{cancelled['run_id']}/cancel")).status_code == 200
    before_b = api.everything()
    r = await api.b.post("/v1/runs:heartbeat", json={"runs": [_beat(kept)]})
    assert r.status_code == 200
    [other] = r.json()["results"]  # team-b names team-a's run: not found, nothing changed
    assert (other["status"], other["error"]["error"]) == (404, "not_found")
    assert "lease_expires_at" not in other
    assert api.everything() == before_b
    r = await api.a.post(
        "/v1/runs:heartbeat",
        json={
            "runs": [
                _beat(kept),
                _beat(cancelled),
                {"run_id": kept["run_id"], "fencing_token": -1},
                {"run_id": kept["run_id"], "fencing_token": 1, "status": "succeeded"},
                _beat(stale, fencing_token=stale["fencing_token"] + 1),
                "not an object",
            ]
        },
    )
    assert r.status_code == 200
    body = r.json()
    ok, lost, bad, unknown, reclaimed, odd = body["results"]
    assert (ok["status"], body["extended"], body["failed"]) == (200, 1, 5)
    assert (lost["status"], lost["error"]["error"], lost["error"]["cancelled"]) == (
        409,
        "lease_lost",
        True,
    )
    assert "lease_expires_at" not in lost
    assert (bad["status"], bad["error"]["field"]) == (400, "runs[2].fencing_token")
    assert (unknown["status"], unknown["error"]["field"]) == (400, "runs[3].status")
    assert (reclaimed["status"], reclaimed["error"]["error"]) == (409, "lease_lost")
    assert reclaimed["error"]["cancelled"] is False
    assert (odd["status"], odd["error"]["field"]) == (400, "runs[5]")
    assert [x["index"] for x in body["results"]] == [0, 1, 2, 3, 4, 5]


async def test_each_item_is_answered_as_the_single_endpoint_answers_it(api: Api) -> None:
    """The same refusals, item by item, as POST /v1/runs/{run_id}/heartbeat gives them."""
    mine, cancelled = await _claim(api, 2)
    assert (await api.a.post(f"/v1/runs/{cancelled['run_id']}/cancel")).status_code == 200
    asks = [
        (api.b, _beat(mine)),  # another team's run
        (api.a, _beat(cancelled)),
        (api.a, _beat(mine, fencing_token=mine["fencing_token"] + 7)),
        (api.a, {"run_id": "export-0.1", "fencing_token": 1}),  # no such run
        (api.a, {"run_id": "nonsense", "fencing_token": 1}),
    ]
    for client, item in asks:
        single = await client.post(
            f"/v1/runs/{item['run_id']}/heartbeat", json={"fencing_token": item["fencing_token"]}
        )
        [result] = (await client.post("/v1/runs:heartbeat", json={"runs": [item]})).json()[
            "results"
        ]
        assert result["status"] == single.status_code, (item, single.json())
        assert result["error"]["error"] == single.json()["error"], item
        assert result["error"].get("cancelled") == single.json().get("cancelled"), item


@pytest.mark.parametrize(
    ("body", "field"),
    [({"runs": []}, "runs"), ({"runs": [{}] * 1001}, "runs"), ({"beats": []}, "beats")],
)
async def test_what_is_not_a_batch_is_a_400_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    before = api.everything()
    r = await api.a.post("/v1/runs:heartbeat", json=body)
    assert (r.status_code, r.json()["field"]) == (400, field)
    assert api.everything() == before


async def test_a_heartbeat_sent_again_extends_the_same_lease_again(api: Api) -> None:
    # A worker sends a batch again when its answer was lost: harmless, the token still holds.
    [run] = await _claim(api, 1)
    r = await api.a.post("/v1/runs:heartbeat", json={"runs": [_beat(run)] * 100})
    assert r.status_code == 200
    assert (r.json()["extended"], r.json()["failed"]) == (100, 0)


async def test_the_answer_does_not_wait_for_the_read_model(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under a herd the read model lags the partitions: a heartbeat's answer is the Heartbeat
    # event's expiry, so it is asked of the scheduler without waiting for the fold.
    for i in range(2):
        assert (await api.a.put(f"/v1/jobs/export-{i}", json=JOB)).status_code == 201
    api.fake.folding = False
    api.fake.advance(1)
    runs = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
    assert (await api.a.get(f"/v1/runs/{runs[0]['run_id']}")).status_code == 404  # not yet
    asked: list[bool] = []
    execute_many = api.fake.execute_many

    async def noting(commands: Any, *, visible: bool = True) -> Any:
        asked.append(visible)
        return await execute_many(commands, visible=visible)

    monkeypatch.setattr(api.fake, "execute_many", noting)
    r = await api.a.post("/v1/runs:heartbeat", json={"runs": [_beat(run) for run in runs]})
    assert r.json()["extended"] == 2, r.json()
    assert all(parse_rfc3339(x["lease_expires_at"], "at") for x in r.json()["results"])
    assert asked == [False]
    stranger = await api.b.post("/v1/runs:heartbeat", json={"runs": [_beat(runs[0])]})
    assert stranger.json()["results"][0]["status"] == 404  # still no way into team-a's runs


async def test_each_item_counts_against_the_tokens_rate(fake: FakeScheduler) -> None:
    limits = Limits(tenants={"team-a": TenantLimits(requests_per_sec=0.001, request_burst=6)})
    async with (
        serve(fake, egress=ANY_TOPIC, limits=limits, clock=lambda: 1000.0) as transport,
        httpx.AsyncClient(
            transport=transport,
            base_url="http://cronlog",
            headers={"Authorization": "Bearer token-of-team-a"},
        ) as a,
    ):
        for i in range(2):
            assert (await a.put(f"/v1/jobs/export-{i}", json=JOB)).status_code == 201
        fake.advance(1)
        runs = (await a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
        assert len(runs) == 2
        # Three requests left: the request pays for the first item, two more go, the rest wait.
        out = await a.post("/v1/runs:heartbeat", json={"runs": [_beat(run) for run in runs] * 3})
        assert out.status_code == 200
        results = out.json()["results"]
        assert [r["status"] for r in results] == [200, 200, 200, 429, 429, 429]
        assert (results[3]["error"]["error"], results[3]["error"]["field"]) == (
            "rate_limited",
            "runs[3]",
        )
        # The bucket is spent: the next request is refused whole.
        refused = await a.post("/v1/runs:heartbeat", json={"runs": [_beat(runs[0])]})
        assert refused.status_code == 429
