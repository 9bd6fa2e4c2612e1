"""Pull workers: claim, heartbeat, complete; lost leases answer 409 and say why, an outcome sent
again is answered as it was recorded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.instants import parse_rfc3339
from api.scheduler import Unavailable
from core.commands import CompleteRun, Outcome
from tests.api.conftest import Api

pytestmark = pytest.mark.anyio

JOB = {
    "name": "export",
    "schedule": "*/5 * * * *",
    "target": "pull://exports",
    "payload": {"table": "orders"},
    "lease_sec": 30,
    "timeout_sec": 120,
}
SLOT = parse_rfc3339("2026-11-29T08:05:00Z", "slot")
CLAIM = {"pool": "exports", "worker_id": "worker-1", "limit": 10}


async def _claim_one(api: Api) -> dict[str, Any]:
    await api.a.put("/v1/jobs/export", json=JOB)
    api.fake.advance(5 * 60_000 + 1_500)  # the 08:05 slot, claimed 1.5 s late
    r = await api.a.post("/v1/workers/claim", json=CLAIM)
    assert r.status_code == 200
    [run] = r.json()["runs"]
    return dict(run)


async def test_claim_gives_the_lease_and_what_to_do(api: Api) -> None:
    run = await _claim_one(api)
    assert run == {
        "run_id": f"export.{SLOT}",
        "job_id": "export",
        "scheduled_for": "2026-11-29T08:05:00.000Z",
        "attempt": 1,
        "fencing_token": 1,
        "lease_expires_at": "2026-11-29T08:05:31.500Z",
        "lease_sec": 30.0,
        "payload": {"table": "orders"},
        "idempotency_key": f"team-a/export:{SLOT}",  # the log's job id: one team's alone
        "timeout_sec": 120.0,
        "start_at": None,  # leased now: start now
        "start_in_ms": 0,
        "check_ahead_ms": 0,  # nothing to check before a start that is now
    }
    view = (await api.a.get(f"/v1/runs/{run['run_id']}")).json()
    assert (view["state"], view["lateness_ms"]) == ("running", 1500)
    assert view["started_at"] == "2026-11-29T08:05:01.500Z"
    assert (await api.a.post("/v1/workers/claim", json=CLAIM)).json() == {"runs": []}


async def test_claim_spans_partitions(api: Api) -> None:
    for i in range(8):  # eight jobs over four partitions
        await api.a.put(f"/v1/jobs/export-{i}", json={**JOB, "schedule": None, "interval_sec": 60})
    api.fake.advance(1)  # each one's first slot is its registration
    runs = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
    assert sorted(r["job_id"] for r in runs) == [f"export-{i}" for i in range(8)]


async def test_heartbeat_then_complete(api: Api) -> None:
    run = await _claim_one(api)
    api.fake.advance(20_000)
    token = {"fencing_token": run["fencing_token"]}
    r = await api.a.post(f"/v1/runs/{run['run_id']}/heartbeat", json=token)
    assert r.status_code == 200
    assert r.json() == {"run_id": run["run_id"], "lease_expires_at": "2026-11-29T08:05:51.500Z"}
    api.fake.advance(20_000)  # past the first lease, inside the renewed one
    done = {**token, "status": "succeeded"}
    r = await api.a.post(f"/v1/runs/{run['run_id']}/complete", json=done)
    assert r.status_code == 200
    view = r.json()
    assert (view["state"], view["finished_at"]) == ("succeeded", "2026-11-29T08:05:41.500Z")
    assert [a["outcome"] for a in view["attempts"]] == ["succeeded"]


async def test_a_stale_token_gets_409_after_the_run_was_reclaimed(api: Api) -> None:
    run = await _claim_one(api)
    api.fake.advance(31_000)  # the lease runs out; the run is retried later
    beat = await api.a.post(
        f"/v1/runs/{run['run_id']}/heartbeat", json={"fencing_token": run["fencing_token"]}
    )
    assert beat.status_code == 409
    assert beat.json()["error"] == "lease_lost"
    assert beat.json()["cancelled"] is False
    api.fake.advance(3_600_000)
    again = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
    retry = next(r for r in again if r["run_id"] == run["run_id"])
    assert (retry["attempt"], retry["fencing_token"] > run["fencing_token"]) == (2, True)
    late = {"fencing_token": run["fencing_token"], "status": "succeeded"}
    r = await api.a.post(f"/v1/runs/{run['run_id']}/complete", json=late)
    assert (r.status_code, r.json()["error"]) == (409, "lease_lost")
    state = (await api.a.get(f"/v1/runs/{run['run_id']}")).json()["state"]
    assert state == "running"  # the zombie's report changed nothing


async def test_a_success_sent_again_is_answered_as_the_first_was(api: Api) -> None:
    # The worker's first answer was lost on the way: it sends the same outcome again.
    run = await _claim_one(api)
    path = f"/v1/runs/{run['run_id']}/complete"
    done = {"fencing_token": run["fencing_token"], "status": "succeeded"}
    first = await api.a.post(path, json=done)
    assert first.status_code == 200
    events = len(api.fake.events)
    api.fake.advance(2_000)
    again = await api.a.post(path, json=done)
    assert (again.status_code, again.json()) == (200, first.json())
    assert len(api.fake.events) == events  # nothing decided, nothing appended
    other = await api.a.post(path, json={**done, "status": "failed", "error": "boom"})
    assert (other.status_code, other.json()["error"]) == (409, "lease_lost")
    stranger = await api.b.post(path, json=done)
    assert stranger.status_code == 404  # another team's run, repeated or not
    assert len(api.fake.events) == events


async def test_a_failure_sent_again_is_answered_as_recorded_the_other_outcome_is_not(
    api: Api,
) -> None:
    run = await _claim_one(api)
    path = f"/v1/runs/{run['run_id']}/complete"
    failed = {
        "fencing_token": run["fencing_token"],
        "status": "failed",
        "error": "503 from the target",
        "retry_after_sec": 600,
    }
    first = await api.a.post(path, json=failed)
    assert (first.status_code, first.json()["state"]) == (200, "retrying")
    events = len(api.fake.events)
    again = await api.a.post(path, json=failed)
    assert (again.status_code, again.json()) == (200, first.json())
    late = {"fencing_token": run["fencing_token"], "status": "succeeded"}
    r = await api.a.post(path, json=late)
    assert (r.status_code, r.json()["error"]) == (409, "lease_lost")
    assert len(api.fake.events) == events
    # The retry is leased to another worker: the failure the first token recorded stays
    # recorded, and is answered so; that token's success is still refused.
    api.fake.advance(600_000)
    claimed = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
    retry = next(r for r in claimed if r["run_id"] == run["run_id"])
    assert retry["fencing_token"] > run["fencing_token"]
    assert (await api.a.post(path, json=failed)).status_code == 200
    assert (await api.a.post(path, json=late)).status_code == 409
    view = (await api.a.get(f"/v1/runs/{run['run_id']}")).json()
    assert (view["state"], [a["outcome"] for a in view["attempts"]]) == (
        "running",
        ["failed", None],
    )


async def test_a_repeat_the_history_has_not_folded_yet_is_waited_for(api: Api) -> None:
    # The first outcome is in the partition, not yet in the read model (a node that died
    # between the append and the fold, a model lagging under load): the repeat waits for it.
    run = await _claim_one(api)
    api.fake.folding = False
    command = CompleteRun(
        run_id=f"team-a/{run['run_id']}",
        fencing_token=run["fencing_token"],
        outcome=Outcome.SUCCEEDED,
        tenant="team-a",
    )
    await api.fake.execute(command)  # the first, whose answer the worker never heard
    events = len(api.fake.events)
    asyncio.get_running_loop().call_later(0.2, api.fake.fold)
    done = {"fencing_token": run["fencing_token"], "status": "succeeded"}
    r = await api.a.post(f"/v1/runs/{run['run_id']}/complete", json=done)
    assert (r.status_code, r.json()["state"]) == (200, "succeeded")
    assert len(api.fake.events) == events


async def test_cancelling_a_running_run_tells_the_worker_at_its_heartbeat(api: Api) -> None:
    run = await _claim_one(api)
    r = await api.a.post(f"/v1/runs/{run['run_id']}/cancel")
    assert (r.status_code, r.json()["state"]) == (200, "cancelled")
    token = {"fencing_token": run["fencing_token"]}
    beat = await api.a.post(f"/v1/runs/{run['run_id']}/heartbeat", json=token)
    assert beat.status_code == 409
    assert beat.json()["cancelled"] is True
    assert "cancelled" in beat.json()["message"]
    done = await api.a.post(
        f"/v1/runs/{run['run_id']}/complete", json={**token, "status": "succeeded"}
    )
    assert (done.status_code, done.json()["cancelled"]) == (409, True)


async def test_a_failure_with_retry_after_waits_at_least_that_long(api: Api) -> None:
    run = await _claim_one(api)
    failed = {
        "fencing_token": run["fencing_token"],
        "status": "failed",
        "error": "429 from the target",
        "retry_after_sec": 600,
    }
    r = await api.a.post(f"/v1/runs/{run['run_id']}/complete", json=failed)
    assert r.status_code == 200
    view = r.json()
    assert (view["state"], view["attempt"]) == ("retrying", 2)
    assert view["available_at"] == "2026-11-29T08:15:01.500Z"
    assert view["attempts"][0]["error"] == "429 from the target"


async def test_a_permanent_failure_goes_straight_to_the_dead_letters(api: Api) -> None:
    run = await _claim_one(api)
    failed = {"fencing_token": run["fencing_token"], "status": "failed", "permanent": True}
    r = await api.a.post(f"/v1/runs/{run['run_id']}/complete", json=failed)
    assert (r.json()["state"], r.json()["dead_reason"]) == ("dead", "permanent_failure")


async def test_a_claim_reaching_ahead_leases_what_starts_soon_and_hears_of_its_start(
    api: Api,
) -> None:
    """A claim with ahead_sec leases the run due in 3 s: its lease counts from its start, the
    answer says how far off that is; the worker checks the lease before starting (nothing is
    decided), and its first heartbeat after the start reports how late it began."""
    for partition in api.fake.partitions:  # a node's lead time: runs materialised 30 s ahead
        partition.lead_ms = 30_000
    await api.a.put("/v1/jobs/export", json=JOB)
    api.fake.advance(5 * 60_000 - 3_000)  # 3 s before the 08:05 slot
    plain = await api.a.post("/v1/workers/claim", json=CLAIM)
    assert plain.json() == {"runs": []}  # not ready yet
    r = await api.a.post("/v1/workers/claim", json={**CLAIM, "ahead_sec": 5})
    [run] = r.json()["runs"]
    assert run["start_at"] == "2026-11-29T08:05:00.000Z" and run["start_in_ms"] == 3_000
    assert run["check_ahead_ms"] == 3_000  # checked then; the node answers at the cut-off
    assert run["lease_expires_at"] == "2026-11-29T08:05:30.000Z"
    path = f"/v1/runs/{run['run_id']}/heartbeat"
    before = len(api.fake.events)
    check = await api.a.post(path, json={"fencing_token": run["fencing_token"], "check": True})
    assert check.json() == {"run_id": run["run_id"], "lease_expires_at": None}
    assert len(api.fake.events) == before  # a check decides nothing
    api.fake.advance(3_000 + 250)
    beat = await api.a.post(
        path, json={"fencing_token": run["fencing_token"], "started_late_ms": 40}
    )
    assert beat.status_code == 200
    view = (await api.a.get(f"/v1/runs/{run['run_id']}")).json()
    assert (view["started_at"], view["lateness_ms"]) == ("2026-11-29T08:05:00.040Z", 40)
    assert view["attempts"][0]["started_at"] == "2026-11-29T08:05:00.040Z"


async def test_a_reach_past_the_longest_lead_is_refused_naming_the_field(api: Api) -> None:
    r = await api.a.post("/v1/workers/claim", json={**CLAIM, "ahead_sec": 301})
    assert (r.status_code, r.json()["field"]) == (400, "ahead_sec")


async def test_a_claim_whose_answer_cannot_be_made_gives_its_leases_back(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leases were granted, but the worker gets a 503, not the runs: nobody holds them, so
    they are given back and the next claim gets the run at once (a critical run's lease would
    otherwise run out and set it aside as outcome_unknown)."""
    await api.a.put("/v1/jobs/export", json={**JOB, "critical": True})
    api.fake.advance(5 * 60_000 + 1_500)
    reader = api.fake.reader

    async def unreadable(tenant: str, job_ids: list[str]) -> Any:
        raise Unavailable("the read model is refilling")

    monkeypatch.setattr(reader, "jobs_by_id", unreadable)
    r = await api.a.post("/v1/workers/claim", json=CLAIM)
    assert r.status_code == 503
    [(leases, why)] = api.fake.returned
    assert [lease.fencing_token for lease in leases] == [1]
    assert "could not be made" in why
    monkeypatch.undo()
    [run] = (await api.a.post("/v1/workers/claim", json=CLAIM)).json()["runs"]
    assert (run["run_id"], run["attempt"], run["fencing_token"]) == (f"export.{SLOT}", 1, 2)
    view = (await api.a.get(f"/v1/runs/{run['run_id']}")).json()
    assert [a["fencing_token"] for a in view["attempts"]] == [2]
