"""One owned partition, running: recover, then decide in batches, durably.

Recovery, in this order (the partition is an argument, never ambient):

1. open the partition's state store and read the offset it reflects (or take a warm
   standby's open store and state, ``node.standby``); when the newest snapshot is newer than
   the store, restore it into the store (``node.snapshotter`` writes them);
2. catch up the events stream from there (``projections.state_store.catch_up``);
3. fill the timing wheel from the state (``core.timers.all_timers``);
4. only then start deciding, as the partition's single, fenced writer.

The loop takes everything waiting — requests, replies from executors, timers that fell due —
and decides it against the in-memory state, folding each decision at once so the next one
sees it. It then appends all the batch's events in **one** durable write (one fsync or one
Kafka transaction for the lot: the midnight herd costs one write per batch, not per job), saves
the state and the offset together, and only then answers the callers and starts the runs it
leased, and hands a point-in-time view of the store to the snapshotter when a snapshot is due
(the view is all it waits for). Before it takes the next batch it lets the append settle
(``PartitionWriter.wait_until_readable``: on Kafka, until the transaction's markers are
written, which the next transaction must wait for anyway), so what arrives meanwhile is
decided together. A failed append means the in-memory state ran ahead of the
log: the runner answers every caller "unavailable" and recovers from the store and the log
again; a fenced append means another node owns the partition now, and the runner stops.

**The runner supervises itself.** Anything else that goes wrong — a bug in a decision, a store
that cannot be read, a write that failed in a way the loop did not foresee — ends the batch in
hand (its callers are told "unavailable", the room it reserved is given back), and the runner
recovers again from its store and the log after a short backoff (doubling up to
``MAX_RESTART_DELAY_S``). It never stays owned and dead: until it has recovered,
:attr:`PartitionRunner.deciding` is clear, the node reports it not ready, and the first failure
of a streak is logged with its traceback. Callers are never trusted: a reply to a caller that
has gone away (a cancelled future, say) is logged and dropped, never raised into the loop.

A run for a push target starts only with room reserved in the node's executors
(:class:`Dispatcher`); one refused room waits in the executors' queue, which hands it back
through :meth:`PartitionRunner.grant` when room frees up, so no timer spins while it waits.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core import events as ev
from core.clock import Clock
from core.commands import AnyCommand, CompleteRun, HeartbeatRun, Outcome, StartRun
from core.decide import CHECK_GUARD_MS
from core.errors import CronlogError, Fenced, LogCorrupted, Unavailable
from core.events import AnyEvent
from core.jobs import JobSpec, KafkaTarget
from core.partition import DEFAULT_RETENTION_MS, Partition
from core.state import PartitionState, RunState, RunStatus
from eventlog.port import EventLog, Outbound, PartitionWriter
from node import decisions
from node.calls import MAX_ERROR, NOT_CALLED
from node.snapshotter import Snapshotter
from node.stalls import THRESHOLD_S, LoopTimes
from node.standby import Warm
from projections.decoding import EventDecoder
from projections.state_store import StateStore, catch_up

if TYPE_CHECKING:
    from node.produced import ProducedTargets

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a partition's last recovery started from and read (``cronlog_recovery_*``)."""

    snapshot_offset: int | None  # the offset of the snapshot it restored, if it restored one
    replayed: int  # records it read from the events stream after what it restored or held


MAX_BATCH = 2000  # requests decided per append
# A runner answers every request it takes, even when it fails or stops; this bounds a local
# caller's wait should that ever not hold (the node's requests, the executors' outcomes), so
# nothing waits for ever.
LOCAL_TIMEOUT_S = 60.0
# A worker's check of a run leased ahead that comes before the start is CHECK_GUARD_MS away is
# held, and answered once the partition decides past that instant (``_hold_check``); one sent
# more than this long before that instant is refused (503, nothing decided) instead of held.
CHECK_HOLD_MAX_MS = 5_000
# Events folded per store save while recovering: a save re-encodes every job and run its batch
# touched, so larger batches write a busy job once instead of once per thousand events
# (measured: a 48,000-event tail costs about a third less CPU than at 1,000).
RECOVERY_BATCH = 5000
# Timers decided per append: smaller, so the first runs of a herd are durable (and started)
# within milliseconds instead of after the whole herd was decided.
MAX_TIMERS = 500
IDLE_WAIT_S = 0.5  # the longest a runner sleeps without looking at the clock again
# A partition whose append has been in flight this long, or whose oldest due timer has waited
# this long undecided, is not deciding (``PartitionRunner.not_deciding_why``): twice the stall
# watch's threshold, so a batch that is merely slow on a busy machine does not flap readiness.
STUCK_S = 2.0
APPENDING = "appending to the log"
RESTART_DELAY_S = 0.1  # the first recovery after a failure; doubles with each failure in a row
MAX_RESTART_DELAY_S = 30.0
# Appends carrying a kafka:// run's record that may fail before its attempt is decided failed
# (without the record: an aborted transaction left nothing, so the failure is not ambiguous).
OUTBOUND_TRIES = 2


@dataclass(frozen=True, slots=True)
class Decided:
    """A request's events, durably appended at ``offsets``."""

    events: list[AnyEvent]
    offsets: list[int]


Reply = Callable[["Decided | CronlogError"], None]


@dataclass(slots=True)
class Request:
    command: AnyCommand
    reply: Reply | None = None
    offset: int | None = None  # the command's offset in the commands stream, if it came from there
    queued_at: float = 0.0  # time.monotonic() when it reached the runner's inbox
    # A hand-over's last batch (``command`` aside): the critical jobs' next calls armed
    # (``Partition.arm_ahead``). Answered once the batch is appended; its leases are dispatched
    # right after, before the loop takes anything else (a stop ends the batch in hand first).
    arms_ahead: bool = False


# A start that waited for call room: how long (seconds), and why there was none.
Waited = tuple[float, str]
# Told of each scheduled run started more than THRESHOLD_S after it was due: (partition, cause
# kind: "room", "partition" or "claim", how late in ms, the cause in words).
LateStart = Callable[[int, str, int, str], None]


class Dispatcher:
    """The node's own executors, as a runner sees them.

    Before a run is started the runner reserves room for it (:meth:`reserve`); the lease it
    then grants goes to :meth:`dispatch`, which uses the reservation. A reservation whose run
    did not start after all is given back with :meth:`release`. A run refused room waits in
    the dispatcher's queue, which hands it back later with ``runner.grant(tenant, run_id,
    waited)``, the room already reserved.
    """

    worker_id: str

    def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
        raise NotImplementedError

    def release(self, tenant: str) -> None:
        raise NotImplementedError

    def dispatch(self, runner: PartitionRunner, lease: ev.LeaseGranted) -> None:
        raise NotImplementedError

    def cancelled(self, run_id: str) -> None:
        """``run_id`` was cancelled: a call armed ahead for it and not started is dropped."""

    def never_started(self, run_id: str, fencing_token: int) -> bool:
        """The lease ``fencing_token`` of ``run_id`` has run out: True if it was handed to these
        executors and its call was never started, in which case it never will be (withdrawn
        now). False where that is not known (another process's lease, a call under way)."""
        return False

    def ask(self, runner: PartitionRunner, asked: ev.RunOutcomeAsked, spec: JobSpec) -> None:
        """Ask ``spec``'s target what became of the attempt ``asked`` names (its status URL:
        ``core.asking``) and have the answer decided (``AnswerOutcome``). One that cannot ask
        does nothing: the ask's deadline answers for it (``AnswerDue``)."""


class PartitionRunner:
    def __init__(
        self,
        partition: int,
        log_: EventLog,
        writer: PartitionWriter,
        open_store: Callable[[], StateStore],
        clock: Clock,
        dispatcher: Dispatcher,
        on_appended: Callable[[int, list[int], list[AnyEvent]], None] | None = None,
        on_recovered: Callable[[int], None] | None = None,
        on_failed: Callable[[int, BaseException], None] | None = None,
        decoder: EventDecoder | None = None,
        snapshotter: Snapshotter | None = None,
        warm: Warm | None = None,
        retention_ms: int = DEFAULT_RETENTION_MS,
        lead_ms: int = 0,
        arm_ms: int = 0,
        on_late: LateStart | None = None,
        produced: ProducedTargets | None = None,
    ) -> None:
        """``produced``: set where the log produces ``kafka://`` runs in the events' own
        transaction (:mod:`node.produced`); without it they are calls, as any push target."""
        self.partition = partition
        self._produced = produced
        # The records for others (kafka:// runs) the batch in hand appends with its events
        self._outbound: list[Outbound] = []
        # kafka:// runs whose record was in appends that failed: run id -> (attempt, appends
        # failed, the last one's error); tried OUTBOUND_TRIES times, then decided failed
        self._outbound_failed: dict[str, tuple[int, int, str]] = {}
        self._on_late = on_late
        self._retention_ms = retention_ms
        self._lead_ms = lead_ms
        self._arm_ms = arm_ms  # how long before its start a push run's call is armed
        self._log = log_
        self._writer = writer
        self._open_store = open_store
        self._store: StateStore | None = None  # opened by the loop, closed when it ends
        self._clock = clock
        self._dispatcher = dispatcher
        self._on_appended = on_appended
        self._on_recovered = on_recovered
        self._on_failed = on_failed
        self._decoder = decoder
        self._snapshotter = snapshotter
        self._warm = warm  # a standby's open store and state, used by the first recovery only
        self._since_snapshot = 0  # events appended since the last snapshot was taken
        self._snapshot_at = time.monotonic()
        self.restored_from: int | None = None  # the snapshot offset the last recovery restored
        self.warm_from: int | None = None  # the standby offset the last recovery started from
        self.last_recovery: Recovery | None = None  # None until the first recovery has ended
        self._inbox: deque[Request] = deque()
        # Checks that came before their run's guard instant: (that instant, arrival, request),
        # answered by the loop once it decides past the instant (under ``_cv``)
        self._held_checks: list[tuple[int, int, Request]] = []
        self._arrivals = itertools.count()
        self._cv = threading.Condition()
        self._stopped = False
        # Why ``stop`` was asked (the node stopping, the partition revoked): None while no one
        # asked. A writer that closes after a stop was asked is the stop, not a fence.
        self._stop_reason: str | None = None
        self._thread: threading.Thread | None = None
        # The partition's pure core: its state and timers (replaced by every recovery).
        self.core = Partition(
            partition,
            clock.now_ms(),
            retention_ms=retention_ms,
            lead_ms=lead_ms,
            arm_ms=arm_ms,
            kafka_at_slot=produced is not None,
        )
        # (tenant, run id, how long it waited and why) given room by the dispatcher
        self._granted: list[tuple[str, str, Waited | None]] = []
        # What the loop's thread is doing and since when (time.monotonic()), where the last
        # batch's time went, and the deadline of the oldest timer it has yet to decide (or of
        # the next one): read by the node's stall watch (node.stalls) from its own thread.
        self.phase: tuple[str, float] = ("starting", time.monotonic())
        self.times = LoopTimes()
        self._due_at: int | None = None
        # The oldest timer already due when the first recovery ended (a partition taken over
        # after it went unowned owes every slot since): behind its timers from then until its
        # first batch is decided, which sets ``_due_at``.
        self._owed_at: int | None = None
        # Set while the runner decides: recovered, and not failing since. ``caught_up`` is the
        # same event under the name the node's start-up waits by.
        self.deciding = threading.Event()
        self.caught_up = self.deciding
        # The partition time of the batch being decided (or last decided), set before its first
        # decision: no decision from then on is taken at an earlier time. 0 from the start of
        # each recovery until its first batch. Read by ``lease_holds`` from the API's thread.
        self._deciding_at = 0
        self.fenced = False  # the loop ended because another writer owns the partition
        self.ended = threading.Event()  # the loop's thread has returned
        self._ended_at: float | None = None  # its time.monotonic()
        self.failures = 0  # failures since the last batch that went through
        self.restarts = 0  # recoveries after a failure, over the runner's life
        # Why the last append failed, while no append has succeeded since (None otherwise).
        self._append_failed: str | None = None

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"partition-{self.partition}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 10.0, reason: str = "the partition was revoked") -> None:
        """Stop deciding at once, and wait up to ``timeout_s`` for the loop to end; requests
        still waiting are answered "unavailable". ``reason`` is what the log says the
        partition stopped for."""
        self.request_stop(reason)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._fail_waiting()

    def request_stop(self, reason: str = "the partition was revoked") -> None:
        """Stop deciding, without waiting: the loop ends after the batch in hand (whose append
        is bounded by the log's timeout)."""
        with self._cv:
            if self._stop_reason is None and not self._stopped:
                self._stop_reason = reason
            self._stopped = True
            self._cv.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def alive(self) -> bool:
        """The loop's thread is running (deciding, or recovering after a failure)."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, request: Request) -> None:
        request.queued_at = time.monotonic()
        with self._cv:
            if not self._stopped:
                self._inbox.append(request)
                self._cv.notify()
                return
        _reply(request, Unavailable(f"partition {self.partition} is not running here"))

    def submit_many(self, requests: Sequence[Request]) -> None:
        """Queue ``requests`` together, so the loop takes them in one batch (up to
        ``MAX_BATCH``) and appends their events in one write."""
        arrived = time.monotonic()
        for request in requests:
            request.queued_at = arrived
        with self._cv:
            if not self._stopped:
                self._inbox.extend(requests)
                self._cv.notify()
                return
        _answer_all(requests, Unavailable(f"partition {self.partition} is not running here"))

    def grant(self, tenant: str, run_id: str, waited: Waited | None = None) -> bool:
        """Start ``run_id``, which waited for room the dispatcher has now reserved for it
        (``waited``: how long, and why). False if this runner has stopped (the dispatcher then
        takes the room back)."""
        with self._cv:
            if self._stopped:
                return False
            self._granted.append((tenant, run_id, waited))
            self._cv.notify()
            return True

    def lease_holds(self, check: HeartbeatRun) -> bool:
        """Whether ``check`` (a worker asking, a few seconds before the start of a run leased
        ahead, whether its lease still holds) can be answered "it holds" from this thread,
        without queueing for a batch: the run is leased ahead under the check's token, and the
        batch being decided is already past the instant up to which a pause, a schedule change
        or a cancel withdraws it (``CHECK_GUARD_MS`` before its start), so no decision to come
        can. Every decision taken at or before that instant is folded into the state already,
        since the loop takes its batches one after another. False means only "ask the loop"
        (which answers a refusal or a lease not leased ahead, and holds a check that came
        before the instant until it is past it: :meth:`_hold_check`). A herd's fifty thousand
        checks come together: queued, they waited behind the partitions' appends and were
        answered seconds late."""
        if not self.deciding.is_set():
            return False
        deciding_at = self._deciding_at  # read first: the state read after it is at least as new
        until = self._check_until(check)
        return until is not None and deciding_at > until

    def _check_until(self, check: HeartbeatRun) -> int | None:
        """The instant after which nothing withdraws the run ``check`` asks about
        (``CHECK_GUARD_MS`` before its start), when the check's token holds its live lease,
        leased ahead; None otherwise (the loop answers that)."""
        run = self.core.state.runs.get(check.run_id)
        if (
            run is None
            or run.start_at is None
            or run.status is not RunStatus.RUNNING
            or run.fencing_token != check.fencing_token
            or (check.tenant is not None and run.tenant != check.tenant)
        ):
            return None
        return run.start_at - CHECK_GUARD_MS

    @property
    def state(self) -> PartitionState:
        """The partition's state as last decided (read by the node's gauges and executors)."""
        return self.core.state

    def checkpoint(self) -> int | None:
        """The next event offset the partition's state store holds durably: where its next
        recovery starts reading. None while no store is open (recovering, failed, stopped)."""
        store = self._store
        if store is None:
            return None
        try:
            return store.durable_offset()
        except Exception as err:  # closed under us by a failure: unknown, so nothing is pruned
            log.warning("partition %d: state store checkpoint unknown: %s", self.partition, err)
            return None

    def ended_for(self) -> float:
        """Seconds since the loop ended (0 while it runs)."""
        return 0.0 if self._ended_at is None else time.monotonic() - self._ended_at

    def _recover(self) -> None:
        self.deciding.clear()
        self._deciding_at = 0
        warm, self._warm = self._warm, None
        loaded = None
        if warm is not None and self._store is None:
            self._store, loaded = warm.store, (warm.state, warm.offset)
        elif warm is not None:
            warm.store.close()
        if self._store is None:
            self._store = self._open_store()
        snapshots = self._snapshotter.store if self._snapshotter is not None else None
        self.restored_from = None
        self.warm_from = None if loaded is None else loaded[1]
        replayed = 0

        def read(records: int) -> None:
            nonlocal replayed
            replayed += records

        state = catch_up(
            self._store,
            self._log,
            self.partition,
            batch_size=RECOVERY_BATCH,
            decoder=self._decoder,
            snapshots=snapshots,
            on_restored=self._restored,
            on_unusable=self._unusable,
            loaded=loaded,
            on_batch=read,
        )
        self.last_recovery = Recovery(self.restored_from, replayed)
        self.core = Partition(
            self.partition,
            self._clock.now_ms(),
            state,
            retention_ms=self._retention_ms,
            lead_ms=self._lead_ms,
            arm_ms=self._arm_ms,
            kafka_at_slot=self._produced is not None,
        )
        # A recovery that replayed a long tail (or, the first time, the whole log) leaves a
        # snapshot due at once, so the next owner need not replay it again.
        self._since_snapshot = self._store.offset() - (self.restored_from or 0)
        self._snapshot_at = time.monotonic()
        self._owed_at = self.core.overdue_since()
        self.deciding.set()
        if self._on_recovered is not None:
            self._on_recovered(self.partition)

    def _restored(self, offset: int) -> None:
        self.restored_from = offset
        if self._snapshotter is not None:
            self._snapshotter.metrics.snapshot_restored()

    def _unusable(self, err: Exception) -> None:
        if self._snapshotter is not None:
            self._snapshotter.metrics.snapshot_unusable()

    def _snapshot_if_due(self, appended: int) -> None:
        """Hand a point-in-time view of the store to the snapshotter when one is due. The view
        is all this thread waits for; the snapshot is read and written on the snapshotter's."""
        self._since_snapshot += appended
        snapshotter = self._snapshotter
        if snapshotter is None or self._store is None:
            return
        if not snapshotter.policy.due(
            self._since_snapshot, time.monotonic() - self._snapshot_at
        ) or snapshotter.busy(self.partition):
            return
        started = time.perf_counter()
        self._since_snapshot = 0
        self._snapshot_at = time.monotonic()
        try:
            view = self._store.view()
        except Exception:  # the batch is durable and saved: a snapshot is only a shortcut
            log.exception("partition %d: no view of the store for a snapshot", self.partition)
            snapshotter.metrics.snapshot_failed()
            return
        snapshotter.take(self.partition, view, self._clock.now_ms())
        snapshotter.metrics.snapshot_paused(time.perf_counter() - started)

    # -- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopped:
                try:
                    self._recover()
                    self._decide_until_stopped()
                except Fenced:
                    with self._cv:
                        asked = self._stop_reason is not None
                    if not asked:  # a newer writer took the partition: that is a fence
                        self.fenced = True
                        decisions.fenced(self.partition)
                    # else the writer closed because this node gave the partition up: the
                    # batch in hand was not written and its callers heard "unavailable".
                    return
                except LogCorrupted as damage:  # the log failed itself: recovering cannot help
                    log.error("partition %d: runner stopped: %s", self.partition, damage)
                    return
                except Exception as err:
                    self._failed(err)
        finally:
            with self._cv:
                self._stopped = True
            self.deciding.clear()
            self._fail_waiting()
            self._close_store()
            self._ended_at = time.monotonic()
            if self._stop_reason is not None:
                log.info("partition %d: stopped deciding: %s", self.partition, self._stop_reason)
            self.ended.set()

    def _decide_until_stopped(self) -> None:
        while not self._stopped:
            times = LoopTimes()
            # The last append settles first (Kafka: its commit markers written, which the next
            # transaction would otherwise wait for inside the log, 20 ms at a time): what
            # arrives meanwhile joins the batch taken next, instead of waiting for another.
            settling = self._enter("waiting for its last append to become readable")
            self._writer.wait_until_readable()
            self._enter("waiting for work")
            times.settle_s = time.monotonic() - settling
            batch = self._wait_for_work()
            if self._stopped:
                break
            # A partition's time never goes back. After the wall clock steps back, the wheel
            # keeps its later time, and a timer armed by the earlier clock would be "already
            # due" to the wheel, decided too early to do anything, and lost; so until the clock
            # catches up, the partition decides at the wheel's time.
            now = max(self._clock.now_ms(), self.core.wheel.now_ms)
            self._deciding_at = now
            if self._due_at is not None and now > self._due_at:
                times.woke_late_s = (now - self._due_at) / 1000
            self.core.advance(now)
            # the checks held until an instant this batch is past are decided with it
            batch = self._checks_due(now) + batch
            times.requests = len(batch)
            self._process(batch, now, times)
            self.times = times
            self._due_at = self.core.overdue_since() or self.core.next_deadline()
            self._owed_at = None  # decided: from here on the batch's deadline says
            self.failures = 0

    def _enter(self, phase: str) -> float:
        """Say what the loop's thread does from now on (for the stall watch); its start."""
        started = time.monotonic()
        self.phase = (phase, started)
        return started

    def behind_s(self) -> float:
        """How far behind its timers the partition is: since the oldest timer it has yet to
        decide came due (0 when none has, and while it is not deciding: readiness reports
        that)."""
        due = self._due_at if self._due_at is not None else self._owed_at
        if due is None or not self.deciding.is_set():
            return 0.0
        return max(0.0, (self._clock.now_ms() - due) / 1000)

    def not_deciding_why(self) -> str | None:
        """Why the partition decides nothing now, in words; None while it does. It does not
        while it recovers or fails (``deciding`` is clear); while an append has been in flight
        for more than ``STUCK_S`` (a broker that stopped answering holds it up to the log's
        timeout); from an append that failed until one succeeds; and while a timer that came
        due has waited more than ``STUCK_S`` undecided (its thread held elsewhere)."""
        if not self.deciding.is_set():
            if self.failures == 0:
                return "recovering"
            return f"failing ({self.failures} in a row), recovering again"
        phase, since = self.phase
        held = time.monotonic() - since
        if phase == APPENDING and held > STUCK_S:
            return f"an append in flight for {held:.1f} s"
        failed = self._append_failed
        if failed is not None:
            return f"its last append failed ({failed})"
        behind = self.behind_s()
        if behind > STUCK_S:
            return f"{behind:.1f} s behind its timers"
        return None

    def stall_cause(self) -> str:
        """Why the partition is behind, in words: what its thread has been doing since, or,
        when it is running again, what its last batch spent its time on."""
        phase, since = self.phase
        took = time.monotonic() - since
        if phase == "waiting for work":
            return (
                f"its thread has not run for {self.behind_s():.1f} s since a timer came due"
                " (the process is busy elsewhere, or stood still)"
            )
        if took > THRESHOLD_S:
            return f"{phase} for {took:.1f} s"
        return self.times.cause()

    def _failed(self, err: Exception) -> None:
        """Count the failure, say so, and wait before recovering again (``stop`` cuts it short)."""
        self.deciding.clear()
        self.failures += 1
        self.restarts += 1
        delay = min(MAX_RESTART_DELAY_S, RESTART_DELAY_S * 2.0 ** (self.failures - 1))
        if self.failures == 1:
            log.exception(
                "partition %d: runner failed; recovering from its store and the log in %.1f s",
                self.partition,
                delay,
            )
        else:
            log.error(
                "partition %d: runner failed again (%d in a row): %r; recovering in %.1f s",
                self.partition,
                self.failures,
                err,
                delay,
            )
        if self._on_failed is not None:
            try:
                self._on_failed(self.partition, err)
            except Exception:
                log.exception("partition %d: on_failed failed", self.partition)
        self._close_store()  # opened afresh: whatever failed may have been the store
        with self._cv:
            self._cv.wait_for(lambda: self._stopped, delay)

    def _close_store(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            try:
                store.close()
            except Exception:
                log.exception("partition %d: closing its state store failed", self.partition)

    def _wait_for_work(self) -> list[Request]:
        with self._cv:
            if (
                not self._inbox
                and not self.core.has_due()
                and not self._stopped
                and not self._granted
            ):
                deadline = self.core.next_deadline()
                if self._held_checks:
                    # a held check is answered once the partition decides past its instant
                    after = self._held_checks[0][0] + 1
                    deadline = after if deadline is None else min(deadline, after)
                wait = IDLE_WAIT_S
                if deadline is not None:
                    wait = min(wait, max(0.0, (deadline - self._clock.now_ms()) / 1000))
                if wait > 0:
                    self._cv.wait(wait)
            if self._stopped:
                # What waits stays in the inbox, for the stop to answer "unavailable" (the
                # callers ask the partition's next owner): taken here, it went unanswered, its
                # caller waiting LOCAL_TIMEOUT_S.
                return []
            batch: list[Request] = []
            while self._inbox and len(batch) < MAX_BATCH:
                batch.append(self._inbox.popleft())
            return batch

    def _decide(self, command: AnyCommand, now: int, out: list[AnyEvent]) -> None:
        out.extend(self.core.handle(command, now))

    def _start_if_room(
        self, run_id: str, now: int, events: list[AnyEvent], starting: dict[str, str]
    ) -> None:
        run = self.state.runs.get(run_id)
        if run is None:
            return
        if self._produced_now(run, now):
            self._start_produced(run_id, now, events)  # no call to make: no call room taken
        elif self._dispatcher.reserve(self, run):
            self._start(run.tenant, run_id, now, events, starting)
        # else it waits in the dispatcher's queue, to come back through grant()

    def _process(self, batch: list[Request], now: int, times: LoopTimes | None = None) -> None:
        times = times if times is not None else LoopTimes()
        events: list[AnyEvent] = []
        answers: list[tuple[Request, tuple[int, int] | CronlogError]] = []
        # Runs that start here (run id -> tenant): each holds a reservation until its lease
        # is dispatched after the append.
        starting: dict[str, str] = {}
        # Runs started in this batch that waited for call room (run id -> how long, why)
        waits: dict[str, Waited] = {}
        # Runs whose target is to be asked (core.asking), once what asks it is durable
        asks: list[str] = []
        deciding = self._enter("deciding")
        times.decided_at = deciding
        self._outbound = []
        try:
            through = self._decide_batch(batch, now, events, answers, starting, waits, times, asks)
        except BaseException:
            # The state ran ahead of the log with nothing appended: the supervisor recovers.
            # Not deciding from here on, before any caller hears of the failure.
            self.deciding.clear()
            self._release(starting)
            _answer_all(batch, Unavailable(f"partition {self.partition} failed; try again"))
            raise
        if not events and through is None:
            _answer(answers, [], [])
            self._ask_targets(asks)
            times.decide_s = time.monotonic() - deciding
            return
        appending = self._enter(APPENDING)
        times.decide_s = appending - deciding
        outbound = self._outbound
        try:
            offsets = self._writer.append(
                [ev.encode(e) for e in events], commands_through=through, outbound=outbound
            )
        except Fenced:
            self.deciding.clear()
            self._release(starting)
            _answer_all(batch, Unavailable(f"partition {self.partition} moved"))
            raise
        except Exception as err:
            self.deciding.clear()
            self._append_failed = f"{type(err).__name__}: {err}"[:200]
            log.exception("partition %d: append failed; recovering", self.partition)
            self._carried(outbound, events, f"{type(err).__name__}: {err}")
            _answer(answers, [], [], Unavailable(f"partition {self.partition}: {err}"))
            self._recover_after_append(events, starting)
            return
        # Durable: answer, and start what was leased, before the store (which the log can
        # always rebuild) and the observers.
        saving = self._enter("saving its state")
        times.append_s = saving - appending
        self._append_failed = None
        if self._outbound_failed:
            self._forget_settled()
        _answer(answers, events, offsets)
        self._dispatch(events, starting)
        self._ask_targets(asks)
        assert self._store is not None
        self._store.save(self.state, list(zip(offsets, events, strict=True)))
        self._snapshot_if_due(len(events))
        observing = self._enter("telling its observers")
        times.save_s = observing - saving
        if self._on_late is not None:
            self._late_starts(events, now, waits, batch, times)
        if self._on_appended is not None and events:
            try:
                self._on_appended(self.partition, offsets, events)
            except Exception:  # an observer's failure must not strand the decided batch
                log.exception("partition %d: on_appended failed", self.partition)
        times.observe_s = time.monotonic() - observing

    def _late_starts(
        self,
        events: list[AnyEvent],
        now: int,
        waits: dict[str, Waited],
        batch: list[Request],
        times: LoopTimes,
    ) -> None:
        """Tell of every scheduled run this batch started more than ``THRESHOLD_S`` after it
        was due (its ``available_at``: the slot, its jitter, a retry's backoff), with the
        cause this runner knows."""
        assert self._on_late is not None
        runs = self.state.runs
        held: str | None = None  # what held the partition, worked out once a batch
        queued = max((times.decided_at - r.queued_at for r in batch), default=0.0)

        def partition_cause() -> str:
            nonlocal held
            if held is None:
                if times.woke_late_s > THRESHOLD_S:
                    held = times.cause()
                elif queued > THRESHOLD_S:
                    held = f"requests waited {queued:.1f} s for it; {self.times.cause()}"
                else:
                    held = f"{self.core.due_count()} timers still due; {self.times.cause()}"
            return held

        for event in events:
            if isinstance(event, ev.RunStarted) and event.trigger is ev.Trigger.SCHEDULE:
                # a run leased or armed ahead: granted in time, started (as reported) late
                run = runs.get(event.run_id)
                late_ms = 0 if run is None else event.started_at - run.available_at
                if late_ms > THRESHOLD_S * 1000:
                    self._on_late(
                        self.partition,
                        "start",
                        late_ms,
                        "leased ahead in time, started late where it runs (its executor"
                        " process or pull worker was busy, or the worker away)",
                    )
                continue
            if not isinstance(event, ev.LeaseGranted) or event.trigger is not ev.Trigger.SCHEDULE:
                continue
            run = runs.get(event.run_id)
            if run is None:
                continue
            late_ms = now - run.available_at
            if late_ms <= THRESHOLD_S * 1000:
                continue
            waited = waits.get(event.run_id)
            if waited is not None and waited[0] * 1000 >= late_ms / 2:
                seconds, why = waited
                kind, cause = "room", f"waited {seconds:.1f} s for call room: {why}"
            elif event.worker_id == self._dispatcher.worker_id:
                kind, cause = "partition", f"its partition decided it late ({partition_cause()})"
            elif times.woke_late_s > THRESHOLD_S or queued > THRESHOLD_S:
                kind, cause = "partition", f"its claim was decided late ({partition_cause()})"
            else:
                kind, cause = (
                    "claim",
                    "no claim of its pool reached the partition sooner (its workers were busy"
                    " or away, or their claims were slow on the way)",
                )
            self._on_late(self.partition, kind, late_ms, cause)

    def _decide_batch(
        self,
        batch: list[Request],
        now: int,
        events: list[AnyEvent],
        answers: list[tuple[Request, tuple[int, int] | CronlogError]],
        starting: dict[str, str],
        waits: dict[str, Waited],
        times: LoopTimes,
        asks: list[str],
    ) -> int | None:
        """Decide the batch's requests, the runs granted room (noting in ``waits`` how long
        each waited) and the timers due (noting in ``asks`` the runs whose target is to be
        asked); return the command position the batch moves to, if any."""
        through: int | None = None
        arming: list[Request] = []
        for request in batch:
            if request.offset is not None:
                through = request.offset + 1
            if request.arms_ahead:
                events += self.core.arm_ahead(now)
                arming.append(request)  # answered once their leases are decided, below
                continue
            if self._hold_check(request, now):
                continue
            start = len(events)
            try:
                self._decide(request.command, now, events)
                answers.append((request, (start, len(events))))
            except CronlogError as err:
                answers.append((request, err))
        with self._cv:
            granted, self._granted = self._granted, []
        for i, (tenant, run_id, waited) in enumerate(granted):
            if waited is not None:
                waits[run_id] = waited
            try:
                self._start(tenant, run_id, now, events, starting)
            except BaseException:
                for left, _, _ in granted[i + 1 :]:
                    self._dispatcher.release(left)
                raise
        for _ in range(MAX_TIMERS):
            due = self.core.take_due()
            if due is None:
                break
            times.timers += 1
            key = due[1]
            if key[0] == "ready":
                self._start_if_room(key[1], now, events, starting)
            elif key[0] == "ask":
                asks.append(key[1])
            elif key[0] == "lease" and self._never_called(key[1], now, events):
                pass
            else:
                events += self.core.fire(key, now)
        answers += [(request, (len(events), len(events))) for request in arming]
        return through

    def _never_called(self, run_id: str, now: int, events: list[AnyEvent]) -> bool:
        """A lease that has run out whose call this node's executors never started (they were
        behind: a backlog, a starved process): decide the attempt failed without a call, as the
        executors would have said had they come to it in time, so that even a critical run is
        tried again rather than set aside as ``outcome_unknown``. Only where the executors that
        were handed the lease say so; anywhere else the expiry stays ambiguous."""
        run = self.state.runs.get(run_id)
        if (
            run is None
            or run.status is not RunStatus.RUNNING
            or run.lease_expires_at is None
            or run.lease_expires_at > now
            or not self._dispatcher.never_started(run_id, run.fencing_token)
        ):
            return False
        log.warning(
            "run %s: its lease ran out before this node's executors started its call; the"
            " attempt failed without a call",
            run_id,
        )
        self._decide(
            CompleteRun(
                run_id=run_id,
                fencing_token=run.fencing_token,
                outcome=Outcome.FAILED,
                error=NOT_CALLED,
            ),
            now,
            events,
        )
        return True

    def _hold_check(self, request: Request, now: int) -> bool:
        """Hold ``request`` when it is a worker's check of a run leased ahead that came
        before the instant after which nothing can withdraw the run (``CHECK_GUARD_MS`` before
        its start): a pause or a schedule change decided until then withdraws it, so the answer
        "the lease holds" is true only once the partition has decided past that instant. The
        check is answered then (:meth:`_checks_due`), whenever the worker sent it: a worker may
        check early (the SDK does, so that a herd's checks are read before the slot), and no
        worker's timing can make the answer wrong. A check that holds no live lease is decided
        now (refused); one more than ``CHECK_HOLD_MAX_MS`` early is refused with nothing
        decided (503: send it later)."""
        command = request.command
        if type(command) is not HeartbeatRun or not command.check:
            return False
        until = self._check_until(command)
        if until is None or now > until:
            return False
        if until - now > CHECK_HOLD_MAX_MS:
            _reply(
                request,
                Unavailable(
                    f"run {command.run_id}: a check is answered once its start is"
                    f" {CHECK_GUARD_MS / 1000:g} s away; this one came"
                    f" {(until - now) / 1000:.1f} s before that (at most"
                    f" {CHECK_HOLD_MAX_MS / 1000:g} s); send it later"
                ),
            )
            return True
        with self._cv:
            heapq.heappush(self._held_checks, (until, next(self._arrivals), request))
        return True

    def _checks_due(self, now: int) -> list[Request]:
        """The held checks whose instant the batch deciding at ``now`` is past: every
        decision taken at or before it is folded into the state already."""
        if not self._held_checks:  # nearly every batch: no lock taken
            return []
        due: list[Request] = []
        with self._cv:
            held = self._held_checks
            while held and held[0][0] < now:
                due.append(heapq.heappop(held)[2])
        released = time.monotonic()
        for request in due:
            request.queued_at = released  # held on purpose: not a wait for the loop
        return due

    def _recover_after_append(self, events: list[AnyEvent], starting: dict[str, str]) -> None:
        """After an append that failed, the log alone says what happened: recover from it, then
        start the leases it holds after all (the call was never made, so making it now is its
        first and only attempt) and give back the room of the rest."""
        try:
            self._recover()
        except BaseException:
            self._release(starting)
            raise
        for event in events:
            if isinstance(event, ev.LeaseGranted) and event.run_id in starting:
                run = self.state.runs.get(event.run_id)
                if (
                    run is not None
                    and run.status is RunStatus.RUNNING
                    and run.fencing_token == event.fencing_token
                ):
                    self._dispatch_one(event, starting.pop(event.run_id))
        self._release(starting)

    def _dispatch(self, events: list[AnyEvent], starting: dict[str, str]) -> None:
        """Start the leases granted here; tell the executors of runs cancelled (a call armed
        ahead for one is not made)."""
        for event in events:
            if isinstance(event, ev.LeaseGranted):
                if event.run_id in starting:
                    self._dispatch_one(event, starting[event.run_id])
            elif isinstance(event, ev.RunCancelled):
                self._dispatcher.cancelled(event.run_id)

    def _ask_targets(self, run_ids: list[str]) -> None:
        """Have the executors ask the targets of the runs still asking (core.asking). After
        an append that failed the recovery arms these timers again."""
        for run_id in run_ids:
            run = self.state.runs.get(run_id)
            job = self.state.jobs.get(run.job_id) if run is not None else None
            if run is None or job is None or run.status is not RunStatus.ASKING:
                continue
            if run.ask_at is None or run.answer_by is None:
                continue  # answered meanwhile
            asked = ev.RunOutcomeAsked(
                at=run.ask_at,
                job_id=run.job_id,
                tenant=run.tenant,
                run_id=run.run_id,
                scheduled_for=run.scheduled_for,
                attempt=run.attempt,
                fencing_token=run.fencing_token,
                ask=run.ask,
                ask_at=run.ask_at,
                answer_by=run.answer_by,
            )
            try:
                self._dispatcher.ask(self, asked, job.spec)
            except Exception:  # its deadline answers for it
                log.exception("partition %d: run %s was not asked about", self.partition, run_id)

    def _dispatch_one(self, lease: ev.LeaseGranted, tenant: str) -> None:
        try:
            self._dispatcher.dispatch(self, lease)
        except Exception:
            # The lease stands and runs out unused; its run is retried (a critical one's
            # outcome is then unknown). Say so rather than lose the room too.
            log.exception("partition %d: run %s could not be started", self.partition, lease.run_id)
            self._dispatcher.release(tenant)

    def _start(
        self, tenant: str, run_id: str, now: int, events: list[AnyEvent], starting: dict[str, str]
    ) -> None:
        """Decide the start of a run whose room is reserved; give the room back if it did not."""
        before = len(events)
        try:
            start = StartRun(
                run_id=run_id, worker_id=self._dispatcher.worker_id, horizon_ms=self._arm_ms
            )
            self._decide(start, now, events)
        except CronlogError as err:  # cancelled, finished or moved on since it came due
            log.debug("partition %d: %s", self.partition, err)
            self._dispatcher.release(tenant)
            return
        except BaseException:
            self._dispatcher.release(tenant)
            raise
        if any(isinstance(e, ev.LeaseGranted) for e in events[before:]):
            starting[run_id] = tenant
        else:  # not started after all (a misfire of a run materialised ahead): no room held
            self._dispatcher.release(tenant)

    def _produced_now(self, run: RunState, now: int) -> bool:
        """Whether the run is a ``kafka://`` run to produce in this batch's transaction
        (:mod:`node.produced`): one due now. One not due yet was armed ahead before its job
        became ``kafka://``; it is leased ahead and made as a call, as it was armed."""
        if self._produced is None or run.available_at > now:
            return False
        job = self.state.jobs.get(run.job_id)
        return job is not None and isinstance(job.spec.target, KafkaTarget)

    def _start_produced(self, run_id: str, now: int, events: list[AnyEvent]) -> None:
        """Decide a due ``kafka://`` run's start, then at once its outcome (``_produce``)."""
        before = len(events)
        try:
            self._decide(StartRun(run_id=run_id, worker_id=self._dispatcher.worker_id), now, events)
        except CronlogError as err:  # cancelled, finished or moved on since it came due
            log.debug("partition %d: %s", self.partition, err)
            return
        lease = next((e for e in events[before:] if isinstance(e, ev.LeaseGranted)), None)
        if lease is not None:  # else not started after all (a misfire of a run made ahead)
            self._produce(lease, now, events)

    def _produce(self, lease: ev.LeaseGranted, now: int, events: list[AnyEvent]) -> None:
        """A ``kafka://`` run, just leased: decide its outcome in the same batch, its record
        going into the batch's transaction when it may be produced (:mod:`node.produced`)."""
        assert self._produced is not None
        job = self.state.jobs[lease.job_id]
        assert isinstance(job.spec.target, KafkaTarget)
        topic = job.spec.target.topic
        refused = self._produced.refusal(lease.tenant, topic)
        failed = self._outbound_failed.get(lease.run_id)
        if failed is not None and failed[0] == lease.attempt and failed[1] >= OUTBOUND_TRIES:
            del self._outbound_failed[lease.run_id]
            gave_up = f"Kafka: {failed[1]} transactions carrying it failed: {failed[2]}"
            refused = refused or (gave_up, False)
        if refused is not None:
            error, permanent = refused
            outcome = CompleteRun(
                run_id=lease.run_id,
                fencing_token=lease.fencing_token,
                outcome=Outcome.FAILED,
                error=error[:MAX_ERROR],
                permanent=permanent,
            )
            log.info("partition %d: run %s: %s", self.partition, lease.run_id, error)
        else:
            outcome = CompleteRun(
                run_id=lease.run_id, fencing_token=lease.fencing_token, outcome=Outcome.SUCCEEDED
            )
            self._outbound.append(self._produced.record(lease, job.spec, topic))
        self._decide(outcome, now, events)

    def _carried(self, outbound: list[Outbound], events: list[AnyEvent], error: str) -> None:
        """After an append that failed: count it against each ``kafka://`` run whose record it
        carried, so a run is tried ``OUTBOUND_TRIES`` times and then decided failed."""
        if not outbound:
            return
        for event in events:
            if isinstance(event, ev.RunCompleted):
                job = self.state.jobs.get(event.job_id)
                if job is None or not isinstance(job.spec.target, KafkaTarget):
                    continue
                attempt, tries, _ = self._outbound_failed.get(event.run_id, (event.attempt, 0, ""))
                tries = tries + 1 if attempt == event.attempt else 1
                self._outbound_failed[event.run_id] = (event.attempt, tries, error[:500])

    def _forget_settled(self) -> None:
        """Drop the counts of runs no longer waiting to start (the append was committed after
        all, or the run was cancelled or moved on)."""
        for run_id in list(self._outbound_failed):
            run = self.state.runs.get(run_id)
            if run is None or run.status is not RunStatus.PENDING:
                del self._outbound_failed[run_id]

    def _release(self, starting: dict[str, str]) -> None:
        for tenant in starting.values():
            self._dispatcher.release(tenant)
        starting.clear()

    def _fail_waiting(self) -> None:
        with self._cv:
            waiting = list(self._inbox) + [request for _, _, request in self._held_checks]
            self._inbox.clear()
            self._held_checks.clear()
            granted, self._granted = self._granted, []
        for tenant, _, _ in granted:
            self._dispatcher.release(tenant)
        _answer_all(waiting, Unavailable(f"partition {self.partition} is not running here"))


def _reply(request: Request, answer: Decided | CronlogError) -> None:
    """Answer ``request``; a caller that has gone away (its future cancelled, its loop closed)
    is logged and forgotten, never an error of the runner's."""
    if request.reply is None:
        return
    try:
        request.reply(answer)
    except Exception as err:
        log.debug("an answer to %s had nobody to take it: %r", type(request.command).__name__, err)


def _answer(
    answers: Sequence[tuple[Request, tuple[int, int] | CronlogError]],
    events: list[AnyEvent],
    offsets: list[int],
    not_written: CronlogError | None = None,
) -> None:
    """Answer each request: its refusal, its events at their offsets, or ``not_written`` when
    the append of its events failed."""
    for request, answer in answers:
        if isinstance(answer, CronlogError):
            _reply(request, answer)
        elif not_written is not None:
            _reply(request, not_written)
        else:
            first, end = answer
            _reply(request, Decided(events[first:end], offsets[first:end]))


def _answer_all(requests: Sequence[Request], err: CronlogError) -> None:
    for request in requests:
        _reply(request, err)
