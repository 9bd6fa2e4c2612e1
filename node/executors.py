"""The node's own executors: they run the leases the partition runners grant for push targets.

An HTTP target gets ``POST <url>`` with a JSON body (job, run, slot, attempt, fencing token,
payload) and these headers:

``Idempotency-Key: <job_id>:<scheduled_for ms>``   the same for every attempt of a run
``X-Cronlog-Run-Id``, ``X-Cronlog-Attempt``, ``X-Cronlog-Fencing-Token``

How an answer is classified:

===========================================  =============================================
2xx                                          succeeded
408, 429, 5xx (``Retry-After`` honoured)     failed, transient: retried with backoff
other 4xx                                    failed, permanent: dead-lettered at once
the request could not be sent ("unreachable")  failed, transient (the target never saw it)
timeout, 504, connection lost after sending  failed, transient and **ambiguous**: it may have
                                             taken effect, so a critical job dead-letters
refused by the egress policy                 failed, permanent ("egress policy: ...")
a secret the headers name is missing         failed, permanent (names the secret)
===========================================  =============================================

What a team reads in ``run.error`` is bounded: the status and at most ``error_excerpt_bytes``
of the answer's body (200 unless the operator says otherwise; 0: none), control characters
made spaces. A call that could not be made says "unreachable", whatever the reason (refused,
no route, timed out connecting, no such name), so a team learns nothing of ports it may not
reach; the node's log keeps the details for the operator.

Where a call may go is the operator's egress policy (``core/egress.py``), applied here on the
address actually connected to (``node/egress.py``).

A Kafka-topic target gets the same body produced to the topic (key: the job id, headers as
above); it succeeded once the broker acknowledged it (``acks=all``). The topic must be one the
egress policy grants the team, and never one of the cluster's own.

While a call runs, the executor heartbeats the lease every third of its length. A heartbeat
refused because the run was cancelled, or its lease lost, abandons the call at once.

**Room, fairness, rates.** Before a start is decided the runner reserves room for the call
(:mod:`node.admission`): at most ``max_in_flight`` calls at once, ``max_in_flight_per_tenant``
of them for one team (unlimited unless set), and no more than an HTTP target's
``max_calls_per_sec`` to its origin for its team. A run that may not start yet waits there,
its team's most urgent first, the teams served in turn when room frees up, and comes back to
its runner with the room reserved. So a batch of starts never overshoots, and when one team's
40,000 runs fall due together another team's run waits for the next free call, not behind
all of them.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import functools
import logging
import threading
import time
import unicodedata
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec
from aiohttp.abc import AbstractResolver
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace
from yarl import URL

from core import events as ev
from core.commands import AnyCommand, CompleteRun, HeartbeatRun, Outcome
from core.egress import EgressPolicy, parse_host
from core.errors import CronlogError, InvalidDefinition, LeaseLost, Unavailable
from core.ids import idempotency_key, team_id
from core.jobs import HttpTarget, JobSpec, KafkaTarget, validate_headers
from core.state import RunState, ageing_key
from node.admission import Admission, RateLimit, Ticket
from node.egress import PolicyResolver, guarded_socket, refusal_in
from node.runner import Dispatcher, PartitionRunner
from node.secrets import Secrets, SecretUnavailable

log = logging.getLogger(__name__)

MAX_ERROR = 500
DEFAULT_ERROR_EXCERPT = 200
MAX_ERROR_EXCERPT = 1024  # every failed attempt's error is kept in the log for good
UNREACHABLE = "unreachable"
# How long past its lease an outcome is still offered to an owner that was unavailable: the
# lease may have been extended by a heartbeat that was decided but not yet answered.
COMPLETE_GRACE_S = 2.0

Route = Callable[[AnyCommand], Awaitable[list[ev.AnyEvent]]]


def iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def run_body(lease: ev.LeaseGranted, spec: JobSpec) -> bytes:
    return msgspec.json.encode(
        {
            "job_id": team_id(lease.job_id),
            "name": spec.name,
            "tenant": lease.tenant,
            "run_id": team_id(lease.run_id),
            "scheduled_for": iso(lease.scheduled_for),
            "scheduled_for_ms": lease.scheduled_for,
            "attempt": lease.attempt,
            "fencing_token": lease.fencing_token,
            "payload": spec.payload,
        }
    )


def run_headers(lease: ev.LeaseGranted) -> dict[str, str]:
    return {
        "Idempotency-Key": idempotency_key(lease.job_id, lease.scheduled_for),
        "X-Cronlog-Run-Id": team_id(lease.run_id),
        "X-Cronlog-Attempt": str(lease.attempt),
        "X-Cronlog-Fencing-Token": str(lease.fencing_token),
    }


def retry_after_ms(value: str | None, now: datetime | None = None) -> int | None:
    """``Retry-After`` as delay-seconds or an HTTP date, in milliseconds."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value) * 1000
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    delta = when - (now or datetime.now(UTC))
    return max(0, int(delta.total_seconds() * 1000))


def excerpt(body: bytes, limit: int) -> str:
    """At most ``limit`` bytes of an answer's body as text a team may read: control and format
    characters (line breaks, escapes, bidirectional overrides) become spaces, runs of white
    space one space."""
    if limit <= 0:
        return ""
    text = body[:limit].decode("utf-8", "replace")
    text = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in text)
    return " ".join(text.split())


def refused(reason: str) -> Result:
    return Result(Outcome.FAILED, f"egress policy: {reason}"[:MAX_ERROR], permanent=True)


class Result(msgspec.Struct, frozen=True):
    outcome: Outcome
    error: str = ""
    permanent: bool = False
    ambiguous: bool = False
    retry_after_ms: int | None = None


def classify(status: int, retry_after: str | None = None, text: str = "") -> Result:
    """An HTTP answer as an attempt's outcome (the table in the module docstring)."""
    if 200 <= status < 300:
        return Result(Outcome.SUCCEEDED)
    error = (f"HTTP {status}: {text}" if text else f"HTTP {status}")[:MAX_ERROR].strip()
    if status in (408, 429) or status >= 500:
        return Result(
            Outcome.FAILED,
            error,
            ambiguous=status == 504,
            retry_after_ms=retry_after_ms(retry_after),
        )
    return Result(Outcome.FAILED, error, permanent=True)


class Executors(Dispatcher):
    """Runs push targets on one asyncio loop in a thread of its own."""

    def __init__(
        self,
        node_id: str,
        *,
        max_in_flight: int = 512,
        max_in_flight_per_tenant: int | None = None,
        kafka_bootstrap: str | None = None,
        kafka_config: dict[str, str] | None = None,
        producer_factory: Callable[[str], Any] | None = None,
        egress: EgressPolicy | None = None,
        secrets: Secrets | None = None,
        error_excerpt_bytes: int = DEFAULT_ERROR_EXCERPT,
        resolver: AbstractResolver | None = None,
    ) -> None:
        """``egress``: where calls may go (default: the public internet only). ``secrets``:
        where header secret references are read. ``resolver``: what host names are resolved
        with before the policy filters them (default: the system's)."""
        if not 0 <= error_excerpt_bytes <= MAX_ERROR_EXCERPT:
            raise ValueError(f"error_excerpt_bytes must be between 0 and {MAX_ERROR_EXCERPT}")
        self.worker_id = f"{node_id}/executor"
        self.egress = egress if egress is not None else EgressPolicy()
        self._secrets = secrets if secrets is not None else Secrets(None)
        self._excerpt_bytes = error_excerpt_bytes
        self._resolver = resolver
        # The policy is fixed for the node's life, and jobs call the same URLs again and again.
        self._destinations = functools.lru_cache(maxsize=4096)(self._destination)
        self._max = max_in_flight
        self._admission = Admission(max_in_flight, max_in_flight_per_tenant)
        self._wake: asyncio.TimerHandle | None = None  # the loop's look at throttled runs
        self._due_at: float | None = None  # its time.monotonic(), as the loop's clock reads it
        self._lock = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="executors", daemon=True
        )
        self._session: aiohttp.ClientSession | None = None
        self._kafka_bootstrap = kafka_bootstrap
        self._kafka_config = dict(kafka_config or {})
        self._producer_factory = producer_factory
        self._producer: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        # The node's way to its partitions' owners (set by the node before it starts us).
        self.route: Route | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> None:
        # aiohttp rather than httpx here: on a 2-core machine a node made 3.5 times the calls
        # per second with it (bench/bench_fanout.py; docs/architecture.md).
        # The pool holds as many connections as the node has room for calls. Host names are
        # resolved, checked and connected to by address (node/egress.py); no proxy from the
        # environment is used (trust_env stays off), so the address checked is the peer.
        connector = _Connector(
            limit=self._max,
            limit_per_host=0,
            resolver=PolicyResolver(self.egress, self._resolver),
            socket_factory=guarded_socket(self.egress),
        )
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, trust_env=False
        )

    def stop(self) -> None:
        """Abandon calls in flight: their leases run out and the runs are retried elsewhere."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        if self._producer is not None:
            self._producer.flush(5)

    async def _close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self._session is not None:
            await self._session.close()

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

    @staticmethod
    def _limit(runner: PartitionRunner, run: RunState) -> RateLimit | None:
        job = runner.state.jobs.get(run.job_id)
        target = job.spec.target if job is not None else None
        if not isinstance(target, HttpTarget) or target.max_calls_per_sec is None:
            return None
        parts = urlsplit(target.url)
        origin = f"{parts.scheme}://{parts.netloc}".lower()
        return RateLimit((run.tenant, origin), target.max_calls_per_sec)

    def _hand_out(self, granted: list[Ticket]) -> None:
        for ticket in granted:
            if not ticket.runner.grant(ticket.tenant, ticket.run_id):  # its partition moved on
                self.release(ticket.tenant)

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
        """Run ``lease``'s call, in the room :meth:`reserve` made for it."""
        job = runner.state.jobs.get(lease.job_id)
        if job is None:
            self.release(lease.tenant)
            return
        self._loop.call_soon_threadsafe(self._spawn, runner, lease, job.spec)

    def _spawn(self, runner: PartitionRunner, lease: ev.LeaseGranted, spec: JobSpec) -> None:
        task = self._loop.create_task(self._run(runner, lease, spec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, runner: PartitionRunner, lease: ev.LeaseGranted, spec: JobSpec) -> None:
        try:
            call = asyncio.ensure_future(self.call(lease, spec))
            beat = asyncio.ensure_future(self._heartbeat(lease, spec, call))
            try:
                result = await call
            except asyncio.CancelledError:
                if beat.done() and beat.result():
                    return  # the lease was lost or the run cancelled: nothing to report
                raise
            finally:
                beat.cancel()
            await self._complete(lease, spec, result)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("run %s: executor failed", lease.run_id)
        finally:
            self.release(lease.tenant)

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

    async def _complete(self, lease: ev.LeaseGranted, spec: JobSpec, result: Result) -> None:
        """Record the attempt's outcome, asking again while the owner is unavailable, for as long
        as the lease could still be live. The room is held until then, so a drain waits for
        outcomes to be durable, not only for calls to end."""
        command = CompleteRun(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            outcome=result.outcome,
            error=result.error,
            permanent=result.permanent,
            ambiguous=result.ambiguous,
            retry_after_ms=result.retry_after_ms,
        )
        give_up = time.monotonic() + spec.lease_sec + COMPLETE_GRACE_S
        delay = 0.05
        while True:
            refused = await self._ask(command)
            if not isinstance(refused, Unavailable):
                if refused is not None:  # the lease ran out, or the run was cancelled
                    log.info("run %s: outcome not recorded: %s", lease.run_id, refused)
                return
            if time.monotonic() + delay > give_up:
                log.warning(
                    "run %s: outcome %s not recorded, its partition stayed unavailable: %s",
                    lease.run_id,
                    result.outcome,
                    refused,
                )
                return
            await asyncio.sleep(delay)  # a backoff between attempts, not a wait for an event
            delay = min(1.0, delay * 2)

    async def _heartbeat(
        self, lease: ev.LeaseGranted, spec: JobSpec, call: asyncio.Future[Result]
    ) -> bool:
        """Keep the lease alive; cancel ``call`` and return True if it was lost."""
        interval = max(0.2, spec.lease_sec / 3)
        while not call.done():
            await asyncio.sleep(interval)
            if call.done():
                break
            refused = await self._ask(
                HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token)
            )
            if isinstance(refused, LeaseLost):
                log.info("run %s: %s", lease.run_id, refused)
                call.cancel()
                return True
        return False

    async def call(self, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        """Make one attempt's call to ``spec``'s target and classify what came back (on the
        executors' loop: ``asyncio.run_coroutine_threadsafe(executors.call(...), loop)``)."""
        target = spec.target
        try:
            if isinstance(target, HttpTarget):
                return await self._http(target, lease, spec)  # it keeps the timeout itself
            if isinstance(target, KafkaTarget):
                return await asyncio.wait_for(self._kafka(target, lease, spec), spec.timeout_sec)
        except TimeoutError:
            return Result(Outcome.FAILED, f"timed out after {spec.timeout_sec} s", ambiguous=True)
        return Result(Outcome.FAILED, f"no executor for {type(target).__name__}", permanent=True)

    async def _http(self, target: HttpTarget, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        assert self._session is not None
        # The URL aiohttp is given is this object, so the host checked is the host it connects
        # to; a host name is checked, address by address, by the connector's resolver.
        url, reason = self._destinations(target.url)
        if reason is not None:
            log.info("run %s: egress policy: %s", lease.run_id, reason)
            return refused(reason)
        try:
            headers = self._headers(target, lease)
        except (SecretUnavailable, InvalidDefinition) as err:
            return Result(Outcome.FAILED, str(err)[:MAX_ERROR], permanent=True)
        progress = _Progress()
        token = _progress.set(progress)
        try:
            async with asyncio.timeout(spec.timeout_sec):
                async with self._session.post(
                    url,
                    data=run_body(lease, spec),
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=spec.timeout_sec),
                ) as response:
                    if 200 <= response.status < 300:
                        async for _ in response.content.iter_chunked(1 << 16):
                            pass  # drained unread, so the connection serves the next call
                        return Result(Outcome.SUCCEEDED)
                    body = b""
                    if self._excerpt_bytes:
                        body = await response.content.read(self._excerpt_bytes)
                    return classify(
                        response.status,
                        response.headers.get("Retry-After"),
                        excerpt(body, self._excerpt_bytes),
                    )
        except (TimeoutError, aiohttp.ClientError) as err:
            return self._failed(lease, spec, err, connected=progress.connected)
        finally:
            _progress.reset(token)

    def _destination(self, text: str) -> tuple[URL, str | None]:
        """The URL to call for ``text``, and why the policy refuses it if it does. A host
        written as an address is decided here (aiohttp connects to those without asking the
        resolver), and called as the address decided (``127.1`` as ``127.0.0.1``)."""
        url = URL(text)
        host, port = url.raw_host or "", url.port or 0
        try:
            parsed = parse_host(host)
        except ValueError as err:
            return url, str(err)
        if isinstance(parsed, str):
            return url, None
        reason = self.egress.check_address(parsed, port)
        if reason is None and host != str(parsed):
            url = url.with_host(str(parsed))
        return url, reason

    def _failed(
        self, lease: ev.LeaseGranted, spec: JobSpec, err: BaseException, *, connected: bool
    ) -> Result:
        """A call that got no answer: refused by the policy, never connected (the target saw
        nothing), or lost once connected (the request went out: it may have taken effect)."""
        refusal = refusal_in(err)
        if refusal is not None:
            log.info("run %s: egress policy: %s", lease.run_id, refusal)
            return refused(str(refusal))
        log.debug("run %s: call failed (connected: %s): %r", lease.run_id, connected, err)
        if not connected:
            # Refused, timed out connecting, no route, no such name: all alike to the team.
            return Result(Outcome.FAILED, UNREACHABLE)
        if isinstance(err, TimeoutError):
            return Result(Outcome.FAILED, f"timed out after {spec.timeout_sec} s", ambiguous=True)
        return Result(
            Outcome.FAILED, "the connection failed after the request was sent", ambiguous=True
        )

    def _headers(self, target: HttpTarget, lease: ev.LeaseGranted) -> dict[str, str]:
        """The target's headers with its secrets read, then the run's own."""
        validate_headers(target.headers)  # a job stored before these checks existed
        headers: dict[str, str] = {}
        for name, value in target.headers.items():
            if isinstance(value, str):
                headers[name] = value
            else:
                headers[name] = self._secrets.read(lease.tenant, value.from_file)
        headers.update(run_headers(lease))
        headers["Content-Type"] = "application/json"
        return headers

    async def _kafka(self, target: KafkaTarget, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        reason = self.egress.check_topic(lease.tenant, target.topic)
        if reason is not None:
            log.info("run %s: egress policy: %s", lease.run_id, reason)
            return refused(reason)
        if self._kafka_bootstrap is None:
            return Result(
                Outcome.FAILED,
                "this node has no Kafka for kafka:// targets (start it with --target-kafka)",
                permanent=True,
            )
        if self._producer is None:
            if self._producer_factory is not None:
                self._producer = self._producer_factory(self._kafka_bootstrap)
            else:
                self._producer = _default_producer(self._kafka_bootstrap, self._kafka_config)
        done: asyncio.Future[str | None] = self._loop.create_future()

        def settle(error: str | None) -> None:
            if not done.done():
                done.set_result(error)

        def delivered(err: Any, _msg: Any) -> None:
            self._loop.call_soon_threadsafe(settle, None if err is None else str(err))

        self._producer.produce(
            target.topic,
            key=team_id(lease.job_id).encode(),
            value=run_body(lease, spec),
            headers=list(run_headers(lease).items()),
            on_delivery=delivered,
        )
        poller = asyncio.ensure_future(self._poll_producer(done))
        try:
            error = await done
        finally:
            poller.cancel()
        if error is None:
            return Result(Outcome.SUCCEEDED)
        return Result(Outcome.FAILED, f"Kafka: {error}"[:MAX_ERROR], ambiguous=True)

    async def _poll_producer(self, done: asyncio.Future[str | None]) -> None:
        while not done.done():
            await asyncio.to_thread(self._producer.poll, 0.1)


class _Progress:
    """How far one call got: once connected, the request goes out at once, so a call that
    fails after this may have reached the target."""

    __slots__ = ("connected",)

    def __init__(self) -> None:
        self.connected = False


# The call the current task is making. aiohttp connects in the task that makes the request, so
# the connector below can tell the call it has a connection. (A TraceConfig could too, but
# tracing costs every call about a tenth of its CPU time.)
_progress: contextvars.ContextVar[_Progress] = contextvars.ContextVar("progress")


class _Connector(aiohttp.TCPConnector):
    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        connection = await super().connect(req, traces, timeout)
        progress = _progress.get(None)
        if progress is not None:
            progress.connected = True
        return connection


def _default_producer(bootstrap: str, config: dict[str, str]) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            **config,
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
