"""Bounded retention: what recovery still needs, and the loops that archive and prune.

**The recovery floor** (:func:`recovery_floor`) is the lowest event offset a recovery of a
partition on this node may still read from the log: the minimum over the durable checkpoints
of what is derived from it here (the partition's state store, the read model) and, once
snapshots exist, the offset of the partition's newest durable snapshot. Retention never
prunes past it, whatever the settings say, so a kill at any moment restarts from the local
stores and the log alone. Snapshots plug in through ``Node(snapshot_offset=...)``.

**Embedded mode** (:class:`EmbeddedRetention`): every ``interval_s``, for each partition,

1. archive each sealed segment of the events stream the archive lacks (a file per segment,
   or several for a segment of more than 100,000 records, so files end where segments end);
2. prune the events stream's sealed segments that are past ``retention_ms`` or over
   ``retention_bytes``, but only below ``min(recovery floor, archived through)``;
3. prune the commands stream's sealed segments wholly below the partition's command position
   (:func:`eventlog.retention.commands_may_go_below`: every command below it has been
   decided, in the same write as its events), whatever their age.

**Kafka mode** (:class:`KafkaRetention`): the brokers apply retention themselves (the topics'
``retention.ms``/``retention.bytes``, see ``eventlog.kafka``); this loop trims the commands
topic and keeps the archive ahead of the brokers. For each partition this node owns, it

1. deletes the commands below the command position the broker holds for the partition
   (``KafkaLog.trim_commands``: the committed offset, never this node's in-memory one), so
   ``P.commands`` holds only what an owner can still need; the topic's ``retention.ms`` stays
   as the backstop for a partition nobody owns;
2. with an archive, archives once ``file_records`` are waiting or the oldest waiting record has
   waited ``max_delay_ms``, and measures how close the oldest unarchived event is to the
   brokers' retention (``cronlog_archive_retention_used_ratio``: at 1 the brokers delete
   events nobody archived).

Each loop catches, logs and counts (``cronlog_retention_failures``) whatever fails for one
partition and goes on with the next; the next pass tries again. Both are periodic workers
(:class:`~node.worker.PeriodicWorker`): ``cronlog serve`` adds the one it runs to the node's
supervisor (:mod:`node.supervisor`), which starts it again should its thread end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from archive.archiver import Archiver
from archive.files import ArchivedFile, at_of
from core.errors import Pruned, Unavailable
from eventlog.embedded import EmbeddedLog
from eventlog.retention import (
    Retention,
    Segment,
    commands_may_go_below,
    prune_before,
    sealed_below,
)
from node.worker import PeriodicWorker

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 60.0
DEFAULT_MAX_DELAY_MS = 5 * 60_000  # Kafka mode: an event waits at most this long to be archived
AT_RISK_RATIO = 0.5  # the oldest unarchived event is half way to the brokers' retention


def recovery_floor(
    *, state_store: int | None, read_model: int | None, snapshot: int | None = None
) -> int | None:
    """The lowest event offset a recovery of the partition may still read from the log.

    ``state_store`` and ``read_model`` are their durable checkpoints (the next offset each
    reads); None means unknown (a store not open right now), and then the floor is unknown and
    nothing may be pruned. ``snapshot`` is the offset of the newest durable snapshot, None while
    there is none. The floor is the least of those known."""
    if state_store is None or read_model is None:
        return None
    needed = [state_store, read_model] + ([] if snapshot is None else [snapshot])
    return min(needed)


class RetentionMetrics:
    """Counters of what was archived and pruned, and the archive's lag, per partition."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.archived_files = Counter(
            "cronlog_archive_files", "Files written to the archive.", registry=r
        )
        self.archived_records = Counter(
            "cronlog_archive_records", "Events written to the archive.", registry=r
        )
        self.archived_bytes = Counter(
            "cronlog_archive_bytes", "Compressed bytes written to the archive.", registry=r
        )
        self.archived_segments = Counter(
            "cronlog_archive_segments",
            "Sealed segments of the embedded log archived whole.",
            registry=r,
        )
        self.gaps = Counter(
            "cronlog_archive_gap_offsets",
            "Offsets that left the log before anything archived them (recorded as gaps in the "
            "manifest). Anything above 0 is history lost from the archive.",
            registry=r,
        )
        self.pruned_segments = Counter(
            "cronlog_retention_pruned_segments",
            "Segments the embedded log's retention removed, by stream.",
            ["stream"],
            registry=r,
        )
        self.pruned_bytes = Counter(
            "cronlog_retention_pruned_bytes",
            "Bytes of records the embedded log's retention removed, by stream.",
            ["stream"],
            registry=r,
        )
        self.pruned_records = Counter(
            "cronlog_retention_pruned_records",
            "Records retention removed, by stream (on Kafka: the commands trimmed).",
            ["stream"],
            registry=r,
        )
        self.failures = Counter(
            "cronlog_retention_failures",
            "Passes of archiving or pruning a partition that failed (logged; tried again).",
            registry=r,
        )
        for stream in ("events", "commands"):
            self.pruned_segments.labels(stream)
            self.pruned_bytes.labels(stream)
            self.pruned_records.labels(stream)
        self.lag = _PartitionGauges()
        self.lag_collector = _LagCollector(self.lag)
        registry.register(self.lag_collector)

    def archived(self, files: Iterable[ArchivedFile]) -> None:
        for f in files:
            self.archived_files.inc()
            self.archived_records.inc(f.records)
            self.archived_bytes.inc(f.bytes)

    def pruned(self, stream: str, segments: Iterable[Segment]) -> None:
        for s in segments:
            self.pruned_segments.labels(stream).inc()
            self.pruned_bytes.labels(stream).inc(s.bytes)
            self.pruned_records.labels(stream).inc(s.end - s.first)


@dataclass
class _PartitionGauges:
    """What the loops measured on their last pass, per partition."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    offsets: dict[int, int] = field(default_factory=dict)  # log end minus archived through
    age_s: dict[int, float] = field(default_factory=dict)  # oldest unarchived event's age
    retention_s: float | None = None  # the brokers' retention (Kafka mode)

    def set(self, partition: int, offsets: int, age_s: float | None) -> None:
        with self.lock:
            self.offsets[partition] = offsets
            if age_s is None:
                self.age_s.pop(partition, None)
            else:
                self.age_s[partition] = age_s

    def keep_only(self, partitions: Iterable[int]) -> None:
        keep = set(partitions)
        with self.lock:
            for gauge in (self.offsets, self.age_s):
                for p in [p for p in gauge if p not in keep]:
                    del gauge[p]


class _LagCollector:
    def __init__(self, gauges: _PartitionGauges) -> None:
        self._gauges = gauges

    def collect(self) -> list[Metric]:
        g = self._gauges
        lag = GaugeMetricFamily(
            "cronlog_archive_lag_offsets",
            "Offsets of the events stream past what the archive holds, per partition.",
            labels=["partition"],
        )
        age = GaugeMetricFamily(
            "cronlog_archive_oldest_unarchived_age_seconds",
            "Age of the oldest event not archived yet, per partition (0 when all are).",
            labels=["partition"],
        )
        used = GaugeMetricFamily(
            "cronlog_archive_retention_used_ratio",
            "Kafka mode: that age over the events topic's retention.ms. At 1 the brokers "
            f"delete events nobody archived; alert well before (at {AT_RISK_RATIO}).",
            labels=["partition"],
        )
        with g.lock:
            for p, offsets in sorted(g.offsets.items()):
                lag.add_metric([str(p)], offsets)
                a = g.age_s.get(p, 0.0)
                age.add_metric([str(p)], a)
                if g.retention_s:
                    used.add_metric([str(p)], a / g.retention_s)
        return [lag, age, used]


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class _Retention(PeriodicWorker):
    """A retention loop: ``run_once(now)`` every ``interval_s``, on the wall clock (segments and
    events carry wall-clock instants). A pass that fails as a whole (``run_once`` counts each
    partition's own failures; this is a bug) is logged and counted, and the next one runs."""

    _thread_name = "retention"
    _stop_timeout_s = 30.0
    interval_s: float
    metrics: RetentionMetrics
    _wall_ms: Callable[[], int]

    def run_once(self, now_ms: int) -> None:
        raise NotImplementedError

    def _pass(self) -> None:
        self.run_once(self._wall_ms())

    def _interval_s(self) -> float:
        return self.interval_s

    def _failed(self) -> None:
        self.metrics.failures.inc()
        log.exception("retention: a pass failed; trying again in %.0f s", self.interval_s)


class EmbeddedRetention(_Retention):
    """Archive, then prune, the embedded log (module docstring)."""

    def __init__(
        self,
        log_: EmbeddedLog,
        retention: Retention,
        floor: Callable[[int], int | None],
        metrics: RetentionMetrics,
        *,
        archiver: Archiver | None,
        interval_s: float = DEFAULT_INTERVAL_S,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.interval_s = interval_s
        self._wall_ms = wall_ms
        self.log = log_
        self.retention = retention
        self.floor = floor
        self.metrics = metrics
        self.archiver = archiver

    def run_once(self, now_ms: int) -> None:
        for p in range(self.log.num_partitions):
            try:
                self._partition(p, now_ms)
            except Exception:
                self.metrics.failures.inc()
                log.exception("retention of partition %d failed; trying again next pass", p)

    def _partition(self, p: int, now_ms: int) -> None:
        keep_from = self.floor(p)
        if self.archiver is not None:
            self._archive_sealed(p)
            through = self.archiver.archive.archived_through(p)
            keep_from = None if keep_from is None else min(keep_from, through)
            end = self.log.end_offset("events", p)
            self.metrics.lag.set(p, max(0, end - through), None)
        if keep_from is not None:
            self._prune_events(p, now_ms, keep_from)
        self._prune_commands(p)

    def _archive_sealed(self, p: int) -> None:
        assert self.archiver is not None
        segments = self.log.segments("events", p)
        through = self.archiver.archive.archived_through(p)
        for segment in segments[:-1]:
            if segment.end <= through:
                continue
            files = self.archiver.archive_until(p, segment.end)
            self.metrics.archived(files)
            self.metrics.archived_segments.inc()
            through = self.archiver.archive.archived_through(p)
            if through < segment.end:  # the log ended early: it would have raised
                raise RuntimeError(f"segment {segment} of partition {p} archived only to {through}")

    def _prune_events(self, p: int, now_ms: int, keep_from: int) -> None:
        segments = self.log.segments("events", p)
        before = prune_before(
            segments,
            now_ms=now_ms,
            keep_from=keep_from,
            retention_ms=self.retention.retention_ms,
            retention_bytes=self.retention.retention_bytes,
        )
        self._prune_to("events", p, segments, before)

    def _prune_commands(self, p: int) -> None:
        segments = self.log.segments("commands", p)
        start = self.log.start_offset("commands", p)
        to = commands_may_go_below(self.log.command_position(p), start)
        self._prune_to("commands", p, segments, None if to is None else sealed_below(segments, to))

    def _prune_to(self, stream: str, p: int, segments: list[Segment], before: int | None) -> None:
        if before is None:
            return
        self.log.prune(stream, p, before)
        gone = [s for s in segments if s.end <= before]
        self.metrics.pruned(stream, gone)
        log.info(
            "retention: %s partition %d now starts at %d (%d segments, %d bytes pruned)",
            stream,
            p,
            before,
            len(gone),
            sum(s.bytes for s in gone),
        )


class TrimsCommands(Protocol):
    """What :class:`KafkaRetention` needs of the log: ``KafkaLog.trim_commands``."""

    def trim_commands(self, partition: int) -> tuple[int, int] | None: ...


class KafkaRetention(_Retention):
    """Trim the commands topic and keep the archive ahead of the brokers' retention, for the
    partitions owned here (module docstring)."""

    def __init__(
        self,
        log_: TrimsCommands,
        owned: Callable[[], Iterable[int]],
        metrics: RetentionMetrics,
        *,
        archiver: Archiver | None,
        retention_ms: int | None,
        max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
        interval_s: float = 10.0,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.interval_s = interval_s
        self._wall_ms = wall_ms
        self.log = log_
        self.archiver = archiver
        self.owned = owned
        self.metrics = metrics
        self.max_delay_ms = max_delay_ms
        self._waiting_since: dict[int, int] = {}
        metrics.lag.retention_s = None if retention_ms is None else retention_ms / 1000

    def run_once(self, now_ms: int) -> None:
        owned = sorted(self.owned())
        self.metrics.lag.keep_only(owned)
        for p in owned:
            try:
                self._trim_commands(p)
            except Unavailable as err:  # a broker away for a moment: a line, not a traceback
                self.metrics.failures.inc()
                log.warning("trimming the commands of partition %d failed (%s); next pass", p, err)
            except Exception:
                self.metrics.failures.inc()
                log.exception("trimming the commands of partition %d failed; next pass", p)
            if self.archiver is None:
                continue
            try:
                self._archive(self.archiver, p, now_ms)
            except Exception:
                self.metrics.failures.inc()
                log.exception("archiving partition %d failed; trying again next pass", p)

    def _trim_commands(self, p: int) -> None:
        trimmed = self.log.trim_commands(p)
        if trimmed is None:
            return
        before, start = trimmed
        self.metrics.pruned_records.labels("commands").inc(max(0, start - before))
        log.debug("retention: commands partition %d now starts at %d", p, start)

    def _archive(self, archiver: Archiver, p: int, now_ms: int) -> None:
        log_, archive = archiver.log, archiver.archive
        backlog = archiver.backlog(p)
        # The log starting past the archive means retention outran it: record that at once.
        outran = archive.archived_through(p) < log_.start_offset("events", p)
        if backlog:
            since = self._waiting_since.setdefault(p, now_ms)
            waited = now_ms - since >= self.max_delay_ms
            if outran or waited or backlog >= archiver.file_records:
                self.metrics.archived(archiver.archive_until(p, log_.end_offset("events", p)))
                self._waiting_since.pop(p, None)
        else:
            self._waiting_since.pop(p, None)
        through = archive.archived_through(p)
        end = log_.end_offset("events", p)
        try:
            oldest = log_.read_events(p, through, 1) if through < end else []
        except Pruned:  # retention moved on meanwhile: the next pass records it
            oldest = []
        at = at_of(oldest[0].value) if oldest else None
        age = None if at is None else max(0.0, (now_ms - at) / 1000)
        self.metrics.lag.set(p, max(0, end - through), age)


def gap_counter(metrics: RetentionMetrics) -> Callable[[int, int, int], None]:
    """The archiver's ``on_gap``: count the offsets lost from the archive."""

    def count(partition: int, from_offset: int, end_offset: int) -> None:
        metrics.gaps.inc(end_offset - from_offset)

    return count
