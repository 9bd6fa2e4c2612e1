"""Runs: history with pages, ad-hoc and backfill triggers, cancel, the dead-letter list, replay."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from api import runs as api_runs
from api.instants import parse_rfc3339
from core.clock import FakeClock
from core.commands import TriggerRun
from core.events import AnyEvent, RunMaterialised
from core.ids import team_id
from projections.read_model import ReadModel
from tests.api.conftest import START, Api, serve
from tests.api.fakes import FakeScheduler

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


async def test_a_future_slot_is_refused_and_changes_nothing(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    before = api.everything()
    for headers in ({}, {"Idempotency-Key": "later-1"}):
        body = {"scheduled_for": "2026-11-29T08:00:00.001Z"}  # a millisecond after now
        r = await api.a.post("/v1/jobs/rollup/runs", json=body, headers=headers)
        assert (r.status_code, r.json()["error"], r.json()["field"]) == (
            422,
            "invalid",
            "scheduled_for",
        )
    assert api.everything() == before
    now = await api.a.post("/v1/jobs/rollup/runs", json={"scheduled_for": "2026-11-29T08:00:00Z"})
    assert now.status_code == 201  # the present instant is not the future


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


async def test_a_key_reused_without_a_slot_is_the_same_run(api: Api) -> None:
    """A repeat of a keyed "run now", later, is the run the key made: 200, nothing decided."""
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    headers = {"Idempotency-Key": "now-1"}
    first = await api.a.post("/v1/jobs/rollup/runs", headers=headers)
    assert first.status_code == 201
    api.fake.advance(5_000)
    events = len(api.fake.events)
    again = await api.a.post("/v1/jobs/rollup/runs", headers=headers)
    assert again.status_code == 200
    assert again.json() == (await api.a.get(f"/v1/runs/{first.json()['run_id']}")).json()
    assert len(api.fake.events) == events


async def test_a_key_names_its_run_whatever_slot_a_repeat_asks_for(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    headers = {"Idempotency-Key": "backfill-1"}
    first = {"scheduled_for": "2026-11-29T06:00:00Z"}
    made = await api.a.post("/v1/jobs/rollup/runs", json=first, headers=headers)
    events = len(api.fake.events)
    other = {"scheduled_for": "2026-11-29T07:00:00Z"}
    for body in (other, None):
        again = await api.a.post("/v1/jobs/rollup/runs", json=body, headers=headers)
        assert (again.status_code, again.json()["run_id"]) == (200, made.json()["run_id"])
    assert len(api.fake.events) == events


async def test_a_key_is_the_same_run_after_the_run_succeeded(api: Api) -> None:
    """The partition forgets a run that succeeded; the read model still names it by its key."""
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    headers = {"Idempotency-Key": "now-1"}
    run_id = (await api.a.post("/v1/jobs/rollup/runs", headers=headers)).json()["run_id"]
    await _succeed(api, run_id)
    events = len(api.fake.events)
    again = await api.a.post("/v1/jobs/rollup/runs", headers=headers)
    assert (again.status_code, again.json()["run_id"]) == (200, run_id)
    assert again.json()["state"] == "succeeded"
    assert len(api.fake.events) == events


async def test_another_tenant_reusing_a_key_gets_nothing_of_ours(api: Api) -> None:
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    headers = {"Idempotency-Key": "now-1"}
    assert (await api.a.post("/v1/jobs/rollup/runs", headers=headers)).status_code == 201
    events = len(api.fake.events)
    theirs = await api.b.post("/v1/jobs/rollup/runs", headers=headers)
    assert (theirs.status_code, theirs.json()["error"]) == (404, "not_found")
    body = {"scheduled_for": "2026-11-29T08:00:00Z"}
    theirs = await api.b.post("/v1/jobs/rollup/runs", json=body)
    assert (theirs.status_code, theirs.json()["error"]) == (404, "not_found")
    assert len(api.fake.events) == events


async def _succeed(api: Api, run_id: str) -> None:
    claim = {"pool": "rollups", "worker_id": "w1"}
    [lease] = (await api.a.post("/v1/workers/claim", json=claim)).json()["runs"]
    assert lease["run_id"] == run_id
    done = {"fencing_token": lease["fencing_token"], "status": "succeeded"}
    r = await api.a.post(f"/v1/runs/{run_id}/complete", json=done)
    assert r.json()["state"] == "succeeded"


@pytest.mark.parametrize("end", ["succeeded", "cancelled"])
async def test_a_slot_whose_run_ended_is_not_run_again(api: Api, end: str) -> None:
    """A run that succeeded or was cancelled has left the partition state: the API finds it in
    the read model and sends nothing, so the identity (job, slot) stays one run."""
    await api.a.put("/v1/jobs/rollup", json=MINUTELY)
    body = {"scheduled_for": "2026-11-29T07:00:00Z"}
    run_id = (await api.a.post("/v1/jobs/rollup/runs", json=body)).json()["run_id"]
    if end == "succeeded":
        await _succeed(api, run_id)
    else:
        await api.a.post(f"/v1/runs/{run_id}/cancel")
    api.fake.advance(1_000)
    events = len(api.fake.events)
    before = (await api.a.get(f"/v1/runs/{run_id}")).json()
    for headers in ({}, {"Idempotency-Key": "a-fresh-key"}):
        again = await api.a.post("/v1/jobs/rollup/runs", json=body, headers=headers)
        assert (again.status_code, again.json()) == (200, before)
        assert before["state"] == end
    assert len(api.fake.events) == events
    runs = (await api.a.get("/v1/jobs/rollup/runs")).json()["runs"]
    assert [r["run_id"] for r in runs] == [run_id]


# -- a read model behind the partition ---------------------------------------------------------


class LaggingReadModel(ReadModel):
    """Holds events back while ``lagging``, as a read model behind its log does; the held tail
    arrives once someone waits on the model (unless ``arrives`` is False)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.lagging = False
        self.arrives = True
        self.held: list[tuple[AnyEvent, int, int]] = []
        self.waits = 0

    def process(self, event: AnyEvent, partition: int, offset: int) -> None:
        if self.lagging:
            self.held.append((event, partition, offset))
        else:
            super().process(event, partition, offset)

    def catch_up(self) -> None:
        held, self.held, self.lagging = self.held, [], False
        with self.batch():
            for event, partition, offset in held:
                super().process(event, partition, offset)

    def wait_for(self, partition: int, offset: int, timeout_s: float) -> bool:
        self.waits += 1
        if self.arrives:
            threading.Thread(target=self.catch_up).start()
        return super().wait_for(partition, offset, timeout_s)


@dataclass
class Lagging:
    fake: FakeScheduler
    history: LaggingReadModel
    a: httpx.AsyncClient


@pytest.fixture
async def lagging(tmp_path: Path) -> AsyncIterator[Lagging]:
    history = LaggingReadModel(tmp_path / "read_model")
    with history:
        fake = FakeScheduler(history, FakeClock(START))
        async with (
            serve(fake) as transport,
            httpx.AsyncClient(
                transport=transport,
                base_url="http://cronlog",
                headers={"Authorization": "Bearer token-of-team-a"},
            ) as client,
        ):
            assert (await client.put("/v1/jobs/rollup", json=MINUTELY)).status_code == 201
            yield Lagging(fake, history, client)


async def test_a_slot_decided_by_a_timer_is_waited_for(lagging: Lagging) -> None:
    lagging.history.lagging = True
    lagging.fake.advance(60_000)  # the 08:01 slot: in the partition, not yet in the read model
    events = len(lagging.fake.events)
    body = {"scheduled_for": "2026-11-29T08:01:00Z"}
    r = await lagging.a.post("/v1/jobs/rollup/runs", json=body)
    assert (r.status_code, r.json()["run_id"]) == (200, f"rollup.{ms('2026-11-29T08:01:00Z')}")
    assert (r.json()["trigger"], lagging.history.waits) == ("schedule", 1)
    assert len(lagging.fake.events) == events


async def test_a_key_used_elsewhere_is_waited_for(lagging: Lagging) -> None:
    lagging.history.lagging = True
    [made] = await lagging.fake.execute(
        TriggerRun(job_id="team-a/rollup", tenant="team-a", idempotency_key="k-1")
    )
    assert isinstance(made, RunMaterialised)
    events = len(lagging.fake.events)
    r = await lagging.a.post("/v1/jobs/rollup/runs", headers={"Idempotency-Key": "k-1"})
    assert (r.status_code, r.json()["run_id"]) == (200, team_id(made.run_id))
    assert lagging.history.waits == 1
    assert len(lagging.fake.events) == events


async def test_a_run_that_never_becomes_readable_is_503(
    lagging: Lagging, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api_runs, "CATCH_UP_S", 0.05)
    lagging.history.lagging, lagging.history.arrives = True, False
    await lagging.fake.execute(
        TriggerRun(job_id="team-a/rollup", tenant="team-a", idempotency_key="k-1")
    )
    events = len(lagging.fake.events)
    r = await lagging.a.post("/v1/jobs/rollup/runs", headers={"Idempotency-Key": "k-1"})
    assert (r.status_code, r.json()["error"]) == (503, "unavailable")
    assert r.headers["retry-after"] == "1"
    assert len(lagging.fake.events) == events
