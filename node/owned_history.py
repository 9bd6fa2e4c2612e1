"""History kept with its partition: one read model per partition this node owns.

With ``--history-on owner`` a node folds only the events of the partitions it owns, each into
a read model of its own under ``<data>/history/p<N>/read_model`` (docs/architecture.md,
"History kept with its partition"). Taking a partition over opens its model (empty on a node
that never held it, or as this node left it) and a follower that folds from the model's
position through the archive and the log; until it has folded what the log held at the
takeover, the partition's history answers :class:`~core.errors.HistoryRefilling` (a 503 with
``Retry-After``), never an incomplete answer. Losing the partition stops the follower and
closes the model; its directory stays, so taking it back folds only what happened meanwhile.

A model of one partition holds that partition's jobs, runs, counts and figures only, so the
sums and listings over several (:mod:`projections.merging`) add nothing twice. The hot window
forgets in each model as it does in one (:class:`HotWindows`).

**Standbys.** With ``--standby-replicas N`` a node keeps following the history of the
partitions it stands by for (``node.standby.standby_targets``: p+1 … p+N of each it owns), as
its state's standby does: the model is open and folded, answering nothing; when the partition
is assigned here it answers as soon as it has folded the last few events, with nothing to open
or restore.

**Checkpoints a partition.** With an object store for history checkpoints (the archive
directory's, as for a whole model: :mod:`projections.history_checkpoint`), each partition's
owner writes checkpoints of that partition's model under ``partition-<N>/`` of the store
(:class:`HistoryCheckpoints`, every ``--history-checkpoint-every``), and a node taking a
partition over with no model of it (or one far behind) restores the newest and folds only the
tail after it: a takeover copies one partition's history, not the whole cluster's, and folds
minutes of events, not the partition's life. The model is opened (and restored) on a thread
of its own, so the membership's callback never waits for a copy; meanwhile the partition's
history answers HistoryRefilling.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from archive.store import ObjectStore
from core.clock import Clock
from core.errors import CronlogError, HistoryRefilling
from eventlog.port import EventLog
from node.history_checkpointer import HistoryCheckpointer
from node.history_reader import Held, refilling
from node.hot_window import HotWindow, HotWindowMetrics
from node.worker import PeriodicWorker, backoff_s
from projections import history_checkpoint
from projections.decoding import EventDecoder
from projections.history import ArchivedRuns, History
from projections.history_checkpoint import HistoryMetrics
from projections.model_fold import Observer
from projections.read_model import ReadModel, ReadModelRunner

log = logging.getLogger(__name__)

HistoryOn = Literal["every-node", "owner"]  # where a node keeps history (--history-on)
OPEN_RETRY_S = 0.5  # a model that could not be opened is tried again after this, doubling
MAX_OPEN_RETRY_S = 30.0


@dataclass(slots=True)
class _Kept:
    model: ReadModel
    runner: ReadModelRunner
    held: Held
    window: HotWindow | None
    checkpointer: HistoryCheckpointer | None


@dataclass(frozen=True, slots=True)
class Checkpointing:
    """Where and how often each partition's history checkpoints are written."""

    store: ObjectStore
    node_id: str
    every_s: float = history_checkpoint.DEFAULT_EVERY_S
    keep: int = history_checkpoint.DEFAULT_KEEP
    grace_ms: int = history_checkpoint.DEFAULT_GRACE_MS
    metrics: HistoryMetrics | None = None


class OwnedHistory:
    """The read models of the partitions this node owns (see the module's docstring).
    ``gain`` and ``lose`` are called as ownership moves (on the membership's thread)."""

    def __init__(
        self,
        log_: EventLog,
        data_dir: Path,
        clock: Clock,
        *,
        window_ms: int | None,
        archived: ArchivedRuns | None,
        observers: list[Observer],
        decoder: EventDecoder,
        on_failed: Callable[[int, BaseException], None] | None = None,
        defer_while: Callable[[], bool] | None = None,
        window_metrics: HotWindowMetrics | None = None,
        checkpointing: Checkpointing | None = None,
    ) -> None:
        self._log = log_
        self._dir = data_dir / "history"
        self._clock = clock
        self._window_ms = window_ms
        self._archived = archived
        self._observers = observers
        self._decoder = decoder
        self._on_failed = on_failed
        self._defer_while = defer_while
        self._window_metrics = window_metrics or HotWindowMetrics()
        self._checkpointing = checkpointing
        self._lock = threading.Lock()
        self._kept: dict[int, _Kept] = {}
        # partitions being opened (a checkpoint restored) on a thread of their own, and whether
        # each is still wanted when its thread is done
        self._opening: dict[int, threading.Thread] = {}
        self._wanted: set[int] = set()
        # partitions followed as standbys (folded, answering nothing), and those to follow
        self._standby: dict[int, _Kept] = {}
        self._standing: set[int] = set()
        self._closed = False
        self._stopping = threading.Event()  # set on close: an opening thread waits no more

    def gain(self, partition: int) -> None:
        """Keep ``partition``'s history from now on: open its model (restoring the newest
        checkpoint where there is none) and fold the log into it, on a thread of its own. It
        answers nothing until it has folded what the log holds now."""
        with self._lock:
            if self._closed or partition in self._kept:
                return
            self._wanted.add(partition)
            warm = self._standby.pop(partition, None)
            if warm is not None:  # followed as a standby: it answers once it has the tail
                self._hold(warm.model, partition)
                self._kept[partition] = warm
                log.info("partition %d: its history is kept here (a warm standby)", partition)
                return
            if partition in self._opening:
                return  # lost and gained again while it opens: still wanted
            thread = threading.Thread(
                target=self._open, args=(partition,), name=f"history-open:p{partition}"
            )
            self._opening[partition] = thread
            thread.start()

    def _open(self, partition: int) -> None:
        """(On the partition's opening thread.) Open its model; one that fails is opened
        again after a backoff for as long as the partition is still wanted here (it answers
        HistoryRefilling meanwhile, naming no other owner), never given up in silence."""
        failures = 0
        while True:
            try:
                kept = self._opened(partition)
                break
            except Exception as err:
                failures += 1
                if self._on_failed is not None:
                    self._on_failed(partition, err)
                with self._lock:
                    wanted = not self._closed and (
                        partition in self._wanted or partition in self._standing
                    )
                delay = backoff_s(failures, OPEN_RETRY_S, MAX_OPEN_RETRY_S)
                log.exception(
                    "partition %d: its history could not be opened here (%d in a row)%s",
                    partition,
                    failures,
                    f"; again in {delay:.1f} s" if wanted else "",
                )
                if not wanted or self._stopping.wait(delay):
                    with self._lock:
                        self._opening.pop(partition, None)
                    return
        with self._lock:
            self._opening.pop(partition, None)
            keep = partition in self._wanted and not self._closed
            stand = not keep and partition in self._standing and not self._closed
            if keep:
                self._kept[partition] = kept
                kept.runner.start()
            elif stand:
                self._standby[partition] = kept
                kept.runner.start()
        if not keep and not stand:  # lost (and no longer stood by) while it opened
            kept.model.close()
            return
        log.info(
            "partition %d: its history is %s here",
            partition,
            "kept" if keep else "followed as a standby",
        )

    def _opened(self, partition: int) -> _Kept:
        """The partition's model, opened (restored from a checkpoint where that is quicker
        than folding), held until it has folded what the log holds now, and its followers."""
        path = self._dir / f"p{partition}"
        checkpointing = self._checkpointing
        if checkpointing is None:
            model = ReadModel.open(path)
        else:
            store = history_checkpoint.partition_store(checkpointing.store, partition)
            model, restored = history_checkpoint.open_model(path, store, checkpointing.metrics)
            if restored is not None:
                log.info(
                    "partition %d: history restored from checkpoint %s (%d events, %.1f MB in"
                    " %.2f s); folding the tail after it",
                    partition,
                    restored.key,
                    restored.manifest.events,
                    restored.size / 1e6,
                    restored.seconds,
                )
        self._hold(model, partition)
        for observer in self._observers:
            model.observe(observer)
        runner = ReadModelRunner(
            self._log,
            model,
            on_failed=self._on_failed,
            decoder=self._decoder,
            defer_while=self._defer_while,
            partitions=[partition],
        )
        window = (
            None
            if self._window_ms is None
            else HotWindow(model, self._window_ms, self._clock, self._window_metrics)
        )
        held = Held(model, History(model, self._clock, self._window_ms, self._archived))
        checkpointer = None
        if checkpointing is not None:
            checkpointer = HistoryCheckpointer(
                model,
                history_checkpoint.partition_store(checkpointing.store, partition),
                path,
                node_id=checkpointing.node_id,
                clock=self._clock,
                writes=lambda: partition in self._kept,
                lag=lambda: max(
                    0, self._log.end_offset("events", partition) - model.position(partition)
                ),
                every_s=checkpointing.every_s,
                keep=checkpointing.keep,
                grace_ms=checkpointing.grace_ms,
                metrics=checkpointing.metrics,
            )
        return _Kept(model, runner, held, window, checkpointer)

    def _hold(self, model: ReadModel, partition: int) -> None:
        """The model answers for ``partition`` only once it has folded what the log holds
        now."""
        try:
            model.hold_until({partition: self._log.end_offset("events", partition)})
        except CronlogError as err:  # the end unknown: it answers once it has read it
            log.warning("partition %d: where its log ends is unknown: %s", partition, err)
            model.hold_until({partition: 1 << 62})

    def stand_by(self, partitions: set[int]) -> None:
        """Follow the history of ``partitions`` (those this node does not own: its standbys'
        targets) from now on, and stop following any other it followed."""
        with self._lock:
            if self._closed:
                return
            self._standing = set(partitions) - set(self._kept)
            dropped = [self._standby.pop(p) for p in list(self._standby) if p not in partitions]
            start = [
                p
                for p in sorted(self._standing)
                if p not in self._standby and p not in self._opening
            ]
            for p in start:
                thread = threading.Thread(target=self._open, args=(p,), name=f"history-open:p{p}")
                self._opening[p] = thread
                thread.start()
        for kept in dropped:
            kept.runner.stop()
            kept.model.close()

    def standbys(self) -> list[int]:
        return sorted(self._standby)

    def wait_opened(self, timeout_s: float) -> bool:
        """Wait (blocking) for the models being opened now; whether none is left opening."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._opening.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not self._opening

    def lose(self, partition: int) -> None:
        """Stop keeping ``partition``'s history (it moved away): its follower stops and its
        model closes; the files stay for a later return."""
        with self._lock:
            self._wanted.discard(partition)
            kept = self._kept.pop(partition, None)
        if kept is not None:
            kept.runner.stop()
            kept.model.close()

    def held(self, partition: int) -> Held | None:
        """The partition's history if kept here (None: another node keeps it);
        HistoryRefilling while it is opened or has not folded what the log held when it was
        taken over."""
        kept = self._kept.get(partition)
        if kept is None:
            if partition in self._opening:
                raise HistoryRefilling(
                    f"the history of partition {partition} is being opened here (a checkpoint"
                    " restored); try again shortly"
                )
            return None
        refused = refilling(kept.model, partition)
        if refused is not None:
            raise refused
        return kept.held

    def wait_filled(self, partition: int, timeout_s: float) -> bool:
        """Wait (blocking) up to ``timeout_s`` for the partition's history to have folded what
        the log held when it was taken over; whether it has (False too when not kept here)."""
        deadline = time.monotonic() + timeout_s
        opening = self._opening.get(partition)
        if opening is not None:
            opening.join(timeout_s)
        kept = self._kept.get(partition)
        if kept is None:
            return False
        model = kept.model
        remaining = max(0.0, deadline - time.monotonic())
        return model.wait_until(lambda: partition not in model.refilling(), remaining)

    def kept(self) -> list[Held]:
        return [kept.held for kept in list(self._kept.values())]

    def model(self, partition: int) -> ReadModel | None:
        kept = self._kept.get(partition)
        return None if kept is None else kept.model

    def partitions(self) -> list[int]:
        return sorted(self._kept)

    def windows(self) -> list[HotWindow]:
        """The hot windows of every model here, standbys' too (they forget as owners do)."""
        models = list(self._kept.values()) + list(self._standby.values())
        return [kept.window for kept in models if kept.window is not None]

    def checkpointers(self) -> list[HistoryCheckpointer]:
        return [k.checkpointer for k in list(self._kept.values()) if k.checkpointer is not None]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stopping.set()
            opening = list(self._opening.values())
        for thread in opening:  # each closes what it opened, unwanted now
            thread.join()
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
            kept += list(self._standby.values())
            self._standby = {}
        for one in kept:
            one.runner.stop()
            one.model.close()


class HotWindows(PeriodicWorker):
    """The hot window (:mod:`node.hot_window`) of every partition's model kept here, one
    pass over each every ``interval_s``."""

    _thread_name = "history-window"

    def __init__(self, owned: OwnedHistory, interval_s: float) -> None:
        self._owned = owned
        self.interval_s = interval_s

    def run_once(self) -> None:
        for window in self._owned.windows():
            window.run_once()

    def _pass(self) -> None:
        self.run_once()

    def _interval_s(self) -> float:
        return self.interval_s

    def _failed(self) -> None:
        log.exception("history window: a pass failed; the next one tries again")


class HistoryCheckpoints(PeriodicWorker):
    """Checkpoints of every partition's model kept here, each when its turn comes (a pass every
    ``every_s`` ticks each partition's :class:`HistoryCheckpointer`)."""

    _thread_name = "history-checkpoints"
    _wait_first = True
    _stop_timeout_s = 60.0

    def __init__(self, owned: OwnedHistory, every_s: float) -> None:
        self._owned = owned
        self.every_s = every_s

    def run_once(self) -> None:
        for checkpointer in self._owned.checkpointers():
            try:
                checkpointer.tick()
            except Exception:
                log.exception("a partition's history checkpoint failed; the next pass tries again")

    def _pass(self) -> None:
        self.run_once()

    def _interval_s(self) -> float:
        return self.every_s

    def _failed(self) -> None:
        log.exception("history checkpoints: a pass failed; the next one tries again")
