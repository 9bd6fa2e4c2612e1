"""Following the log: one thread per partition feeds the read model's fold.

The runner reads each partition's events from the model's recorded position, so a crash or a
set-aside (positions back to 0, or to a refilled checkpoint's) is followed by folding exactly
what the model lacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from core.errors import CronlogError, LogCorrupted, StoreDamaged
from eventlog.port import EventLog
from projections.decoding import EventDecoder
from projections.model_fold import ModelFold

log = logging.getLogger("projections.read_model")  # the name the runner logged under before

RETRY_S = 0.2  # a follower that failed reads again after this, doubling with each failure
MAX_RETRY_S = 10.0
# A node starting with a read model far behind the log (a new node, a model rebuilt) folds
# that history while its partitions recover from their stores and snapshots: both want the
# one interpreter lock, and the partitions' recovery is what the first on-time fire waits for.
# So a follower more than a batch behind waits while any partition is still recovering, for at
# most this long after the runner starts, then folds whatever else goes on: history is late,
# never lost. A follower within a batch of the log's end (the live case) never waits.
DEFER_FOR_S = 30.0
DEFER_POLL_S = 0.1
MAX_SET_ASIDE = 3  # rebuilds one runner starts; more means something other than the disk is wrong


class ReadModelRunner:
    """Feeds a :class:`~projections.read_model.ReadModel` from every partition of an event log.

    ``run_once()`` folds in everything there is now and returns how many events it read.
    ``start()`` runs one thread per partition, each blocking in ``read_events(..., timeout_s)``
    from the model's position, so an event is queryable moments after it is committed;
    ``stop()`` ends them (within ``poll_s``). While ``defer_while()`` is true (the node's
    partitions are still recovering), a follower more than a batch behind the log's end waits,
    for at most ``defer_for_s`` after ``start()`` (see ``DEFER_FOR_S``). Records that are not
    events go through ``decoder`` (reported once, passed over). A model found damaged while
    folding is set aside and folded again from offset 0 (up to ``MAX_SET_ASIDE`` times), or
    refilled from a history checkpoint where there is one. A thread whose read or fold fails
    otherwise says so (the first failure of a streak with its traceback), tells ``on_failed``,
    and tries again from the model's position after a backoff: it never stops following while
    the runner runs, unless the log itself is damaged (``LogCorrupted``: the log has failed and
    the node that owns it stops).
    """

    def __init__(
        self,
        log_: EventLog,
        model: ModelFold,  # a ReadModel: the runner needs only its fold and positions
        batch_size: int = 1000,
        poll_s: float = 0.2,
        on_failed: Callable[[int, BaseException], None] | None = None,
        decoder: EventDecoder | None = None,
        defer_while: Callable[[], bool] | None = None,
        defer_for_s: float = DEFER_FOR_S,
        partitions: Sequence[int] | None = None,
    ) -> None:
        self._log = log_
        # the partitions it follows: every one of the log's (a model of every partition), or
        # those given (history kept with its partition: a model of one)
        self._partitions = None if partitions is None else list(partitions)
        self._model = model
        self._batch_size = batch_size
        self._poll_s = poll_s
        self._on_failed = on_failed
        self._decoder = decoder or EventDecoder("read_model")
        self._defer_while = defer_while
        self._defer_for_s = defer_for_s
        self._defer_until = 0.0
        self.deferred = threading.Event()  # set once a follower has waited (for tests)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def run_once(self, on_batch: Callable[[int], None] | None = None) -> int:
        """Fold in everything there is now; returns how many records were read. ``on_batch``
        is told how many each batch read (a tool's progress)."""
        total = 0
        for partition in self.partitions:
            while True:
                generation = self._model.generation
                position = self._model.position(partition)
                records = self._log.read_events(partition, position, self._batch_size)
                if not records:
                    self._model.reached_the_end(partition, position, generation)
                    break
                total += self._model.process_records(partition, records, self._decoder)
                if on_batch is not None:
                    on_batch(len(records))
        return total

    def start(self) -> None:
        if self._threads:
            raise CronlogError("the read model runner is already running")
        self._stopping.clear()
        self._defer_until = time.monotonic() + self._defer_for_s
        self._threads = [
            threading.Thread(target=self._follow, args=(p,), name=f"read-model:p{p}", daemon=True)
            for p in self.partitions
        ]
        for thread in self._threads:
            thread.start()

    @property
    def partitions(self) -> list[int]:
        if self._partitions is None:
            return list(range(self._log.num_partitions))
        return self._partitions

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def __enter__(self) -> ReadModelRunner:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _deferring(self, partition: int) -> bool:
        """Whether this follower waits now: the node is recovering partitions, the runner
        started less than ``defer_for_s`` ago, and the model is more than a batch behind."""
        if self._defer_while is None or time.monotonic() >= self._defer_until:
            return False
        if not self._defer_while():
            return False
        behind = self._log.end_offset("events", partition) - self._model.position(partition)
        return behind > self._batch_size

    def _follow(self, partition: int) -> None:
        model = self._model
        failures = 0
        while not self._stopping.is_set():
            try:
                if self._deferring(partition):
                    self.deferred.set()
                    self._stopping.wait(DEFER_POLL_S)
                    continue
                generation = model.generation
                position = model.position(partition)
                records = self._log.read_events(partition, position, self._batch_size, self._poll_s)
                if not records:
                    model.reached_the_end(partition, position, generation)
                if records:
                    try:
                        model.process_records(
                            partition, records, self._decoder, generation=generation
                        )
                    except StoreDamaged as damage:
                        if model.set_asides >= MAX_SET_ASIDE:
                            raise
                        model.set_aside(damage, generation)
                failures = 0
            except LogCorrupted as damage:  # the log failed itself: reading again cannot help
                if not self._stopping.is_set():
                    log.error("read model of partition %d stopped: %s", partition, damage)
                return
            except Exception as exc:
                if self._stopping.is_set():
                    return
                failures += 1
                delay = min(MAX_RETRY_S, RETRY_S * 2.0 ** (failures - 1))
                if failures == 1:
                    log.exception("read model of partition %d failed; retrying", partition)
                else:
                    log.error(
                        "read model of partition %d failed again (%d in a row): %r",
                        partition,
                        failures,
                        exc,
                    )
                if self._on_failed is not None:
                    self._on_failed(partition, exc)
                self._stopping.wait(delay)
