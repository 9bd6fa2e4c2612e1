"""What a node tells its operators: Prometheus metrics, served at ``GET /metrics``.

The figures that say whether a scheduler is healthy are, in the words of the design: scheduling
delay (start minus slot) at p50 and p99, the ready queue's depth per priority class, and the
rates of lease reclaims, retries and dead letters. Everything here serves one of those, or the
log and the read model they depend on.

- **Counters** follow the events this node appended as a partition's owner, so each node counts
  the decisions of its own partitions and a cluster's figure is the sum over its nodes. A
  partition that moves to another node takes its counting with it; nothing is counted twice.
- **Gauges** are read from the node when scraped (:class:`Gauges`): the runs of the partitions
  it owns, by state and, for the ready ones, by priority; its jobs; the read model's lag. A
  scrape never waits on a broker: a figure that needs one (the read model's lag, from the log's
  end offsets) is measured on a thread of its own (:class:`Measured`), and the scrape shows the
  last measurement with its age, so a stalled cluster is scraped as promptly as a healthy one.

Labels never name a tenant, a job or a run: the series stay few whatever the number of jobs,
and one team's names are not shown to whoever reads the metrics. The endpoint has its own bearer
token (see ``cli.main``), since what it shows spans every tenant.

prometheus_client does the bookkeeping and the text exposition format; each node keeps its own
registry, so several nodes in one process (tests) do not share counters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from core import events as ev
from eventlog.port import Outbound, PartitionWriter
from node.runner import Recovery
from node.snapshotter import Written
from projections.decoding import ForeignRecord
from projections.history_checkpoint import Collected, Restored, Taken

log = logging.getLogger(__name__)

# Scheduling delay: the target is "within a second of the slot", aiming for milliseconds.
DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# A manual or dependency run's start minus its slot: a run now is milliseconds, a backfill of
# last week's slots is days.
TRIGGERED_BUCKETS = (0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0)
# One append is one fsync (embedded) or one Kafka transaction.
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


@dataclass(slots=True)
class Gauges:
    """The node as it is now, for the gauges."""

    ready: bool = False
    partitions_owned: int = 0
    runs: dict[str, int] = field(default_factory=dict)  # state -> count
    ready_by_priority: dict[int, int] = field(default_factory=dict)  # pending and due
    oldest_ready_age_s: float = 0.0  # how long the longest-waiting ready run has waited
    jobs: dict[str, int] = field(default_factory=dict)  # status -> count
    read_model_lag: int = 0  # events the read model is behind the log, over all partitions
    read_model_lag_age_s: float = 0.0  # how long ago that was measured
    executor_in_flight: int = 0
    waiting_for_room: int = 0  # due push runs held back by the node's or their team's room
    waiting_for_rate: int = 0  # ... by their downstream's max_calls_per_sec
    partitions_not_deciding: int = 0  # owned, but recovering, failing, fenced or without runner
    deciding: dict[int, bool] = field(default_factory=dict)  # by owned partition
    recoveries: dict[int, Recovery] = field(default_factory=dict)  # by owned partition


class NodeMetrics:
    """A node's metrics: fed by :meth:`appended` and :class:`TimedWriter`, read by ``render``."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.schedule_delay = Histogram(
            "cronlog_schedule_delay_seconds",
            "Start of a scheduled run's first attempt minus its slot, as its history shows it "
            "(a job's jitter offset and a pull worker's wait for a claim count too). Manual "
            "triggers, backfills and dependency runs are in cronlog_triggered_start_seconds.",
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.triggered_start = Histogram(
            "cronlog_triggered_start_seconds",
            "Start of the first attempt of a run the schedule did not make (trigger: manual, "
            "for run now and backfills; dependency) minus its slot. Not a scheduling delay: a "
            "backfill's slot may be long past.",
            ["trigger"],
            buckets=TRIGGERED_BUCKETS,
            registry=r,
        )
        for trigger in (ev.Trigger.MANUAL, ev.Trigger.DEPENDENCY):  # shown at 0 before one
            self.triggered_start.labels(trigger.value)
        self.materialised = Counter(
            "cronlog_runs_materialised",
            "Runs created, by what triggered them.",
            ["trigger"],
            registry=r,
        )
        self.skipped = Counter(
            "cronlog_slots_skipped",
            "Slots recorded as not run, by reason (misfire, overlap, dst, paused).",
            ["reason"],
            registry=r,
        )
        self.leases = Counter(
            "cronlog_leases_granted", "Attempts started (leases granted).", registry=r
        )
        self.runner_failures = Counter(
            "cronlog_partition_runner_failures",
            "Partition runners that failed and recovered, or ended while their partition was "
            "still owned and were started again.",
            registry=r,
        )
        self.prewarmed = Counter(
            "cronlog_partitions_warmed_before_joining",
            "Partitions whose state this node caught up before it joined the group, as those"
            " the group might give it (node.standby, warm before joining).",
            registry=r,
        )
        self.thread_failures = Counter(
            "cronlog_thread_failures",
            "Failures of the node's own threads, which then try again, by thread.",
            ["thread"],
            registry=r,
        )
        self.history_questions = Counter(
            "cronlog_history_questions",
            "Questions to another partition's owner (history kept by another node with"
            " --history-on owner; a team's limit shares, question shares), by question and side:"
            " asked (by this node, through the log), answered (for another node), stale (read"
            " again after a takeover, its asker long gone: passed over) or unanswered (shares"
            " asked whose answer did not come within the second).",
            ["question", "side"],
            registry=r,
        )
        self.decision_lines_dropped = Counter(
            "cronlog_decision_lines_dropped",
            "Decisions (runs fired, retried, dead-lettered, slots skipped) whose log line was"
            " dropped because too many waited to be written (node/decisions.py).",
            registry=r,
        )
        self.reclaimed = Counter(
            "cronlog_leases_expired",
            "Leases that ran out without a completion: the lease-reclaim rate.",
            registry=r,
        )
        self.returned = Counter(
            "cronlog_leases_returned",
            "Leases given back unused: the claim's answer reached no worker (the node that"
            " asked stopped waiting before the owner answered). Each was counted granted.",
            registry=r,
        )
        self.retries = Counter("cronlog_retries_scheduled", "Retries scheduled.", registry=r)
        self.forgotten = Counter(
            "cronlog_jobs_forgotten",
            "Jobs that ended and left their partition's state after the retention.",
            registry=r,
        )
        self.succeeded = Counter("cronlog_runs_succeeded", "Runs that succeeded.", registry=r)
        self.failed = Counter(
            "cronlog_attempts_failed",
            "Attempts that failed, by kind (transient, permanent, ambiguous).",
            ["kind"],
            registry=r,
        )
        self.dead = Counter(
            "cronlog_runs_dead_lettered",
            "Runs moved to the dead-letter list, by reason.",
            ["reason"],
            registry=r,
        )
        self.cancelled = Counter(
            "cronlog_runs_cancelled", "Runs cancelled, by reason.", ["reason"], registry=r
        )
        self.replayed = Counter("cronlog_runs_replayed", "Dead runs requeued.", registry=r)
        self.answers = Counter(
            "cronlog_outcome_answers",
            "Answers of targets asked what became of a critical run's attempt of unknown"
            " outcome (core.asking), by answer",
            ["answer"],
            registry=r,
        )
        self.claims = Counter(
            "cronlog_claims",
            "Claims this node looked through its pools for, by whether they got runs (a"
            " long-polling claim looks once, then once per run that may be ready)",
            ["outcome"],
            registry=r,
        )
        self.append_seconds = Histogram(
            "cronlog_log_append_seconds",
            "Durable appends of one decided batch to a partition (one fsync or transaction).",
            buckets=APPEND_BUCKETS,
            registry=r,
        )
        self.appended_events = Counter(
            "cronlog_log_appended_events", "Events this node appended to the log.", registry=r
        )
        self.foreign_records = Counter(
            "cronlog_foreign_records",
            "Records of the events stream that are not events, passed over, by the reader that "
            "met them (recovery, read_model, relay); each reader counts a record once per "
            "process. Something other than cronlog can write to the events stream.",
            ["reader"],
            registry=r,
        )
        for reader in ("recovery", "read_model", "relay"):  # shown at 0 before the first one
            self.foreign_records.labels(reader)
        self.snapshot_pause = Histogram(
            "cronlog_snapshot_pause_seconds",
            "How long a partition's runner stopped deciding to take a snapshot (opening a"
            " point-in-time view of its state store; the rest happens on another thread).",
            buckets=APPEND_BUCKETS,
            registry=r,
        )
        self.snapshot_seconds = Histogram(
            "cronlog_snapshot_write_seconds",
            "Reading, encoding and durably writing one snapshot, off the deciding thread.",
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.snapshot_bytes = Histogram(
            "cronlog_snapshot_bytes",
            "Size of each snapshot written (compressed).",
            buckets=(1e3, 1e4, 1e5, 1e6, 4e6, 16e6, 64e6),
            registry=r,
        )
        self.snapshot_failures = Counter(
            "cronlog_snapshot_failures",
            "Snapshots that could not be written (logged; the next due one is tried).",
            registry=r,
        )
        self.snapshot_restores = Counter(
            "cronlog_snapshot_restores",
            "Recoveries that restored a snapshot and replayed only the tail after it.",
            registry=r,
        )
        self.snapshot_offset = Gauge(
            "cronlog_snapshot_offset",
            "The event offset of the newest snapshot this node wrote of each partition (the"
            " next owner replays the events from there on).",
            ["partition"],
            registry=r,
        )
        self.snapshots_unusable = Counter(
            "cronlog_snapshots_unusable",
            "Snapshots a recovery could not restore (damaged, of another format) and passed"
            " over to the state store and the log.",
            registry=r,
        )

        self.history_start_fold = Gauge(
            "cronlog_history_start_fold_events",
            "Events the read model had to fold when the node started, to catch up with the log"
            " (after the checkpoint it restored, if it restored one).",
            registry=r,
        )
        self.history_restores = Counter(
            "cronlog_history_checkpoint_restores",
            "Starts whose read model was restored from a history checkpoint.",
            registry=r,
        )
        self.history_unusable = Counter(
            "cronlog_history_checkpoints_unusable",
            "History checkpoints a start could not restore (damaged, missing a file, of another"
            " format) and passed over for an older one.",
            registry=r,
        )
        self.history_refused = Counter(
            "cronlog_history_checkpoints_refused",
            "History checkpoints not written because the read model's copy failed RocksDB's"
            " checksums (the model was then set aside and refilled).",
            registry=r,
        )
        self.history_pause = Histogram(
            "cronlog_history_checkpoint_pause_seconds",
            "How long the read model's folds waited while a history checkpoint was taken.",
            buckets=APPEND_BUCKETS,
            registry=r,
        )
        self.history_seconds = Histogram(
            "cronlog_history_checkpoint_write_seconds",
            "Taking and uploading one history checkpoint, off the fold.",
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.history_failures = Counter(
            "cronlog_history_checkpoint_failures",
            "History checkpoints that could not be written (logged; the next is tried).",
            registry=r,
        )
        self.history_collected = Counter(
            "cronlog_history_checkpoint_files_collected",
            "Checkpoint files deleted because nothing needed them any more (dropped"
            " checkpoints' after the grace period, and those a writer that died left).",
            registry=r,
        )
        self.history_reuploaded = Counter(
            "cronlog_history_checkpoint_files_reuploaded",
            "Files found deleted under a checkpoint being written and put back by its writer.",
            registry=r,
        )
        self.history_kept_for_grace = Gauge(
            "cronlog_history_checkpoint_files_kept_for_grace",
            "Checkpoint files no checkpoint names, kept for the grace period (a writer's lease"
            " or a dropped checkpoint still protects them).",
            registry=r,
        )

    def history_start(self, restored: Restored | None, tail: int) -> None:
        if restored is not None:
            self.history_restores.inc()
        self.history_start_fold.set(tail)

    def history_checkpoint_written(self, taken: Taken) -> None:
        self.history_pause.observe(taken.pause_s)
        self.history_seconds.observe(taken.seconds)
        self.history_reuploaded.inc(taken.reuploaded)

    def history_checkpoint_collected(self, collected: Collected) -> None:
        self.history_collected.inc(collected.files)
        self.history_kept_for_grace.set(collected.kept_for_grace)

    def history_checkpoint_failed(self) -> None:
        self.history_failures.inc()

    def history_checkpoint_unusable(self) -> None:
        self.history_unusable.inc()

    def history_checkpoint_refused(self) -> None:
        self.history_refused.inc()

    def snapshot_paused(self, seconds: float) -> None:
        self.snapshot_pause.observe(seconds)

    def snapshot_written(self, written: Written) -> None:
        self.snapshot_seconds.observe(written.seconds)
        self.snapshot_bytes.observe(written.size)
        self.snapshot_offset.labels(str(written.partition)).set(written.offset)

    def snapshot_failed(self) -> None:
        self.snapshot_failures.inc()

    def snapshot_restored(self) -> None:
        self.snapshot_restores.inc()

    def snapshot_unusable(self) -> None:
        self.snapshots_unusable.inc()

    def watch(self, gauges: Callable[[], Gauges]) -> None:
        """Read the gauges from ``gauges()`` at every scrape."""
        self.registry.register(_GaugeCollector(gauges))

    def appended(
        self, partition: int, offsets: Sequence[int], events: Sequence[ev.AnyEvent]
    ) -> None:
        """Count the events a partition's runner has just appended durably.

        A herd's batch holds hundreds of events of a few kinds: they are tallied first, so each
        counter (and each label's child, a locked lookup) is touched once per batch."""
        tally: Tally[tuple[Any, str]] = Tally()
        for event in events:
            match event:
                case ev.RunMaterialised():
                    tally[self.materialised, event.trigger.value] += 1
                case ev.LeaseGranted():
                    tally[self.leases, ""] += 1
                    if event.attempt == 1 and event.start_at is None:
                        self._started(event.trigger, event.lateness_ms)
                    # granted ahead: its delay is its start's, which RunStarted reports
                case ev.RunStarted():
                    if event.attempt == 1:
                        self._started(event.trigger, event.started_at - event.scheduled_for)
                case ev.RunSkipped():
                    tally[self.skipped, event.reason.value] += event.count or 1
                case ev.LeaseExpired():
                    tally[self.reclaimed, ""] += 1
                case ev.LeaseReturned():
                    tally[self.returned, ""] += 1
                case ev.RetryScheduled():
                    tally[self.retries, ""] += 1
                case ev.RunCompleted():
                    tally[self.succeeded, ""] += 1
                case ev.RunFailed():
                    kind = "ambiguous" if event.ambiguous else "transient"
                    tally[self.failed, "permanent" if event.permanent else kind] += 1
                case ev.RunDeadLettered():
                    tally[self.dead, event.reason.value] += 1
                case ev.RunCancelled():
                    tally[self.cancelled, event.reason.value] += 1
                case ev.RunReplayed():
                    tally[self.replayed, ""] += 1
                case ev.RunOutcomeAnswered():
                    tally[self.answers, event.answer.value] += 1
                case ev.JobForgotten():
                    tally[self.forgotten, ""] += 1
                case (
                    ev.JobRegistered()
                    | ev.JobUpdated()
                    | ev.JobPaused()
                    | ev.JobResumed()
                    | ev.JobCancelled()
                    | ev.RunReleased()
                    | ev.Heartbeat()
                    | ev.UpstreamRecorded()
                    | ev.RunOutcomeAsked()
                ):
                    pass  # counted nowhere: the gauges show jobs as they are
                case _:
                    assert_never(event)
        for (counter, label), count in tally.items():
            (counter.labels(label) if label else counter).inc(count)

    def foreign(self, record: ForeignRecord) -> None:
        """Count a foreign record one of the node's readers passed over."""
        self.foreign_records.labels(record.reader).inc()

    def _started(self, trigger: ev.Trigger, lateness_ms: int) -> None:
        late = max(0, lateness_ms) / 1000
        if trigger is ev.Trigger.SCHEDULE:
            self.schedule_delay.observe(late)
        else:
            self.triggered_start.labels(trigger.value).observe(late)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class Measured:
    """A figure whose measure may wait on a broker (the read model's lag, from the log's end
    offsets), read at every scrape without waiting on one.

    A read starts a measurement on a thread of its own when the last is older than ``fresh_s``
    and none is running (one at a time: a broker that does not answer holds one thread, not one
    per scrape), waits for it ``wait_s`` at most, and answers the newest measurement with its
    age in seconds. A measurement that fails is logged and reads -1 (unknown)."""

    def __init__(
        self,
        measure: Callable[[], int],
        name: str,
        *,
        fresh_s: float = 1.0,
        wait_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._measure = measure
        self._name = name
        self._fresh_s = fresh_s
        self._wait_s = wait_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value = -1
        self._at = clock()  # when the newest measurement began (the start, before the first)
        self._measured = False
        self._running: threading.Event | None = None  # set when the running one ends

    def read(self) -> tuple[int, float]:
        """The newest measurement and how old it is (seconds)."""
        with self._lock:
            running = self._running
            if running is None and (not self._measured or self._clock() - self._at > self._fresh_s):
                running = self._running = threading.Event()
                threading.Thread(
                    target=self._run, args=(running,), name=f"measure {self._name}", daemon=True
                ).start()
        if running is not None:
            running.wait(self._wait_s)
        with self._lock:
            return self._value, max(0.0, self._clock() - self._at)

    def _run(self, done: threading.Event) -> None:
        began = self._clock()
        try:
            value = self._measure()
        except Exception as err:  # a broker's error, or the log closed under it
            log.warning("%s unknown: %s", self._name, err)
            value = -1
        with self._lock:
            self._value, self._at, self._measured = value, began, True
            self._running = None
        done.set()


class TimedWriter:
    """A partition writer whose appends are timed and counted into ``metrics``."""

    def __init__(self, writer: PartitionWriter, metrics: NodeMetrics) -> None:
        self._writer = writer
        self._metrics = metrics

    @property
    def partition(self) -> int:
        return self._writer.partition

    def append(
        self,
        events: Sequence[bytes],
        *,
        commands_through: int | None = None,
        outbound: Sequence[Outbound] = (),
    ) -> list[int]:
        started = time.perf_counter()
        offsets = self._writer.append(events, commands_through=commands_through, outbound=outbound)
        self._metrics.append_seconds.observe(time.perf_counter() - started)
        self._metrics.appended_events.inc(len(events))
        return offsets

    def wait_until_readable(self) -> None:
        self._writer.wait_until_readable()

    def command_position(self) -> int:
        return self._writer.command_position()

    def close(self) -> None:
        self._writer.close()


class _GaugeCollector:
    def __init__(self, gauges: Callable[[], Gauges]) -> None:
        self._gauges = gauges

    def collect(self) -> list[Metric]:
        g = self._gauges()
        ready = GaugeMetricFamily(
            "cronlog_node_ready", "1 when the node owns partitions and has caught up."
        )
        ready.add_metric([], 1.0 if g.ready else 0.0)
        owned = GaugeMetricFamily("cronlog_partitions_owned", "Partitions this node decides.")
        owned.add_metric([], g.partitions_owned)
        dark = GaugeMetricFamily(
            "cronlog_partitions_not_deciding",
            "Partitions this node owns but does not decide now (recovering, failing, fenced): "
            "alert when it stays above 0.",
        )
        dark.add_metric([], g.partitions_not_deciding)
        deciding = GaugeMetricFamily(
            "cronlog_partition_deciding",
            "Each owned partition: 1 while it decides, 0 while it does not (recovering, failing,"
            " fenced, or an append in flight or failed, or timers due undecided, for more than"
            " 2 s): /readyz names each one at 0 with why.",
            labels=["partition"],
        )
        for partition, yes in sorted(g.deciding.items()):
            deciding.add_metric([str(partition)], 1.0 if yes else 0.0)
        runs = GaugeMetricFamily(
            "cronlog_runs",
            "Live and dead runs of the owned partitions, by state.",
            labels=["state"],
        )
        for state, count in sorted(g.runs.items()):
            runs.add_metric([state], count)
        queue = GaugeMetricFamily(
            "cronlog_runs_ready",
            "Runs due and waiting to start (the ready queue), by priority.",
            labels=["priority"],
        )
        for priority, count in sorted(g.ready_by_priority.items()):
            queue.add_metric([str(priority)], count)
        oldest = GaugeMetricFamily(
            "cronlog_runs_ready_oldest_age_seconds",
            "How long the longest-waiting ready run has been due (0 when none is).",
        )
        oldest.add_metric([], g.oldest_ready_age_s)
        jobs = GaugeMetricFamily(
            "cronlog_jobs", "Jobs of the owned partitions, by status.", labels=["status"]
        )
        for status, count in sorted(g.jobs.items()):
            jobs.add_metric([status], count)
        lag = GaugeMetricFamily(
            "cronlog_read_model_lag_events",
            "Events in the log that the read model (history queries) has not folded in yet "
            "(-1 when the log could not be asked). Measured from the brokers apart from the"
            " scrape: cronlog_read_model_lag_age_seconds says how old it is.",
        )
        lag.add_metric([], g.read_model_lag)
        lag_age = GaugeMetricFamily(
            "cronlog_read_model_lag_age_seconds",
            "How long ago cronlog_read_model_lag_events was measured: it grows while the"
            " brokers do not answer (a scrape waits at most a quarter second for them).",
        )
        lag_age.add_metric([], g.read_model_lag_age_s)
        calls = GaugeMetricFamily(
            "cronlog_executor_calls_in_flight", "Calls this node's executors are making now."
        )
        calls.add_metric([], g.executor_in_flight)
        held = GaugeMetricFamily(
            "cronlog_runs_waiting_to_start",
            "Due push runs the executors hold back, by what they wait for (room, rate).",
            labels=["waiting_for"],
        )
        held.add_metric(["room"], g.waiting_for_room)
        held.add_metric(["rate"], g.waiting_for_rate)
        restored = GaugeMetricFamily(
            "cronlog_recovery_snapshot_offset",
            "The offset of the snapshot the last recovery of each owned partition restored"
            " (-1: it restored none, and folded from its state store, a standby or the log's"
            " first event).",
            labels=["partition"],
        )
        replayed = GaugeMetricFamily(
            "cronlog_recovery_replayed_events",
            "Records the last recovery of each owned partition read from the events stream,"
            " after the snapshot, state store or standby it started from.",
            labels=["partition"],
        )
        for partition, recovery in sorted(g.recoveries.items()):
            offset = recovery.snapshot_offset
            restored.add_metric([str(partition)], -1 if offset is None else offset)
            replayed.add_metric([str(partition)], recovery.replayed)
        return [
            *(ready, owned, dark, deciding, runs, queue, oldest, jobs, lag, lag_age, calls),
            *(held, restored, replayed),
        ]
