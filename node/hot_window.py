"""``HotWindow(model, window_ms, clock)``: finished runs older than the window leave the read model.

The read model keeps every run it folds; at the seeds' load (10M runs a day) that is 300M
records a month. So the node keeps only a window of history hot (``--history-window``, 30
days by default): a run whose slot is older than ``now - window`` and that is finished for
good (succeeded or cancelled, :data:`projections.read_model.FORGETTABLE`) leaves it, with its
index keys; so do skipped-slot records whose last slot is that old. Live runs of any age stay,
and so do dead ones (still replayable, and listed as dead letters). What left is answered from
the archive (:mod:`projections.history`). Then jobs go: a job its partition forgot
(``JobForgotten``) that ended before the window's start, of which no run and no skip record is
held any more, leaves with its index keys (:meth:`projections.read_model.ReadModel.forget_jobs`), so
one-shots and deleted jobs do not pile up in the model; its runs stay answerable by id from the
archive.

A pass (:meth:`HotWindow.run_once`, every ``interval_s`` on the worker's thread) reads the clock
once and removes in batches of at most ``batch`` runs (or ``batch`` skip records looked at), each
batch one write under the model's writer lock, released between batches, so a fold waits at
most one batch (the longest hold is ``cronlog_history_window_pause_seconds``). A pass stops
after ``max_batches`` and the next one goes on; ``cronlog_history_window_behind_seconds`` says
how far the oldest finished run still held is past the window (0 when none is). A failed pass
is logged and counted (``cronlog_history_window_failures``) and the next one tries again; the
thread never ends on a failure, and the node's supervisor starts it again if it ends anyway
(:mod:`node.supervisor`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from core.clock import Clock
from node.worker import PeriodicWorker
from projections.read_model import ReadModel

log = logging.getLogger(__name__)

DEFAULT_WINDOW_MS = 30 * 86_400_000
DEFAULT_INTERVAL_S = 60.0
DEFAULT_BATCH = 100  # ~6 ms of holding the writer lock on a loaded core (bench.bench_hot_window)
DEFAULT_MAX_BATCHES = 1000  # 100k runs a pass; the seeds forget ~120 runs a second


class HotWindowMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.runs = Counter(
            "cronlog_history_window_forgotten_runs",
            "Finished runs that left the read model for being older than the history window.",
            registry=r,
        )
        self.skips = Counter(
            "cronlog_history_window_forgotten_skips",
            "Skipped-slot records that left the read model for being older than the window.",
            registry=r,
        )
        self.jobs = Counter(
            "cronlog_history_window_forgotten_jobs",
            "Jobs that left the read model: forgotten by their partition, ended before the "
            "window, with none of their runs held any more.",
            registry=r,
        )
        self.behind = Gauge(
            "cronlog_history_window_behind_seconds",
            "How far the oldest finished run still in the read model is past the window (0: "
            "none is); growing means forgetting does not keep up.",
            registry=r,
        )
        self.pause = Gauge(
            "cronlog_history_window_pause_seconds",
            "The longest time one batch of forgetting held the read model's writer lock.",
            registry=r,
        )
        self.failures = Counter(
            "cronlog_history_window_failures",
            "Passes of the history window that failed (logged; the next pass tries again).",
            registry=r,
        )


@dataclass(slots=True)
class Pass:
    """What one pass did."""

    cutoff: int
    runs: int = 0
    skips: int = 0
    jobs: int = 0
    longest_hold_s: float = 0.0
    behind_ms: int = 0


class HotWindow(PeriodicWorker):
    def __init__(
        self,
        model: ReadModel,
        window_ms: int,
        clock: Clock,
        metrics: HotWindowMetrics | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        batch: int = DEFAULT_BATCH,
        max_batches: int = DEFAULT_MAX_BATCHES,
    ) -> None:
        if window_ms <= 0 or batch < 1 or max_batches < 1:
            raise ValueError("window_ms, batch and max_batches must be positive")
        self.model = model
        self.window_ms = window_ms
        self.clock = clock
        self.metrics = metrics or HotWindowMetrics()
        self.interval_s = interval_s
        self.batch = batch
        self.max_batches = max_batches
        self._skips_from: bytes | None = None  # where the skip records' scan goes on
        self._jobs_from: bytes | None = None  # ... and the forgotten jobs'
        self.last: Pass | None = None
        self.longest_hold_s = 0.0  # the longest one batch held the writer's lock, ever

    def cutoff(self) -> int:
        """Slots before this instant are past the window now."""
        return self.clock.now_ms() - self.window_ms

    def run_once(self) -> Pass:
        """One pass: forget what is past the window as of the clock's now, in bounded batches."""
        done = Pass(cutoff=self.cutoff())
        resume: dict[bytes, bytes] = {}  # where each index's scan goes on, for this cutoff
        for _ in range(self.max_batches):
            forgot = self.model.forget_runs(done.cutoff, self.batch, resume)
            done.runs += forgot.runs
            done.longest_hold_s = max(done.longest_hold_s, forgot.held_s)
            if forgot.runs < self.batch:
                break
        for _ in range(self.max_batches):
            forgot = self.model.forget_skips(done.cutoff, self._skips_from, self.batch)
            done.skips += forgot.skips
            done.longest_hold_s = max(done.longest_hold_s, forgot.held_s)
            self._skips_from = forgot.resume
            if forgot.resume is None:
                break
        for _ in range(self.max_batches):  # after the runs: a job goes once none is held
            forgot = self.model.forget_jobs(done.cutoff, self._jobs_from, self.batch)
            done.jobs += forgot.jobs
            done.longest_hold_s = max(done.longest_hold_s, forgot.held_s)
            self._jobs_from = forgot.resume
            if forgot.resume is None:
                break
        oldest = self.model.oldest_forgettable(done.cutoff)
        done.behind_ms = 0 if oldest is None else done.cutoff - oldest
        self.metrics.runs.inc(done.runs)
        self.metrics.skips.inc(done.skips)
        self.metrics.jobs.inc(done.jobs)
        self.metrics.behind.set(done.behind_ms / 1000)
        self.longest_hold_s = max(self.longest_hold_s, done.longest_hold_s)
        self.metrics.pause.set(self.longest_hold_s)
        self.last = done
        if done.runs or done.skips or done.jobs:
            log.info(
                "history window: %d runs, %d skip records and %d jobs older than %d left the "
                "read model",
                done.runs,
                done.skips,
                done.jobs,
                done.cutoff,
            )
        return done

    # -- the worker's thread ----------------------------------------------------------------

    _thread_name = "history-window"

    def _pass(self) -> Pass:
        return self.run_once()

    def _interval_s(self) -> float:
        return self.interval_s

    def _failed(self) -> None:
        self.metrics.failures.inc()
        log.exception("history window: a pass failed; the next one tries again")
