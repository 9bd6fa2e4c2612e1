"""A node's Prometheus metrics: counters from the events it appended, gauges read at scrape."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core import events as ev
from core.commands import PauseJob, PutJob, TriggerRun
from core.jobs import DAY_MS, PullTarget
from node.metrics import Gauges, Measured, NodeMetrics
from node.node import Node
from node.runner import Recovery
from node.snapshotter import Written
from tests.node.targets import Target
from tests.node.test_node_embedded import node as node  # the fixtures
from tests.node.test_node_embedded import now_ms, spec, state_of
from tests.node.test_node_embedded import target as target

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: NodeMetrics) -> Samples:
    """Every sample of the text exposition, parsed back as Prometheus would."""
    samples: Samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def run_event(cls: type, attempt: int = 1, **kw: object) -> ev.AnyEvent:
    base: dict[str, object] = dict(
        at=1_000, job_id="j", tenant="team-a", run_id="j.1", scheduled_for=1, attempt=attempt
    )
    return cls(**{**base, **kw})  # type: ignore[no-any-return]


def counted(node: Node, job_id: str) -> None:
    """Until the job's partition has counted every batch it appended: a partition answers a
    command before it counts the batch, but only after counting the batches before it."""
    asyncio.run(node.execute(PauseJob(job_id=job_id, tenant="team-a")))


def test_counters_follow_the_appended_events() -> None:
    metrics = NodeMetrics()
    metrics.appended(
        0,
        list(range(9)),
        [
            run_event(ev.RunMaterialised, available_at=1, priority=5),
            run_event(ev.LeaseGranted, worker_id="w", lease_expires_at=9, lateness_ms=40),
            run_event(ev.LeaseExpired, lease_expires_at=9),
            run_event(ev.RetryScheduled, 2, available_at=5, delay_ms=4),
            run_event(ev.LeaseGranted, 2, worker_id="w", lease_expires_at=9, lateness_ms=9000),
            run_event(ev.RunFailed, 2, error="503"),
            run_event(ev.RunFailed, 2, error="404", permanent=True),
            run_event(ev.RunDeadLettered, 2, reason=ev.DeadReason.PERMANENT_FAILURE, error="404"),
            ev.RunSkipped(
                at=1,
                job_id="j",
                tenant="team-a",
                scheduled_for=1,
                last_scheduled_for=3,
                count=3,
                reason=ev.SkipReason.MISFIRE,
            ),
        ],
    )
    got = scrape(metrics)
    assert got["cronlog_runs_materialised_total", (("trigger", "schedule"),)] == 1
    assert got["cronlog_leases_granted_total", ()] == 2
    assert got["cronlog_leases_expired_total", ()] == 1
    assert got["cronlog_retries_scheduled_total", ()] == 1
    assert got["cronlog_attempts_failed_total", (("kind", "transient"),)] == 1
    assert got["cronlog_attempts_failed_total", (("kind", "permanent"),)] == 1
    assert got["cronlog_runs_dead_lettered_total", (("reason", "permanent_failure"),)] == 1
    assert got["cronlog_slots_skipped_total", (("reason", "misfire"),)] == 3
    # Only a run's first attempt measures the scheduler's delay: a retry waits on purpose.
    assert got["cronlog_schedule_delay_seconds_count", ()] == 1
    assert got["cronlog_schedule_delay_seconds_sum", ()] == pytest.approx(0.04)
    assert got["cronlog_schedule_delay_seconds_bucket", (("le", "0.05"),)] == 1
    assert got["cronlog_schedule_delay_seconds_bucket", (("le", "0.025"),)] == 0


@pytest.mark.slow
def test_a_node_shows_its_ready_queue_its_appends_and_its_dead_letters(
    node: Node, target: Target
) -> None:
    got = scrape(node.metrics)
    assert got["cronlog_node_ready", ()] == 1
    assert got["cronlog_partitions_owned", ()] == 4
    assert got["cronlog_runs_ready", (("priority", "7"),)] == 0
    assert got["cronlog_runs_waiting_to_start", (("waiting_for", "rate"),)] == 0
    assert got["cronlog_relay_retrying", ()] == 0
    assert got["cronlog_relay_failures_total", ()] == 0
    assert got["cronlog_relay_abandoned_total", (("reason", "moved"),)] == 0

    # A pull job's run waits in the ready queue until a worker claims it.
    slot = now_ms()
    pull = spec(target.url, run_at=slot, target=PullTarget(pool="crunch"), priority=7)
    asyncio.run(node.execute(PutJob(job_id="waits", spec=pull)))
    got = scrape(node.metrics)
    assert got["cronlog_jobs", (("status", "active"),)] == 1
    assert got["cronlog_runs", (("state", "pending"),)] == 1
    assert got["cronlog_runs_ready", (("priority", "7"),)] == 1
    assert got["cronlog_runs_ready_oldest_age_seconds", ()] >= 0
    assert got["cronlog_log_append_seconds_count", ()] >= 1
    assert got["cronlog_log_appended_events_total", ()] >= 2  # the job and its run
    (lease,) = asyncio.run(node.claim("team-a", "crunch", "w1", 1))
    counted(node, "waits")
    got = scrape(node.metrics)
    assert got["cronlog_runs_ready", (("priority", "7"),)] == 0
    assert got["cronlog_runs", (("state", "running"),)] == 1
    assert got["cronlog_schedule_delay_seconds_count", ()] == 1
    assert got["cronlog_schedule_delay_seconds_sum", ()] == lease.lateness_ms / 1000

    # A target that keeps failing: two attempts, one retry, one dead letter.
    target.answer = lambda call: (503, {}, 0.0)
    slot = now_ms() + 100
    asyncio.run(
        node.execute(PutJob(job_id="flaky", spec=spec(target.url, run_at=slot, max_attempts=2)))
    )
    assert node.history.wait_until(lambda: state_of(node, f"flaky.{slot}") == "dead", 10)
    # The read model can show the dead run a moment before its owner counted it; the owner
    # answers a later command of the same partition only after counting the batch before it.
    asyncio.run(node.execute(PauseJob(job_id="flaky", tenant="team-a")))
    got = scrape(node.metrics)
    assert got["cronlog_runs", (("state", "dead"),)] == 1
    assert got["cronlog_attempts_failed_total", (("kind", "transient"),)] == 2
    assert got["cronlog_retries_scheduled_total", ()] == 1
    assert got["cronlog_runs_dead_lettered_total", (("reason", "attempts_exhausted"),)] == 1
    assert got["cronlog_read_model_lag_events", ()] >= 0


@pytest.mark.slow
def test_backfills_and_manual_triggers_have_their_own_figure(node: Node, target: Target) -> None:
    daily = spec(target.url, schedule="0 0 * * *", target=PullTarget(pool="bf"))
    asyncio.run(node.execute(PutJob(job_id="daily", spec=daily)))
    two_days_ago = (now_ms() // DAY_MS - 2) * DAY_MS  # one of its past slots
    asyncio.run(
        node.execute(TriggerRun(job_id="daily", tenant="team-a", scheduled_for=two_days_ago))
    )
    (backfill,) = asyncio.run(node.claim("team-a", "bf", "w1", 1))
    assert backfill.trigger is ev.Trigger.MANUAL
    asyncio.run(node.execute(TriggerRun(job_id="daily", tenant="team-a")))  # run now
    (run_now,) = asyncio.run(node.claim("team-a", "bf", "w1", 1))
    counted(node, "daily")
    got = scrape(node.metrics)
    manual = (("trigger", "manual"),)
    assert got["cronlog_triggered_start_seconds_count", manual] == 2
    assert got["cronlog_triggered_start_seconds_sum", manual] == pytest.approx(
        (backfill.lateness_ms + run_now.lateness_ms) / 1000
    )
    assert got["cronlog_triggered_start_seconds_bucket", (("le", "1.0"), *manual)] == 1
    assert got["cronlog_triggered_start_seconds_count", (("trigger", "dependency"),)] == 0
    # Two days of "delay" would page whoever alerts on the scheduler's: it is not there.
    assert got["cronlog_schedule_delay_seconds_count", ()] == 0

    # A run the schedule made is the scheduler's delay, and only that.
    once = spec(target.url, run_at=now_ms(), target=PullTarget(pool="bf"))
    asyncio.run(node.execute(PutJob(job_id="once", spec=once)))
    (scheduled,) = asyncio.run(node.claim("team-a", "bf", "w1", 1))
    assert scheduled.trigger is ev.Trigger.SCHEDULE
    counted(node, "once")
    got = scrape(node.metrics)
    assert got["cronlog_schedule_delay_seconds_count", ()] == 1
    assert got["cronlog_schedule_delay_seconds_sum", ()] == scheduled.lateness_ms / 1000
    assert got["cronlog_triggered_start_seconds_count", manual] == 2


def test_each_partition_shows_what_its_last_recovery_restored_and_replayed() -> None:
    metrics = NodeMetrics()
    metrics.watch(lambda: Gauges(recoveries={0: Recovery(4_000, 12), 3: Recovery(None, 9_000)}))
    metrics.snapshot_written(Written(partition=3, offset=8_990, size=100, items=4, seconds=0.01))
    samples = scrape(metrics)
    assert samples["cronlog_recovery_snapshot_offset", (("partition", "0"),)] == 4_000
    assert samples["cronlog_recovery_replayed_events", (("partition", "0"),)] == 12
    assert samples["cronlog_recovery_snapshot_offset", (("partition", "3"),)] == -1  # none
    assert samples["cronlog_recovery_replayed_events", (("partition", "3"),)] == 9_000
    assert samples["cronlog_snapshot_offset", (("partition", "3"),)] == 8_990
    assert ("cronlog_recovery_replayed_events", (("partition", "1"),)) not in samples


def test_a_figure_measured_from_a_broker_that_does_not_answer_never_holds_the_scrape() -> None:
    answer = threading.Event()
    calls = []

    def measure() -> int:
        calls.append(1)
        assert answer.wait(10)  # a broker that stopped answering
        return 42

    lag = Measured(measure, "read model lag", fresh_s=0.0, wait_s=0.05)
    began = time.monotonic()
    assert lag.read()[0] == -1  # unknown yet: said so, at once
    value, age = lag.read()
    assert value == -1 and age > 0
    assert time.monotonic() - began < 5.0  # the measurement waits 10 s (a loaded machine: slack)
    assert len(calls) == 1  # one measurement at a time, however many scrapes
    answer.set()
    deadline = time.monotonic() + 10
    while lag.read()[0] != 42:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_figure_whose_measurement_fails_reads_minus_one() -> None:
    def measure() -> int:
        raise RuntimeError("broker down")

    assert Measured(measure, "read model lag", wait_s=5.0).read()[0] == -1


def test_the_read_model_lag_is_shown_with_its_age(node: Node) -> None:
    samples = scrape(node.metrics)
    assert samples["cronlog_read_model_lag_events", ()] >= 0
    assert 0 <= samples["cronlog_read_model_lag_age_seconds", ()] < 60
