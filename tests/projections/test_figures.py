"""A team's figures in the read model: counted as an independent tally of the same events
counts them, quantiles read from buckets, and old minutes forgotten."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import events as ev
from projections.figures import (
    DELAY_BOUNDS_MS,
    MINUTE_MS,
    RETENTION_MS,
    Minute,
    merged,
    observe,
    quantile,
)
from projections.read_model import ReadModel
from tests.projections.histories import T0, busy_partition

DAY_MS = 24 * 60 * MINUTE_MS


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ReadModel]:
    with ReadModel.open(tmp_path / "data") as m:
        yield m


def reference(events: list[ev.AnyEvent]) -> dict[str, Counter[str]]:
    """Per tenant, what its figures must add up to, tallied from the events directly."""
    out: dict[str, Counter[str]] = {}
    trigger: dict[str, ev.Trigger] = {}
    started: set[str] = set()
    for e in events:
        tally = out.setdefault(e.tenant, Counter())
        match e:
            case ev.RunMaterialised():
                trigger[e.run_id] = e.trigger
            case ev.LeaseGranted():
                if e.run_id not in started and trigger[e.run_id] is ev.Trigger.SCHEDULE:
                    tally["started"] += 1
                    tally["delay_sum_ms"] += max(0, e.lateness_ms)
                started.add(e.run_id)
            case ev.RunCompleted():
                tally["succeeded"] += 1
            case ev.RunFailed() | ev.LeaseExpired():
                tally["failed"] += 1
            case ev.RetryScheduled():
                tally["retried"] += 1
            case ev.RunDeadLettered():
                tally["dead"] += 1
            case ev.RunCancelled():
                tally["cancelled"] += 1
            case ev.RunSkipped():
                tally["skipped"] += e.count or 1
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_figures_add_up_to_a_tally_of_the_events(model: ReadModel, seed: int) -> None:
    sim = busy_partition(seed)
    events = [ev.decode(raw) for raw in sim.log]
    with model.batch():
        for offset, event in enumerate(events):
            model.process(event, 0, offset)
    expected = reference(events)
    assert sum(c["started"] for c in expected.values()) > 0  # the history exercises it
    until = max(e.at for e in events) + MINUTE_MS
    for tenant, tally in expected.items():
        minutes = model.minutes(tenant, T0 - MINUTE_MS, until)
        assert [at for at, _ in minutes] == sorted({at for at, _ in minutes})
        total = merged(m for _, m in minutes)
        got = {
            name: getattr(total, name)
            for name in ("started", "succeeded", "failed", "retried", "dead", "cancelled")
        }
        got |= {"skipped": total.skipped, "delay_sum_ms": total.delay_sum_ms}
        assert got == {name: tally[name] for name in got}, tenant
        assert sum(total.delay) == total.started


def test_figures_are_the_same_after_a_rebuild(tmp_path: Path) -> None:
    sim = busy_partition(4)
    events = [ev.decode(raw) for raw in sim.log]
    figures = []
    for name in ("first", "again"):
        with ReadModel.open(tmp_path / name) as model:
            for offset, event in enumerate(events):  # one batch per event this time
                model.process(event, 0, offset)
            figures.append(model.minutes("t1", T0 - DAY_MS, T0 + 10 * DAY_MS))
    assert figures[0] == figures[1] and figures[0]


def completed(at: int, tenant: str = "t1", n: int = 0) -> ev.RunCompleted:
    return ev.RunCompleted(
        at=at,
        job_id=f"{tenant}/j",
        tenant=tenant,
        run_id=f"{tenant}/j.{n}",
        scheduled_for=at,
        started_at=at,
    )


def test_minutes_older_than_the_retention_are_forgotten(model: ReadModel) -> None:
    start = T0 - T0 % MINUTE_MS
    model.process(completed(start), 0, 0)
    model.process(completed(start, tenant="t2"), 0, 1)
    model.process(completed(start + DAY_MS), 0, 2)
    up_to_now = (start - DAY_MS, start + 2 * DAY_MS)
    assert [at for at, _ in model.minutes("t1", *up_to_now)] == [start, start + DAY_MS]
    later = start + RETENTION_MS + 2 * 60 * MINUTE_MS
    model.process(completed(later), 0, 3)
    assert [at for at, _ in model.minutes("t1", *up_to_now)] == [start + DAY_MS]
    assert [at for at, _ in model.minutes("t2", *up_to_now)] == [start]  # not t1's to forget
    assert model.minutes("t1", later - DAY_MS, later + MINUTE_MS)[-1][0] == later


def test_a_window_reaches_back_as_far_as_the_retention_at_most(model: ReadModel) -> None:
    start = T0 - T0 % MINUTE_MS
    model.process(completed(start), 0, 0)
    model.process(completed(start + RETENTION_MS), 0, 1)  # the same hour: nothing forgotten
    assert len(model.minutes("t1", 0, start + RETENTION_MS + MINUTE_MS)) == 2
    assert len(model.minutes("t1", 0, start + RETENTION_MS + 2 * 60 * MINUTE_MS)) == 1


def minute_of_delays(*delays: int) -> Minute:
    m = Minute()
    for i, d in enumerate(delays):
        lease = ev.LeaseGranted(
            at=T0,
            job_id="t/j",
            tenant="t",
            run_id=f"t/j.{i}",
            scheduled_for=T0 - d,
            worker_id="w",
            lease_expires_at=T0 + 30_000,
            lateness_ms=d,
        )
        assert observe(m, lease, first_scheduled_start=True)
        assert not observe(m, lease, first_scheduled_start=False)
    return m


def test_quantiles_interpolate_within_a_bucket_capped_at_the_maximum() -> None:
    assert quantile(Minute(), 0.5) is None
    assert 5 < quantile(minute_of_delays(7), 0.99) <= 7  # type: ignore[operator]  # not 10
    m = minute_of_delays(*([3] * 50 + [40] * 48 + [900] * 2))
    assert 2 <= quantile(m, 0.5) <= 5  # type: ignore[operator]
    assert 500 <= quantile(m, 0.99) <= 900  # type: ignore[operator]
    assert m.delay_max_ms == 900 and m.started == 100
    late = minute_of_delays(10 * DELAY_BOUNDS_MS[-1])
    assert quantile(late, 0.5) == pytest.approx(DELAY_BOUNDS_MS[-1] * 5.5)
