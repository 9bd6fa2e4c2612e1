"""One owned partition, running: recover, then decide in batches, durably.

Recovery, in this order (the partition is an argument, never ambient):

1. open the partition's state store and read the offset it reflects;
2. catch up the events stream from there (``projections.state_store.catch_up``);
3. fill the timing wheel from the state (``core.timers.all_timers``);
4. only then start deciding, as the partition's single, fenced writer.

The loop takes everything waiting — requests, replies from executors, timers that fell due —
and decides it against the in-memory state, folding each decision at once so the next one
sees it. It then appends all the batch's events in **one** durable write (one fsync or one
Kafka transaction for the lot: the midnight herd costs one write per batch, not per job), saves
the state and the offset together, and only then answers the callers and starts the runs it
leased. A failed append means the in-memory state ran ahead of the log: the runner answers
every caller "unavailable" and recovers from the store and the log again; a fenced append
means another node owns the partition now, and the runner stops.

A run for a push target starts only with room reserved in the node's executors
(:class:`Dispatcher`); one refused room waits in the executors' queue, which hands it back
through :meth:`PartitionRunner.grant` when room frees up, so no timer spins while it waits.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core import events as ev
from core.clock import Clock
from core.commands import AnyCommand, LeaseDue, SlotDue, StartRun
from core.decide import decide
from core.errors import CronlogError, Fenced, LogCorrupted, Unavailable
from core.events import AnyEvent
from core.state import PartitionState, RunState, evolve
from core.timers import TimerKey, all_timers, timers_after
from core.wheel import TimingWheel
from eventlog.port import EventLog, PartitionWriter
from projections.decoding import EventDecoder
from projections.state_store import StateStore, catch_up

log = logging.getLogger(__name__)

MAX_BATCH = 2000  # requests decided per append
# Timers decided per append: smaller, so the first runs of a herd are durable (and started)
# within milliseconds instead of after the whole herd was decided.
MAX_TIMERS = 500
IDLE_WAIT_S = 0.5  # the longest a runner sleeps without looking at the clock again


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


class Dispatcher:
    """The node's own executors, as a runner sees them.

    Before a run is started the runner reserves room for it (:meth:`reserve`); the lease it
    then grants goes to :meth:`dispatch`, which uses the reservation. A reservation whose run
    did not start after all is given back with :meth:`release`. A run refused room waits in
    the dispatcher's queue, which hands it back later with ``runner.grant(tenant, run_id)``,
    the room already reserved.
    """

    worker_id: str

    def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
        raise NotImplementedError

    def release(self, tenant: str) -> None:
        raise NotImplementedError

    def dispatch(self, runner: PartitionRunner, lease: ev.LeaseGranted) -> None:
        raise NotImplementedError


class PartitionRunner:
    def __init__(
        self,
        partition: int,
        log_: EventLog,
        writer: PartitionWriter,
        store: StateStore,
        clock: Clock,
        dispatcher: Dispatcher,
        on_appended: Callable[[int, list[int], list[AnyEvent]], None] | None = None,
        on_recovered: Callable[[int], None] | None = None,
        decoder: EventDecoder | None = None,
    ) -> None:
        self.partition = partition
        self._log = log_
        self._writer = writer
        self._store = store
        self._clock = clock
        self._dispatcher = dispatcher
        self._on_appended = on_appended
        self._on_recovered = on_recovered
        self._decoder = decoder
        self._inbox: deque[Request] = deque()
        self._cv = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.state = PartitionState(partition)
        self.wheel: TimingWheel[TimerKey] = TimingWheel(clock.now_ms())
        self._due: deque[TimerKey] = deque()
        self._granted: list[tuple[str, str]] = []  # (tenant, run id) given room by the dispatcher
        self.caught_up = threading.Event()

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"partition-{self.partition}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop deciding at once; requests still waiting are answered "unavailable"."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._fail_waiting()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def submit(self, request: Request) -> None:
        with self._cv:
            if self._stopped:
                if request.reply is not None:
                    request.reply(Unavailable(f"partition {self.partition} is not running here"))
                return
            self._inbox.append(request)
            self._cv.notify()

    def grant(self, tenant: str, run_id: str) -> bool:
        """Start ``run_id``, which waited for room the dispatcher has now reserved for it.
        False if this runner has stopped (the dispatcher then takes the room back)."""
        with self._cv:
            if self._stopped:
                return False
            self._granted.append((tenant, run_id))
            self._cv.notify()
            return True

    def _recover(self) -> None:
        self.state = catch_up(self._store, self._log, self.partition, decoder=self._decoder)
        now = self._clock.now_ms()
        self.wheel = TimingWheel(now)
        self._due.clear()
        for key, deadline in all_timers(self.state):
            if not self.wheel.add(key, deadline):
                self._due.append(key)
        self.caught_up.set()
        if self._on_recovered is not None:
            self._on_recovered(self.partition)

    # -- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._recover()
            while not self._stopped:
                batch = self._wait_for_work()
                if self._stopped:
                    break
                now = self._clock.now_ms()
                for _, key in self.wheel.advance(now):
                    self._due.append(key)
                self._process(batch, now)
        except Fenced:
            log.warning("partition %d: fenced, another node owns it now", self.partition)
        except LogCorrupted as damage:  # the log fails itself and stops the node
            log.error("partition %d: runner stopped: %s", self.partition, damage)
        except Exception:
            log.exception("partition %d: runner failed", self.partition)
        finally:
            with self._cv:
                self._stopped = True
            self._fail_waiting()

    def _wait_for_work(self) -> list[Request]:
        with self._cv:
            if not self._inbox and not self._due and not self._stopped and not self._granted:
                deadline = self.wheel.next_deadline()
                wait = IDLE_WAIT_S
                if deadline is not None:
                    wait = min(wait, max(0.0, (deadline - self._clock.now_ms()) / 1000))
                if wait > 0:
                    self._cv.wait(wait)
            batch: list[Request] = []
            while self._inbox and len(batch) < MAX_BATCH:
                batch.append(self._inbox.popleft())
            return batch

    def _decide(self, command: AnyCommand, now: int, out: list[AnyEvent]) -> list[AnyEvent]:
        decided = decide(self.state, command, now)
        for event in decided:
            evolve(self.state, event)
            out.append(event)
            for key, deadline in timers_after(self.state, event):
                if deadline is None:
                    self.wheel.cancel(key)
                elif not self.wheel.add(key, deadline):
                    self._due.append(key)
        return decided

    def _start_if_room(
        self, run_id: str, now: int, events: list[AnyEvent], starting: dict[str, str]
    ) -> None:
        run = self.state.runs.get(run_id)
        if run is not None and self._dispatcher.reserve(self, run):
            self._start(run.tenant, run_id, now, events, starting)
        # else it waits in the dispatcher's queue, to come back through grant()

    def _process(self, batch: list[Request], now: int) -> None:
        events: list[AnyEvent] = []
        answers: list[tuple[Request, tuple[int, int] | CronlogError]] = []
        through: int | None = None
        for request in batch:
            start = len(events)
            try:
                self._decide(request.command, now, events)
                answers.append((request, (start, len(events))))
            except CronlogError as err:
                answers.append((request, err))
            if request.offset is not None:
                through = request.offset + 1
        # Runs that start here (run id -> tenant): each holds a reservation until its lease
        # is dispatched after the append.
        starting: dict[str, str] = {}
        with self._cv:
            granted, self._granted = self._granted, []
        for tenant, run_id in granted:
            self._start(tenant, run_id, now, events, starting)
        fired = 0
        while self._due and fired < MAX_TIMERS:
            fired += 1
            kind, ident = self._due.popleft()
            if kind == "ready":
                self._start_if_room(ident, now, events, starting)
                continue
            command: AnyCommand = (
                SlotDue(job_id=ident) if kind == "slot" else LeaseDue(run_id=ident)
            )
            try:
                self._decide(command, now, events)
            except CronlogError as err:  # a timer's command can lose a race with a request
                log.debug("partition %d: %s", self.partition, err)
        offsets: list[int] = []
        if events or through is not None:
            try:
                offsets = self._writer.append(
                    [ev.encode(e) for e in events], commands_through=through
                )
            except Fenced:
                self._release(starting)
                self._answer(answers, Unavailable(f"partition {self.partition} moved"))
                raise
            except Exception as err:
                log.exception("partition %d: append failed; recovering", self.partition)
                self._release(starting)
                self._answer(answers, Unavailable(f"partition {self.partition}: {err}"))
                self._recover()
                return
            self._store.save(self.state, list(zip(offsets, events, strict=True)))
            if self._on_appended is not None and events:
                try:
                    self._on_appended(self.partition, offsets, events)
                except Exception:  # an observer's failure must not strand the decided batch
                    log.exception("partition %d: on_appended failed", self.partition)
        for request, answer in answers:
            if request.reply is None:
                continue
            if isinstance(answer, CronlogError):
                request.reply(answer)
            else:
                first, end = answer
                request.reply(Decided(events[first:end], offsets[first:end]))
        for event in events:
            if isinstance(event, ev.LeaseGranted) and event.run_id in starting:
                self._dispatcher.dispatch(self, event)

    def _start(
        self, tenant: str, run_id: str, now: int, events: list[AnyEvent], starting: dict[str, str]
    ) -> None:
        """Decide the start of a run whose room is reserved; give the room back if it did not."""
        try:
            self._decide(StartRun(run_id=run_id, worker_id=self._dispatcher.worker_id), now, events)
        except CronlogError as err:  # cancelled, finished or moved on since it came due
            log.debug("partition %d: %s", self.partition, err)
            self._dispatcher.release(tenant)
            return
        starting[run_id] = tenant

    def _release(self, starting: dict[str, str]) -> None:
        for tenant in starting.values():
            self._dispatcher.release(tenant)

    def _answer(self, answers: Sequence[tuple[Request, object]], err: CronlogError) -> None:
        for request, _ in answers:
            if request.reply is not None:
                request.reply(err)

    def _fail_waiting(self) -> None:
        with self._cv:
            waiting = list(self._inbox)
            self._inbox.clear()
            granted, self._granted = self._granted, []
        for tenant, _ in granted:
            self._dispatcher.release(tenant)
        for request in waiting:
            if request.reply is not None:
                request.reply(Unavailable(f"partition {self.partition} is not running here"))
