"""The history window: finished runs past it leave the read model in bounded batches, driven by
a fake clock; live and dead runs, the jobs and their quota stay; a failed pass is counted and
the thread goes on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import events as ev
from core.clock import FakeClock
from core.partition import DEFAULT_RETENTION_MS
from eventlog.embedded import EmbeddedLog
from node.hot_window import HotWindow, HotWindowMetrics
from node.node import Node
from projections.read_model import FORGETTABLE, Forgot, ReadModel
from projections.views import RUN_STATES, RunView
from tests.node.test_snapshot_supervision import thread_deaths, wait_for
from tests.projections.histories import busy_partition

__all__ = ["thread_deaths"]  # a fixture

WINDOW = 86_400_000
TENANTS = ("t1", "t2")


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ReadModel]:
    with ReadModel.open(tmp_path / "data") as m:
        yield m


def _runs(model: ReadModel) -> dict[str, RunView]:
    out = {}
    for tenant in TENANTS:
        for state in RUN_STATES:
            for run in model.runs(tenant, state, limit=1000).items:
                out[run.run_id] = run
    return out


def _fed(model: ReadModel) -> list[ev.AnyEvent]:
    sim = busy_partition(6, steps=400)
    events = list(sim.events())
    with model.batch():
        for offset, event in enumerate(events):
            model.process(event, 0, offset)
    return events


def test_finished_runs_past_the_window_leave_and_the_rest_stays(model: ReadModel) -> None:
    events = _fed(model)
    before = _runs(model)
    slots = [r.scheduled_for for r in before.values()]
    cutoff = (min(slots) + max(slots)) // 2
    finished = ("succeeded", "cancelled")  # for good: never live again, nor replayable
    old = {i for i, r in before.items() if r.scheduled_for < cutoff and r.state in finished}
    kept_old = {i for i, r in before.items() if r.scheduled_for < cutoff and i not in old}
    assert len(old) > 10
    assert {before[i].state for i in kept_old} & {"dead", "pending", "running", "retrying"}
    jobs = {k: v for k, v in model.dump() if k.startswith((b"j/", b"cj/", b"tj"))}
    quotas = [model.job_count(t) for t in TENANTS]
    skips = [e for e in events if isinstance(e, ev.RunSkipped)]
    assert any(s.last_scheduled_for < cutoff for s in skips)
    assert any(s.last_scheduled_for >= cutoff for s in skips)

    window = HotWindow(model, WINDOW, FakeClock(cutoff + WINDOW), batch=7)
    done = window.run_once()

    after = _runs(model)
    assert done.runs == len(old)
    assert set(after) == set(before) - old
    assert all(after[i] == before[i] for i in after)  # what stays is untouched
    stored = model.dump()
    for run_id in old:  # no key or value names a forgotten run any more
        assert not [k for k, v in stored if run_id.encode() in k or v == run_id.encode()]
    for tenant in TENANTS:  # counts: the runs the model holds, the listings' sizes
        counts = model.counts(tenant)
        assert counts == {s: sum(1 for r in after.values() if (r.tenant, r.state) == (tenant, s))
                          for s in RUN_STATES}  # fmt: skip
    assert {k: v for k, v in stored if k.startswith((b"j/", b"cj/", b"tj"))} == jobs
    assert [model.job_count(t) for t in TENANTS] == quotas
    for job_id in {s.job_id for s in skips}:
        tenant = next(s.tenant for s in skips if s.job_id == job_id)
        listed = model.skipped(tenant, job_id, limit=1000)
        assert all(s.last_scheduled_for >= cutoff for s in listed)
        newer = [s for s in skips if s.job_id == job_id and s.last_scheduled_for >= cutoff]
        assert len(listed) == len(newer)
    assert done.behind_ms == 0
    assert window.run_once().runs == 0  # nothing more to do at the same instant


def test_a_pass_is_bounded_and_the_next_goes_on(model: ReadModel) -> None:
    _fed(model)
    before = _runs(model)
    cutoff = max(r.scheduled_for for r in before.values()) + 1
    finished = sum(1 for r in before.values() if r.state in FORGETTABLE)
    metrics = HotWindowMetrics()
    window = HotWindow(model, WINDOW, FakeClock(cutoff + WINDOW), metrics, batch=3, max_batches=2)
    first = window.run_once()
    assert first.runs == 6 < finished
    assert first.behind_ms > 0  # said: forgetting is behind
    assert metrics.behind._value.get() == first.behind_ms / 1000
    total = first.runs
    for _ in range(finished):
        if window.last is not None and window.last.behind_ms == 0:
            break
        total += window.run_once().runs
    assert total == finished
    assert metrics.runs._value.get() == finished
    assert 0 < window.longest_hold_s == metrics.pause._value.get()


class _Failing:
    """A model whose first forgetting fails; the second is awaited by the test."""

    def __init__(self, model: ReadModel) -> None:
        self.model = model
        self.calls = 0
        self.again = threading.Event()

    def forget_runs(
        self, cutoff: int, max_runs: int, resume: dict[bytes, bytes] | None = None
    ) -> Forgot:
        self.calls += 1
        if self.calls == 1:
            raise OSError("disk went away")
        self.again.set()
        return self.model.forget_runs(cutoff, max_runs, resume)

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)


def test_a_failed_pass_is_counted_and_the_thread_goes_on(
    model: ReadModel, caplog: pytest.LogCaptureFixture
) -> None:
    failing = _Failing(model)
    metrics = HotWindowMetrics()
    window = HotWindow(failing, WINDOW, FakeClock(10 * WINDOW), metrics, interval_s=0.01)  # type: ignore[arg-type]
    window.start()
    try:
        assert failing.again.wait(10)
        assert window.alive and window.started
    finally:
        window.stop()
    assert metrics.failures._value.get() == 1
    assert "a pass failed" in caplog.text
    assert window.started is False and window.alive is False


def test_the_node_starts_the_window_again_when_its_thread_ends(
    tmp_path: Path, thread_deaths: list[BaseException]
) -> None:
    with EmbeddedLog.open(tmp_path / "log", 1) as log:
        node = Node(log, tmp_path / "node")
        window = node.hot_window
        assert window is not None
        passes = threading.Semaphore(0)
        first = [True]

        def run_once() -> object:
            if first[0]:
                first[0] = False
                raise SystemExit("killed")  # not an Exception: the thread ends
            passes.release()
            return None

        window.run_once = run_once  # type: ignore[method-assign]
        node.start()
        try:
            wait_for("the thread's end was not noticed", lambda: thread_deaths)
            wait_for(
                "the history window was not started again",
                lambda: node.metrics.thread_failures.labels("history-window")._value.get() == 1,
            )
            assert passes.acquire(timeout=30)  # the new thread makes its pass
        finally:
            node.stop()


def _job_ids(model: ReadModel) -> set[str]:
    return {k[2:].decode() for k, _ in model.dump() if k.startswith(b"j/")}


def test_forgotten_jobs_leave_once_none_of_their_runs_is_held(model: ReadModel) -> None:
    sim = busy_partition(6, steps=400)
    sim.jump(DEFAULT_RETENTION_MS + 60_000)  # a retention on: the partition forgets what ended
    events = list(sim.events())
    with model.batch():
        for offset, event in enumerate(events):
            model.process(event, 0, offset)
    ended: dict[str, int] = {}  # the jobs their partition forgot (and did not register again)
    for event in events:
        if isinstance(event, ev.JobForgotten):
            ended[event.job_id] = event.ended_at
        elif isinstance(event, ev.JobRegistered):
            ended.pop(event.job_id, None)
    before = _job_ids(model)
    assert len(ended) >= 2 and set(ended) <= before
    cutoff = max(e.at for e in events) + 1
    window = HotWindow(model, WINDOW, FakeClock(cutoff + WINDOW), batch=2, max_batches=1)
    for _ in range(100):  # bounded passes that go on where the last stopped
        window.run_once()
    after = _job_ids(model)
    stored = model.dump()
    holding = {
        job_id
        for job_id in before
        if any(k.startswith(f"jr/{job_id}/".encode()) for k, _ in stored)
    }
    assert holding  # dead runs stay, and so do their jobs
    assert after == before - (set(ended) - holding)
    assert before - after  # some left
    for job_id in before - after:  # no key names a job that left (a dependant's keys stay)
        named = [
            k
            for k, _ in stored
            if k.endswith(job_id.encode())
            or (f"/{job_id}/".encode() in k and not k.startswith(b"dp/"))
        ]
        assert named == []
    for tenant in TENANTS:  # the quota counts the jobs held that are not deleted
        held = [model.job(tenant, j) for j in after]
        assert model.job_count(tenant) == sum(
            1 for v in held if v is not None and v.status != "cancelled"
        )


def test_a_model_from_before_takes_deleted_jobs_out_of_the_listings_once(tmp_path: Path) -> None:
    with ReadModel.open(tmp_path) as model:
        _fed(model)
        deleted = [j.job_id for t in TENANTS for j in model.jobs(t, "cancelled", 1000).items]
        assert deleted
        listed = {j.job_id for t in TENANTS for j in model.jobs(t, limit=1000).items}
        assert not set(deleted) & listed
        view = model.job(TENANTS[0], deleted[0]) or model.job(TENANTS[1], deleted[0])
        assert view is not None
        # as an earlier version left it: the deleted job listed, no marker
        model._db[f"tj/{view.tenant}/{view.job_id}".encode()] = b""
        del model._db[b"m/unlisted-cancelled"]
    with ReadModel.open(tmp_path) as model:
        assert view.job_id not in {j.job_id for j in model.jobs(view.tenant, limit=1000).items}
        assert model.job(view.tenant, view.job_id) == view
