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
no connection could be made                  failed, transient (the target never saw it)
timeout, 504, connection lost mid-call       failed, transient and **ambiguous**: it may have
                                             taken effect, so a critical job dead-letters
===========================================  =============================================

A Kafka-topic target gets the same body produced to the topic (key: the job id, headers as
above); it succeeded once the broker acknowledged it (``acks=all``).

While a call runs, the executor heartbeats the lease every third of its length. A heartbeat
refused because the run was cancelled, or its lease lost, abandons the call at once.

**Room and fairness.** A node makes at most ``max_in_flight`` calls at once, and one tenant at
most ``max_in_flight_per_tenant`` of them (unlimited unless set). A run that comes due without
room waits in its tenant's queue, most urgent first (priority with ageing, as pull claims are
ordered); freed room goes to the tenants' queues in turn, round-robin. So when one team's
40,000 runs fall due together, another team's run waits for the next free call, not behind
all of them. The room is reserved before a run's start is decided and dispatched with its
lease, so a batch of starts never overshoots the limits.
"""

from __future__ import annotations

import asyncio
import email.utils
import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

import aiohttp
import msgspec

from core import events as ev
from core.commands import CompleteRun, HeartbeatRun, Outcome
from core.errors import CronlogError, LeaseLost
from core.jobs import HttpTarget, JobSpec, KafkaTarget
from core.state import RunState, ageing_key
from node.runner import Decided, Dispatcher, PartitionRunner, Request

log = logging.getLogger(__name__)

MAX_ERROR = 500


def iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def idempotency_key(job_id: str, scheduled_for: int) -> str:
    return f"{job_id}:{scheduled_for}"


def run_body(lease: ev.LeaseGranted, spec: JobSpec) -> bytes:
    return msgspec.json.encode(
        {
            "job_id": lease.job_id,
            "name": spec.name,
            "tenant": lease.tenant,
            "run_id": lease.run_id,
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
        "X-Cronlog-Run-Id": lease.run_id,
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
    error = f"HTTP {status}: {text}"[:MAX_ERROR].strip()
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
        producer_factory: Callable[[str], Any] | None = None,
    ) -> None:
        if max_in_flight < 1 or (
            max_in_flight_per_tenant is not None and max_in_flight_per_tenant < 1
        ):
            raise ValueError("the executors' limits must be at least 1")
        self.worker_id = f"{node_id}/executor"
        self._max = max_in_flight
        self._max_per_tenant = max_in_flight_per_tenant or max_in_flight
        self._in_flight = 0  # reserved or running calls
        self._by_tenant: dict[str, int] = {}
        # Runs refused room: per tenant a heap of (ageing key, arrival, runner, run id), and
        # the tenants in the order their turns come.
        self._queued: dict[str, list[tuple[int, int, PartitionRunner, str]]] = {}
        self._turns: deque[str] = deque()
        self._arrivals = itertools.count()
        self._draining = False
        self._lock = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="executors", daemon=True
        )
        self._session: aiohttp.ClientSession | None = None
        self._kafka_bootstrap = kafka_bootstrap
        self._producer_factory = producer_factory
        self._producer: Any = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> None:
        # aiohttp rather than httpx here: on a 2-core machine a node made 3.5 times the calls
        # per second with it (bench/bench_fanout.py; docs/architecture.md).
        # The pool holds as many connections as the node has room for calls.
        connector = aiohttp.TCPConnector(limit=self._max, limit_per_host=0)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

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
        """Room for ``run``'s call now, or False: then it waits in its tenant's queue."""
        with self._lock:
            if self._draining:
                return False  # left pending: the partition's next owner starts it
            if not self._queued.get(run.tenant) and self._has_room(run.tenant):
                self._take(run.tenant)
                return True
            queue = self._queued.get(run.tenant)
            if queue is None:
                queue = self._queued[run.tenant] = []
                self._turns.append(run.tenant)
            heapq.heappush(queue, (ageing_key(run), next(self._arrivals), runner, run.run_id))
            return False

    def release(self, tenant: str) -> None:
        """Give back the room of a call that ended, or of a reservation that was not used,
        and hand the freed room to the runs waiting for it."""
        with self._lock:
            self._in_flight -= 1
            held = self._by_tenant[tenant] - 1
            if held:
                self._by_tenant[tenant] = held
            else:
                del self._by_tenant[tenant]
            self._lock.notify_all()
            grants = self._grants()
        for runner, granted_tenant, run_id in grants:
            if not runner.grant(granted_tenant, run_id):  # its partition has moved on
                self.release(granted_tenant)

    def _has_room(self, tenant: str) -> bool:
        return self._in_flight < self._max and self._by_tenant.get(tenant, 0) < self._max_per_tenant

    def _take(self, tenant: str) -> None:
        self._in_flight += 1
        self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1

    def _grants(self) -> list[tuple[PartitionRunner, str, str]]:
        """Reserve room for waiting runs, one tenant after another (round-robin), each
        tenant's most urgent first (priority with ageing, as pull claims are ordered)."""
        grants: list[tuple[PartitionRunner, str, str]] = []
        if self._draining:
            return grants
        skipped = 0  # tenants in a row that are at their own limit
        while self._turns and self._in_flight < self._max and skipped < len(self._turns):
            tenant = self._turns[0]
            self._turns.rotate(-1)  # whoever is served, the next turn is the next tenant's
            if not self._has_room(tenant):
                skipped += 1
                continue
            skipped = 0
            queue = self._queued[tenant]
            _, _, runner, run_id = heapq.heappop(queue)
            if not queue:
                del self._queued[tenant]
                self._turns.remove(tenant)
            self._take(tenant)
            grants.append((runner, tenant, run_id))
        return grants

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def drain(self, timeout_s: float) -> bool:
        """Start no more calls, and wait up to ``timeout_s`` for those in flight to end (and
        report their outcome). True if none is left. Runs that come due meanwhile stay pending
        for whoever owns their partition next."""
        with self._lock:
            self._draining = True
            self._queued.clear()
            self._turns.clear()
        return self.wait_idle(timeout_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no call is in flight."""
        with self._lock:
            return self._lock.wait_for(lambda: self._in_flight == 0, timeout_s)

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
            beat = asyncio.ensure_future(self._heartbeat(runner, lease, spec, call))
            try:
                result = await call
            except asyncio.CancelledError:
                if beat.done() and beat.result():
                    return  # the lease was lost or the run cancelled: nothing to report
                raise
            finally:
                beat.cancel()
            runner.submit(
                Request(
                    CompleteRun(
                        run_id=lease.run_id,
                        fencing_token=lease.fencing_token,
                        outcome=result.outcome,
                        error=result.error,
                        permanent=result.permanent,
                        ambiguous=result.ambiguous,
                        retry_after_ms=result.retry_after_ms,
                    )
                )
            )
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("run %s: executor failed", lease.run_id)
        finally:
            self.release(lease.tenant)

    async def _heartbeat(
        self,
        runner: PartitionRunner,
        lease: ev.LeaseGranted,
        spec: JobSpec,
        call: asyncio.Future[Result],
    ) -> bool:
        """Keep the lease alive; cancel ``call`` and return True if it was lost."""
        interval = max(0.2, spec.lease_sec / 3)
        while not call.done():
            await asyncio.sleep(interval)
            if call.done():
                break
            answer: Future[Decided | CronlogError] = Future()
            runner.submit(
                Request(
                    HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token),
                    reply=answer.set_result,
                )
            )
            outcome = await asyncio.wrap_future(answer)
            if isinstance(outcome, LeaseLost):
                log.info("run %s: %s", lease.run_id, outcome)
                call.cancel()
                return True
        return False

    async def call(self, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        """Make one attempt's call to ``spec``'s target and classify what came back (on the
        executors' loop: ``asyncio.run_coroutine_threadsafe(executors.call(...), loop)``)."""
        target = spec.target
        try:
            if isinstance(target, HttpTarget):
                return await asyncio.wait_for(self._http(target, lease, spec), spec.timeout_sec)
            if isinstance(target, KafkaTarget):
                return await asyncio.wait_for(self._kafka(target, lease, spec), spec.timeout_sec)
        except TimeoutError:
            return Result(Outcome.FAILED, f"timed out after {spec.timeout_sec} s", ambiguous=True)
        return Result(Outcome.FAILED, f"no executor for {type(target).__name__}", permanent=True)

    async def _http(self, target: HttpTarget, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        assert self._session is not None
        headers = {**target.headers, **run_headers(lease), "Content-Type": "application/json"}
        try:
            async with self._session.post(
                target.url,
                data=run_body(lease, spec),
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=spec.timeout_sec),
            ) as response:
                if 200 <= response.status < 300:
                    async for _ in response.content.iter_chunked(1 << 16):
                        pass  # drained unread, so the connection serves the next call
                    return Result(Outcome.SUCCEEDED)
                text = (await response.content.read(MAX_ERROR)).decode("utf-8", "replace")
                return classify(response.status, response.headers.get("Retry-After"), text)
        except aiohttp.ClientConnectorError as err:  # never connected: the target saw nothing
            return Result(Outcome.FAILED, f"cannot connect: {err}"[:MAX_ERROR])
        except TimeoutError as err:
            return Result(Outcome.FAILED, f"timed out: {err}"[:MAX_ERROR], ambiguous=True)
        except aiohttp.ClientError as err:  # e.g. the connection dropped mid-call
            return Result(
                Outcome.FAILED, f"{type(err).__name__}: {err}"[:MAX_ERROR], ambiguous=True
            )

    async def _kafka(self, target: KafkaTarget, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        if self._kafka_bootstrap is None:
            return Result(
                Outcome.FAILED,
                "this node has no Kafka for kafka:// targets (start it with --target-kafka)",
                permanent=True,
            )
        if self._producer is None:
            factory = self._producer_factory or _default_producer
            self._producer = factory(self._kafka_bootstrap)
        done: asyncio.Future[str | None] = self._loop.create_future()

        def settle(error: str | None) -> None:
            if not done.done():
                done.set_result(error)

        def delivered(err: Any, _msg: Any) -> None:
            self._loop.call_soon_threadsafe(settle, None if err is None else str(err))

        self._producer.produce(
            target.topic,
            key=lease.job_id.encode(),
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


def _default_producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
