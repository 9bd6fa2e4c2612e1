"""The typed client, blocking and asyncio, against a real ``cronlog serve``: every operation,
the refusals as exceptions, and models that keep to the node's ``/openapi.json``."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import httpx
import msgspec
import pytest
from cronlog_client import (
    UNSET,
    BackoffIn,
    Client,
    Conflict,
    HttpTarget,
    InvalidRequest,
    JobDefinition,
    JobPatch,
    LeaseLost,
    NewJob,
    NotFound,
    Refused,
    Unauthorized,
    Unreachable,
    models,
)

from tests.cli.test_serve import Serve
from tests.sdk.conftest import async_client, unique

pytestmark = pytest.mark.slow
UTC = dt.UTC


def soon(seconds: float) -> dt.datetime:
    return dt.datetime.now(UTC) + dt.timedelta(seconds=seconds)


def test_jobs_from_creation_to_cancellation(a: Client, b: Client) -> None:
    job_id = unique("report")
    definition = NewJob(
        job_id=job_id,
        name="report",
        schedule="0 9 * * 1-5",
        timezone="Europe/London",
        target=HttpTarget(url="http://127.0.0.1:9/hook", headers={"X-Team": "a"}),
        payload={"day": 1},
        retries=2,
        timeout_sec=5,
        priority=7,
        overlap_policy="skip",
        misfire_policy="catch_up",
        allow_jitter_sec=3,
        backoff=BackoffIn(base_sec=1, jitter=False),
        start_at="2030-01-01T00:00:00Z",
        end_at=dt.datetime(2031, 1, 1, tzinfo=UTC),
    )
    created = a.create_job(definition)
    assert created.job_id == job_id and created.version == 1
    assert created.start_at == dt.datetime(2030, 1, 1, tzinfo=UTC)
    assert created.next_run_at is not None and created.next_run_at.year == 2030
    assert isinstance(created.target, models.HttpTarget) and created.target.headers == {
        "X-Team": "a"
    }
    assert (created.priority, created.overlap_policy, created.backoff.base_sec) == (7, "skip", 1.0)
    # The same create again is the same job; team-b does not see it.
    assert a.create_job(definition).version == 1
    with pytest.raises(NotFound):
        b.get_job(job_id)

    patched = a.patch_job(job_id, JobPatch(priority=3, version=1))
    assert (patched.priority, patched.version) == (3, 2)
    with pytest.raises(Conflict):
        a.patch_job(job_id, JobPatch(priority=4, version=1))
    assert a.pause_job(job_id).status == "paused"
    assert [j.job_id for j in a.iter_jobs("paused")] == [job_id]
    assert a.resume_job(job_id).status == "active"
    replaced = a.put_job(
        job_id,
        JobDefinition(name="report", interval_sec=3600, target="pull://reports"),
        if_version=4,
    )
    assert (replaced.interval_sec, replaced.schedule, replaced.version) == (3600.0, None, 5)
    assert a.cancel_job(job_id).status == "cancelled"
    assert a.get_job(job_id).status == "cancelled"


def test_paging_walks_every_job(a: Client) -> None:
    ids = {unique("paged") for _ in range(7)}
    for job_id in ids:
        a.put_job(job_id, JobDefinition(name="p", schedule="0 0 1 1 *", target="pull://p"))
    first = a.list_jobs(limit=3)
    assert len(first.jobs) == 3 and first.next_cursor is not None
    assert ids <= {job.job_id for job in a.iter_jobs(page_size=2)}


def test_refusals_are_typed_and_name_the_field(a: Client, node: Serve) -> None:
    with pytest.raises(InvalidRequest) as bad:
        a.create_job(NewJob(name="x", target="pull://p", schedule="* * * * *", retries=-1))
    assert (bad.value.status, bad.value.field) == (400, "retries")
    with pytest.raises(Refused) as refused:
        a.create_job(NewJob(name="x", target="pull://p", schedule="*/10 * * * * *"))
    assert refused.value.field == "schedule" and "seconds" in refused.value.message
    with pytest.raises(Refused) as past:
        a.create_job(NewJob(name="x", target="pull://p", run_at="2020-01-01T00:00:00Z"))
    assert past.value.field == "run_at"
    with pytest.raises(NotFound):
        a.get_run("nope.1")
    with pytest.raises(Unauthorized), Client(node.url, "not-a-token") as stranger:
        stranger.list_jobs()
    with pytest.raises(Unreachable), Client("http://127.0.0.1:9", "t", retries=0) as nowhere:
        nowhere.list_jobs()
    with pytest.raises(ValueError, match="timezone"):
        a.trigger("x", scheduled_for=dt.datetime(2026, 1, 1))  # a naive time is refused here


def test_seconds_previews_and_slots(a: Client) -> None:
    job_id = unique("ticks")
    job = a.put_job(
        job_id,
        JobDefinition(name="t", schedule="* * * * *", seconds="*/15", target="pull://ticks"),
    )
    assert (job.schedule, job.seconds) == ("* * * * *", "*/15")
    fires = a.preview_job(job_id, n=4).fires
    assert [f.at.second for f in fires] in ([0, 15, 30, 45], [15, 30, 45, 0], [30, 45, 0, 15],
                                            [45, 0, 15, 30])  # fmt: skip
    preview = a.preview_schedule("30 1 * * *", timezone="America/New_York", n=2,
                                 after="2024-11-03T00:00:00Z")  # fmt: skip
    assert [f.local for f in preview.fires] == [
        "2024-11-03T01:30:00-04:00",
        "2024-11-04T01:30:00-05:00",
    ]
    hourly = unique("hourly")
    a.put_job(hourly, JobDefinition(name="h", schedule="0 * * * *", target="pull://h",
                                    start_at="2026-01-01T00:00:00Z",
                                    allow_past=True))  # fmt: skip
    slots = a.job_slots(hourly, "2026-01-01T00:00:00Z", "2026-01-01T05:30:00Z")
    assert [s.scheduled_for.hour for s in slots.slots] == [0, 1, 2, 3, 4, 5]
    assert all(s.due and s.state is None for s in slots.slots) and not slots.more


def test_backfill_triggers_each_missing_slot_once(a: Client) -> None:
    job_id = unique("daily")
    a.put_job(job_id, JobDefinition(name="d", schedule="0 6 * * *", target="pull://daily"))
    start, end = "2026-01-01T00:00:00Z", "2026-01-05T23:00:00Z"
    a.trigger(job_id, scheduled_for="2026-01-03T06:00:00Z")  # one slot has run already
    plan = a.backfill_plan(job_id, start, end)
    assert [s.state is None for s in plan.slots] == [True, True, False, True, True]
    seen: list[tuple[int, int]] = []
    runs = a.backfill(job_id, start, end, progress=lambda n, total, _: seen.append((n, total)))
    assert [r.scheduled_for.day for r in runs] == [1, 2, 4, 5]
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(r.trigger == "manual" for r in runs)
    assert a.backfill(job_id, start, end) == []  # again: nothing left to trigger
    assert len(list(a.iter_job_runs(job_id))) == 5


def test_runs_by_hand_and_a_pull_worker_by_hand(a: Client, b: Client) -> None:
    job_id = unique("crunch")
    a.put_job(
        job_id,
        JobDefinition(
            name="c",
            schedule="0 0 1 1 *",
            target="pull://sdk-crunch",
            retries=0,
            lease_sec=30,
        ),
    )
    run = a.trigger(job_id, idempotency_key="once")
    assert a.trigger(job_id, idempotency_key="once").run_id == run.run_id
    assert b.claim("sdk-crunch", "w-b") == []  # another team's pool of that name
    [claimed] = a.claim("sdk-crunch", "w1", limit=5)
    assert claimed.run_id == run.run_id and claimed.payload is None
    assert claimed.idempotency_key.startswith(f"team-a/{job_id}:")
    beat = a.heartbeat(claimed.run_id, claimed.fencing_token)
    assert beat.lease_expires_at > claimed.lease_expires_at - dt.timedelta(seconds=1)
    with pytest.raises(LeaseLost):
        a.heartbeat(claimed.run_id, claimed.fencing_token - 1)
    failed = a.complete(claimed.run_id, claimed.fencing_token, "failed", error="disk full",
                        permanent=True)  # fmt: skip
    assert (failed.state, failed.dead_reason) == ("dead", "permanent_failure")
    assert run.run_id in {r.run_id for r in a.iter_runs("dead")}
    assert a.replay_run(run.run_id).state == "pending"
    cancelled = a.cancel_run(run.run_id)
    assert cancelled.state == "cancelled"
    assert [r.state for r in a.job_runs(job_id).runs] == ["cancelled"]


def test_the_async_client_speaks_the_same_api(node: Serve) -> None:
    async def scenario() -> None:
        async with async_client(node) as cronlog:
            job_id = unique("async")
            job = await cronlog.put_job(
                job_id, JobDefinition(name="x", schedule="0 0 1 1 *", target="pull://async")
            )
            assert job.job_id == job_id
            assert (await cronlog.pause_job(job_id)).status == "paused"
            assert job_id in [j.job_id async for j in cronlog.iter_jobs("paused")]
            run = await cronlog.trigger(job_id)
            assert (await cronlog.get_run(run.run_id)).state == "pending"
            claim = asyncio.ensure_future(cronlog.claim("async", "w", wait_sec=5))
            [claimed] = await asyncio.wait_for(claim, 10)
            done = await cronlog.complete(claimed.run_id, claimed.fencing_token)
            assert done.state == "succeeded"
            assert [r.run_id async for r in cronlog.iter_job_runs(job_id)] == [run.run_id]
            assert await cronlog.ready() and await cronlog.health()
            with pytest.raises(NotFound):
                await cronlog.get_job("missing")

    asyncio.run(scenario())


def test_the_models_keep_to_the_nodes_openapi_document(node: Serve) -> None:
    schemas = httpx.get(f"{node.url}/openapi.json", timeout=10).json()["components"]["schemas"]
    pairs: list[tuple[type[Any], str]] = [
        (models.Job, "JobOut"),
        (models.JobPage, "JobPage"),
        (models.Run, "RunOut"),
        (models.Attempt, "AttemptOut"),
        (models.RunPage, "RunPage"),
        (models.ClaimedRun, "ClaimedRun"),
        (models.HeartbeatOut, "HeartbeatOut"),
        (models.Preview, "PreviewOut"),
        (models.FireTime, "FireTime"),
        (models.Slot, "SlotOut"),
        (models.Slots, "SlotsOut"),
        (models.NewJob, "NewJob"),
        (models.JobDefinition, "JobDefinition"),
        (models.JobPatch, "JobPatch"),
        (models.BackoffIn, "BackoffIn"),
        (models.RunSummary, "RunSummary"),
        (models.ChangePreview, "ChangePreviewOut"),
        (models.ReplayOut, "ReplayOut"),
        (models.ReplayRefused, "ReplayRefused"),
        (models.Stats, "StatsOut"),
        (models.StatsFigures, "StatsFigures"),
        (models.StatsPoint, "StatsPoint"),
        (models.Team, "TeamOut"),
        (models.JobBatch, "JobBatchOut"),
        (models.JobResult, "JobResult"),
        (models.HeartbeatBatch, "HeartbeatBatchOut"),
        (models.HeartbeatResult, "HeartbeatResult"),
        (models.ItemError, "ErrorBody"),
        (models.TeamLimits, "TenantLimits"),
    ]
    for model, name in pairs:
        ours = set(model.__struct_fields__)
        theirs = set(schemas[name]["properties"])
        assert ours == theirs, f"{model.__name__} vs {name}: {sorted(ours ^ theirs)}"


def test_unset_fields_are_not_sent() -> None:
    body = msgspec.json.decode(msgspec.json.encode(JobPatch(priority=1, schedule=None)))
    assert body == {"priority": 1, "schedule": None}
    assert JobPatch().priority is UNSET


def test_change_previews_replays_by_filter_the_teams_figures(a: Client) -> None:
    job_id = unique("ui-ops")
    a.put_job(job_id, JobDefinition(name="u", schedule="0 9 * * *", target="pull://ui-ops"))
    change = a.preview_change(job_id, JobPatch(schedule="0 9,17 * * *"), n=4)
    assert change.job_id == job_id and change.added and not change.dropped
    assert a.get_job(job_id).schedule == "0 9 * * *"  # a preview changes nothing
    for day in (1, 2):
        run = a.trigger(job_id, scheduled_for=f"2026-01-0{day}T09:00:00Z")
        [claimed] = a.claim("ui-ops", "w", wait_sec=5)
        a.complete(claimed.run_id, claimed.fencing_token, "failed", error="x", permanent=True)
        assert a.get_run(run.run_id).state == "dead"
    counted = a.replay_dead(job_id=job_id, dry_run=True)
    assert (counted.dry_run, counted.matched, counted.replayed) == (True, 2, [])
    done = a.replay_dead(job_id=job_id, scheduled_before="2026-01-02T00:00:00Z")
    assert len(done.replayed) == 1 and done.replayed[0].endswith(".1767258000000")
    team = a.team()
    assert team.tenant == "team-a" and team.jobs >= 1 and team.limits.max_event_streams == 8
    figures = a.stats(window_min=60)
    assert figures.runs_by_state.get("dead", 0) >= 1 and figures.points
    [found] = [j for j in a.iter_jobs(q=job_id)]
    assert found.job_id == job_id and found.last_run is not None


def test_many_jobs_at_once_in_batches(
    a: Client, b: Client, node: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cronlog_client.client.MAX_BATCH_JOBS", 2)  # split a few into batches
    key = unique("migration")
    there = unique("there")
    a.put_job(there, JobDefinition(name="kept", schedule="0 0 1 1 *", target="pull://batch"))
    jobs = [
        NewJob(name="one", schedule="0 0 1 1 *", target="pull://batch"),
        NewJob(name="kept", schedule="0 0 1 1 *", target="pull://batch", job_id=there),
        NewJob(name="bad", schedule="0 0 31 2 *", target="pull://batch"),  # never fires
        NewJob(name="two", interval_sec=3600, target="pull://batch"),
        NewJob(name="other", schedule="0 0 1 1 *", target="pull://batch", job_id=there),
    ]
    done = a.create_jobs(jobs, idempotency_key=key)
    assert [r.status for r in done.results] == [201, 200, 422, 201, 409]
    assert [r.index for r in done.results] == [0, 1, 2, 3, 4]
    assert (done.created, done.existing, done.failed) == (2, 1, 2)
    assert done.results[2].error is not None and done.results[2].error.field == "jobs[2].schedule"
    assert [r.index for r in done.refused] == [2, 4]
    created = [r.job_id for r in done.results if r.status == 201]
    assert [a.get_job(job_id).name for job_id in created if job_id] == ["one", "two"]
    # Sent again with the same key: the same jobs, nothing new.
    again = a.create_jobs(jobs, idempotency_key=key)
    assert [r.status for r in again.results] == [200, 200, 422, 200, 409]
    assert [r.job_id for r in again.results][:2] == [r.job_id for r in done.results][:2]
    # Another team's jobs are its own, whatever the key.
    assert b.create_jobs(jobs[:1], idempotency_key=key).created == 1

    async def scenario() -> None:
        async with async_client(node) as cronlog:
            out = await cronlog.create_jobs(jobs, idempotency_key=key)
            assert [r.status for r in out.results] == [200, 200, 422, 200, 409]
            fresh = await cronlog.create_jobs(jobs[:1] + jobs[3:4])
            assert fresh.created == 2

    asyncio.run(scenario())


def test_many_outcomes_at_once_in_batches(
    a: Client, b: Client, node: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cronlog_client.client.MAX_BATCH_RUNS", 2)  # split a few into batches
    pool = unique("sdk-many")
    job_ids = [unique("many") for _ in range(4)]
    for job_id in job_ids:
        a.put_job(job_id, JobDefinition(name="m", schedule="0 0 1 1 *", target=f"pull://{pool}"))
        a.trigger(job_id)
    claimed = sorted(a.claim(pool, "w1", limit=10), key=lambda r: r.job_id)
    assert len(claimed) == 4
    ok, retry, lost, other = claimed
    assert b.complete_many([models.Completion(run_id=ok.run_id, fencing_token=ok.fencing_token)]
                           ).results[0].status == 404  # fmt: skip
    done = a.complete_many(
        [
            models.Completion(run_id=ok.run_id, fencing_token=ok.fencing_token),
            models.Completion(run_id=retry.run_id, fencing_token=retry.fencing_token,
                              status="failed", error="busy", retry_after_sec=600),
            models.Completion(run_id=lost.run_id, fencing_token=lost.fencing_token + 1),
            models.Completion(run_id=other.run_id, fencing_token=-1),
        ]
    )  # fmt: skip
    assert [r.status for r in done.results] == [200, 200, 409, 400]
    assert [r.index for r in done.results] == [0, 1, 2, 3]
    assert (done.completed, done.failed) == (2, 2)
    assert [r.index for r in done.refused] == [2, 3]
    refusal = done.results[3].error
    assert refusal is not None and refusal.field == "runs[3].fencing_token"  # as given
    assert a.get_run(ok.run_id).state == "succeeded"
    assert a.get_run(retry.run_id).state == "retrying"
    assert a.get_run(lost.run_id).state == "running"

    async def scenario() -> None:
        async with async_client(node) as cronlog:
            out = await cronlog.complete_many(
                [models.Completion(run_id=lost.run_id, fencing_token=lost.fencing_token)]
            )
            assert [r.status for r in out.results] == [200]

    asyncio.run(scenario())
    assert a.get_run(lost.run_id).state == "succeeded"


def test_many_heartbeats_at_once_in_batches(
    a: Client, b: Client, node: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cronlog_client.client.MAX_BATCH_BEATS", 2)  # split a few into batches
    pool = unique("sdk-beats")
    job_ids = [unique("beats") for _ in range(3)]
    for job_id in job_ids:
        a.put_job(job_id, JobDefinition(name="m", schedule="0 0 1 1 *", target=f"pull://{pool}"))
        a.trigger(job_id)
    claimed = sorted(a.claim(pool, "w1", limit=10), key=lambda r: r.job_id)
    assert len(claimed) == 3
    ok, cancelled, other = claimed
    a.cancel_run(cancelled.run_id)
    assert b.heartbeat_many([models.Beat(run_id=ok.run_id, fencing_token=ok.fencing_token)]
                            ).results[0].status == 404  # fmt: skip
    done = a.heartbeat_many(
        [
            models.Beat(run_id=ok.run_id, fencing_token=ok.fencing_token),
            models.Beat(run_id=cancelled.run_id, fencing_token=cancelled.fencing_token),
            models.Beat(run_id=other.run_id, fencing_token=-1),
            models.Beat(run_id=other.run_id, fencing_token=other.fencing_token + 1),
            models.Beat(run_id=other.run_id, fencing_token=other.fencing_token),
        ]
    )
    assert [r.status for r in done.results] == [200, 409, 400, 409, 200]
    assert [r.index for r in done.results] == [0, 1, 2, 3, 4]
    assert (done.extended, done.failed) == (2, 3)
    assert [r.index for r in done.refused] == [1, 2, 3]
    lost, bad, stale = done.refused
    assert lost.error is not None and lost.error.cancelled is True
    assert stale.error is not None and stale.error.cancelled is False
    assert bad.error is not None and bad.error.field == "runs[2].fencing_token"  # as given
    beaten = done.results[0]
    assert beaten.ok and beaten.run_id == ok.run_id
    assert beaten.lease_expires_at is not None and beaten.lease_expires_at > dt.datetime.now(UTC)

    async def scenario() -> None:
        async with async_client(node) as cronlog:
            out = await cronlog.heartbeat_many(
                [models.Beat(run_id=r.run_id, fencing_token=r.fencing_token) for r in claimed]
            )
            assert [r.status for r in out.results] == [200, 409, 200]

    asyncio.run(scenario())


def test_a_page_says_where_its_runs_came_from() -> None:
    """A page the server answers from the archive (``api.wire``) reads back with its source."""
    from cronlog_client.models import RunPage

    from api.wire import RunPage as ServerPage

    server = ServerPage(runs=[], next_cursor=None, source="archive", gone_before=None)
    run = {
        "run_id": "r.1", "job_id": "r", "state": "succeeded", "attempt": 1, "trigger": "schedule",
        "scheduled_for": "2026-11-01T00:00:00Z", "available_at": "2026-11-01T00:00:00Z",
        "started_at": None, "finished_at": None, "lateness_ms": None, "error": "",
        "dead_reason": None, "attempts": [], "source": "archive",
    }  # fmt: skip
    body = msgspec.json.encode({**msgspec.to_builtins(server), "runs": [run]})
    page = msgspec.json.decode(body, type=RunPage)
    assert (page.source, page.runs[0].source, page.gone_before) == ("archive", "archive", None)
    gone = msgspec.json.encode({**msgspec.to_builtins(server), "gone_before": run["available_at"]})
    when = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    assert msgspec.json.decode(gone, type=RunPage).gone_before == when
