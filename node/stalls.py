"""Stalls that explain themselves: a partition behind its timers, a run started late, a process
that stood still — each logged at warning with where it happened and why, and counted.

Three watches, one supervised thread (:class:`StallWatch`, a pass every quarter second):

- **The process.** The watch's own pass comes late when nothing in the process ran: a native
  call that holds the interpreter lock (a RocksDB write stalled on compaction, say), or a
  machine that did not schedule the process. Each pass reads the processor time every Python
  thread has used so far (:class:`ThreadClocks`, from Linux's ``/proc``); a pass more than
  ``THRESHOLD_S`` late compares, and the warning that follows names the thread that used the
  processor while the process stood still, or says that none did (the process was stopped or
  starved, or a thread waited in a native call holding the lock), with where each thread is
  once the process runs again. Every thread's stack and processor time is kept in
  ``stalls.txt`` beside the node's stores until the next stall replaces it. (The interpreter's
  fault handler could take the stacks during the stall, from a thread of its own, but it reads
  the other threads' frames without the lock: once the process runs again it reads them while
  they change, and that killed nodes with signal 11 right after a SIGSTOP ended, or in a stall
  under load; docs/reliability.md.)
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

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from node.worker import PeriodicWorker

if TYPE_CHECKING:
    from node.runner import PartitionRunner

log = logging.getLogger(__name__)

THRESHOLD_S = 1.0  # the seeds ask for a start within a second of the slot
INTERVAL_S = 0.25
REPORT_EVERY_S = 10.0  # late starts of one partition and cause: one line at most this often


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


class ThreadClocks:
    """The processor time each Python thread of the process has used: Linux's
    ``/proc/self/task/<tid>/stat``, one open file per thread read again at each look (a sixth
    of a millisecond for 30 threads). Where there is no ``/proc``, no thread's time is known
    and a stall names no thread."""

    def __init__(self) -> None:
        self._files: dict[int, int] = {}  # native thread id -> its open stat file
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def read(self) -> dict[int, float]:
        """Thread ident -> processor seconds, for every Python thread running now."""
        used: dict[int, float] = {}
        alive: set[int] = set()
        for thread in threading.enumerate():
            tid, ident = thread.native_id, thread.ident
            if tid is None or ident is None:
                continue
            alive.add(tid)
            seconds = self._seconds(tid)
            if seconds is not None:
                used[ident] = seconds
        for tid in [tid for tid in self._files if tid not in alive]:
            os.close(self._files.pop(tid))
        return used

    def _seconds(self, tid: int) -> float | None:
        try:
            fd = self._files.get(tid)
            if fd is None:
                fd = self._files[tid] = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
            stat = os.pread(fd, 1024, 0)
            # after the name in parentheses: utime and stime are the line's 14th and 15th
            fields = stat[stat.rindex(b")") + 2 :].split()
            return (int(fields[11]) + int(fields[12])) / self._ticks
        except (OSError, ValueError, IndexError):
            # a thread that has just ended (its id may come back for another thread)
            fd = self._files.pop(tid, None)
            if fd is not None:
                os.close(fd)
            return None

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()


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
        self._clock = clock
        self._on_failed = on_failed
        self._last: float | None = None
        self._threads = ThreadClocks()
        self._used: dict[int, float] = {}  # thread ident -> processor seconds, at the last pass
        self._process_used = 0.0  # the whole process's, its native threads' included
        self._behind: dict[int, float] = {}  # partition -> seconds behind, while in a stall

    def start(self) -> None:
        self._last = None
        super().start()

    def stop(self, timeout_s: float | None = None) -> None:
        super().stop(timeout_s)
        self._threads.close()

    def _interval_s(self) -> float:
        return INTERVAL_S

    def _failed(self) -> None:
        log.exception("stall watch: a pass failed; the next comes at its time")
        if self._on_failed is not None:
            self._on_failed()

    def _pass(self) -> None:
        now = self._clock()
        used, process_used = self._threads.read(), time.process_time()
        if self._last is not None:
            late = now - self._last - INTERVAL_S
            if late > THRESHOLD_S:
                self._process_stalled(late, used, process_used)
        self._last, self._used, self._process_used = now, used, process_used
        self._partitions()
        self._late.report()

    def _process_stalled(self, seconds: float, used: dict[int, float], process_used: float) -> None:
        """Say what the processor did while the process stood still: one thread held it, none
        ran, or native threads had most of it."""
        self._metrics.stalls.labels("process").inc()
        spent = {ident: s - self._used.get(ident, 0.0) for ident, s in used.items()}
        frames = sys._current_frames()  # with the lock held: safe, and as the threads run again
        names: dict[int | None, str] = {t.ident: t.name for t in threading.enumerate()}
        ident, busiest = max(spent.items(), key=lambda item: item[1], default=(None, 0.0))
        in_all = max(0.0, process_used - self._process_used)
        if ident is not None and busiest >= seconds / 2:
            why = (
                f"its thread {names.get(ident, ident)} held it, {busiest:.1f} s on the"
                f" processor (now at {where(frames.get(ident))})"
            )
        elif in_all < seconds / 4:
            why = (
                f"no thread of it ran ({in_all:.1f} s on the processor in all): the machine did"
                " not run the process (stopped, or starved of processor), or a thread held the"
                " interpreter lock while it waited in a native call"
            )
        else:
            python = sum(max(0.0, s) for s in spent.values())
            most = (
                f" (the most, {busiest:.1f} s, {names.get(ident, ident)}, now at"
                f" {where(frames.get(ident))})"
                if ident is not None
                else ""
            )
            why = (
                f"its threads used {in_all:.1f} s of processor, {python:.1f} s of it in Python"
                f"{most} and the rest in native threads (RocksDB's, librdkafka's)"
            )
        kept = self._keep(seconds, spent, frames, names)
        log.warning(
            "the node's process stood still for %.1f s: %s%s",
            seconds,
            why,
            f" (every thread's stack: {kept})" if kept else "",
        )

    def _keep(
        self,
        seconds: float,
        spent: Mapping[int, float],
        frames: Mapping[int, FrameType],
        names: Mapping[int | None, str],
    ) -> Path | None:
        """Every thread's stack as the process runs again, with its processor time during the
        stall, into ``dump_path`` (replacing the last stall's)."""
        path = self._dump_path
        if path is None:
            return None
        parts = [
            f"The process stood still for {seconds:.1f} s, until"
            f" {time.strftime('%Y-%m-%dT%H:%M:%S%z')}; each thread's stack as it ran again,"
            " the one that used the processor most first:\n"
        ]
        for ident, frame in sorted(frames.items(), key=lambda item: -spent.get(item[0], 0.0)):
            parts.append(
                f"\nThread {names.get(ident, ident)}: {spent.get(ident, 0.0):.2f} s on the"
                " processor in the stall\n" + "".join(traceback.format_stack(frame))
            )
        try:
            # A worker process's directory may not be made yet.
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.write_text("".join(parts), encoding="utf-8")
        except OSError as err:
            log.warning("stall watch: the stacks of a stall could not be kept: %s", err)
            return None
        return path

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


def where(frame: FrameType | None) -> str:
    """A thread's innermost two frames, ``inner (file.py:12) < outer (file.py:40)``."""
    if frame is None:
        return "(ended)"
    found: list[str] = []
    at: FrameType | None = frame
    while at is not None and len(found) < 2:
        code = at.f_code
        found.append(f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{at.f_lineno})")
        at = at.f_back
    return " < ".join(found)
