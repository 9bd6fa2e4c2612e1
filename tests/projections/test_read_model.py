"""The read model: history queries over events made by the real core.

The model runs on RocksDB in a temporary directory (it has no in-memory adapter). Waiting is
always on the model (``wait_for``) or the log, never a sleep.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from api.translate import next_run
from core import events as ev
from core.commands import (
    CancelJob,
    CancelRun,
    ClaimRuns,
    CompleteRun,
    Outcome,
    PauseJob,
    PutJob,
    ResumeJob,
    ReturnLease,
    TriggerRun,
)
from core.errors import InvalidDefinition, StoreDamaged, Unavailable
from core.jobs import PullTarget
from core.state import RunStatus
from eventlog.embedded import EmbeddedLog
from eventlog.port import Record
from projections.decoding import EventDecoder, ForeignRecord
from projections.read_model import MAX_LIMIT, ReadModel, ReadModelRunner
from projections.views import RUN_STATES, Page, RunView
from tests import corruption
from tests.core.harness import Sim
from tests.projections.histories import T0, Writers, _spec, busy_partition

TENANTS = ("t1", "t2")


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ReadModel]:
    with ReadModel.open(tmp_path / "data") as m:
        yield m


def feed(model: ReadModel, sim: Sim, partition: int = 0, start: int = 0) -> None:
    with model.batch():
        for offset, raw in enumerate(sim.log[start:], start):
            model.process(ev.decode(raw), partition, offset)


def all_pages(fetch: object, limit: int) -> list[list[RunView]]:
    pages: list[list[RunView]] = []
    cursor = None
    while True:
        page: Page[RunView] = fetch(limit=limit, cursor=cursor)  # type: ignore[operator]
        pages.append(page.items)
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


def newest_first(runs: list[RunView]) -> list[RunView]:
    return sorted(runs, key=lambda r: (-r.scheduled_for, r.run_id))


def run_ids_by_job(sim: Sim) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for e in sim.events():
        if isinstance(e, ev.RunMaterialised):
            out.setdefault(e.job_id, set()).add(e.run_id)
    return out


# -- queries ----------------------------------------------------------------------------------


def test_runs_of_a_job_page_newest_first_with_no_duplicates_or_gaps(model: ReadModel) -> None:
    sim = busy_partition(4, steps=300)
    feed(model, sim)
    for job_id, run_ids in run_ids_by_job(sim).items():
        tenant = sim.state.jobs[job_id].spec.tenant
        pages = all_pages(lambda **kw: model.runs_of(tenant, job_id, **kw), limit=3)  # noqa: B023
        listed = [r for page in pages for r in page]
        assert all(len(page) <= 3 for page in pages)
        assert [r.run_id for r in listed] == [r.run_id for r in newest_first(listed)]
        assert sorted(r.run_id for r in listed) == sorted(run_ids)
    assert max(len(ids) for ids in run_ids_by_job(sim).values()) > 9, "several pages were read"


def test_a_cursor_survives_new_runs_arriving_between_pages(model: ReadModel) -> None:
    sim = busy_partition(4, steps=300)
    half = len(sim.log) // 2
    with model.batch():
        for offset, raw in enumerate(sim.log[:half]):
            model.process(ev.decode(raw), 0, offset)
    first = model.runs_of("t1", "rollup", limit=4)
    feed(model, sim, start=half)  # newer slots arrive: they sort before the cursor
    rest = [
        r for page in all_pages(lambda **kw: model.runs_of("t1", "rollup", **kw), 4) for r in page
    ]
    second = model.runs_of("t1", "rollup", limit=1000, cursor=first.next_cursor).items
    older = [
        r.run_id
        for r in rest
        if (-r.scheduled_for, r.run_id) > (-first.items[-1].scheduled_for, first.items[-1].run_id)
    ]
    assert [r.run_id for r in second] == older
    assert not {r.run_id for r in first.items} & {r.run_id for r in second}


def test_runs_mirror_the_partition_state_and_the_dead_letter_list(model: ReadModel) -> None:
    sim = busy_partition(6, steps=400)
    feed(model, sim)
    expected = {
        RunStatus.PENDING: {"pending", "retrying"},
        RunStatus.RUNNING: {"running"},
        RunStatus.BLOCKED: {"blocked"},
        RunStatus.DEAD: {"dead"},
        RunStatus.CANCELLED: {"cancelled"},
    }
    for run in sim.state.runs.values():
        view = model.run(run.tenant, run.run_id)
        assert view is not None
        assert view.state in expected[run.status], (run, view)
        assert view.attempt == run.attempt
    for tenant in TENANTS:
        dead = {
            r.run_id
            for r in sim.state.runs.values()
            if r.tenant == tenant and r.status is RunStatus.DEAD
        }
        pages = all_pages(lambda **kw: model.runs(tenant, "dead", **kw), limit=2)  # noqa: B023
        listed = [r.run_id for page in pages for r in page]
        assert len(listed) == len(set(listed))
        assert set(listed) == dead
    assert any(r.status is RunStatus.DEAD for r in sim.state.runs.values())


def test_succeeded_runs_stay_in_history_after_leaving_the_state(model: ReadModel) -> None:
    sim = busy_partition(2, steps=300)
    feed(model, sim)
    completed = {e.run_id: e for e in sim.events() if isinstance(e, ev.RunCompleted)}
    assert completed
    for run_id, done in completed.items():
        view = model.run(done.tenant, run_id)
        assert view is not None
        if run_id not in sim.state.runs:
            assert view.state == "succeeded"
            assert view.finished_at == done.at
            assert view.attempts[-1].outcome == "succeeded"


def test_counts_are_the_listings_sizes(model: ReadModel) -> None:
    sim = busy_partition(8, steps=400)
    feed(model, sim)
    _check_counts(model, sim)


def _check_counts(model: ReadModel, sim: Sim) -> None:
    materialised: Counter[str] = Counter()
    for job_id, ids in run_ids_by_job(sim).items():
        materialised[sim.state.jobs[job_id].spec.tenant] += len(ids)
    for tenant in TENANTS:
        counts = model.counts(tenant)
        assert set(counts) == set(RUN_STATES)
        for state in RUN_STATES:
            listed = model.runs(tenant, state, limit=1000)
            assert listed.next_cursor is None
            assert counts[state] == len(listed.items)
            assert all(r.state == state and r.tenant == tenant for r in listed.items)
        assert sum(counts.values()) == materialised[tenant]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000))
def test_counts_always_match_the_listings(
    tmp_path_factory: pytest.TempPathFactory, seed: int
) -> None:
    with ReadModel.open(tmp_path_factory.mktemp("rm")) as model:
        sim = busy_partition(seed, steps=150)
        feed(model, sim)
        _check_counts(model, sim)


def _live_jobs(sim: Sim, tenant: str) -> int:
    return sum(
        1 for j in sim.state.jobs.values() if j.spec.tenant == tenant and j.status != "cancelled"
    )


def test_job_counts_are_the_tenants_jobs_not_cancelled(model: ReadModel) -> None:
    sim = busy_partition(9, steps=400)
    feed(model, sim)
    assert any(j.status == "cancelled" for j in sim.state.jobs.values())
    for tenant in TENANTS:
        assert model.job_count(tenant) == _live_jobs(sim, tenant)
    assert model.job_count("nobody") == 0


def test_a_model_written_before_job_counts_counts_once_on_open(tmp_path: Path) -> None:
    sim = busy_partition(9, steps=400)
    with ReadModel.open(tmp_path) as model:
        feed(model, sim)
    # As an older version left it: no counters, no marker.
    options = Options(raw_mode=True)
    db = Rdict(str(tmp_path / "read_model"), options=options)
    # A raw-mode Rdict iterates its keys(), not itself.
    stale = [k for k in db.keys() if k.startswith((b"cj/", b"m/job-counts"))]  # noqa: SIM118
    for key in stale:
        del db[key]
    db.close()
    with ReadModel.open(tmp_path) as model:
        for tenant in TENANTS:
            assert model.job_count(tenant) == _live_jobs(sim, tenant)


def test_attempts_of_a_retried_run_and_its_lateness(model: ReadModel) -> None:
    sim = busy_partition(6, steps=400)
    feed(model, sim)
    events = sim.events()
    retried = {e.run_id for e in events if isinstance(e, ev.RetryScheduled)}
    checked = 0
    for run_id in sorted(retried):
        leases = [e for e in events if isinstance(e, ev.LeaseGranted) and e.run_id == run_id]
        if not leases or any(
            isinstance(e, ev.RunMaterialised) and e.run_id == run_id and e.at > leases[0].at
            for e in events
        ):
            continue  # a slot run again by hand after it ended: its record has both histories
        view = model.run(leases[0].tenant, run_id)
        assert view is not None
        assert [(a.attempt, a.fencing_token, a.worker_id, a.started_at) for a in view.attempts] == [
            (g.attempt, g.fencing_token, g.worker_id, g.at) for g in leases
        ]
        assert view.started_at == leases[0].at
        assert view.lateness_ms == leases[0].lateness_ms == leases[0].at - view.scheduled_for
        ended = view.attempts[:-1]
        assert all(a.outcome in ("failed", "lease_expired") for a in ended)
        assert all(a.finished_at is not None for a in ended)
        checked += 1
    assert checked > 3


def test_a_scripted_retry_then_success(tmp_path: Path) -> None:
    """One run, two attempts: the first fails, the retry succeeds."""
    sim = Sim(T0)
    sim.do(PutJob(job_id="j", spec=_spec("j", "t1", run_at=T0 + 5_000, max_attempts=3)))
    sim.advance(7_000)
    [first] = sim.do(ClaimRuns(tenant="t1", pool="p", worker_id="w1"))
    assert isinstance(first, ev.LeaseGranted)
    sim.do(
        CompleteRun(
            run_id=first.run_id,
            fencing_token=first.fencing_token,
            outcome=Outcome.FAILED,
            error="boom",
        )
    )
    sim.advance(120_000)
    [second] = sim.do(ClaimRuns(tenant="t1", pool="p", worker_id="w2"))
    assert isinstance(second, ev.LeaseGranted)
    sim.advance(1_000)
    sim.do(
        CompleteRun(
            run_id=second.run_id, fencing_token=second.fencing_token, outcome=Outcome.SUCCEEDED
        )
    )
    with ReadModel.open(tmp_path) as model:
        feed(model, sim)
        view = model.run("t1", first.run_id)
        assert view is not None
        assert view.state == "succeeded" and view.attempt == 2 and view.error == ""
        assert view.lateness_ms == 2_000 and view.started_at == T0 + 7_000
        assert [(a.worker_id, a.outcome, a.error) for a in view.attempts] == [
            ("w1", "failed", "boom"),
            ("w2", "succeeded", ""),
        ]
        assert view.finished_at == sim.now
        job = model.job("t1", "j")
        assert job is not None and job.status == "finished"
        assert [j.job_id for j in model.jobs("t1", status="finished").items] == ["j"]
        assert model.jobs("t1", status="active").items == []


def test_jobs_list_by_id_and_status(model: ReadModel) -> None:
    sim = busy_partition(9, steps=400)
    feed(model, sim)
    cancelled = 0
    for tenant in TENANTS:
        ids = sorted(j for j, s in sim.state.jobs.items() if s.spec.tenant == tenant)
        deleted = [j for j in ids if str(sim.state.jobs[j].status) == "cancelled"]
        cancelled += len(deleted)
        listed, cursor = [], None
        while True:
            page = model.jobs(tenant, limit=2, cursor=cursor)
            listed += [j.job_id for j in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert listed == [j for j in ids if j not in deleted]  # a deleted job is not listed
        assert [j.job_id for j in model.jobs(tenant, "cancelled", limit=1000).items] == deleted
        for job_id in ids:
            view = model.job(tenant, job_id)
            state = sim.state.jobs[job_id]
            assert view is not None
            assert view.version == state.version and view.next_slot == state.next_slot
            if view.status != "finished":
                assert view.status == str(state.status)
            assert view.job_id in [j.job_id for j in model.jobs(tenant, view.status).items]
    assert cancelled > 0  # the history deletes some


def test_skipped_slots_newest_first(model: ReadModel) -> None:
    sim = busy_partition(4, steps=300)
    feed(model, sim)
    skips = [e for e in sim.events() if isinstance(e, ev.RunSkipped)]
    by_job = Counter(e.job_id for e in skips)
    assert by_job
    for job_id, n in by_job.items():
        tenant = sim.state.jobs[job_id].spec.tenant
        listed = model.skipped(tenant, job_id, limit=1000)
        mine = [e for e in skips if e.job_id == job_id][::-1]
        assert len(listed) == n
        assert [(s.scheduled_for, s.reason, s.count) for s in listed] == [
            (e.scheduled_for, str(e.reason), e.count) for e in mine
        ]
        assert model.skipped(tenant, job_id, limit=1) == listed[:1]


def test_another_tenants_ids_are_not_found(model: ReadModel) -> None:
    sim = busy_partition(4, steps=300)
    feed(model, sim)
    run = next(r for r in sim.state.runs.values() if r.tenant == "t1")
    assert model.job("t2", "rollup") is None and model.job("t1", "rollup") is not None
    assert model.run("t2", run.run_id) is None and model.run("t1", run.run_id) is not None
    assert model.runs_of("t2", "rollup").items == []
    assert model.skipped("t2", "rollup") == []
    assert all(j.tenant == "t2" for j in model.jobs("t2", limit=1000).items)
    assert set(model.counts("nobody").values()) == {0}
    # A cursor is only a position: replayed against another tenant it shows nothing of ours.
    cursor = model.runs_of("t1", "rollup", limit=1).next_cursor
    assert cursor is not None
    assert all(r.tenant == "t2" for r in model.runs("t2", "dead", cursor=cursor).items)


def test_bad_arguments_name_the_field(model: ReadModel) -> None:
    with pytest.raises(InvalidDefinition) as e:
        model.runs("t1", "exploded")  # type: ignore[arg-type]
    assert e.value.field == "state"
    with pytest.raises(InvalidDefinition):
        model.jobs("t1", limit=0)
    with pytest.raises(InvalidDefinition) as e:
        model.jobs("t1", cursor="@@@")
    assert e.value.field == "cursor"


def test_a_keyed_trigger_is_found_by_its_key_for_its_tenant_only(model: ReadModel) -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="j", spec=_spec("j", "t1", schedule="0 * * * *")))
    sim.do(PutJob(job_id="k", spec=_spec("k", "t1", schedule="0 * * * *")))
    [now] = sim.do(TriggerRun(job_id="j", tenant="t1", idempotency_key="now-1"))
    sim.advance(1_000)
    [past] = sim.do(
        TriggerRun(job_id="j", tenant="t1", scheduled_for=T0 - 3_600_000, idempotency_key="b/1")
    )
    sim.do(TriggerRun(job_id="j", tenant="t1", scheduled_for=T0 - 7_200_000))
    feed(model, sim)
    assert isinstance(now, ev.RunMaterialised) and isinstance(past, ev.RunMaterialised)
    for key, made in (("now-1", now), ("b/1", past)):
        view = model.run_by_key("t1", "j", key)
        assert view is not None
        assert (view.run_id, view.idempotency_key) == (made.run_id, key)
        assert view == model.run("t1", made.run_id)
    assert model.run_by_key("t2", "j", "now-1") is None  # another tenant's key: not found
    assert model.run_by_key("t1", "k", "now-1") is None  # a key belongs to its job
    assert model.run_by_key("t1", "j", "now-2") is None
    unkeyed = model.run("t1", f"j.{T0 - 7_200_000}")
    assert unkeyed is not None and unkeyed.idempotency_key is None


def test_a_slot_materialised_again_keeps_one_record_and_its_history(model: ReadModel) -> None:
    """The partition state forgets a run that succeeded or was cancelled, so the core can
    materialise its slot again: the record shows the new run and keeps the earlier attempts."""
    sim = Sim(T0)
    sim.do(PutJob(job_id="j", spec=_spec("j", "t1", schedule="0 * * * *")))
    slot = T0 - 3_600_000
    sim.do(TriggerRun(job_id="j", tenant="t1", scheduled_for=slot, idempotency_key="first"))
    sim.advance(2_000)
    [lease] = sim.do(ClaimRuns(tenant="t1", pool="p", worker_id="w1"))
    assert isinstance(lease, ev.LeaseGranted)
    sim.advance(1_000)
    sim.do(
        CompleteRun(
            run_id=lease.run_id, fencing_token=lease.fencing_token, outcome=Outcome.SUCCEEDED
        )
    )
    assert lease.run_id not in sim.state.runs
    feed(model, sim)
    done = model.run("t1", lease.run_id)
    assert done is not None and done.state == "succeeded"
    start = len(sim.log)
    sim.advance(1_000)
    again = sim.do(TriggerRun(job_id="j", tenant="t1", scheduled_for=slot, idempotency_key="2nd"))
    assert [e.run_id for e in again if isinstance(e, ev.RunMaterialised)] == [lease.run_id]
    feed(model, sim, start=start)
    view = model.run("t1", lease.run_id)
    assert view is not None
    assert (view.state, view.attempt, view.finished_at) == ("pending", 1, None)
    assert [(a.worker_id, a.outcome) for a in view.attempts] == [("w1", "succeeded")]
    assert (view.started_at, view.lateness_ms) == (done.started_at, done.lateness_ms)
    assert view.idempotency_key == "2nd"
    for key in ("first", "2nd"):
        assert model.run_by_key("t1", "j", key) == view
    assert [r.run_id for r in model.runs_of("t1", "j").items] == [lease.run_id]
    counts = model.counts("t1")
    assert (counts["succeeded"], counts["pending"], sum(counts.values())) == (0, 1, 1)
    assert [r.run_id for r in model.runs("t1", "pending").items] == [lease.run_id]
    # Cancelled, then materialised a third time: still one record, still every attempt.
    start = len(sim.log)
    sim.do(CancelRun(run_id=lease.run_id, tenant="t1"))
    sim.advance(1_000)
    sim.do(TriggerRun(job_id="j", tenant="t1", scheduled_for=slot))
    feed(model, sim, start=start)
    view = model.run("t1", lease.run_id)
    assert view is not None and view.state == "pending" and view.idempotency_key == "2nd"
    assert len(view.attempts) == 1
    assert sum(model.counts("t1").values()) == 1


def test_events_before_the_position_are_not_folded_twice(model: ReadModel) -> None:
    sim = busy_partition(1, steps=200)
    feed(model, sim)
    once = model.dump()
    feed(model, sim)  # the same offsets again
    assert model.dump() == once
    assert model.position(0) == len(sim.log)


# -- the runner and positions -----------------------------------------------------------------


def _history(tmp_path: Path, steps: int) -> tuple[EmbeddedLog, Writers, int]:
    sim = busy_partition(31, steps=steps, partition=0, prefix="d")
    log = EmbeddedLog.open(tmp_path / "log", 1)
    writers = Writers(log)
    writers.append(0, sim.log)
    return log, writers, len(sim.log)


def test_a_follower_far_behind_waits_while_partitions_recover_then_folds(tmp_path: Path) -> None:
    log, writers, total = _history(tmp_path, steps=200)
    assert total > 50
    recovering = threading.Event()
    recovering.set()
    with ReadModel.open(tmp_path / "m") as model:
        runner = ReadModelRunner(
            log, model, batch_size=50, defer_while=recovering.is_set, defer_for_s=60
        )
        runner.start()
        try:
            assert runner.deferred.wait(10)
            assert model.position(0) == 0  # it waited before its first read
            recovering.clear()
            assert model.wait_for(0, total - 1, 10)
        finally:
            runner.stop()
    writers.close()
    log.close()


def test_a_follower_near_the_end_folds_while_partitions_recover(tmp_path: Path) -> None:
    log, writers, total = _history(tmp_path, steps=10)
    with ReadModel.open(tmp_path / "m") as model:
        runner = ReadModelRunner(log, model, batch_size=total, defer_while=lambda: True)
        runner.start()
        try:
            assert model.wait_for(0, total - 1, 10)  # the live case never waits
        finally:
            runner.stop()
        assert not runner.deferred.is_set()
    writers.close()
    log.close()


def test_a_follower_waits_no_longer_than_its_bound(tmp_path: Path) -> None:
    log, writers, total = _history(tmp_path, steps=200)
    with ReadModel.open(tmp_path / "m") as model:
        runner = ReadModelRunner(
            log, model, batch_size=50, defer_while=lambda: True, defer_for_s=0.0
        )
        runner.start()
        try:
            assert model.wait_for(0, total - 1, 10)  # recovery never ends here; history still folds
        finally:
            runner.stop()
    writers.close()
    log.close()


def test_reopening_resumes_from_the_recorded_positions(tmp_path: Path) -> None:
    sims = [busy_partition(20 + p, steps=200, partition=p, prefix=f"p{p}") for p in range(2)]
    log = EmbeddedLog.open(tmp_path / "log", 2)
    writers = Writers(log)
    halves = [len(s.log) // 2 for s in sims]
    for p, sim in enumerate(sims):
        writers.append(p, sim.log[: halves[p]])
    with ReadModel.open(tmp_path / "a") as model:
        assert ReadModelRunner(log, model, batch_size=50).run_once() == sum(halves)
        assert model.positions() == dict(enumerate(halves))
    for p, sim in enumerate(sims):
        writers.append(p, sim.log[halves[p] :])
    with ReadModel.open(tmp_path / "a") as model:
        assert model.positions() == dict(enumerate(halves))
        read = ReadModelRunner(log, model, batch_size=50).run_once()
        assert read == sum(len(s.log) for s in sims) - sum(halves)
        resumed = model.dump()
    with ReadModel.open(tmp_path / "b") as model:
        ReadModelRunner(log, model).run_once()
        assert model.dump() == resumed
    writers.close()
    log.close()


def test_runner_follows_every_partition_and_wait_for_returns_once_caught_up(
    tmp_path: Path,
) -> None:
    sims = [busy_partition(30 + p, steps=150, partition=p, prefix=f"p{p}") for p in range(3)]
    log = EmbeddedLog.open(tmp_path / "log", 3)
    writers = Writers(log)
    failed: list[BaseException] = []
    with (
        ReadModel.open(tmp_path / "rm") as model,
        ReadModelRunner(log, model, on_failed=lambda p, e: failed.append(e)),
    ):
        last: dict[int, int] = {}
        for p, sim in enumerate(sims):
            last[p] = writers.append(p, sim.log)[-1]
        for p in range(3):
            assert model.wait_for(p, last[p], timeout_s=30)
        assert model.lag(log) == {0: 0, 1: 0, 2: 0}
        for p, sim in enumerate(sims):
            for job_id in run_ids_by_job(sim):
                tenant = sim.state.jobs[job_id].spec.tenant
                view = model.job(tenant, job_id)
                assert view is not None and view.partition == p
        # Read-your-writes: a new event is queryable once wait_for says so.
        [offset] = writers.append(
            1,
            [ev.encode(ev.JobPaused(at=T0 + 1, job_id="p1rollup", tenant="t1", version=99))],
        )
        assert model.wait_for(1, offset, timeout_s=30)
        paused = model.job("t1", "p1rollup")
        assert paused is not None and paused.status == "paused" and paused.version == 99
        assert not model.wait_for(2, offset + 10_000, timeout_s=0.05)
        assert failed == []
    writers.close()
    log.close()


def test_runner_follows_past_a_foreign_record_and_reports_it_once(tmp_path: Path) -> None:
    """A record in the events stream that is not an event froze the read model of its partition
    for every tenant (the follower thread died on it, lag grew, nothing said so)."""
    sim = busy_partition(31, steps=120, partition=0, prefix="p0")
    log = EmbeddedLog.open(tmp_path / "log", 2)
    writers = Writers(log)
    seen: list[ForeignRecord] = []
    decoder = EventDecoder("read_model", seen.append)
    failed: list[BaseException] = []
    with (
        ReadModel.open(tmp_path / "rm") as model,
        ReadModelRunner(
            log, model, decoder=decoder, poll_s=0.05, on_failed=lambda p, e: failed.append(e)
        ),
    ):
        half = len(sim.log) // 2
        writers.append(0, sim.log[:half])
        [foreign] = writers.append(0, [b'{"job_id": "p0rollup", "payload": "from a target"}'])
        last = writers.append(0, sim.log[half:])[-1]
        assert model.wait_for(0, last, timeout_s=30)
        assert failed == []
        assert [(f.partition, f.offset) for f in seen] == [(0, foreign)]
        assert model.lag(log) == {0: 0, 1: 0}
        for job_id in run_ids_by_job(sim):
            assert model.job(sim.state.jobs[job_id].spec.tenant, job_id) is not None
    with ReadModel.open(tmp_path / "once") as model:
        ReadModelRunner(log, model, decoder=decoder).run_once()
        assert model.positions() == {0: last + 1}
    assert len(seen) == 1  # the same decoder reports a record once
    writers.close()
    log.close()


def test_dependants_follow_registration_update_and_cancel(model: ReadModel) -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="a", spec=_spec("a", "t1", schedule="0 * * * *")))
    sim.do(PutJob(job_id="b", spec=_spec("b", "t1", schedule="0 * * * *")))
    sim.do(PutJob(job_id="load", spec=_spec("load", "t1", depends_on=("a", "b"))))
    sim.do(PutJob(job_id="other", spec=_spec("other", "t2", depends_on=("a",))))
    feed(model, sim)
    assert model.dependants("t1", "a") == ["load"] and model.dependants("t1", "b") == ["load"]
    assert model.dependants("t2", "a") == ["other"]  # a tenant's own jobs only
    start = len(sim.log)
    sim.do(PutJob(job_id="load", spec=_spec("load", "t1", depends_on=("b",))))
    feed(model, sim, start=start)
    assert model.dependants("t1", "a") == [] and model.dependants("t1", "b") == ["load"]
    start = len(sim.log)
    sim.do(CancelJob(job_id="load", tenant="t1"))
    feed(model, sim, start=start)
    assert model.dependants("t1", "b") == []


def test_an_upstream_s_dependants_are_not_read_until_a_job_depends_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The relay looks up the dependants of every success; most nodes have none, and the
    # lookup's seek was a tenth of a node's CPU at 2,500 pull runs a second on two workers.
    sim = Sim(T0)
    sim.do(PutJob(job_id="a", spec=_spec("a", "t1", schedule="0 * * * *")))
    scans: list[bytes] = []
    scan = ReadModel._scan

    def counted(self: ReadModel, prefix: bytes, *args: Any, **kw: Any) -> Any:
        scans.append(prefix)
        return scan(self, prefix, *args, **kw)

    monkeypatch.setattr(ReadModel, "_scan", counted)
    with ReadModel.open(tmp_path / "data") as model:
        feed(model, sim)
        scans.clear()
        assert model.dependants("t1", "a") == [] and scans == []  # nothing read
        start = len(sim.log)
        sim.do(PutJob(job_id="load", spec=_spec("load", "t1", depends_on=("a",))))
        feed(model, sim, start=start)
        assert model.dependants("t1", "a") == ["load"]
    with ReadModel.open(tmp_path / "data") as model:  # reopened: known from the store
        assert model.dependants("t1", "a") == ["load"]


def test_a_follower_that_fails_tries_again_and_catches_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim = busy_partition(5, steps=40, partition=0, prefix="p0")
    log = EmbeddedLog.open(tmp_path / "log", 1)
    writers = Writers(log)
    last = writers.append(0, sim.log)[-1]
    reads = 0

    class Flaky:
        """The log, whose first two reads fail as a disk or a broker might."""

        num_partitions = 1

        def read_events(self, *args: Any, **kw: Any) -> list[Record]:
            nonlocal reads
            reads += 1
            if reads <= 2:
                raise OSError("read failed")
            return log.read_events(*args, **kw)

    failed: list[BaseException] = []
    with (
        ReadModel.open(tmp_path / "rm") as model,
        ReadModelRunner(Flaky(), model, on_failed=lambda p, e: failed.append(e)),  # type: ignore[arg-type]
    ):
        assert model.wait_for(0, last, timeout_s=30)
    assert [type(e) for e in failed] == [OSError, OSError]
    loud = [r for r in caplog.records if "read model of partition 0 failed" in r.getMessage()]
    assert len(loud) == 2 and loud[0].exc_info and not loud[1].exc_info
    writers.close()
    log.close()


# -- damage ---------------------------------------------------------------------------------------

BULK = 300


def _bulk_log(tmp_path: Path) -> tuple[EmbeddedLog, Writers, int]:
    """A log of a few hundred jobs, and a read model of it on disk, closed (in SST files)."""
    sim = Sim(T0)
    for i in range(BULK):
        spec = _spec(f"bulk-{i}", "t1", schedule="0 3 * * *", payload={"note": f"job {i} " * 20})
        sim.do(PutJob(job_id=f"bulk-{i}", spec=spec))
    log = EmbeddedLog.open(tmp_path / "log", 1)
    writers = Writers(log)
    last = writers.append(0, sim.log)[-1]
    with ReadModel.open(tmp_path / "data") as model:
        ReadModelRunner(log, model).run_once()
    return log, writers, last


def _listed(model: ReadModel) -> set[str] | None:
    """Every job of t1 by paging, or None while the model answers Unavailable."""
    found: set[str] = set()
    cursor = None
    try:
        while True:
            page = model.jobs("t1", limit=50, cursor=cursor)
            found |= {job.job_id for job in page.items}
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor
    except Unavailable:
        return None


def test_a_query_that_finds_the_model_damaged_sets_it_aside_and_it_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, writers, last = _bulk_log(tmp_path)
    damaged = corruption.damage(tmp_path / "data" / "read_model")
    everything = {f"bulk-{i}" for i in range(BULK)}
    with (
        caplog.at_level(logging.ERROR, logger="projections.read_model"),
        ReadModel.open(tmp_path / "data") as model,
    ):
        # (Unchecked, a listing stopped at the damaged block, short, as if that were all.)
        with pytest.raises(Unavailable, match="being rebuilt"):
            for i in range(BULK):
                model.job("t1", f"bulk-{i}")
        assert model.set_asides == 1 and model.positions() == {}
        failed: list[BaseException] = []
        with ReadModelRunner(log, model, on_failed=lambda p, e: failed.append(e)):
            assert model.wait_for(0, last, timeout_s=30)
            assert _listed(model) == everything
        assert failed == []
    [aside] = sorted((tmp_path / "data").glob("read_model.damaged-*"))
    assert (aside / damaged.name).exists()
    [line] = [r.getMessage() for r in caplog.records]
    assert f"set aside as {aside}, rebuilding it from the log" in line and "checksum" in line
    writers.close()
    log.close()


def test_a_fold_that_finds_the_model_damaged_sets_it_aside_and_folds_again(
    tmp_path: Path,
) -> None:
    log, writers, _ = _bulk_log(tmp_path)
    corruption.damage(tmp_path / "data" / "read_model")
    failed: list[BaseException] = []
    with (
        ReadModel.open(tmp_path / "data") as model,
        ReadModelRunner(log, model, on_failed=lambda p, e: failed.append(e)),
    ):
        # Every job's record is read to fold its pause, the damaged ones among them.
        paused = [
            ev.encode(ev.JobPaused(at=T0 + 1, job_id=f"bulk-{i}", tenant="t1", version=2))
            for i in range(BULK)
        ]
        last = writers.append(0, paused)[-1]
        assert model.wait_for(0, last, timeout_s=30)
        assert model.set_asides == 1 and failed == []
        page = model.jobs("t1", status="paused", limit=MAX_LIMIT)
        assert len(page.items) == BULK
    writers.close()
    log.close()


def test_a_model_rocksdb_will_not_open_is_set_aside_on_open(tmp_path: Path) -> None:
    log, writers, last = _bulk_log(tmp_path)
    [manifest] = (tmp_path / "data" / "read_model").glob("MANIFEST-*")
    corruption.flip(manifest, size=min(4096, manifest.stat().st_size // 2), at=0.25)
    with pytest.raises(StoreDamaged):
        ReadModel(tmp_path / "data" / "read_model")  # the tools' way in: it says so
    with ReadModel.open(tmp_path / "data") as model:  # the node's: aside, and start again
        assert model.positions() == {} and model.set_asides == 1
        ReadModelRunner(log, model).run_once()
        assert model.position(0) == last + 1 and model.job("t1", "bulk-7") is not None
    assert len(list((tmp_path / "data").glob("read_model.damaged-*"))) == 1
    writers.close()
    log.close()


def test_history_keeps_forgotten_jobs_and_an_id_registered_again_is_listed_once(
    model: ReadModel,
) -> None:
    from core.jobs import JobSpec, PullTarget

    retention = 600_000
    sim = Sim(T0, retention_ms=retention)
    pool = PullTarget(pool="p")
    once = JobSpec(name="once", tenant="t1", target=pool, run_at=T0 + 1000)
    cron = JobSpec(name="cron", tenant="t1", target=pool, schedule="0 3 * * *")
    sim.do(PutJob(job_id="a", spec=once))
    sim.do(PutJob(job_id="b", spec=cron))
    sim.advance(1000)
    [lease] = sim.do(ClaimRuns(tenant="t1", pool="p", worker_id="w", limit=1))
    assert isinstance(lease, ev.LeaseGranted)
    sim.do(
        CompleteRun(
            run_id=lease.run_id, fencing_token=lease.fencing_token, outcome=Outcome.SUCCEEDED
        )
    )
    sim.do(CancelJob(job_id="b", tenant="t1"))
    sim.advance(retention)
    assert {e.job_id for e in sim.of_type(ev.JobForgotten)} == {"a", "b"}
    assert not sim.state.jobs
    feed(model, sim)
    view = model.job("t1", "a")
    assert view is not None and view.status == "finished"
    assert [r.run_id for r in model.runs_of("t1", "a", 10).items] == [lease.run_id]
    assert model.job_count("t1") == 1  # the finished one-shot counts, as before it was forgotten
    start = len(sim.log)
    sim.do(PutJob(job_id="b", spec=cron))  # the id is free again: a new job
    sim.do(PutJob(job_id="a", spec=cron))
    feed(model, sim, start=start)
    for job_id in ("a", "b"):
        again = model.job("t1", job_id)
        assert again is not None and again.status == "active" and again.version == 1
        listed = [
            status
            for status in ("active", "paused", "cancelled", "finished")
            if job_id in [j.job_id for j in model.jobs("t1", status).items]
        ]
        assert listed == ["active"]
    assert model.job_count("t1") == 2


# -- the lead time ------------------------------------------------------------------------------


@pytest.mark.parametrize("one_batch", [False, True])
def test_a_run_materialised_ahead_is_pending_and_a_withdrawn_one_leaves_no_record(
    tmp_path: Path, one_batch: bool
) -> None:
    lead = 5_000
    sim = Sim(T0 + 30_000, lead_ms=lead)
    sim.do(PutJob(job_id="j", spec=_spec("j", "t1", schedule="* * * * *")))
    slot = T0 + 60_000
    sim.advance(slot - lead - sim.now)
    with ReadModel.open(tmp_path / "rm") as model:
        fed = 0
        if not one_batch:
            feed(model, sim)
            fed = len(sim.log)
            ahead = model.run("t1", f"j.{slot}")
            assert ahead is not None and ahead.state == "pending"
            assert ahead.scheduled_for == slot and model.counts("t1")["pending"] == 1
        sim.do(PauseJob(job_id="j", tenant="t1"))
        if not one_batch:
            feed(model, sim, start=fed)
            fed = len(sim.log)
            assert model.run("t1", f"j.{slot}") is None
            assert model.runs_of("t1", "j").items == []
            assert sum(model.counts("t1").values()) == 0
            job = model.job("t1", "j")
            assert job is not None and job.next_slot == slot and job.status == "paused"
        sim.do(ResumeJob(job_id="j", tenant="t1"))  # in time: the slot runs after all
        feed(model, sim, start=fed)
        again = model.run("t1", f"j.{slot}")
        assert again is not None and again.state == "pending"
        assert [r.run_id for r in model.runs_of("t1", "j").items] == [f"j.{slot}"]
        assert model.counts("t1")["pending"] == 1


def test_a_run_materialised_ahead_is_the_jobs_next_run_until_its_slot(tmp_path: Path) -> None:
    # The job's next slot moves past a run materialised ahead; the API still names that run's
    # slot as the next run until it comes, as it did without a lead.
    lead = 5_000
    sim = Sim(T0 + 30_000, lead_ms=lead)
    sim.do(PutJob(job_id="j", spec=_spec("j", "t1", schedule="* * * * *")))
    slot = T0 + 60_000
    with ReadModel.open(tmp_path / "rm") as model:
        feed(model, sim)
        fed = len(sim.log)
        job = model.job("t1", "j")
        assert job is not None and next_run(job, sim.now) == slot  # not materialised yet
        sim.advance(slot - lead - sim.now)
        feed(model, sim, start=fed)
        fed = len(sim.log)
        job = model.job("t1", "j")
        assert job is not None and job.next_slot == slot + 60_000 and job.ahead_slot == slot
        assert next_run(job, slot - 1) == slot
        assert next_run(job, slot) == slot + 60_000  # its slot came: the next one is next
        sim.do(PauseJob(job_id="j", tenant="t1"))  # withdrawn: the slot is the next again
        feed(model, sim, start=fed)
        job = model.job("t1", "j")
        assert job is not None and job.ahead_slot is None and job.next_slot == slot


def test_a_model_is_refilling_until_it_folds_what_it_held_or_finds_nothing_more(
    tmp_path: Path,
) -> None:
    """The hold a node puts on its model at start (the log's end then), and the one a
    set-aside puts (what it held): history of those partitions is incomplete until the fold
    gets there, or finds no record past where it is (Kafka's end counts its transaction
    markers: offsets no event takes)."""
    log = EmbeddedLog.open(tmp_path / "log", 2)
    writers = Writers(log)
    writers.append(0, busy_partition(5, steps=40, partition=0).log, chunk=10)
    end = log.end_offset("events", 0)
    with ReadModel.open(tmp_path / "n") as model:
        model.hold_until({0: end, 1: 0})
        assert model.refilling() == {0: (0, end)}
        ReadModelRunner(log, model).run_once()
        assert model.refilling() == {}
        model.set_aside(StoreDamaged("read model: a block checksum mismatch"))
        assert model.refilling() == {0: (0, end)}  # until it holds again what it held
        model.hold_until({1: 3})  # more than partition 1 will ever hold: the markers' case
        ReadModelRunner(log, model).run_once()
        assert model.refilling() == {}
    writers.close()
    log.close()


def test_a_lease_given_back_leaves_no_attempt_in_the_runs_history(model: ReadModel) -> None:
    """No worker received it (``LeaseReturned``): the run shows pending again, with neither the
    attempt nor its start; the next lease is its first attempt and its start."""
    slot = T0 + 60_000
    sim = Sim(T0)
    sim.do(
        PutJob(
            job_id="t1/once",
            spec=_spec("once", "t1", schedule=None, run_at=slot, target=PullTarget(pool="p")),
        )
    )
    sim.advance(slot - sim.now)
    claim = ClaimRuns(tenant="t1", pool="p", worker_id="w", limit=1)
    [lost] = [e for e in sim.do(claim) if isinstance(e, ev.LeaseGranted)]
    sim.advance(1_500)
    sim.do(ReturnLease(run_id=lost.run_id, fencing_token=lost.fencing_token))
    feed(model, sim)
    view = model.run("t1", lost.run_id)
    assert view is not None
    assert (view.state, view.attempts, view.started_at, view.lateness_ms) == (
        "pending",
        [],
        None,
        None,
    )
    fed = len(sim.log)
    [again] = [e for e in sim.do(claim) if isinstance(e, ev.LeaseGranted)]
    done = CompleteRun(
        run_id=again.run_id, fencing_token=again.fencing_token, outcome=Outcome.SUCCEEDED
    )
    sim.do(done)
    feed(model, sim, start=fed)
    view = model.run("t1", lost.run_id)
    assert view is not None and view.state == "succeeded"
    assert [(a.fencing_token, a.outcome) for a in view.attempts] == [
        (again.fencing_token, "succeeded")
    ]
    assert view.started_at == again.at and view.lateness_ms == again.at - slot
