"""The node's own executors: they run the leases the partition runners grant for push targets.

What one attempt's call does, and how its answer is classified, is :mod:`node.caller`. Here is
everything around it: room for the call, the lease kept alive while it runs, and its outcome
brought to the partition's owner.

Calls are made on the executors' own loop, or — with ``processes`` above 0 — in executor
processes (:mod:`node.call_process`): the HTTP and Kafka work of a midnight herd then runs on
other cores than the partitions' deciding and the API. Either way the same :class:`Caller`
makes the call; only the hop differs.

**Asks.** A run whose attempt's outcome is unknown and whose target can say (``core.asking``)
comes here too, when its ``ask`` timer comes due: its target's status URL is asked
(:meth:`node.caller.Caller.ask`, on this loop also when calls go to executor processes: asks
are few) and the answer is taken to the partition's owner (``AnswerOutcome``). An ask needs no
call room; one whose answer cannot be recorded by its deadline is answered there instead.

While a call runs, the executor heartbeats the lease every third of its length. A heartbeat
refused because the run was cancelled, or its lease lost, abandons the call at once.

**Room, fairness, rates.** Before a start is decided the runner reserves room for the call
(:mod:`node.admission`): at most ``max_in_flight`` calls at once, ``max_in_flight_per_tenant``
of them for one team (unlimited unless set), the last ``reserved`` of the room for teams with
few calls in flight (a tenth of it unless set), and no more than an HTTP target's
``max_calls_per_sec`` to its origin for its team. A run that may not start yet waits there,
its team's most urgent first, the teams served in turn when room frees up, and comes back to
its runner with the room reserved. So a batch of starts never overshoots, and when one team's
40,000 runs fall due together another team's run waits for the next free call, not behind
all of them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, assert_never
from urllib.parse import urlsplit

from core import events as ev
from core.commands import AnswerOutcome, AnyCommand, CompleteRun, HeartbeatRun, Outcome
from core.egress import EgressPolicy
from core.errors import CronlogError, LeaseLost, Unavailable
from core.jobs import HttpTarget, JobSpec, KafkaTarget, PullTarget
from core.shares import Shares
from core.state import RunState, ageing_key
from core.turns import Turns
from node.admission import DEFAULT_ROOM, Admission, RateLimit, Ticket, default_reserve
from node.call_process import CallerProcesses
from node.calls import (
    DEFAULT_ERROR_EXCERPT,
    MAX_ERROR_EXCERPT,
    NOT_CALLED,
    CallerConfig,
    Result,
    call_at_start,
    classify,
    retry_after_ms,
)
from node.handoff import Handoff
from node.runner import LOCAL_TIMEOUT_S, Decided, Dispatcher, PartitionRunner, Reply
from node.secrets import Secrets

if TYPE_CHECKING:
    from aiohttp.abc import AbstractResolver

    from node.caller import Caller


__all__ = [
    "DEFAULT_ERROR_EXCERPT",
    "MAX_ERROR_EXCERPT",
    "Executors",
    "Result",
    "classify",
    "retry_after_ms",
]

log = logging.getLogger(__name__)

# How long past its lease an outcome is still offered to an owner that was unavailable: the
# lease may have been extended by a heartbeat that was decided but not yet answered.
COMPLETE_GRACE_S = 2.0
# Leases the executors' loop starts before it lets its other work in (see ``dispatch``).
START_CHUNK = 64
SWEEP_S = 1.0  # how often the outcomes waiting for their answer are looked at, while some wait
RETRY_FIRST_S = 0.05  # an outcome its partition could not take: asked again after this
# Calls whose first heartbeats fall due within this of one another are looked at by one timer
# of the loop (``_FirstBeats``), a little early rather than late.
BEAT_TICK_S = 0.05

Route = Callable[[AnyCommand], Awaitable[list[ev.AnyEvent]]]
# Hands a command to the runner of a partition this node runs, answered on the runner's
# thread; False where the partition is decided elsewhere (then ``Route``).
Local = Callable[[AnyCommand, Reply], bool]


class Executors(Dispatcher):
    """Runs push targets on one asyncio loop in a thread of its own."""

    def __init__(
        self,
        node_id: str,
        *,
        max_in_flight: int = DEFAULT_ROOM,
        max_in_flight_per_tenant: int | None = None,
        reserved: tuple[int, int] | None = None,
        kafka_bootstrap: str | None = None,
        kafka_config: dict[str, str] | None = None,
        producer_factory: Callable[[str], Any] | None = None,
        egress: EgressPolicy | None = None,
        secrets: Secrets | None = None,
        error_excerpt_bytes: int = DEFAULT_ERROR_EXCERPT,
        resolver: AbstractResolver | None = None,
        processes: int = 0,
    ) -> None:
        """``egress``: where calls may go (default: the public internet only). ``secrets``:
        where header secret references are read. ``resolver``: what host names are resolved
        with before the policy filters them (default: the system's). ``processes``: executor
        processes to make the calls in (0: on the executors' own loop). ``reserved``: the room
        kept for teams with few calls, and how much of it one team may hold (default:
        :func:`node.admission.default_reserve`)."""
        if processes < 0:
            raise ValueError(f"processes must be 0 or more, got {processes}")
        if processes and (resolver is not None or producer_factory is not None):
            raise ValueError("a resolver or producer factory works in-process only")
        self.worker_id = f"{node_id}/executor"
        self.config = CallerConfig(
            egress=egress if egress is not None else EgressPolicy(),
            secrets_dir=secrets.root if secrets is not None else None,
            error_excerpt_bytes=error_excerpt_bytes,
            max_connections=max_in_flight,
            kafka_bootstrap=kafka_bootstrap,
            kafka_config=tuple(sorted((kafka_config or {}).items())),
            resolver=resolver,
        )
        self.egress = self.config.egress
        # The calls are made here only without executor processes: the HTTP client (aiohttp,
        # a tenth of a second to import) is then imported, and not otherwise.
        self._caller: Caller | None = None
        if not processes:
            from node.caller import Caller

            self._caller = Caller(self.config, producer_factory)
        self._processes = (
            CallerProcesses(self.config, processes, on_failed=self._process_failed)
            if processes
            else None
        )
        kept, share = reserved if reserved is not None else default_reserve(max_in_flight)
        self._admission = Admission(
            max_in_flight, max_in_flight_per_tenant, reserved=kept, reserved_per_team=share
        )
        # Leases handed over by the runners, to start on the loop one team after another.
        self._to_start: Turns[tuple[PartitionRunner, ev.LeaseGranted, JobSpec]] = Turns()
        self._to_start_lock = threading.Lock()
        self._starting_planned = False  # a chunk is on its way to the loop
        self._wake: asyncio.TimerHandle | None = None  # the loop's look at throttled runs
        self._due_at: float | None = None  # its time.monotonic(), as the loop's clock reads it
        self._lock = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._handoff = Handoff(self._loop)
        self._first_beats = _FirstBeats(self._loop)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="executors", daemon=True
        )
        self._tasks: set[asyncio.Task[None]] = set()
        # Calls armed ahead, by run id, until they end (on the loop): a cancel drops them.
        self._armed: dict[str, asyncio.Future[Result]] = {}
        # Leases handed over whose call has not passed its start's check yet: run id -> the
        # lease's fencing token (:meth:`never_started`); a lease leaves it as its call starts,
        # or as the runner takes it back, whichever is first (under ``_handed_lock``).
        self._handed: dict[str, int] = {}
        self._handed_lock = threading.Lock()
        self._dropped: set[asyncio.Future[Result]] = set()
        # The in-process caller that asks targets when calls go to executor processes (made on
        # the loop at the first ask), and the asks under way: (run id, token, ask).
        self._status_caller: Caller | None = None
        self._asking: set[tuple[str, int, int]] = set()
        # The node's way to its partitions' owners (set by the node before it starts us), and
        # to the partitions it runs itself without a round trip through this loop.
        self.route: Route | None = None
        self.submit_local: Local | None = None
        # Calls under way, abandoned when the executors close.
        self._calls: set[asyncio.Future[Result]] = set()
        # Outcomes handed to a partition of this node, not answered yet (oldest first): id ->
        # (when, the command, when to give up, what it records, its team).
        self._unanswered: dict[int, tuple[float, CompleteRun, float, str, str]] = {}
        self._unanswered_lock = threading.Lock()
        self._outcome_ids = itertools.count()
        self._sweeping = False
        # Told when an executor process ended unasked (the node counts it).
        self.on_process_failed: Callable[[], None] | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> None:
        if self._processes is not None:
            await self._processes.start()
        elif self._caller is not None:
            await self._caller.open()

    def _process_failed(self) -> None:
        if self.on_process_failed is not None:
            self.on_process_failed()

    def stop(self) -> None:
        """Abandon calls in flight: their leases run out and the runs are retried elsewhere."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _close(self) -> None:
        for call in list(self._calls):
            call.cancel()  # abandoned: its lease runs out (see ``_called``)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self._processes is not None:
            await self._processes.stop()
        elif self._caller is not None:
            await self._caller.close()
        if self._status_caller is not None:
            await self._status_caller.close()

    def reserve(self, runner: PartitionRunner, run: RunState) -> bool:
        """Room for ``run``'s call now, or False: it waits and comes back through
        ``runner.grant`` (see :mod:`node.admission`)."""
        ticket = Ticket(runner, run.run_id, run.tenant, ageing_key(run), self._limit(runner, run))
        with self._lock:
            reserved = self._admission.reserve(ticket)
            if not reserved:
                self._look_again(self._admission.next_due_s())
        return reserved

    def release(self, tenant: str) -> None:
        """Give back the room of a call that ended, or of a reservation that was not used,
        and hand the freed room to the runs waiting for it."""
        with self._lock:
            granted = self._admission.release(tenant)
            self._look_again(self._admission.next_due_s())
            self._lock.notify_all()
        self._hand_out(granted)

    def share_limits(self, shares: Shares) -> None:
        """The node is one of several: a downstream's ``max_calls_per_sec`` and a team's cap
        (``--max-calls-per-team``) are the cluster's, and this node's calls take their share
        of each (``core.shares``)."""
        with self._lock:
            self._admission.shares = shares
            self._admission.on_share = self._share_came

    def _share_came(self) -> None:
        """A team's first share of its cap arrived: its waiting runs are looked at now."""
        with self._lock:
            self._look_again(0.0)

    @staticmethod
    def _limit(runner: PartitionRunner, run: RunState) -> RateLimit | None:
        job = runner.state.jobs.get(run.job_id)
        if job is None:
            return None
        match job.spec.target:
            case HttpTarget(url=url, max_calls_per_sec=rate) if rate is not None:
                # What the downstream tolerates: the team's calls to the URL's origin share it.
                parts = urlsplit(url)
                origin = f"{parts.scheme}://{parts.netloc}".lower()
                return RateLimit((run.tenant, origin), rate)
            case HttpTarget() | KafkaTarget() | PullTarget():
                return None
            case _:
                assert_never(job.spec.target)

    def _hand_out(self, granted: list[Ticket]) -> None:
        now = time.monotonic()  # the admission's clock
        for ticket in granted:
            if not ticket.runner.grant(ticket.tenant, ticket.run_id, ticket.waited(now)):
                self.release(ticket.tenant)  # its partition moved on

    def _look_again(self, delay_s: float | None) -> None:
        """(Under the lock.) Have the loop look at the throttled runs in ``delay_s``; it is
        told only when that is sooner than the look already planned, so a call ending does
        not wake the loop for nothing."""
        if delay_s is None:
            return
        when = time.monotonic() + delay_s
        if self._due_at is not None and self._due_at <= when:
            return
        self._due_at = when
        self._loop.call_soon_threadsafe(self._plan, when)

    def _plan(self, when: float) -> None:
        # (On the loop.) Plans arrive soonest last; the loop's clock is time.monotonic().
        if self._wake is not None:
            self._wake.cancel()
        self._wake = self._loop.call_at(when, self._on_due)

    def _on_due(self) -> None:
        with self._lock:
            self._wake = None
            self._due_at = None
            granted = self._admission.due()
            self._look_again(self._admission.next_due_s())
        self._hand_out(granted)

    @property
    def in_flight(self) -> int:
        return self._admission.in_flight

    @property
    def waiting(self) -> tuple[int, int]:
        """Runs waiting (for room, for a downstream's rate)."""
        with self._lock:
            return self._admission.waiting_for_room, self._admission.waiting_for_rate

    def drain(self, timeout_s: float) -> bool:
        """Start no more calls, and wait up to ``timeout_s`` for those in flight to end (and
        report their outcome). True if none is left. Runs that come due meanwhile stay pending
        for whoever owns their partition next."""
        with self._lock:
            self._admission.drain()
        return self.wait_idle(timeout_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no call is in flight."""
        with self._lock:
            return self._lock.wait_for(lambda: self._admission.in_flight == 0, timeout_s)

    def dispatch(self, runner: PartitionRunner, lease: ev.LeaseGranted) -> None:
        """Run ``lease``'s call, in the room :meth:`reserve` made for it. The leases handed over
        are started on the executors' loop one team after another, ``START_CHUNK`` at a time
        with the loop's other work between chunks: another team's lease handed over during a
        herd of 5,000 starts in the next chunk, not after the herd."""
        job = runner.state.jobs.get(lease.job_id)
        if job is None:
            self.release(lease.tenant)
            return
        with self._handed_lock:
            self._handed[lease.run_id] = lease.fencing_token
        with self._to_start_lock:
            self._to_start.append(lease.tenant, (runner, lease, job.spec))
            if self._starting_planned:
                return
            self._starting_planned = True
        self._handoff.post(self._start_chunk)

    def _start_chunk(self) -> None:
        # (On the loop.) The next chunk, if any, after what the loop has ready meanwhile: the
        # chunk's own tasks (each hands its call over) and the answers coming back.
        with self._to_start_lock:
            chunk = [self._to_start.popleft() for _ in range(min(START_CHUNK, len(self._to_start)))]
            more = bool(self._to_start)
            self._starting_planned = more
        for runner, lease, spec in chunk:
            self._spawn(runner, lease, spec)
        if more:
            self._loop.call_soon(self._start_chunk)

    def _spawn(self, runner: PartitionRunner, lease: ev.LeaseGranted, spec: JobSpec) -> None:
        """(On the loop.) Start ``lease``'s call. Its end comes back to ``_called``, a callback:
        no task per call (a herd's 50,000 calls pay for none)."""
        try:
            if not self._take_handed(lease.run_id, lease.fencing_token):
                # Its runner found the lease run out before this came to it, and decided (and
                # logged) that the attempt failed without a call (PartitionRunner._never_called).
                self.release(lease.tenant)
                return
            if time.time() * 1000 >= lease.lease_expires_at - BEAT_MARGIN_S * 1000:
                # The node stood still between granting the lease and calling (a pause, a
                # stop): the run may be someone else's by now, or will be before a heartbeat
                # could renew the lease. Make no call, and say so: the target saw nothing, so
                # even a critical run may be tried again (if the expiry was decided first,
                # this is refused and the expiry stands).
                log.warning("run %s: its lease ran out before the call started", lease.run_id)
                self._report(lease, spec, Result(Outcome.FAILED, NOT_CALLED))
                return
            call = self._start_call(lease, spec)
        except Exception:
            log.exception("run %s: executor failed", lease.run_id)
            self.release(lease.tenant)
            return
        if lease.start_at is not None:
            self._armed[lease.run_id] = call  # a cancel before its start withdraws it
        # Most calls end long before a third of their lease: the heartbeat starts only for
        # those still running then, so a herd does not pay a task per call for it.
        keeper = _LeaseKeeper(self, lease, spec, call)
        self._calls.add(call)
        call.add_done_callback(lambda _: self._called(call, lease, spec, keeper))

    def _called(
        self,
        call: asyncio.Future[Result],
        lease: ev.LeaseGranted,
        spec: JobSpec,
        keeper: _LeaseKeeper,
    ) -> None:
        """(On the loop.) ``lease``'s call ended: its outcome goes to the run's owner, unless
        the call was abandoned (its lease lost, its run cancelled, the executors closing)."""
        self._calls.discard(call)
        keeper.stop()
        if self._armed.get(lease.run_id) is call:
            del self._armed[lease.run_id]
        try:
            if call.cancelled():
                if keeper.lost:
                    self._dropped.discard(call)
                else:
                    self._withdrawn(lease, call)  # (said, if it was)
                self.release(lease.tenant)  # nothing to report
                return
            error = call.exception()
            if error is not None:
                log.error("run %s: executor failed", lease.run_id, exc_info=error)
                self.release(lease.tenant)
                return
            result = call.result()
        except Exception:
            log.exception("run %s: executor failed", lease.run_id)
            self.release(lease.tenant)
            return
        self._report(lease, spec, result)

    def never_started(self, run_id: str, fencing_token: int) -> bool:
        """(From a runner's thread, its lease run out.) True, and the call withdrawn for good,
        if the lease was handed here and its call has not passed the check before its start;
        the task that comes to it later makes no call and reports nothing."""
        return self._take_handed(run_id, fencing_token)

    def _take_handed(self, run_id: str, fencing_token: int) -> bool:
        """Take the lease out of ``_handed``, for whichever comes first: its call's start (which
        may then go ahead) or its runner at the expiry (which then decides it was not called).
        False for the one that comes second."""
        with self._handed_lock:
            if self._handed.get(run_id) != fencing_token:
                return False
            del self._handed[run_id]
            return True

    def cancelled(self, run_id: str) -> None:
        """(From a runner's thread.) ``run_id`` was cancelled: a call armed ahead for it is
        dropped before its start (one under way is abandoned, as a cancelled call is)."""
        if self._armed:  # read without the loop: an empty dict is the common case
            self._handoff.post(lambda: self._drop(run_id))

    def _drop(self, run_id: str) -> None:
        call = self._armed.pop(run_id, None)
        if call is not None and not call.done():
            self._dropped.add(call)
            call.cancel()

    def ask(self, runner: PartitionRunner, asked: ev.RunOutcomeAsked, spec: JobSpec) -> None:
        """(From a runner's thread.) Ask the target of the run ``asked`` names what became of
        its attempt, and take the answer to the run's owner (see the module)."""
        self._handoff.post(self._spawn_ask, asked, spec)

    def _spawn_ask(self, asked: ev.RunOutcomeAsked, spec: JobSpec) -> None:
        key = (asked.run_id, asked.fencing_token, asked.ask)
        if key in self._asking:
            return  # asked already (its timer was armed again): one answer is enough
        self._asking.add(key)
        task = self._loop.create_task(self._ask_target(asked, spec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._asking.discard(key))

    async def _ask_target(self, asked: ev.RunOutcomeAsked, spec: JobSpec) -> None:
        try:
            caller = self._caller
            if caller is None:  # calls go to executor processes; asks are made here
                if self._status_caller is None:
                    from node.caller import Caller

                    self._status_caller = Caller(self.config)
                    await self._status_caller.open()
                caller = self._status_caller
            said = await caller.ask(asked, spec)
            log.info("run %s: ask %d answered %s", asked.run_id, asked.ask, said.answer)
            command = AnswerOutcome(
                run_id=asked.run_id,
                fencing_token=asked.fencing_token,
                ask=asked.ask,
                answer=said.answer,
                status=said.status,
                detail=said.detail,
            )
            # Past the deadline the deadline answers (AnswerDue), and the owner asks again.
            left_s = (asked.answer_by - time.time() * 1000) / 1000
            await self._record(command, time.monotonic() + left_s, f"answer {said.answer}")
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("run %s: asking its target failed", asked.run_id)

    def _withdrawn(self, lease: ev.LeaseGranted, call: asyncio.Future[Result]) -> bool:
        if call in self._dropped:
            self._dropped.discard(call)
            log.info("run %s: cancelled before its armed call started", lease.run_id)
            return True
        return False

    def _start_call(self, lease: ev.LeaseGranted, spec: JobSpec) -> asyncio.Future[Result]:
        """The call under way: in an executor process when there are some, else here. A call
        armed ahead (the lease's ``start_at``) waits for its start where it is made."""
        if self._processes is not None:
            with self._lock:
                few = self._admission.holds_few(lease.tenant)
            return self._processes.submit(lease, spec, few)
        assert self._caller is not None  # there is one exactly when there are no processes
        return asyncio.ensure_future(call_at_start(self._caller, lease, spec))

    async def _ask(self, command: AnyCommand) -> CronlogError | None:
        """Have the partition's owner decide ``command``, wherever it runs now (the node routes
        it: a partition that moved while the call ran still hears of it); its refusal, if any."""
        if self.route is None:
            raise CronlogError("executors started without a node to route their requests")
        try:
            await self.route(command)
        except CronlogError as err:
            return err
        return None

    def _report(self, lease: ev.LeaseGranted, spec: JobSpec, result: Result) -> None:
        """(On the loop.) Record the attempt's outcome, asking again while the owner is
        unavailable, for as long as the lease could still be live; then give the call's room
        back. The room is held until then, so a drain waits for outcomes to be durable, not only
        for calls to end. An outcome for a partition this node runs goes to its runner at once,
        answered on the runner's thread (``_answered``): no future, timer or turn of this loop
        per outcome."""
        command = CompleteRun(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            outcome=result.outcome,
            error=result.error,
            permanent=result.permanent,
            ambiguous=result.ambiguous,
            retry_after_ms=result.retry_after_ms,
            # a call armed ahead: its start is recorded with its outcome (RunStarted)
            started_late_ms=result.started_late_ms if lease.start_at is not None else None,
        )
        give_up = time.monotonic() + spec.lease_sec + COMPLETE_GRACE_S
        what = f"outcome {result.outcome}"
        try:
            if self._report_here(command, give_up, what, lease.tenant):
                return
        except Exception:
            log.exception("run %s: %s not handed to its partition", lease.run_id, what)
        self._spawn_recording(command, give_up, what, lease.tenant, 0.0)

    def _report_here(self, command: CompleteRun, give_up: float, what: str, tenant: str) -> bool:
        """Hand ``command`` to its partition's runner if this node runs it; False if not."""
        submit = self.submit_local
        if submit is None:
            return False
        key = next(self._outcome_ids)
        with self._unanswered_lock:
            self._unanswered[key] = (time.monotonic(), command, give_up, what, tenant)

        def reply(answer: Decided | CronlogError) -> None:
            with self._unanswered_lock:
                if self._unanswered.pop(key, None) is None:
                    return  # taken as unanswered by the sweep, and asked again
            try:
                self._answered(command, give_up, what, tenant, answer)
            except Exception:
                # The runner would log this at debug only (a caller gone away); here it is a
                # room that may not come back, so it is said (unless the executors closed).
                if not self._loop.is_closed():
                    log.exception("run %s: the answer to its %s was lost", command.run_id, what)

        handed = False
        try:
            handed = submit(command, reply)
        finally:
            if not handed:
                with self._unanswered_lock:
                    self._unanswered.pop(key, None)
        if handed and not self._sweeping:
            self._sweeping = True
            self._loop.call_later(SWEEP_S, self._sweep)
        return handed

    def _answered(
        self,
        command: CompleteRun,
        give_up: float,
        what: str,
        tenant: str,
        answer: Decided | CronlogError,
    ) -> None:
        """(On the runner's thread.) The run's owner answered ``command``: the room goes back,
        or, if the partition could not take it (it stopped or moved meanwhile), it is asked
        again through the node, wherever the partition runs now."""
        if isinstance(answer, Unavailable):
            self._handoff.post(self._spawn_recording, command, give_up, what, tenant, RETRY_FIRST_S)
            return
        if isinstance(answer, CronlogError):  # the lease ran out, the run was cancelled...
            log.info("run %s: %s not recorded: %s", command.run_id, what, answer)
        self.release(tenant)

    def _sweep(self) -> None:
        """(On the loop, every ``SWEEP_S`` while outcomes wait for their answer.) One not
        answered in ``LOCAL_TIMEOUT_S`` is asked again through the node, and said."""
        self._sweeping = False
        cutoff = time.monotonic() - LOCAL_TIMEOUT_S
        with self._unanswered_lock:
            waited = self._unanswered
            late = list(itertools.takewhile(lambda key: waited[key][0] <= cutoff, waited))
            taken = [self._unanswered.pop(key) for key in late]
            waiting = bool(self._unanswered)
        for _, command, give_up, what, tenant in taken:
            log.error(
                "run %s: %s had no answer from its partition in %.0f s; asking again",
                command.run_id,
                what,
                LOCAL_TIMEOUT_S,
            )
            self._spawn_recording(command, give_up, what, tenant, 0.0)
        if waiting and not self._sweeping:
            self._sweeping = True
            self._loop.call_later(SWEEP_S, self._sweep)

    def _spawn_recording(
        self, command: CompleteRun, give_up: float, what: str, tenant: str, wait_s: float
    ) -> None:
        """(On the loop.) Record ``command`` through the node (``_record``), after ``wait_s``;
        then give the room back."""
        task = self._loop.create_task(self._recording(command, give_up, what, tenant, wait_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recording(
        self, command: CompleteRun, give_up: float, what: str, tenant: str, wait_s: float
    ) -> None:
        try:
            if wait_s:
                await asyncio.sleep(wait_s)  # a backoff before asking again, not an event
            await self._record(command, give_up, what)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("run %s: recording its %s failed", command.run_id, what)
        finally:
            self.release(tenant)

    async def _record(
        self, command: CompleteRun | AnswerOutcome, give_up: float, what: str
    ) -> None:
        """Have the run's owner decide ``command``, asking again while it is unavailable until
        ``give_up`` (``time.monotonic``). A refusal (the lease ran out, the run was cancelled or
        answered meanwhile) ends it: logged, as is giving up."""
        delay = 0.05
        while True:
            refused = await self._ask(command)
            if not isinstance(refused, Unavailable):
                if refused is not None:
                    log.info("run %s: %s not recorded: %s", command.run_id, what, refused)
                return
            if time.monotonic() + delay > give_up:
                log.warning(
                    "run %s: %s not recorded, its partition stayed unavailable: %s",
                    command.run_id,
                    what,
                    refused,
                )
                return
            await asyncio.sleep(delay)  # a backoff between attempts, not a wait for an event
            delay = min(1.0, delay * 2)

    async def _heartbeat(
        self, lease: ev.LeaseGranted, spec: JobSpec, call: asyncio.Future[Result]
    ) -> bool:
        """Keep the lease alive (the first beat is due now); cancel ``call`` and return True
        if it was lost."""
        interval = heartbeat_interval(spec)
        while not call.done():
            refused = await self._ask(
                HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token)
            )
            if isinstance(refused, LeaseLost):
                log.info("run %s: %s", lease.run_id, refused)
                call.cancel()
                return True
            await asyncio.sleep(interval)
        return False

    async def call(self, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        """Make one attempt's call to ``spec``'s target and classify what came back (on the
        executors' loop: ``asyncio.run_coroutine_threadsafe(executors.call(...), loop)``), in
        an executor process when there are some."""
        return await self._start_call(lease, spec)


def heartbeat_interval(spec: JobSpec) -> float:
    return max(0.2, spec.lease_sec / 3)


# A heartbeat sent this long before the lease runs out is decided before it does: the time a
# beat takes to reach its partition's owner and be decided, with room for a busy node.
BEAT_MARGIN_S = 0.25


def first_beat_s(lease: ev.LeaseGranted, spec: JobSpec, now_ms: float) -> float:
    """When a call's first heartbeat is due, from now: a third of its lease, or sooner if the
    lease would run out first. A call that starts late (its node was busy) has less than its
    lease left, and an outcome arriving after the lease is an unknown one (a critical run set
    aside for a person): the beat renews the lease while the call runs."""
    left_s = (lease.lease_expires_at - now_ms) / 1000
    return max(0.0, min(heartbeat_interval(spec), left_s - BEAT_MARGIN_S))


class _FirstBeats:
    """When the calls' first heartbeats fall due: one timer of the loop for the calls due within
    ``BEAT_TICK_S`` of one another, not one each. Most calls end long before their first beat
    (their entry is then passed over), so a herd of 50,000 calls arms a few hundred timers."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: dict[int, list[_LeaseKeeper]] = {}

    def add(self, keeper: _LeaseKeeper, delay_s: float) -> None:
        """(On the loop.) Tell ``keeper`` in ``delay_s``, up to a tick early."""
        tick = math.floor((self._loop.time() + delay_s) / BEAT_TICK_S)
        keepers = self._due.get(tick)
        if keepers is None:
            keepers = self._due[tick] = []
            self._loop.call_at(tick * BEAT_TICK_S, self._fire, tick)
        keepers.append(keeper)

    def _fire(self, tick: int) -> None:
        for keeper in self._due.pop(tick, ()):
            try:
                keeper.due()
            except Exception:  # one keeper's failure must not leave the tick's others unbeaten
                log.exception("a call's first heartbeat could not start")


class _LeaseKeeper:
    """Heartbeats a call's lease while the call runs, from a third of the lease on, or sooner
    when less than that is left of it (:func:`first_beat_s`). Stopped, it lets go of the call
    and its lease: a herd's keepers wait in ``_FirstBeats`` until their first beat's instant,
    long after most calls ended, and hold nothing bigger than themselves meanwhile."""

    __slots__ = ("_beating", "_work")

    def __init__(
        self,
        executors: Executors,
        lease: ev.LeaseGranted,
        spec: JobSpec,
        call: asyncio.Future[Result],
    ) -> None:
        self._work: tuple[Executors, ev.LeaseGranted, JobSpec, asyncio.Future[Result]] | None = (
            executors,
            lease,
            spec,
            call,
        )
        self._beating: asyncio.Task[bool] | None = None
        executors._first_beats.add(self, first_beat_s(lease, spec, time.time() * 1000))

    def due(self) -> None:
        """(On the loop.) The first beat is due: it starts if the call still runs."""
        if self._work is None:
            return  # stopped: the call ended
        executors, lease, spec, call = self._work
        if not call.done():
            self._beating = asyncio.ensure_future(executors._heartbeat(lease, spec, call))

    @property
    def lost(self) -> bool:
        beating = self._beating
        return (
            beating is not None
            and beating.done()
            and not beating.cancelled()
            and (beating.result())
        )

    def stop(self) -> None:
        self._work = None
        if self._beating is not None and not self._beating.done():
            self._beating.cancel()
