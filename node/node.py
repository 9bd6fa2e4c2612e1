"""A cronlog node: the partitions it owns, its executors, the read model, and the API's port.

The same node runs on the embedded log (one machine, every partition) and on Kafka (several
nodes; the consumer group decides who owns what). It learns ownership only through the log's
membership callbacks:

- ``assigned``: for each partition, open its state store and start a
  :class:`~node.runner.PartitionRunner` (which catches up and rebuilds its wheel before
  deciding anything);
- ``revoked``: stop those runners at once.

Requests for a partition this node owns go straight to its runner. A request for a partition
owned elsewhere is appended to that partition's commands stream with this node's id; the owner
decides it and replies, once its events are durable, to this node's mailbox
(:mod:`node.wire`). No answer in time means "unavailable": the request may or may not have
been decided, and retrying it is safe (requests are idempotent or fenced). Every answer is
given only once its events are durable in the log and the read model has caught up with them,
so a client reads its own writes.

**Nothing owned stays dead.** Every thread the node starts catches what goes wrong, says so
and carries on. Its background work is a list of services under one supervisor
(``Node.services``, :mod:`node.supervisor`; the list is at the end of ``Node.__init__``): it
starts them in order, stops them in reverse, and starts again, after a backoff, one whose
thread ended. A partition runner recovers by itself after a failure (:mod:`node.runner`); the
membership thread, after each poll, also checks that every partition the node owns has a runner
that is alive (:meth:`Node._supervise`), starts one where it has none, and renews the writer of
a partition whose runner was fenced while the group still assigns it to this node (a writer
that failed on a broker's error, not a new owner: a real new owner's revocation arrives within
``FENCE_GRACE_S``). Readiness is the same checks: ``/readyz`` fails, naming why
(:meth:`Node.not_ready`), and the metrics show it, while any owned partition is not deciding or
a required service is down.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from archive.archive import Archive
from archive.store import ObjectStore
from core import events as ev
from core.clock import Clock, SystemClock
from core.commands import (
    AnswerOutcome,
    AnyCommand,
    CancelJob,
    CancelRun,
    ClaimRuns,
    CompleteRun,
    HeartbeatRun,
    PauseJob,
    PutJob,
    ReplayRun,
    ResumeJob,
    ReturnLease,
    SlotDue,
    StartRun,
    TriggerRun,
    UpstreamSucceeded,
)
from core.decide import job_id_of_run
from core.errors import (
    CronlogError,
    HistoryMoved,
    LogCorrupted,
    NotYetReadable,
    Unavailable,
)
from core.jobs import MAX_PRIORITY
from core.partition import DEFAULT_ARM_MS, DEFAULT_LEAD_MS, DEFAULT_RETENTION_MS
from core.shares import ShareBook, Shares
from core.state import JobStatus, PartitionState, RunStatus
from eventlog.port import EventLog, Mailbox, Membership, Record, partition_for
from eventlog.snapshots import SnapshotStore
from node import decisions, limit_shares, wire
from node.claims import ReadyHints, split
from node.executors import Executors
from node.handoff import handoff_to
from node.history_checkpointer import HistoryCheckpointer
from node.history_reader import FILL_WAIT_S, Held, HistoryReader, every_partition
from node.history_reader import answer as history_answer
from node.hot_window import (
    DEFAULT_INTERVAL_S,
    DEFAULT_WINDOW_MS,
    HotWindow,
    HotWindowMetrics,
)
from node.limit_shares import ShareAsking
from node.metrics import Gauges, Measured, NodeMetrics, TimedWriter
from node.owned_history import (
    Checkpointing,
    HistoryCheckpoints,
    HistoryOn,
    HotWindows,
    OwnedHistory,
)
from node.produced import ProducedTargets
from node.ready_watch import AHEAD_MS as WATCH_AHEAD_MS
from node.ready_watch import MAX_INSTANTS, ReadyWatches, Told, Watching
from node.relay import DependencyRelay, RelayMetrics
from node.retention import recovery_floor
from node.runner import LOCAL_TIMEOUT_S, Decided, PartitionRunner, Reply, Request
from node.snapshotter import SnapshotPolicy, Snapshotter
from node.stalls import LateStarts, StallMetrics, StallWatch
from node.standby import StandbyFollower, may_be_given, standby_targets
from node.supervisor import Supervisor
from node.worker import Unwatched, Worker, backoff_s
from projections import history_checkpoint
from projections.decoding import EventDecoder
from projections.history import ArchivedRuns, History, past_window
from projections.model_fold import ReadyRun
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import RocksStateStore
from projections.wakeups import Wakeups

T = TypeVar("T")

log = logging.getLogger(__name__)

READ_YOUR_WRITES_S = 5.0
FORWARD_TIMEOUT_S = 10.0
FORWARD_BATCH = 500  # the commands one forwarded request carries at most
# A question about another owner's history waits this long for its answer (the owner may first
# wait up to READ_YOUR_WRITES_S for its history to fold the asker's last write).
QUERY_TIMEOUT_S = 8.0
# How long the watch of another owner's partitions a claim keeps up (node.ready_watch) lasts:
# claims of the pool here renew it as their answers come.
STANDING_WATCH_S = 10.0
# A question read this long after it was asked (by the asker's clock: a new owner reading the
# commands again after a takeover) is passed over: its asker gave up long ago (QUERY_TIMEOUT_S,
# or a watch's wait), and clocks may disagree by a little.
STALE_QUERY_MS = 60_000
QUERY_THREADS = 4  # the threads answering other nodes' questions about history kept here
# A claim's ask of another node's partition: short, so a slow or lost owner delays a pull
# worker's claim by this much at most, once (all such asks of a claim go at once). A lease
# granted after it ran out is never handed out, and runs out unused.
REMOTE_CLAIM_TIMEOUT_S = 2.0
CLAIM_ROUNDS = 3  # rounds of asks per claim (those that granted their whole share go again)
# A claim's answer that comes after the claim stopped waiting is still taken this long, and the
# leases it granted (to nobody) are given back (``Node.return_leases``); one later than that
# leaves its leases to run out.
LATE_REPLY_S = 60.0
# A runner fenced while its partition is still assigned here waits this long for the group's
# revocation before the node takes it for a failed writer and opens a new one.
FENCE_GRACE_S = 5.0
# How long giving partitions up waits, in all, for their runners to end (see _stop_runners):
# when the group revokes them, and when the node stops (no group waits then).
STOP_WAIT_S = 3.0
NODE_STOP_WAIT_S = 10.0
# How long a stopping node asks the group's coordinator whether others remain to hand over to.
OTHERS_TIMEOUT_S = 2.0
# How long a graceful hand-over waits for its partitions' last batch (``Node._arm_last_batch``).
LAST_BATCH_WAIT_S = 0.5
# A handover begins this long after a whole second (the second's slots have started by then).
HANDOVER_AFTER_MS = 150
# Warming before joining (node.standby): up to this many times a member's share of the
# partitions, the likeliest first, for at most this long (the join waits for it).
PREWARM_SHARES = 2
PREWARM_BUDGET_S = 15.0
NEXT_READY_SCAN = 10_000  # ready entries of a pool a waiting claim looks at, per partition
RETRY_BACKOFF_S = 0.2  # a thread of the node that failed tries again after this, doubling
MAX_RETRY_BACKOFF_S = 10.0
# A command that cannot be decoded still advances the partition's command position.
_NOTHING = SlotDue(job_id="")


def routing_key(command: AnyCommand) -> str:
    """The job id that decides which partition a command goes to."""
    match command:
        case PutJob() | PauseJob() | ResumeJob() | CancelJob() | TriggerRun() | UpstreamSucceeded():
            return command.job_id
        case (
            StartRun()
            | HeartbeatRun()
            | CompleteRun()
            | ReturnLease()
            | AnswerOutcome()
            | CancelRun()
            | ReplayRun()
        ):
            return job_id_of_run(command.run_id)
    raise TypeError(f"{type(command).__name__} is not routed by job")


def _outcome_of(result: Decided | CronlogError) -> wire.Outcome:
    """A runner's answer to a forwarded command, as the reply carries it."""
    if isinstance(result, CronlogError):
        return wire.outcome(result)
    return wire.outcome((result.events, result.offsets))


def _may_be_held(command: AnyCommand) -> bool:
    """Whether the owner may hold ``command``'s answer until an instant to come: a worker's
    check of a run leased ahead (``PartitionRunner._hold_check``, up to seconds). Such a
    command is asked alone, never in a request of several, whose one reply would wait for it."""
    return type(command) is HeartbeatRun and command.check


def _holds_here(runner: PartitionRunner, command: AnyCommand) -> bool:
    """Whether ``command`` is a worker's check of a run leased ahead that the partition's state
    answers "the lease holds" without its loop (:meth:`PartitionRunner.lease_holds`)."""
    return type(command) is HeartbeatRun and command.check and runner.lease_holds(command)


class Node:
    def __init__(
        self,
        log_: EventLog,
        data_dir: Path,
        *,
        node_id: str = "node-1",
        clock: Clock | None = None,
        executors: Executors | None = None,
        fence_grace_s: float = FENCE_GRACE_S,
        stop_wait_s: float = STOP_WAIT_S,
        snapshots: SnapshotStore | None = None,
        snapshot_policy: SnapshotPolicy | None = None,
        standby_replicas: int = 0,
        snapshot_offset: Callable[[int], int | None] | None = None,
        retention_ms: int = DEFAULT_RETENTION_MS,
        lead_ms: int = DEFAULT_LEAD_MS,
        arm_ms: int = DEFAULT_ARM_MS,
        history_window_ms: int | None = DEFAULT_WINDOW_MS,
        archive: Archive | None = None,
        history_store: ObjectStore | None = None,
        history_checkpoint_every_s: float = history_checkpoint.DEFAULT_EVERY_S,
        history_checkpoints_kept: int = history_checkpoint.DEFAULT_KEEP,
        history_checkpoint_grace_ms: int = history_checkpoint.DEFAULT_GRACE_MS,
        history_on: HistoryOn = "every-node",
        monotonic: Callable[[], float] = time.monotonic,
        produced: ProducedTargets | None = None,
        cluster_limits: bool = False,
    ) -> None:
        """``monotonic``: the clock the supervisor times its restarts by (seconds).
        ``history_store``: where read-model checkpoints are kept (the archive's object
        store; shared by the cluster's nodes): a node without a read model restores the newest
        and folds only the tail, and the owner of partition 0 writes one every
        ``history_checkpoint_every_s``; files nothing names are collected once
        ``history_checkpoint_grace_ms`` is over. None: every new read model folds from the
        first event. ``history_on``: where history is kept, ``every-node`` (one read model
        folding every partition) or ``owner`` (a model per partition this node owns,
        :mod:`node.owned_history`; other partitions' history is asked of their owners).
        ``produced``: set where ``kafka://`` runs go into the events' own transaction, exactly
        once (:mod:`node.produced`: cluster mode, the teams' topics on the cluster).
        ``cluster_limits``: this node is one member of several (a cluster, or worker processes),
        and its teams' limits are the cluster's: ``shares`` holds this node's shares of them,
        asked of each team's owner (:mod:`node.limit_shares`). Otherwise ``shares`` is None and
        a team's limits are whole on this node."""
        self.produced = produced
        self.shares = (
            Shares(self._owned_fraction, least=1 / log_.num_partitions) if cluster_limits else None
        )
        self._monotonic = monotonic
        self._share_book = ShareBook()
        self.history_on = history_on
        # a node of several worker processes: why the others are not ready (cli.workers)
        self.siblings_not_ready: Callable[[], list[str]] | None = None
        self._standby_replicas = standby_replicas
        # What each member of the group holds, asked before joining (warm_before_joining).
        self._holdings: Callable[[], list[frozenset[int]]] | None = None
        self.node_id = node_id
        self._retention_ms = retention_ms
        self._lead_ms = lead_ms  # how long before its slot a run is materialised (core.partition)
        self._arm_ms = arm_ms  # how long before its start a push run's call is armed
        # The oldest snapshot a recovery may fall back to, per partition, once snapshots exist
        # (the node's own snapshot store unless given); retention keeps the log from there
        # (recovery_floor).
        self._snapshot_offset = snapshot_offset or (
            self._snapshot_floor if snapshots is not None else _no_snapshot
        )
        self._fence_grace_s = fence_grace_s
        self._stop_wait_s = stop_wait_s
        self._log = log_
        self._data_dir = Path(data_dir)
        self._clock = clock or SystemClock()
        self.executors = executors or Executors(node_id)
        if self.shares is not None:
            self.executors.share_limits(self.shares)
        self._runners: dict[int, PartitionRunner] = {}
        self._lock = threading.Lock()
        self._membership: Membership | None = None
        self._stopping = threading.Event()
        # A stop that hands the partitions over before it drains: the membership thread leaves
        # the group when asked to (it is the thread that owns the membership), then says so.
        self._hand_over = threading.Event()
        self._handed_over = threading.Event()
        self._handing_over = False  # hand_over() was called
        self._assigned = threading.Event()
        self._ownership = threading.Condition()
        self._mailbox: Mailbox | None = None
        self._waiting: dict[str, Callable[[wire.Reply], None]] = {}
        self.metrics = NodeMetrics()
        self._owned_history: OwnedHistory | None = None
        self._history: ReadModel | None = None
        if history_on == "every-node":
            self._history, restored = history_checkpoint.open_model(
                self._data_dir, history_store, self.metrics
            )
            self._report_history_start(self._history, restored)
        # the offset of this node's last write to each partition whose history is kept
        # elsewhere: a later question about it waits until its owner has folded that far
        self._written: dict[int, int] = {}
        self._queries = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="history-query")
        # watches of ready runs, answered at once or held: apart from the questions, which may
        # wait seconds for a fold, so a claim elsewhere never waits behind them
        self._watch_answers = ThreadPoolExecutor(1, thread_name_prefix="ready-watch")
        self._decisions = decisions.DecisionLog(
            on_dropped=self.metrics.decision_lines_dropped.inc,
            on_failed=self.metrics.thread_failures.labels("decision-log").inc,
        )
        # Where partitions' owners leave snapshots; a new owner restores the newest one.
        self.snapshotter = (
            Snapshotter(snapshots, snapshot_policy, self.metrics) if snapshots is not None else None
        )
        # One decoder per reader of the events stream, so each foreign record is counted once.
        self._recovery_decoder = EventDecoder("recovery", self.metrics.foreign)
        self._stream_decoder = EventDecoder("events_stream", self.metrics.foreign)
        history_decoder = EventDecoder("read_model", self.metrics.foreign)
        self._history_runner = (
            None
            if self._history is None
            else ReadModelRunner(
                log_,
                self._history,
                on_failed=lambda p, err: self.metrics.thread_failures.labels("read-model").inc(),
                decoder=history_decoder,
                # History far behind waits while partitions recover: their first fires first.
                defer_while=self._recovering,
            )
        )
        self._relay = DependencyRelay(
            log_,
            lambda: self._reader,
            self.execute,
            EventDecoder("relay", self.metrics.foreign),
            # A relay stops retrying once its partition is owned elsewhere: the new owner
            # relays the partition's recent successes again when it has recovered it.
            owns=lambda p: p in self._owned_now(),
            metrics=RelayMetrics(self.metrics.registry),
        )
        self._read_model_lag = Measured(self._history_lag, "read model lag")
        self.metrics.watch(self.gauges)
        # Finished runs older than the window leave the read model; past it, the archive
        # answers (read through log_, which is archive + log when there is an archive).
        self.hot_window = (
            None
            if history_window_ms is None or self._history is None
            else HotWindow(
                self._history,
                history_window_ms,
                self._clock,
                HotWindowMetrics(self.metrics.registry),
                # every minute, or a tenth of a window shorter than ten minutes
                interval_s=min(DEFAULT_INTERVAL_S, max(0.1, history_window_ms / 10_000)),
            )
        )
        archived = (
            None
            if archive is None
            else ArchivedRuns(log_, archive, EventDecoder("history", self.metrics.foreign))
        )
        self._wakeups = Wakeups(self._clock.now_ms)
        self._ready_hints = ReadyHints()
        # Watches of ready runs between nodes that keep history with its partition
        # (node.ready_watch): those other nodes placed here, and those placed from here.
        self._watches = ReadyWatches(self._clock.now_ms)
        self._watching = Watching()
        # tasks of the API's loops held until they end (ready watches, leases given back)
        self._loop_tasks: set[asyncio.Task[None]] = set()
        self._reader: HistoryReader
        if self._history is not None:
            every = Held(
                self._history, History(self._history, self._clock, history_window_ms, archived)
            )
            self._reader = HistoryReader(
                self._log.num_partitions,
                every_partition(every),
                lambda: [every],
                archived=lambda: archived is not None,
                past_window=every.runs.past_window,
            )
        else:
            self._owned_history = OwnedHistory(
                log_,
                self._data_dir,
                self._clock,
                window_ms=history_window_ms,
                archived=archived,
                observers=[self._wakeups, self._ready_hints, self._watches],
                decoder=history_decoder,
                on_failed=lambda p, err: self.metrics.thread_failures.labels("read-model").inc(),
                defer_while=self._recovering,
                window_metrics=HotWindowMetrics(self.metrics.registry),
                checkpointing=None
                if history_store is None
                else Checkpointing(
                    history_store,
                    node_id,
                    every_s=history_checkpoint_every_s,
                    keep=history_checkpoints_kept,
                    grace_ms=history_checkpoint_grace_ms,
                    metrics=self.metrics,
                ),
            )
            self._reader = HistoryReader(
                self._log.num_partitions,
                self._owned_history.held,
                self._owned_history.kept,
                ask=self._ask_history,
                written=lambda p: self._written.get(p, -1),
                wait_filled=self._owned_history.wait_filled,
                archived=lambda: archived is not None,
                past_window=partial(past_window, clock=self._clock, window_ms=history_window_ms),
            )
        self.executors.route = self._decide
        self.executors.submit_local = self._submit_local
        self.executors.on_process_failed = self.metrics.thread_failures.labels(
            "executor-process"
        ).inc
        # Partitions this node does not own, followed so that taking one over is quick.
        self.standby = StandbyFollower(
            log_,
            lambda p: RocksStateStore.open(self._data_dir, p),
            self._owned_now,
            standby_replicas,
            snapshots,
            on_failed=lambda p, err: self.metrics.thread_failures.labels("standby").inc(),
        )
        if self._history is not None:
            self._history.observe(self._wakeups)
            self._history.observe(self._ready_hints)
        # One node writes read-model checkpoints for every node to start from.
        self.history_checkpointer = (
            None
            if history_store is None or self._history is None
            else HistoryCheckpointer(
                self._history,
                history_store,
                self._data_dir,
                node_id=node_id,
                clock=self._clock,
                writes=lambda: 0 in self._runners,
                lag=self._history_lag,
                every_s=history_checkpoint_every_s,
                keep=history_checkpoints_kept,
                grace_ms=history_checkpoint_grace_ms,
                metrics=self.metrics,
            )
        )
        # A partition behind its timers, a run started late, the process standing still: each
        # logged with its cause and counted (node.stalls).
        stall_metrics = StallMetrics(self.metrics.registry)
        self.late_starts = LateStarts(stall_metrics)
        self.stall_watch = StallWatch(
            lambda: dict(self._runners),
            stall_metrics,
            self.late_starts,
            dump_path=self._data_dir / "stalls.txt",
            on_failed=self.metrics.thread_failures.labels("stall-watch").inc,
        )
        # The node's background services, in the order they start; they stop in the reverse
        # order, so none is stopped under another still using it (the partitions' runners stop
        # with the membership, before the executors, the relay and the read model they use).
        # ``cronlog serve`` adds its own after these (node.supervisor).
        self.services = Supervisor(
            on_failed=lambda name: self.metrics.thread_failures.labels(name).inc(),
            clock=monotonic,
        )
        for service in (
            self._decisions,
            self.stall_watch,
            self.snapshotter,
            Unwatched("executors", self.executors.start, self.executors.stop),
            None
            if self._history_runner is None
            else Unwatched("read-model", self._history_runner.start, self._history_runner.stop),
            self.history_checkpointer,
            self.hot_window,
            None
            if self._owned_history is None or history_store is None
            else HistoryCheckpoints(self._owned_history, history_checkpoint_every_s),
            None
            if self._owned_history is None or history_window_ms is None
            else HotWindows(
                self._owned_history,
                interval_s=min(DEFAULT_INTERVAL_S, max(0.1, history_window_ms / 10_000)),
            ),
            self._relay,
            # Without these two the node answers nothing: readiness waits for them.
            Worker(
                "mailbox",
                self._read_mailbox,
                required=True,
                opens=self._open_mailbox,
                closes=self._close_mailbox,
            ),
            Worker("membership", self._poll, required=True, opens=self._join, closes=self._leave),
            self.standby,
            None
            if self.shares is None
            else ShareAsking(
                self.node_id,
                self.shares,
                self._share_book,
                num_partitions=self._log.num_partitions,
                owned=self._owned_now,
                ask=self._ask_owner,
                now_ms=self._mono_ms,
                wall_ms=self._clock.now_ms,
                on_failed=self.metrics.thread_failures.labels("limit-shares").inc,
                on_unanswered=self.metrics.history_questions.labels(
                    limit_shares.QUERY, "unanswered"
                ).inc,
            ),
        ):
            if service is not None:
                self.services.add(service)

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.services.start()

    def stop(self, drain_s: float = 30.0) -> None:
        """Leave gracefully: when other members remain, hand the partitions over at once
        (stop deciding, leave the group) so their runs keep their slots; start no more calls,
        and let those in flight finish and record their outcomes (up to ``drain_s``; a
        critical run's call cut short would be dead-lettered as outcome_unknown), wherever
        their partitions run now (the outcomes are routed to the new owners); then stop
        deciding and give up what is left, and stop every service.

        A node alone (or one whose group is not known) drains before it gives its partitions
        up, as there is nobody to record the outcomes meanwhile: its runs due during the
        drain wait for it or for the next owner."""
        self.hand_over()
        if not self.executors.drain(drain_s):
            log.warning(
                "%s: calls still in flight after %.0f s are abandoned", self.node_id, drain_s
            )
        self._stopping.set()
        self.services.stop()
        if self._history is not None:
            self._history.close()
        self._queries.shutdown(wait=True, cancel_futures=True)
        self._watch_answers.shutdown(wait=True, cancel_futures=True)
        if self._owned_history is not None:
            self._owned_history.close()

    def hand_over(self) -> None:
        """The first step of :meth:`stop`, which ``cronlog serve`` takes before it closes its
        port (so its peers' watch, ``node.peer_watch``, never finds it refusing while it still
        owns partitions): when other members remain, stop deciding and leave the group just
        after a whole second. Once; a later call returns at once."""
        with self._lock:
            if self._handing_over:
                return
            self._handing_over = True
        # Until the partitions are handed over, their runs start here: a run not started while
        # the node still decides would wait for the next owner, and come late.
        if self._others_remain():
            # Just after a whole second: cron slots are whole seconds, and that second's have
            # started here, so the next owner has nearly two seconds before the next slot's
            # run is late (it had less than one when the handover began late in a second).
            into = self._clock.now_ms() % 1000
            time.sleep(((HANDOVER_AFTER_MS - into) % 1000) / 1000)
            self._arm_last_batch()
            self._hand_over.set()
            if not self._handed_over.wait(NODE_STOP_WAIT_S + OTHERS_TIMEOUT_S):
                log.warning("%s: the partitions were not handed over in time", self.node_id)

    def _arm_last_batch(self) -> None:
        """Before handing the partitions over: have each runner arm the next calls of its
        critical jobs within the arming time (``Partition.arm_ahead``), which this node makes
        as it drains, and wait for them up to ``LAST_BATCH_WAIT_S`` in all. Those jobs keep
        one call armed otherwise (a killed node's armed leases are ambiguous), so a hand-over
        longer than a second made their next slot late; with this batch, their calls are armed
        through the arming time, as every other push job's are."""
        with self._lock:
            runners = list(self._runners.values())
        answered: list[threading.Event] = []
        for runner in runners:
            done = threading.Event()

            def said(_answer: Decided | CronlogError, done: threading.Event = done) -> None:
                done.set()

            runner.submit(Request(_NOTHING, reply=said, arms_ahead=True))
            answered.append(done)
        deadline = time.monotonic() + LAST_BATCH_WAIT_S
        for done in answered:
            if not done.wait(max(0.0, deadline - time.monotonic())):
                log.info(
                    "%s: handing over before every partition armed its last batch", self.node_id
                )
                return

    def _open_mailbox(self) -> None:
        if self._mailbox is None:
            self._mailbox = self._log.mailbox(self.node_id)

    def _close_mailbox(self) -> None:
        if self._mailbox is not None:
            self._mailbox.close()

    def warm_before_joining(self, holdings: Callable[[], list[frozenset[int]]]) -> None:
        """Before joining the group, warm the partitions it may give this node: ``holdings``
        says what each member holds now (``node.standby``, "Warm before joining"). To be
        called before :meth:`start`."""
        self._holdings = holdings

    def _join(self) -> None:
        if self._membership is None:
            self._warm_what_may_come()
            self._membership = self._log.join(self)

    def _warm_what_may_come(self) -> None:
        """Catch up, as standbys, the stores of the partitions the group may give this node
        when it joins, so that a take-over from a live owner is not a cold one."""
        if self._holdings is None:
            return
        began = time.monotonic()
        try:
            holdings = self._holdings()
        except Exception as err:  # the group could not be asked: join cold, as before
            log.warning("%s: the group's holdings are unknown: %s; joining cold", self.node_id, err)
            return
        if not any(holdings):
            return  # nobody holds anything: the first start, or the whole group restarting
        members = len(holdings) + 1
        share = -(-self._log.num_partitions // members)  # the most a member is given
        candidates = may_be_given(holdings, self._log.num_partitions, PREWARM_SHARES * share)
        warmed = self.standby.prewarm(candidates, PREWARM_BUDGET_S)
        self.metrics.prewarmed.inc(len(warmed))
        log.info(
            "%s: warmed partitions %s before joining, in %.2f s (the group's %d members hold %s)",
            self.node_id,
            warmed,
            time.monotonic() - began,
            len(holdings),
            ", ".join(str(sorted(h)) for h in holdings),
        )

    def _leave(self) -> None:
        # Stop deciding before leaving the group: leaving closes every partition's writer, and
        # a runner still deciding would find its writer closed under it and take that for a
        # fence by another node.
        self._stop_runners(list(self._runners), "the node is stopping", NODE_STOP_WAIT_S)
        if self._membership is not None:
            self._membership.close()  # revokes what is left (nothing: every runner stopped)

    def _others_remain(self) -> bool:
        membership = self._membership
        if membership is None or not membership.owned():
            return False
        return (membership.others(OTHERS_TIMEOUT_S) or 0) > 0

    def _poll(self, stopping: threading.Event) -> None:
        """The membership thread: poll the log's membership (its callbacks run here), decide
        the commands it hands over, and keep what this node owns alive (:meth:`_supervise`).
        Ends for good when the log has failed. A stop that hands over (:meth:`stop`) has it
        leave the group here, and then wait for the stop."""
        assert self._membership is not None
        failures = 0
        while not stopping.is_set():
            if self._hand_over.is_set():
                self._leave()
                log.info("%s: handed its partitions over to the group", self.node_id)
                self._handed_over.set()
                stopping.wait()
                return
            try:
                records = self._membership.poll(0.2)
                for record in records:
                    self._from_log(record.partition, record.offset, record.value)
                self._supervise()
                failures = 0
            except LogCorrupted as damage:  # the log failed itself: polling it again cannot help
                log.error("%s: stopped polling the log: %s", self.node_id, damage)
                return
            except Exception:
                if stopping.is_set():
                    return
                failures += 1
                self.metrics.thread_failures.labels("membership").inc()
                log.exception("%s: membership poll failed (%d in a row)", self.node_id, failures)
                stopping.wait(_backoff(failures))

    def _from_log(self, partition: int, offset: int, value: bytes) -> None:
        runner = self._runners.get(partition)
        if runner is None:
            return
        try:
            envelope = wire.decode_envelope(value)
        except msgspec.ValidationError:
            log.warning("partition %d: undecodable command at %d skipped", partition, offset)
            runner.submit(Request(_NOTHING, offset=offset))  # still move the position past it
            return
        if envelope.command is None:
            # A question is not the partition's business: its runner never sees it (moving
            # the command position past one would cost an append, a Kafka transaction, per
            # question). The next command's position covers it; a new owner that reads it
            # again passes it over once it is older than any asker still waits.
            query = envelope.query
            if query is None or envelope.reply_to is None:
                return
            stale_ms = limit_shares.STALE_MS if query.name == limit_shares.QUERY else STALE_QUERY_MS
            if query.asked_at and self._clock.now_ms() - query.asked_at > stale_ms:
                self.metrics.history_questions.labels(query.name, "stale").inc()
                return
            self.metrics.history_questions.labels(query.name, "answered").inc()
            if query.name == limit_shares.QUERY:  # quick: a lock and a sum per limit
                self._watch_answers.submit(
                    self._answer_shares, query, envelope.reply_to, envelope.request_id
                )
            elif query.name == "watch_ready":  # quick, and never behind a question that waits
                self._watch_answers.submit(
                    self._watched, partition, query, envelope.reply_to, envelope.request_id
                )
            else:
                self._queries.submit(
                    self._answer, partition, query, envelope.reply_to, envelope.request_id
                )
            return
        if envelope.more:
            self._decide_together(runner, offset, envelope)
            return
        reply = None
        if envelope.reply_to is not None and envelope.request_id is not None:
            reply = self._replier(envelope.reply_to, envelope.request_id)
        runner.submit(Request(envelope.command, reply=reply, offset=offset))

    def _decide_together(
        self, runner: PartitionRunner, offset: int, envelope: wire.Envelope
    ) -> None:
        """A request of several commands: queued together, so they are decided in one batch,
        and answered in one reply once the last is. Only the last carries the record's offset:
        were the batch cut in two, the first part's append does not move the partition's
        command position past commands not yet decided."""
        assert envelope.command is not None
        commands = [envelope.command, *envelope.more]
        to, request_id = envelope.reply_to, envelope.request_id
        outcomes: list[wire.Outcome | None] = [None] * len(commands)
        left = [len(commands)]
        lock = threading.Lock()

        def answer(i: int) -> Callable[[Decided | CronlogError], None]:
            def reply(result: Decided | CronlogError) -> None:
                with lock:
                    if outcomes[i] is not None:
                        return
                    outcomes[i] = _outcome_of(result)
                    left[0] -= 1
                    if left[0]:
                        return
                if to is not None and request_id is not None:
                    done = [o for o in outcomes if o is not None]
                    self._log.send_reply(to, wire.encode(wire.answered(request_id, done)))

            return reply

        last = len(commands) - 1
        runner.submit_many(
            [
                Request(command, reply=answer(i), offset=offset if i == last else None)
                for i, command in enumerate(commands)
            ]
        )

    def _answer(
        self, partition: int, query: wire.Query, node_id: str, request_id: str | None
    ) -> None:
        """(On a query thread.) Answer another node's question about the history of a
        partition kept here, once that history has folded past the asker's last write; asked
        of several partitions at once (``query.also``), each is answered or refused apart."""
        try:
            try:
                args = list(query.args)
                if query.also:
                    answers: dict[int, msgspec.Raw] = {}
                    refused: dict[int, wire.Refused] = {}
                    # one deadline for all the partitions' waits, as for one partition's: the
                    # asker gives up after QUERY_TIMEOUT_S, however many partitions it asked
                    deadline = time.monotonic() + FILL_WAIT_S + READ_YOUR_WRITES_S
                    for p, after in {partition: query.after, **query.also}.items():
                        try:
                            answer = self._answer_part(p, query.name, args, after, deadline)
                            answers[p] = msgspec.Raw(answer)
                        except CronlogError as err:
                            refused[p] = wire.refused(err)
                    message = wire.Reply(
                        request_id=request_id or "",
                        by=self.node_id,
                        answers=answers,
                        refused=refused,
                    )
                else:
                    answer = self._answer_part(partition, query.name, args, query.after)
                    message = wire.Reply(
                        request_id=request_id or "", by=self.node_id, answer=msgspec.Raw(answer)
                    )
            except CronlogError as err:
                message = wire.refusal(request_id or "", err)
            except Exception:  # said to the asker too, rather than left to time out
                self.metrics.thread_failures.labels("history-query").inc()
                log.exception("partition %d: answering %r failed", partition, query.name)
                failed = Unavailable(f"partition {partition}: answering {query.name!r} failed")
                message = wire.refusal(request_id or "", failed)
            if request_id is not None:
                self._log.send_reply(node_id, wire.encode(message))
        except Exception:
            self.metrics.thread_failures.labels("history-query").inc()
            log.exception("partition %d: a history answer was not sent", partition)

    def _answer_part(
        self, partition: int, name: str, args: list[Any], after: int, deadline: float | None = None
    ) -> bytes:
        """The answer to question ``name`` about one partition kept here (JSON), once its
        history has folded past ``after``; HistoryMoved when it is not kept here. ``deadline``
        (monotonic): where several partitions are answered in turn, their waits end by it."""

        def within(wait_s: float) -> float:
            return (
                wait_s if deadline is None else max(0.0, min(wait_s, deadline - time.monotonic()))
            )

        owned = self._owned_history
        if owned is None:
            # One model of every partition cannot answer for one partition alone (its counts
            # and figures are the sums of all): a cluster keeps history one way on every node.
            raise Unavailable(
                f"the owner of partition {partition} keeps history on every node"
                " (--history-on every-node), this node with each partition's owner:"
                " every node of a cluster must keep it the same way"
            )
        owned.wait_filled(partition, within(FILL_WAIT_S))  # taken over moments ago?
        held = owned.held(partition)
        if held is None:
            raise HistoryMoved(f"the history of partition {partition} is not kept here")
        if after >= 0 and not held.model.wait_for(partition, after, within(READ_YOUR_WRITES_S)):
            raise Unavailable(
                f"partition {partition}: the history has not folded the last write yet"
            )
        return history_answer(held, name, args)

    def _replier(self, node_id: str, request_id: str) -> Callable[[Decided | CronlogError], None]:
        def send(result: Decided | CronlogError) -> None:
            message = wire.answered(request_id, [_outcome_of(result)])
            self._log.send_reply(node_id, wire.encode(message))

        return send

    def _read_mailbox(self, stopping: threading.Event) -> None:
        """The mailbox thread: replies to the requests this node forwarded."""
        assert self._mailbox is not None
        failures = 0
        while not stopping.is_set():
            try:
                raws = self._mailbox.poll(0.2)
                failures = 0
            except Exception:
                if stopping.is_set():
                    return
                failures += 1
                self.metrics.thread_failures.labels("mailbox").inc()
                log.exception("%s: mailbox poll failed (%d in a row)", self.node_id, failures)
                stopping.wait(_backoff(failures))
                continue
            for raw in raws:
                try:
                    reply = wire.decode_reply(raw)
                except msgspec.ValidationError as err:
                    log.warning("undecodable reply skipped: %s", err)
                    continue
                with self._lock:
                    waiting = self._waiting.pop(reply.request_id, None)
                if waiting is not None:
                    waiting(reply)

    # -- ownership (called from inside Membership.poll) -------------------------------------

    def assigned(self, partitions: list[int]) -> None:
        for p in partitions:
            if self._owned_history is not None:
                self._owned_history.gain(p)
            self._start_runner(p)
        self._stand_by()
        self._assigned.set()
        with self._ownership:
            self._ownership.notify_all()
        decisions.moved(self.node_id, partitions, sorted(self._runners), assigned=True)

    def _start_runner(self, partition: int) -> None:
        """Start deciding ``partition``: a runner that opens its store and recovers in its own
        thread, so nothing here can fail on the store."""
        assert self._membership is not None

        def open_store() -> RocksStateStore:
            self.standby.wait_released(partition)  # a standby's first catch-up may hold it
            return RocksStateStore.open(self._data_dir, partition)

        runner = PartitionRunner(
            partition,
            self._log,
            TimedWriter(self._membership.writer(partition), self.metrics),
            open_store,
            self._clock,
            self.executors,
            on_appended=self._appended,
            on_recovered=self._relay.recovered,
            on_failed=self._runner_failed,
            decoder=self._recovery_decoder,
            snapshotter=self.snapshotter,
            warm=self.standby.hand_over(partition),
            retention_ms=self._retention_ms,
            lead_ms=self._lead_ms,
            arm_ms=self._arm_ms,
            on_late=self.late_starts.add,
            produced=self.produced,
        )
        with self._lock:
            self._runners[partition] = runner
        runner.start()

    def _owned_now(self) -> frozenset[int]:
        membership = self._membership
        return membership.owned() if membership is not None else frozenset()

    def _snapshot_floor(self, partition: int) -> int | None:
        """The oldest snapshot of ``partition`` a recovery may fall back to (the snapshot
        store's ``floor``), None before the first; 0 (keep everything) when it cannot be read."""
        if self.snapshotter is None:
            return None
        try:
            floor = self.snapshotter.store.floor(partition)
        except Exception as err:
            log.warning("partition %d: snapshot floor unknown: %s", partition, err)
            return 0
        return floor or None

    def _report_history_start(
        self, model: ReadModel, restored: history_checkpoint.Restored | None
    ) -> None:
        """Say where the read model starts from and how much it has to fold to catch up; it
        answers for no partition before it has folded the log as it ends now (refilling)."""
        try:
            log_ = self._log
            model.hold_until({p: log_.end_offset("events", p) for p in range(log_.num_partitions)})
            tail = sum(model.lag(self._log).values())
        except CronlogError as err:
            log.warning("read model: how far behind the log it starts is unknown: %s", err)
            tail = -1
        self.metrics.history_start(restored, tail)
        held = sum(model.positions().values())
        if restored is not None:
            log.info(
                "read model restored from history checkpoint %s (%d events, %.1f MB in %.2f s);"
                " folding the %d events after it",
                restored.key,
                restored.manifest.events,
                restored.size / 1e6,
                restored.seconds,
                tail,
            )
        elif held == 0:
            log.info(
                "read model: no history checkpoint; folding every event from the first: %d", tail
            )
        else:
            log.info(
                "read model: reopened with %d events folded; folding the %d after them", held, tail
            )

    def _runner_failed(self, partition: int, err: BaseException) -> None:
        self.metrics.runner_failures.inc()

    def _supervise(self) -> None:
        """(On the membership thread, after each poll.) Every owned partition has a live runner:
        start one where a runner ended while the partition is still assigned here. (The node's
        background services are the supervisor's, ``self.services``; this thread keeps the
        supervisor's own thread going, as the supervisor keeps this one.)"""
        assert self._membership is not None
        watch = self.services.watch
        if watch.started and not watch.alive:
            log.error("the %s thread ended; starting it again", watch.name)
            self.metrics.thread_failures.labels(watch.name).inc()
            watch.start()
        for p in sorted(self._membership.owned()):
            with self._lock:
                runner = self._runners.get(p)
            if runner is not None and not runner.ended.is_set():
                continue
            if runner is None:
                log.error("partition %d: owned without a runner; starting one", p)
            elif runner.fenced:
                if runner.ended_for() < self._fence_grace_s:
                    continue  # a new owner's revocation is on its way
                log.error(
                    "partition %d: fenced %.1f s ago but still assigned here: its writer failed;"
                    " opening a new one",
                    p,
                    runner.ended_for(),
                )
                self._membership.renew(p)
            else:
                log.error("partition %d: runner ended while owned; starting a new one", p)
            self.metrics.runner_failures.inc()
            self._start_runner(p)

    def _appended(self, partition: int, offsets: list[int], events: list[ev.AnyEvent]) -> None:
        self.metrics.appended(partition, offsets, events)
        self._decisions.appended(partition, events)
        self._relay.appended(partition, offsets, events)

    def revoked(self, partitions: list[int]) -> None:
        reason = "the node is stopping" if self._stopping.is_set() else "the partition was revoked"
        self._stop_runners(partitions, reason, self._stop_wait_s)
        if self._owned_history is not None:
            for p in partitions:
                self._owned_history.lose(p)
                self._watches.lost(p)
            self._stand_by()
        if self.snapshotter is not None:
            for p in partitions:  # its snapshot writer (Kafka: a producer) is not needed here
                self.snapshotter.release(p)

    def _stand_by(self) -> None:
        """Follow the history of the partitions this node stands by for (history kept with
        its partition, ``--standby-replicas``), as its state standbys follow their state."""
        if (
            self._owned_history is not None
            and self._standby_replicas > 0
            and not self._stopping.is_set()
        ):
            owned = frozenset(self._runners)
            targets = standby_targets(owned, self._log.num_partitions, self._standby_replicas)
            self._owned_history.stand_by(set(targets))

    def _stop_runners(self, partitions: list[int], reason: str, wait_s: float) -> None:
        """Stop the runners of ``partitions``: all at once, then wait for them within
        ``wait_s`` in all. The rebalance callback calls this, and the group waits for its
        members' callbacks (up to ``max.poll.interval.ms``), so one runner held by an append to
        a broker that stopped answering must not hold the others, nor the group."""
        runners = []
        for p in partitions:
            with self._lock:
                runner = self._runners.pop(p, None)
            if runner is not None:
                runner.request_stop(reason)
                runners.append(runner)
        deadline = time.monotonic() + wait_s
        for runner in runners:
            runner.stop(max(0.0, deadline - time.monotonic()), reason)
            if not runner.ended.is_set():
                log.warning(
                    "partition %d: its runner has not ended yet; it ends once the call in hand"
                    " returns (an append is bounded by the log's timeout)",
                    runner.partition,
                )
        stopped = [runner.partition for runner in runners]
        decisions.moved(self.node_id, stopped, sorted(self._runners), assigned=False, reason=reason)
        with self._ownership:
            self._ownership.notify_all()

    def wait_owned(self, predicate: Callable[[list[int]], bool], timeout_s: float) -> bool:
        """Block until ``predicate(owned partitions)`` holds (for tests and operators)."""
        with self._ownership:
            return self._ownership.wait_for(lambda: predicate(self.owned()), timeout_s)

    # -- the API's port ------------------------------------------------------------------------

    @property
    def history(self) -> ReadModel:
        """The read model of every partition (``--history-on every-node``; tools and tests)."""
        if self._history is None:
            raise CronlogError("history is kept with each partition here: see node.reader")
        return self._history

    def history_positions(self) -> dict[int, int]:
        """How far the history kept here has folded each partition it keeps, as it would
        reopen after a crash: retention prunes no partition's log above it."""
        if self._history is not None:
            return self._history.durable_positions()
        assert self._owned_history is not None
        found: dict[int, int] = {}
        for p in self._owned_history.partitions():
            model = self._owned_history.model(p)
            if model is not None:
                found[p] = model.durable_positions().get(p, 0)
        return found

    def _history_model(self, partition: int) -> ReadModel | None:
        """The model that folds ``partition`` here, if one does."""
        if self._history is not None:
            return self._history
        assert self._owned_history is not None
        return self._owned_history.model(partition)

    def _history_lag(self) -> int:
        """Events the history kept here has still to fold, over every partition it keeps."""
        if self._history is not None:
            return sum(self._history.lag(self._log).values())
        assert self._owned_history is not None
        lag = 0
        for p in self._owned_history.partitions():
            model = self._owned_history.model(p)
            if model is not None:
                lag += max(0, self._log.end_offset("events", p) - model.position(p))
        return lag

    @property
    def reader(self) -> HistoryReader:
        return self._reader

    def now_ms(self) -> int:
        return self._clock.now_ms()

    @property
    def wakeups(self) -> Wakeups:
        return self._wakeups

    @property
    def num_partitions(self) -> int:
        return self._log.num_partitions

    def read_events(self, partition: int, from_offset: int, max_records: int) -> list[Record]:
        return self._log.read_events(partition, from_offset, max_records)

    def events_end(self, partition: int) -> int:
        return self._log.end_offset("events", partition)

    @property
    def events_decoder(self) -> EventDecoder:
        return self._stream_decoder

    def next_ready(self, tenant: str, pool: str, horizon_ms: int = 0) -> int | None:
        now = self._clock.now_ms() + horizon_ms
        earliest: int | None = None
        for runner in list(self._runners.values()):
            state = runner.state
            # A slice copies in one step under the GIL (the runner may be mid-batch), and only
            # what is looked at: a herd's heaps hold tens of thousands of entries.
            # Runs not due when indexed wait in ``later`` (``core.state``) until a claim
            # moves them; both are looked at.
            entries = list(state.ready.get(pool, ())[:NEXT_READY_SCAN])
            found = [_not_yet_ready(state, entry, pool, tenant, now) for entry in entries]
            # ``later`` is a heap by ``available_at``: walked in order, the first run of the
            # team still to come is the earliest. At a steady rate the root is nearly always
            # a run that came due since the last claim (moved to ``ready`` by the next one):
            # the whole heap of runs made ahead was once looked at below it, for every claim
            # that waited (a tenth of a node's CPU at 1,000 pull runs a second).
            for entry in _in_order(state.later.get(pool, ())[:NEXT_READY_SCAN]):
                if (at := _not_yet_ready(state, entry[1:], pool, tenant, now)) is not None:
                    found.append(at)
                    break
            for at in found:
                if at is not None and (earliest is None or at < earliest):
                    earliest = at
        return earliest

    def ready(self) -> bool:
        """Owns partitions and decides every one of them (recovered, not failing), and no
        required service is down (:meth:`not_ready` says why not)."""
        return not self.not_ready()

    def readiness(self) -> list[str]:
        """Why the node is not ready as ``/readyz`` says it: this process's reasons, and those
        of its sibling worker processes (``siblings_not_ready``, set by ``cronlog serve
        --workers``: a node is ready when every process of it is)."""
        reasons = self.not_ready()
        if self.siblings_not_ready is not None:
            reasons += self.siblings_not_ready()
        return reasons

    def not_ready(self) -> list[str]:
        """Why this process of the node is not ready, one reason each: empty when it is."""
        return self._not_ready(self.not_deciding_why())

    def _not_ready(self, not_deciding: dict[int, str]) -> list[str]:
        reasons = []
        if not self._owned_now():
            reasons.append("it owns no partitions yet")
        if not_deciding:
            reasons.append(
                "partitions not deciding: "
                + ", ".join(f"{p} ({why})" for p, why in sorted(not_deciding.items()))
            )
        down = self.services.down()
        if down:
            reasons.append("services down: " + ", ".join(down))
        return reasons

    def _recovering(self) -> bool:
        """No partition assigned yet, or one this node owns has a runner not caught up."""
        if not self._assigned.is_set():
            return True
        with self._lock:
            runners = list(self._runners.values())
        return any(not runner.caught_up.is_set() for runner in runners)

    def not_deciding(self) -> list[int]:
        """Partitions this node owns and does not decide now (:meth:`not_deciding_why`)."""
        return sorted(self.not_deciding_why())

    def not_deciding_why(self) -> dict[int, str]:
        """Partitions this node owns and does not decide now, each with why: its runner
        recovering, failing or fenced, missing, or held (an append in flight or failed, timers
        due and undecided, for more than ``runner.STUCK_S``: ``PartitionRunner.not_deciding_why``).
        A partition counts as deciding again once its runner appends or catches up."""
        if self._membership is None:
            return {}
        with self._lock:
            runners = dict(self._runners)
        found: dict[int, str] = {}
        for p in sorted(self._membership.owned()):
            runner = runners.get(p)
            if runner is None:
                found[p] = "no runner"
            elif runner.fenced:
                found[p] = "fenced: its writer failed or another node took it"
            elif (why := runner.not_deciding_why()) is not None:
                found[p] = why
        return found

    def wait_recovered(self, timeout_s: float) -> bool:
        """Block until this node owns partitions and every one has caught up (deciding)."""
        deadline = time.monotonic() + timeout_s
        if not self._assigned.wait(timeout_s):
            return False
        for runner in list(self._runners.values()):
            if not runner.caught_up.wait(max(0.0, deadline - time.monotonic())):
                return False
        return not self._recovering()

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until the node is recovered and its required services are up (a one-shot
        one, such as serve's start check of the log: done)."""
        deadline = time.monotonic() + timeout_s
        if not self.wait_recovered(timeout_s):
            return False
        if not self.services.wait_up(max(0.0, deadline - time.monotonic())):
            return False
        return self.ready()

    def owned(self) -> list[int]:
        return sorted(self._runners)

    def recovery_floor(self, partition: int) -> int | None:
        """The lowest event offset a recovery of ``partition`` on this node may still read
        from the log (:func:`node.retention.recovery_floor` over this node's durable
        checkpoints); None while unknown, and then retention prunes nothing."""
        runner = self._runners.get(partition)
        state_store = None if runner is None else runner.checkpoint()
        try:
            model = self._history_model(partition)
            read_model: int | None = (
                None if model is None else model.durable_positions().get(partition, 0)
            )
        except Exception as err:  # closed or damaged: unknown, so nothing is pruned
            log.warning("read model checkpoint unknown: %s", err)
            read_model = None
        return recovery_floor(
            state_store=state_store,
            read_model=read_model,
            snapshot=self._snapshot_offset(partition),
        )

    def gauges(self) -> Gauges:
        """The node as it is now, for the metrics' gauges (called at each scrape)."""
        now = self._clock.now_ms()
        not_deciding = self.not_deciding_why()
        g = Gauges(
            ready=not self._not_ready(not_deciding), executor_in_flight=self.executors.in_flight
        )
        g.partitions_not_deciding = len(not_deciding)
        g.deciding = {p: p not in not_deciding for p in self._owned_now()}
        g.waiting_for_room, g.waiting_for_rate = self.executors.waiting
        g.runs = dict.fromkeys((s.value for s in RunStatus), 0)
        g.jobs = dict.fromkeys((s.value for s in JobStatus), 0)
        g.ready_by_priority = dict.fromkeys(range(MAX_PRIORITY + 1), 0)
        oldest: int | None = None
        runners = list(self._runners.values())
        g.partitions_owned = len(runners)
        for runner in runners:
            state = runner.state
            # list() copies a dict in one step under the GIL: the runner may be mid-batch.
            for run in list(state.runs.values()):
                g.runs[run.status.value] += 1
                if run.status is RunStatus.PENDING and run.available_at <= now:
                    g.ready_by_priority[run.priority] += 1
                    oldest = run.available_at if oldest is None else min(oldest, run.available_at)
            for job in list(state.jobs.values()):
                g.jobs[job.status.value] += 1
            if runner.last_recovery is not None:
                g.recoveries[runner.partition] = runner.last_recovery
        g.oldest_ready_age_s = 0.0 if oldest is None else (now - oldest) / 1000
        # Measured from the brokers, so never inside the scrape: the last measurement, and
        # how old it is (a broker that does not answer leaves it growing old, not the scrape).
        g.read_model_lag, g.read_model_lag_age_s = self._read_model_lag.read()
        return g

    async def execute(self, command: AnyCommand) -> list[ev.AnyEvent]:
        partition = partition_for(routing_key(command), self._log.num_partitions)
        return await self._execute_on(partition, command)

    async def execute_many(
        self, commands: Sequence[AnyCommand], *, visible: bool = True
    ) -> list[list[ev.AnyEvent] | CronlogError]:
        """Each partition's commands go to its runner at once, so they are decided in one
        batch and appended in one write; another node's partitions are asked concurrently.
        Every answer waits for the read model once per partition, at the last offset; with
        ``visible=False`` none does (a batch of heartbeats: its answer reads nothing back)."""
        results: list[list[ev.AnyEvent] | CronlogError | None] = [None] * len(commands)
        by_partition: dict[int, list[int]] = {}
        for i, command in enumerate(commands):
            p = partition_for(routing_key(command), self._log.num_partitions)
            by_partition.setdefault(p, []).append(i)
        offsets: dict[int, int] = {}  # partition -> the last offset its answers hold

        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()
        handoff = handoff_to(loop)
        remote: list[asyncio.Task[None]] = []
        local: list[tuple[int, list[int], PartitionRunner]] = []
        for p, indices in by_partition.items():
            runner = self._runners.get(p)
            if runner is None:
                # one request of many commands to the owner, not a record and a reply each
                together: list[int] = []
                for i in indices:
                    if _may_be_held(commands[i]):
                        ask = self._ask(p, i, commands, results, visible=visible)
                        remote.append(asyncio.create_task(ask))
                    else:
                        together.append(i)
                remote += [
                    asyncio.create_task(
                        self._ask_together(p, part, commands, results, visible=visible)
                    )
                    for k in range(0, len(together), FORWARD_BATCH)
                    for part in [together[k : k + FORWARD_BATCH]]
                ]
            else:
                asked = []
                for i in indices:
                    if _holds_here(runner, commands[i]):
                        results[i] = []  # the lease holds, and nothing to come can withdraw it
                    else:
                        asked.append(i)
                if asked:
                    local.append((p, asked, runner))
        # The runners' answers are kept where their threads leave them, and the loop is woken
        # once, by the last: not a hand-over and a call in the loop per command.
        expected = sum(len(indices) for _, indices, _ in local)
        lock = threading.Lock()
        answers: dict[int, Decided | CronlogError] = {}

        def finish() -> None:
            if not answered.done():
                answered.set_result(None)

        def replier(i: int) -> Callable[[Decided | CronlogError], None]:
            def reply(result: Decided | CronlogError) -> None:
                with lock:
                    if i in answers:
                        return
                    answers[i] = result
                    last = len(answers) == expected
                if last:
                    handoff.post(finish)

            return reply

        for _, indices, runner in local:
            runner.submit_many([Request(commands[i], reply=replier(i)) for i in indices])
        if expected:
            timer = loop.call_later(LOCAL_TIMEOUT_S, finish)
            try:
                await answered
            finally:
                timer.cancel()
        with lock:
            got = dict(answers)  # an answer later than the timeout is not read
        if len(got) < expected:
            log.error("%d commands had no answer in %.0f s", expected - len(got), LOCAL_TIMEOUT_S)
        for p, indices, _ in local:
            for i in indices:
                result = got.get(i)
                if isinstance(result, CronlogError):
                    results[i] = result
                elif result is not None:
                    results[i] = result.events
                    if result.offsets:
                        offsets[p] = max(offsets.get(p, -1), result.offsets[-1])
        if remote:
            await asyncio.gather(*remote)
        waits = offsets if visible else {}  # unwaited: the answers are durable, that is all
        for p, last in waits.items():
            try:
                await self._visible(p, [last])
            except Unavailable as err:
                for i in by_partition[p]:
                    decided = results[i]
                    if isinstance(decided, list):
                        # each its own, with what it decided: durable, only not yet readable
                        results[i] = NotYetReadable(str(err), decided)
        return [
            Unavailable("no answer in time") if result is None else result for result in results
        ]

    async def _ask(
        self,
        partition: int,
        i: int,
        commands: Sequence[AnyCommand],
        results: list[list[ev.AnyEvent] | CronlogError | None],
        *,
        visible: bool = True,
    ) -> None:
        """One command of a batch, to the owner of a partition elsewhere (``visible``: and
        folded by this node's read model before it is answered)."""
        try:
            results[i] = await self._forward(partition, commands[i], visible=visible)
        except CronlogError as err:
            results[i] = err

    async def _ask_together(
        self,
        partition: int,
        indices: list[int],
        commands: Sequence[AnyCommand],
        results: list[list[ev.AnyEvent] | CronlogError | None],
        *,
        visible: bool = True,
    ) -> None:
        """Commands of a batch, to the owner of a partition elsewhere, in one request (the
        ``more`` of :class:`wire.Envelope`); an owner that answers the first alone (a build
        before ``more``) is asked the others one by one."""
        if len(indices) == 1:
            await self._ask(partition, indices[0], commands, results, visible=visible)
            return
        first, *more = (commands[i] for i in indices)
        try:
            reply = await self._through_log(
                partition,
                lambda request_id: wire.Envelope(
                    command=first, more=more, request_id=request_id, reply_to=self.node_id
                ),
                FORWARD_TIMEOUT_S,
                refusals=False,
            )
        except CronlogError as err:
            for i in indices:
                results[i] = err
            return
        outcomes = wire.outcomes(reply)
        if len(outcomes) == 1:  # an older owner: the rest one by one
            await asyncio.gather(
                *(self._ask(partition, i, commands, results, visible=visible) for i in indices[1:])
            )
        elif len(outcomes) != len(indices):
            log.error(
                "partition %d: %d answers to %d commands", partition, len(outcomes), len(indices)
            )
            outcomes = []
        last = -1
        for i, outcome in zip(indices, outcomes, strict=False):
            refused = wire.error_of(outcome)
            results[i] = refused if refused is not None else outcome.events
            if outcome.offsets:
                last = max(last, outcome.offsets[-1])
        for i in indices:
            if results[i] is None:
                results[i] = Unavailable(f"no answer from the owner of partition {partition}")
        if not visible or last < 0:
            return
        try:
            await self._visible(partition, [last])
        except Unavailable as err:
            for i in indices:
                decided = results[i]
                if isinstance(decided, list):
                    results[i] = NotYetReadable(str(err), decided)

    def _submit_local(self, command: AnyCommand, reply: Reply) -> bool:
        """(On the executors' loop.) Hand ``command`` to its partition's runner if this node
        runs the partition, ``reply`` told the answer on the runner's thread: an outcome of the
        executors then takes no future, timer or round trip through their loop. False where the
        partition is decided elsewhere (the executors then ``_decide`` it)."""
        partition = partition_for(routing_key(command), self._log.num_partitions)
        runner = self._runners.get(partition)
        if runner is None or _holds_here(runner, command):
            return False
        _gathering(asyncio.get_running_loop()).submit(runner, Request(command, reply=reply))
        return True

    async def _decide(self, command: AnyCommand) -> list[ev.AnyEvent]:
        """``execute`` without waiting for the read model: for the executors' heartbeats and
        outcomes, which nobody reads back."""
        partition = partition_for(routing_key(command), self._log.num_partitions)
        return await self._execute_on(partition, command, visible=False)

    async def _execute_on(
        self,
        partition: int,
        command: AnyCommand,
        *,
        visible: bool = True,
        timeout_s: float | None = None,
        on_late: Callable[[list[ev.AnyEvent]], None] | None = None,
    ) -> list[ev.AnyEvent]:
        """Decide ``command`` on ``partition``, here or at its owner. ``on_late`` is given the
        events of a decision whose answer came after this stopped waiting (on this loop)."""
        runner = self._runners.get(partition)
        if runner is None:
            return await self._forward(
                partition,
                command,
                visible=visible,
                timeout_s=timeout_s or FORWARD_TIMEOUT_S,
                on_late=on_late,
            )
        if _holds_here(runner, command):
            return []
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Decided | CronlogError | None] = loop.create_future()

        def deliver(result: Decided | CronlogError | None) -> None:
            if not answer.done():
                answer.set_result(result)
            elif on_late is not None and isinstance(result, Decided):
                on_late(result.events)

        handoff = handoff_to(loop)

        def settle(result: Decided | CronlogError) -> None:
            handoff.post(deliver, result)

        # No answer in time settles it with None: one timer, where wait_for would add a
        # future, a task switch and callbacks to every request.
        timer = loop.call_later(LOCAL_TIMEOUT_S, deliver, None)
        _gathering(loop).submit(runner, Request(command, reply=settle))
        try:
            result = await answer
        finally:
            timer.cancel()
        if result is None:
            log.error("partition %d: no answer in %.0f s", partition, LOCAL_TIMEOUT_S)
            raise Unavailable(f"partition {partition} did not answer")
        if isinstance(result, CronlogError):
            raise result
        if visible:
            await self._visible(partition, result.offsets, result.events)
        return result.events

    async def _visible(
        self, partition: int, offsets: list[int], events: Sequence[ev.AnyEvent] = ()
    ) -> None:
        """Wait until the read model holds the events at ``offsets``, so the caller reads its
        own writes; :class:`NotYetReadable` (with the decided ``events``) when it does not in
        time."""
        if not offsets:
            return
        model = self._history_model(partition)
        if model is None:
            # Kept by the partition's owner: the next question about the partition asks it
            # to answer once its history has folded this far.
            with self._lock:
                self._written[partition] = max(self._written.get(partition, -1), offsets[-1])
            return
        if model.position(partition) <= offsets[-1]:
            caught_up = await self._wakeups.folded_past(
                partition, offsets[-1], model.position, READ_YOUR_WRITES_S
            )
            if not caught_up:
                # The write is durable, but an answer read from the read model now would not
                # show it (a create would say "not found"): the caller must try again.
                raise NotYetReadable(
                    f"partition {partition}: decided, but not yet readable; try again", events
                )

    async def _forward(
        self,
        partition: int,
        command: AnyCommand,
        *,
        visible: bool = True,
        timeout_s: float = FORWARD_TIMEOUT_S,
        on_late: Callable[[list[ev.AnyEvent]], None] | None = None,
    ) -> list[ev.AnyEvent]:
        """Ask the partition's owner, wherever it runs, through the log."""
        reply = await self._through_log(
            partition,
            lambda request_id: wire.Envelope(
                command=command, request_id=request_id, reply_to=self.node_id
            ),
            timeout_s,
            on_late=None if on_late is None else lambda late: on_late(late.events),
        )
        if visible:
            await self._visible(partition, reply.offsets, reply.events)
        return reply.events

    async def _ask_history(
        self, partition: int, name: str, args: list[Any], after: int, also: dict[int, int]
    ) -> wire.Reply:
        """A question about the history of a partition kept by its owner elsewhere (and of
        the ``also`` partitions, each with this node's last write to it, that the same owner
        is believed to keep: :mod:`node.history_reader`), through the log as a forwarded
        command goes."""
        query = wire.Query(
            name=name, args=args, after=after, asked_at=self._clock.now_ms(), also=also
        )
        self.metrics.history_questions.labels(name, "asked").inc()
        return await self._through_log(
            partition,
            lambda request_id: wire.Envelope(
                query=query, request_id=request_id, reply_to=self.node_id
            ),
            QUERY_TIMEOUT_S,
        )

    def _mono_ms(self) -> int:
        """The node's monotonic clock in ms: the one the shares' book is kept by, whether an
        ask comes from this node or through the log."""
        return round(self._monotonic() * 1000)

    def _owned_fraction(self) -> float:
        return len(self._runners) / self._log.num_partitions

    def _answer_shares(self, query: wire.Query, node_id: str, request_id: str | None) -> None:
        """(On the watch thread.) Another node's asks for its shares of teams' limits whose
        partition this node owns (:mod:`node.limit_shares`)."""
        if request_id is None:
            return
        try:
            try:
                shares = limit_shares.answer(self._share_book, node_id, query, self._mono_ms())
                message = wire.Reply(request_id=request_id, answer=shares)
            except msgspec.ValidationError as err:
                log.warning("a malformed shares question from %s was refused: %s", node_id, err)
                refused = CronlogError(f"malformed shares question: {err}")
                message = wire.refusal(request_id, refused)
            self._log.send_reply(node_id, wire.encode(message))
        except CronlogError as err:  # the asker keeps its shares and asks again next period
            log.info("shares for %s were not sent: %s", node_id, err)
        except Exception:  # on a pool's thread, whose failures nobody would see otherwise
            self.metrics.thread_failures.labels("limit-shares").inc()
            log.exception("shares for %s could not be answered", node_id)

    def _expect(self, on_reply: Callable[[wire.Reply], None]) -> tuple[str, Callable[[], None]]:
        """A new request id whose reply ``on_reply`` is given (from the mailbox thread), and
        the function that stops waiting for it."""
        request_id = uuid.uuid4().hex

        def stop_waiting() -> None:
            with self._lock:
                self._waiting.pop(request_id, None)

        with self._lock:
            self._waiting[request_id] = on_reply
        return request_id, stop_waiting

    def _ask_owner(
        self, partition: int, query: wire.Query, on_reply: Callable[[wire.Reply], None]
    ) -> Callable[[], None]:
        """Send ``query`` to the owner of ``partition``; ``on_reply`` gets its reply (from the
        mailbox thread). Returns the function that stops waiting for it."""
        request_id, stop_waiting = self._expect(on_reply)
        envelope = wire.Envelope(query=query, request_id=request_id, reply_to=self.node_id)
        try:
            self._log.submit(partition, wire.encode(envelope))
        except BaseException:
            stop_waiting()
            raise
        self.metrics.history_questions.labels(query.name, "asked").inc()
        return stop_waiting

    def _watched(
        self, partition: int, query: wire.Query, node_id: str, request_id: str | None
    ) -> None:
        """(On the watch thread.) Another node's claim watches a pool on a partition owned here
        (:mod:`node.ready_watch`): answered now if the partition holds a run of it, else at the
        first fold of one."""

        def send(at: list[int] | None) -> None:
            if request_id is not None:
                answer = msgspec.Raw(msgspec.json.encode(at))
                message = wire.Reply(request_id=request_id, answer=answer)
                try:
                    self._log.send_reply(node_id, wire.encode(message))
                except CronlogError as err:  # the asker watches again on its next turn
                    log.info("partition %d: a ready watch's answer was lost: %s", partition, err)

        try:
            tenant, pool, until_ms = str(query.args[0]), str(query.args[1]), int(query.args[2])
            told = None
            if len(query.args) >= 5:  # what the asker's last answer told it
                at = tuple(sorted(int(t) for t in query.args[4]))
                told = Told(int(query.args[3]), at)
        except (IndexError, TypeError, ValueError):
            log.warning("partition %d: a malformed ready watch was passed over", partition)
            return
        runner = self._runners.get(partition)
        if runner is None:  # moved on while the watch travelled
            send(None)
            return

        def known() -> list[int]:
            # the state as decided when asked (a held watch is answered later, at a fold)
            ahead = self._clock.now_ms() + WATCH_AHEAD_MS
            return _upcoming_ready(runner.state, pool, tenant, ahead)

        try:
            self._watches.add(tenant, pool, partition, until_ms, send, known(), told, known)
        except Exception:  # the asker watches again when its wait ends; said here
            self.metrics.thread_failures.labels("ready-watch").inc()
            log.exception("partition %d: a ready watch could not be answered", partition)

    def watch_elsewhere(self, tenant: str, pool: str, wait_s: float) -> None:
        """A claim of ``pool`` is made here (and may wait up to ``wait_s``): watch the pool on
        the partitions this node neither owns nor folds (history kept with its partition), so a
        run that becomes ready there reaches the claims' hints and wakes a waiting claim as a
        run folded here would (:mod:`node.ready_watch`; one watch a partition in flight). On
        the API's loop; a no-op where every partition is folded here."""
        if self._owned_history is None or wait_s <= 0:
            return
        elsewhere = [p for p in range(self._log.num_partitions) if p not in self._runners]
        until_ms = self._clock.now_ms() + round(wait_s * 1000)
        loop = asyncio.get_running_loop()
        for p, delay_s, told in self._watching.start(tenant, pool, elsewhere):
            task = loop.create_task(self._watch(p, tenant, pool, until_ms, wait_s, delay_s, told))
            self._loop_tasks.add(task)
            task.add_done_callback(self._loop_tasks.discard)

    async def _watch(
        self,
        partition: int,
        tenant: str,
        pool: str,
        until_ms: int,
        wait_s: float,
        delay_s: float = 0.0,
        told: Told | None = None,
    ) -> None:
        answered = False
        now_told: Told | None = None
        try:
            if delay_s > 0:  # answered moments ago: not again sooner (Watching.start)
                await asyncio.sleep(delay_s)
            asked_ms = self._clock.now_ms()
            args: list[Any] = [tenant, pool, until_ms]
            if told is not None:  # what the last answer said: the owner answers only news
                args += [told.covered_ms, list(told.instants)]
            query = wire.Query(name="watch_ready", args=args, asked_at=asked_ms)
            self.metrics.history_questions.labels("watch_ready", "asked").inc()
            reply = await self._through_log(
                partition,
                lambda request_id: wire.Envelope(
                    query=query, request_id=request_id, reply_to=self.node_id
                ),
                wait_s + 1.0,
            )
            instants = msgspec.json.decode(reply.answer, type=list[int] | None)
            answered = instants is not None
            if instants is None:
                # The partition moved on: ask it now (the claim reaches its new owner), which
                # wakes a waiting claim to ask it and watch it again there, at once.
                instants = [self._clock.now_ms()]
            else:
                now_told = Told.of_answer(asked_ms, instants)
            if instants:
                ready = [ReadyRun(tenant, pool, at, partition) for at in instants]
                self._ready_hints.folded({}, ready)
                self._wakeups.folded({}, ready)
        except CronlogError as err:  # no answer: the claim's next turn watches again
            log.debug("partition %d: a ready watch ended: %s", partition, err)
        except Exception:
            self.metrics.thread_failures.labels("ready-watch").inc()
            log.exception("partition %d: a ready watch failed", partition)
        finally:
            self._watching.ended(tenant, pool, partition, answered, now_told)

    async def _through_log(
        self,
        partition: int,
        envelope: Callable[[str], wire.Envelope],
        timeout_s: float,
        *,
        refusals: bool = True,
        on_late: Callable[[wire.Reply], None] | None = None,
    ) -> wire.Reply:
        """Submit ``envelope(request_id)`` to the partition's commands and wait for the reply
        in this node's mailbox (a refusal raised as the error it names, unless ``refusals``
        is False: a reply of several outcomes is read outcome by outcome). ``on_late``: the
        reply is still taken for ``LATE_REPLY_S`` after the wait gave up, and given to it (on
        this loop) if it comes."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[wire.Reply] = loop.create_future()

        def deliver(reply: wire.Reply) -> None:
            if not answer.done():
                answer.set_result(reply)
            elif on_late is not None:
                on_late(reply)

        handoff = handoff_to(loop)

        def deliver_from_thread(reply: wire.Reply) -> None:
            handoff.post(deliver, reply)

        request_id, stop_waiting = self._expect(deliver_from_thread)
        try:
            await asyncio.to_thread(self._log.submit, partition, wire.encode(envelope(request_id)))
            reply = await asyncio.wait_for(answer, timeout_s)
        except TimeoutError:
            raise Unavailable(f"no answer from the owner of partition {partition}") from None
        finally:
            # not answered in time (or the caller was cancelled): an answer may still come
            if on_late is not None and (not answer.done() or answer.cancelled()):
                loop.call_later(LATE_REPLY_S, stop_waiting)
            else:
                stop_waiting()
        err = wire.error_of(reply) if refusals else None
        if err is not None:
            raise err
        return reply

    async def claim(
        self, tenant: str, pool: str, worker_id: str, limit: int, horizon_ms: int = 0
    ) -> list[ev.LeaseGranted]:
        """Lease up to ``limit`` ready runs of the pool (never more: see :mod:`node.claims`).

        This node's partitions that hold runs of the pool are asked at once, each for a share;
        only if they cannot fill the claim are other nodes' partitions asked — those whose runs
        of the pool this node's read model saw become ready — again all at once, each given at
        most ``REMOTE_CLAIM_TIMEOUT_S``: a slow or lost owner costs a claim that long, once.
        With ``horizon_ms`` the runs ready within it are leased too, ahead of their start."""
        now = self._clock.now_ms() + horizon_ms  # what the claim takes is ready by then
        ask = (tenant, pool, worker_id, horizon_ms)
        # Where other nodes keep history, keep a watch on their partitions while the pool is
        # claimed here, so their runs' instants reach the hints whether or not a claim waits.
        self.watch_elsewhere(tenant, pool, STANDING_WATCH_S)
        local: dict[int, int | None] = {
            # an upper bound: stale entries are tidied by the claim itself
            p: len(runner.state.ready.get(pool, ())) + len(runner.state.later.get(pool, ()))
            for p, runner in list(self._runners.items())
            if _may_hold_ready(runner.state, pool, now)
        }
        granted, spent = await self._claim_rounds(ask, limit, local, None)
        if spent < limit:
            remote = [p for p in range(self._log.num_partitions) if p not in self._runners]
            hinted = self._ready_hints.worth_asking(
                tenant, pool, remote, self._clock.now_ms() + horizon_ms
            )
            if hinted:
                more, _ = await self._claim_rounds(
                    ask, limit - spent, dict.fromkeys(hinted), hinted
                )
                granted += more
        self.metrics.claims.labels("granted" if granted else "empty").inc()
        return granted

    def return_leases(self, leases: Sequence[ev.LeaseGranted], why: str) -> None:
        """Give back ``leases`` that no worker received (their claim's answer reached nobody:
        ``why``), so their runs are claimed again at once instead of waiting for the leases to
        run out (a critical run's would be set aside as ``outcome_unknown``). Only for an
        answer handed to nobody: nobody holds these tokens. On the running loop; returns at
        once, and a return that fails leaves the leases to run out, as before."""
        if not leases:
            return
        log.warning(
            "%s: %d leases no worker received are given back (%s): %s",
            self.node_id,
            len(leases),
            why,
            ", ".join(lease.run_id for lease in leases[:5]) + (" ..." if len(leases) > 5 else ""),
        )
        commands = [ReturnLease(run_id=e.run_id, fencing_token=e.fencing_token) for e in leases]

        async def give_back() -> None:
            try:
                results = await self.execute_many(commands, visible=False)
            except Exception as err:
                log.warning("%s: leases not given back (they run out): %s", self.node_id, err)
                return
            failed = [r for r in results if isinstance(r, CronlogError)]
            if failed:
                log.warning(
                    "%s: %d of %d leases not given back (they run out): %s",
                    self.node_id,
                    len(failed),
                    len(results),
                    failed[0],
                )

        task = asyncio.get_running_loop().create_task(give_back())
        self._loop_tasks.add(task)
        task.add_done_callback(self._loop_tasks.discard)

    async def _claim_rounds(
        self,
        ask: tuple[str, str, str, int],
        limit: int,
        capacity: dict[int, int | None],
        hints: dict[int, int] | None,
    ) -> tuple[list[ev.LeaseGranted], int]:
        """Ask the partitions of ``capacity`` concurrently, each for a share of ``limit`` (the
        claim ``ask``: tenant, pool, worker id and horizon); ask
        again those that granted their whole share while the claim is not full (at most
        ``CLAIM_ROUNDS`` rounds). ``hints``: the partitions are another node's, at these hint
        versions. Returns the leases and how much of ``limit`` is spent: the leases, and the
        shares of asks that did not answer (they may still grant, to nobody, and must not
        make the claim lease more than its limit)."""
        granted: list[ev.LeaseGranted] = []
        unanswered = 0
        timeout_s = LOCAL_TIMEOUT_S if hints is None else REMOTE_CLAIM_TIMEOUT_S
        tenant, pool, _, _ = ask
        for _ in range(CLAIM_ROUNDS):
            shares = split(limit - len(granted) - unanswered, capacity)
            if not shares:
                break
            asked_at = self._clock.now_ms()
            answers = await asyncio.gather(
                *(self._claim_one(p, ask, share, timeout_s) for p, share in shares.items())
            )
            # the next round: those not asked, and those that granted their whole share
            before = capacity
            capacity = {p: cap for p, cap in before.items() if p not in shares}
            for (p, share), leases in zip(shares.items(), answers, strict=True):
                if leases is None:  # no answer: asked again by the next claim
                    unanswered += share
                    continue
                granted += leases
                if len(leases) >= share:  # it may hold more
                    cap = before[p]
                    capacity[p] = None if cap is None else cap - share
                elif hints is not None:
                    self._ready_hints.drained(tenant, pool, p, hints[p], asked_at)
        return granted, len(granted) + unanswered

    async def _claim_one(
        self, partition: int, ask: tuple[str, str, str, int], limit: int, timeout_s: float
    ) -> list[ev.LeaseGranted] | None:
        """One partition's leases for a claim; ``None`` when it did not answer."""
        tenant, pool, worker_id, horizon_ms = ask
        command = ClaimRuns(
            tenant=tenant, pool=pool, worker_id=worker_id, limit=limit, horizon_ms=horizon_ms
        )

        def answered_late(events: list[ev.AnyEvent]) -> None:
            self.return_leases(
                [e for e in events if isinstance(e, ev.LeaseGranted)],
                f"partition {partition} answered a claim after its {timeout_s:g} s",
            )

        try:
            events = await self._execute_on(
                partition, command, timeout_s=timeout_s, on_late=answered_late
            )
        except NotYetReadable as late:
            # The leases are granted and durable: handed to nobody, they would hold their runs
            # until they ran out. The worker gets them; the read model shows them when it has
            # caught up (a completion waits for its own events, which come after them).
            log.warning("partition %d: %s; leases handed out all the same", partition, late)
            events = late.events
        except Unavailable:
            return None
        return [e for e in events if isinstance(e, ev.LeaseGranted)]


class _Gathering:
    """The requests an event loop hands the partition runners, gathered for the rest of the
    loop's current turn and handed over together: one :meth:`PartitionRunner.submit_many` per
    partition instead of one wake-up of its thread per request. Under load, the requests
    that arrive together (uvloop reads every ready connection in one turn) are decided in one
    batch and made durable in one commit; alone, a request waits for nothing but the end of
    the turn. Used from its loop's thread only."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: dict[PartitionRunner, list[Request]] = {}

    def submit(self, runner: PartitionRunner, request: Request) -> None:
        if not self._waiting:
            self._loop.call_soon(self._hand_over)
        self._waiting.setdefault(runner, []).append(request)

    def _hand_over(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for runner, requests in waiting.items():
            try:
                runner.submit_many(requests)
            except Exception as err:  # never a request left waiting for its timeout
                log.exception("partition %d: requests not handed over", runner.partition)
                for request in requests:
                    if request.reply is not None:
                        request.reply(Unavailable(f"partition {runner.partition}: {err}"))


_gatherings: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Gathering] = (
    weakref.WeakKeyDictionary()
)
_gatherings_lock = threading.Lock()  # loops of several threads (the API's, the executors')


def _gathering(loop: asyncio.AbstractEventLoop) -> _Gathering:
    """The loop's :class:`_Gathering` (called from that loop's thread)."""
    with _gatherings_lock:
        gathering = _gatherings.get(loop)
        if gathering is None:
            gathering = _gatherings[loop] = _Gathering(loop)
        return gathering


def _may_hold_ready(state: PartitionState, pool: str, now: int) -> bool:
    """Whether a claim of ``pool`` at ``now`` may get a run from this partition: it holds ready
    runs of the pool, or the earliest of its later ones (the root of their heap) is due. Runs
    materialised a lead time ahead wait in ``later`` until their slot, and a claim before it
    need not ask their runner. Read off the runner's thread: a slice is one step."""
    if state.ready.get(pool):
        return True
    later = state.later.get(pool)
    root = later[:1] if later else []
    return bool(root) and root[0][0] <= now


def _not_yet_ready(
    state: PartitionState, entry: tuple[int, int, str, int], pool: str, tenant: str, now: int
) -> int | None:
    """When the run of a ready entry (of ``state.ready``'s shape) becomes ready, if it is the
    team's, still indexed there, and not ready by ``now``."""
    run = state.runs.get(entry[2])
    if (
        run is not None
        and run.tenant == tenant
        and run.available_at > now
        and state.is_ready_entry_live(entry, pool)
    ):
        return run.available_at
    return None


def _in_order(heap: Sequence[T]) -> Iterator[T]:
    """The entries of ``heap`` (a list kept by ``heapq``, or a copy of a prefix of one: the
    runner may be changing the original) smallest first, lazily: taking the first k costs
    about k log k, where sorting would cost the whole heap."""
    frontier = [(heap[0], 0)] if heap else []
    while frontier:
        entry, i = heapq.heappop(frontier)
        yield entry
        for child in (2 * i + 1, 2 * i + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child], child))


def _upcoming_ready(state: PartitionState, pool: str, tenant: str, until: int) -> list[int]:
    """When the team's runs of ``pool`` in this partition are (or become, up to ``until``)
    ready, the earliest ``MAX_INSTANTS``, as the partition's state holds them now. Read off the
    runner's thread (slices are one step each)."""

    def live(entry: tuple[int, int, str, int]) -> int | None:
        run = state.runs.get(entry[2])
        if (
            run is not None
            and run.tenant == tenant
            and run.available_at <= until
            and state.is_ready_entry_live(entry, pool)
        ):
            return run.available_at
        return None

    found = {at for e in state.ready.get(pool, ())[:NEXT_READY_SCAN] if (at := live(e)) is not None}
    # ``later`` in order, up to ``until``: past MAX_INSTANTS instants of its own, none of the
    # rest can be among the earliest
    ahead: set[int] = set()
    for entry in _in_order(state.later.get(pool, ())[:NEXT_READY_SCAN]):
        if entry[0] > until or len(ahead) == MAX_INSTANTS:
            break
        if (at := live(entry[1:])) is not None:
            ahead.add(at)
    return heapq.nsmallest(MAX_INSTANTS, found | ahead)


def _no_snapshot(partition: int) -> int | None:
    return None


def _backoff(failures: int) -> float:
    return backoff_s(failures, RETRY_BACKOFF_S, MAX_RETRY_BACKOFF_S)
