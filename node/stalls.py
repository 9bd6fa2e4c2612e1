"""Stalls that explain themselves: a partition behind its timers, a run started late, a process
that stood still — each logged at warning with where it happened and why, and counted.

Three watches, one supervised thread (:class:`StallWatch`, a pass every quarter second):

- **The process.** The watch's own pass comes late when nothing in the process ran: a native
  call that holds the interpreter lock (a RocksDB write stalled on compaction, say), or a
  machine that did not schedule the process. Before each pass it arms the interpreter's fault
  handler to write every thread's stack to a file if the next pass is more than
  ``THRESHOLD_S`` late; the handler's own thread needs no lock, so the stacks show what held
  the process while it was held. The warning that follows names the thread that was busy and
  its innermost frames; every thread's stack is kept in ``stalls.txt`` beside the node's
  stores until the next stall replaces it.
- **The partitions.** Each runner says which of its timers is the oldest not yet decided
  (``PartitionRunner.behind_s``) and what its thread is doing (``PartitionRunner.phase``). One
  more than ``THRESHOLD_S`` behind is a stall: a warning names the partition, how far behind it
  is, and the cause (the phase it is stuck in, or the slowest part of its last batch when its
  thread is running but late), once when the stall begins and once when it ends.
- **The starts.** A runner tells :class:`LateStarts` of every scheduled run whose lease it
  granted more than ``THRESHOLD_S`` after the run was due, with the cause it knows: the run
  waited for call room (and why there was none), its partition decided it late (and what held
  the partition), or no claim asked for it sooner. They are gathered per partition and cause
  and logged at most once per ``REPORT_EVERY_S`` with their count and range, so a herd of
  thousands of late runs is one line, not thousands.

Every stall and late start is counted (``cronlog_stalls_total{kind}``,
``cronlog_late_starts_total{cause}``), and how far the furthest partition is behind is a gauge
(``cronlog_partition_behind_seconds``).
"""

from __future__ import annotations

import faulthandler
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from prometheus_client import CollectorRegistry, Counter, Gauge

from node.worker import PeriodicWorker

if TYPE_CHECKING:
    from node.runner import PartitionRunner

log = logging.getLogger(__name__)

THRESHOLD_S = 1.0  # the seeds ask for a start within a second of the slot
INTERVAL_S = 0.25
REPORT_EVERY_S = 10.0  # late starts of one partition and cause: one line at most this often
_IDLE_FRAMES = ("wait (threading.py", "select (selectors.py", "_worker (concurrent")


@dataclass(slots=True)
class LoopTimes:
    """Where a runner's last batch spent its time (seconds), to name what held it."""

    woke_late_s: float = 0.0  # its thread ran this long after the moment it meant to
    settle_s: float = 0.0  # waiting for the previous append to become readable
    decide_s: float = 0.0
    append_s: float = 0.0
    save_s: float = 0.0
    observe_s: float = 0.0  # the observers: metrics, decisions, relay, read-model hand-off
    requests: int = 0
    timers: int = 0
    decided_at: float = 0.0  # time.monotonic() when it began deciding

    def cause(self) -> str:
        """The largest share of the batch, in words."""
        parts = [
            (self.woke_late_s, "its thread ran {:.1f} s after it was due (the process was busy)"),
            (self.settle_s, "waiting {:.1f} s for its last append to become readable"),
            (
                self.decide_s,
                f"deciding a batch of {self.requests} requests and {self.timers} timers"
                " took {:.1f} s",
            ),
            (self.append_s, "appending to the log took {:.1f} s"),
            (self.save_s, "saving its state took {:.1f} s"),
            (self.observe_s, "telling its observers took {:.1f} s"),
        ]
        seconds, words = max(parts, key=lambda part: part[0])
        return words.format(seconds)


class StallMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.stalls = Counter(
            "cronlog_stalls",
            "Stalls of more than a second: the node's process stood still (kind=process), or a"
            " partition fell behind its timers (kind=partition); each is logged at warning with"
            " its cause.",
            ["kind"],
            registry=registry,
        )
        self.late_starts = Counter(
            "cronlog_late_starts",
            "Scheduled runs whose lease was granted more than a second after they were due, by"
            " cause: room (waited for call room), partition (decided late), claim (no claim"
            " asked for the pull run sooner).",
            ["cause"],
            registry=registry,
        )
        self.behind = Gauge(
            "cronlog_partition_behind_seconds",
            "How far behind its timers the furthest owned partition is (0: every due timer is"
            " decided).",
            registry=registry,
        )
        for kind in ("process", "partition"):
            self.stalls.labels(kind)
        for cause in ("room", "partition", "claim"):
            self.late_starts.labels(cause)


@dataclass(slots=True)
class _Late:
    count: int = 0
    least_ms: int = 0
    most_ms: int = 0
    cause: str = ""


class LateStarts:
    """Late starts gathered per (partition, cause kind), logged at most every
    ``REPORT_EVERY_S`` (thread-safe: every runner adds to it)."""

    def __init__(self, metrics: StallMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._gathered: dict[tuple[int, str], _Late] = {}
        self._reported: dict[tuple[int, str], float] = {}

    def add(self, partition: int, kind: str, late_ms: int, cause: str) -> None:
        self._metrics.late_starts.labels(kind).inc()
        with self._lock:
            late = self._gathered.get((partition, kind))
            if late is None:
                self._gathered[(partition, kind)] = _Late(1, late_ms, late_ms, cause)
                return
            late.count += 1
            late.least_ms = min(late.least_ms, late_ms)
            if late_ms >= late.most_ms:
                late.most_ms, late.cause = late_ms, cause  # the worst case's cause

    def report(self) -> None:
        """Log what was gathered, for each (partition, kind) not reported in the last
        ``REPORT_EVERY_S``."""
        now = self._clock()
        with self._lock:
            due = [
                (key, late)
                for key, late in self._gathered.items()
                if now - self._reported.get(key, -REPORT_EVERY_S) >= REPORT_EVERY_S
            ]
            for key, _ in due:
                del self._gathered[key]
                self._reported[key] = now
        for (partition, _), late in sorted(due):
            runs = "a run" if late.count == 1 else f"{late.count:,} runs"
            span = (
                f"{late.most_ms / 1000:.1f} s"
                if late.count == 1
                else f"{late.least_ms / 1000:.1f}-{late.most_ms / 1000:.1f} s"
            )
            log.warning(
                "partition %d: %s started %s after they were due: %s",
                partition,
                runs,
                span,
                late.cause,
            )


class StallWatch(PeriodicWorker):
    """The watch's thread (see the module's docstring); the node starts and supervises it."""

    _thread_name = "stall-watch"
    _stop_timeout_s = 5.0

    def __init__(
        self,
        runners: Callable[[], Mapping[int, PartitionRunner]],
        metrics: StallMetrics,
        late: LateStarts,
        *,
        dump_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_failed: Callable[[], None] | None = None,
    ) -> None:
        self._runners = runners
        self._metrics = metrics
        self._late = late
        self._dump_path = dump_path
        self._dump: TextIO | None = None  # the open file the fault handler writes to
        self._clock = clock
        self._on_failed = on_failed
        self._last: float | None = None
        self._behind: dict[int, float] = {}  # partition -> seconds behind, while in a stall

    def start(self) -> None:
        self._last = None
        if self._dump_path is not None and self._dump is None:
            scratch = self._dump_path.with_name(f".{self._dump_path.name}.armed")
            try:
                # A worker process's directory may not be made yet (it was not: every worker of
                # a node of several logged "no file for stacks" and named no stacks).
                scratch.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._dump = scratch.open("w+", encoding="utf-8")
            except OSError as err:
                log.warning("stall watch: no file for stacks (%s); stalls name no stacks", err)
        super().start()

    def stop(self, timeout_s: float | None = None) -> None:
        super().stop(timeout_s)
        dump, self._dump = self._dump, None
        if dump is not None:
            faulthandler.cancel_dump_traceback_later()
            dump.close()

    def _interval_s(self) -> float:
        return INTERVAL_S

    def _failed(self) -> None:
        log.exception("stall watch: a pass failed; the next comes at its time")
        if self._on_failed is not None:
            self._on_failed()

    def _pass(self) -> None:
        now = self._clock()
        if self._last is not None:
            late = now - self._last - INTERVAL_S
            if late > THRESHOLD_S:
                self._process_stalled(late)
        self._last = now
        self._arm()
        self._partitions()
        self._late.report()

    def _arm(self) -> None:
        dump = self._dump
        if dump is None:
            return
        # Written only if the next pass is THRESHOLD_S late; re-armed (cancelling the last)
        # by every pass that comes in time.
        faulthandler.dump_traceback_later(INTERVAL_S + THRESHOLD_S, file=dump)

    def _process_stalled(self, seconds: float) -> None:
        self._metrics.stalls.labels("process").inc()
        stacks = self._stacks()
        log.warning(
            "the node's process stood still for %.1f s: nothing in it ran (a native call held"
            " the interpreter lock, or the machine did not run the process)%s",
            seconds,
            f"; the busy thread was: {stacks}" if stacks else "",
        )

    def _stacks(self) -> str:
        """The busy threads' innermost frames from the fault handler's dump, whose whole is
        kept in ``dump_path``; the scratch file the handler writes to is cleared for the next."""
        dump, kept = self._dump, self._dump_path
        if dump is None or kept is None:
            return ""
        try:
            dump.seek(0)
            text = dump.read()
            dump.seek(0)
            dump.truncate()
            if text:
                kept.write_text(text, encoding="utf-8")
        except OSError as err:
            log.warning("stall watch: the stacks of a stall could not be kept: %s", err)
            return ""
        busy = busy_threads(text)
        return "; ".join(busy) + f" (every thread's stack: {kept})" if busy else ""

    def _partitions(self) -> None:
        runners = self._runners()
        furthest = 0.0
        for partition, runner in sorted(runners.items()):
            behind = runner.behind_s()
            furthest = max(furthest, behind)
            stalled = self._behind.get(partition)
            if behind > THRESHOLD_S and stalled is None:
                self._behind[partition] = behind
                self._metrics.stalls.labels("partition").inc()
                log.warning(
                    "partition %d: %.1f s behind its timers: %s",
                    partition,
                    behind,
                    runner.stall_cause(),
                )
            elif stalled is not None and behind > THRESHOLD_S:
                self._behind[partition] = max(stalled, behind)
            elif stalled is not None:
                del self._behind[partition]
                log.warning(
                    "partition %d: caught up with its timers (it was up to %.1f s behind)",
                    partition,
                    stalled,
                )
        for partition in [p for p in self._behind if p not in runners]:
            del self._behind[partition]  # no longer owned here
        self._metrics.behind.set(furthest)


def busy_threads(dump: str) -> list[str]:
    """From a fault handler dump (``Thread 0x... (most recent call first):`` then frames), the
    threads not idling in a wait, each as its innermost two frames."""
    busy: list[str] = []
    for block in dump.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines()]
        frames = [line for line in lines[1:] if line.startswith("File ")]
        if not frames:
            continue
        top = frames[0]
        if any(idle in _frame(top) for idle in _IDLE_FRAMES):
            continue
        busy.append(" < ".join(_frame(f) for f in frames[:2]))
    return busy


def _frame(line: str) -> str:
    """``File "/x/y.py", line 12 in name`` -> ``name (y.py:12)``."""
    try:
        path, _, rest = line.partition('", line ')
        number, _, name = rest.partition(" in ")
        return f"{name} ({path.rsplit('/', 1)[-1]}:{number})"
    except ValueError:
        return line
