"""One attempt's call to a push target, and what came back: the work the executors hand out.

An HTTP target gets ``POST <url>`` with a JSON body (job, run, slot, attempt, fencing token,
payload) and these headers:

``Idempotency-Key: <tenant>/<job_id>:<scheduled_for ms>``   the same for every attempt of a run
``X-Cronlog-Run-Id``, ``X-Cronlog-Attempt``, ``X-Cronlog-Fencing-Token``

How an answer is classified:

=============================================  =============================================
2xx                                            succeeded
408, 429, 5xx (``Retry-After`` honoured)       failed, transient: retried with backoff
other 4xx                                      failed, permanent: dead-lettered at once
the request could not be sent ("unreachable")  failed, transient (the target never saw it)
timeout, 504, connection lost after sending    failed, transient and **ambiguous**: it may
                                               have taken effect, so a critical job
                                               dead-letters
refused by the egress policy                   failed, permanent ("egress policy: ...")
a secret the headers name is missing           failed, permanent (names the secret)
=============================================  =============================================

What a team reads in ``run.error`` is bounded: the status and at most ``error_excerpt_bytes``
of the answer's body (200 unless the operator says otherwise; 0: none), control characters
made spaces. A call that could not be made says "unreachable", whatever the reason (refused,
no route, timed out connecting, no such name), so a team learns nothing of ports it may not
reach; the node's log keeps the details for the operator.

Where a call may go is the operator's egress policy (``core/egress.py``), applied here on the
address actually connected to (``node/egress.py``).

**Asking what became of an attempt** (``core.asking``). A critical run whose attempt's outcome
is unknown and whose target names a ``status_url`` is asked about: ``GET <status_url>`` with
the target's own headers (its credentials, secrets read as for a call) and

``X-Cronlog-Ask-Key: <the attempt's Idempotency-Key>``  ``X-Cronlog-Ask-Token: <its token>``
``X-Cronlog-Run-Id``

never ``Idempotency-Key``, so nothing takes the ask for a call. A guard (the SDK's
``cronlog_client.target``) answers ``200 {"outcome": "succeeded" | "failed" | "never_seen" |
"in_progress" | "unknown", "status": <the handler's status, succeeded only>}``; anything else
(another status, another body, unreachable, no answer within ``ASK_TIMEOUT_S``, refused by the
egress policy) is ``no_answer``.

A Kafka-topic target gets the same body produced to the topic (key: the job id, headers as
above); it succeeded once the broker acknowledged it (``acks=all``). The topic must be one the
egress policy grants the team, and never one of the cluster's own.

A :class:`Caller` holds what calls share (the connection pool, the Kafka producer, the policy,
the secrets) and lives on one asyncio loop: the executors' own, or an executor process's
(:mod:`node.call_process`). :class:`CallerConfig` is everything it is built from, so an
executor process is built the same way as the in-process caller.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
import unicodedata
from dataclasses import dataclass
from typing import Any, assert_never

import aiohttp
import msgspec
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace
from yarl import URL

from core import events as ev
from core.commands import Outcome
from core.egress import parse_host
from core.errors import InvalidDefinition
from core.events import OutcomeAnswer
from core.ids import idempotency_key, team_id
from core.jobs import (
    HttpTarget,
    JobSpec,
    KafkaTarget,
    PullTarget,
    validate_headers,
)
from node.calls import (
    MAX_ERROR,
    STARTING,
    UNREACHABLE,
    CallerConfig,
    FairGate,
    Result,
    classify,
    run_body,
    run_headers,
)
from node.egress import PolicyResolver, guarded_socket, refusal_in
from node.secrets import Secrets, SecretUnavailable

log = logging.getLogger(__name__)


ASK_TIMEOUT_S = 10.0  # an ask's call gives up after this (core.asking.ASK_WAIT_MS is longer)
ASK_KEY = "X-Cronlog-Ask-Key"
ASK_TOKEN = "X-Cronlog-Ask-Token"
MAX_ASK_ANSWER = 4096  # bytes of a status answer read


class _StatusAnswer(msgspec.Struct):
    outcome: str
    status: int | None = None


_status_answer = msgspec.json.Decoder(_StatusAnswer)
# what a guard may answer, as the decisions read it (NO_ANSWER is the caller's own)
_ANSWERS = {a.value: a for a in OutcomeAnswer if a is not OutcomeAnswer.NO_ANSWER}


@dataclass(frozen=True, slots=True)
class Answer:
    """What a target's status URL said about an attempt (``AnswerOutcome``'s fields)."""

    answer: OutcomeAnswer
    status: int | None = None
    detail: str = ""


def ask_headers(asked: ev.RunOutcomeAsked) -> dict[str, str]:
    return {
        ASK_KEY: idempotency_key(asked.job_id, asked.scheduled_for),
        ASK_TOKEN: str(asked.fencing_token),
        "X-Cronlog-Run-Id": team_id(asked.run_id),
    }


def read_answer(status: int, body: bytes) -> Answer:
    """A status URL's response as an answer: only a guard's 200 with its JSON says anything."""
    if status != 200:
        return Answer(OutcomeAnswer.NO_ANSWER, detail=f"the status URL answered {status}")
    try:
        said = _status_answer.decode(body)
    except msgspec.DecodeError:
        return Answer(OutcomeAnswer.NO_ANSWER, detail="the status URL's answer is not a status")
    answer = _ANSWERS.get(said.outcome)
    if answer is None:
        return Answer(OutcomeAnswer.NO_ANSWER, detail="the status URL's answer is not a status")
    code = said.status if answer is OutcomeAnswer.SUCCEEDED else None
    return Answer(answer, code if code is not None and 100 <= code <= 599 else None)


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


class Caller:
    """Makes calls on the loop it was opened on."""

    def __init__(self, config: CallerConfig, producer_factory: Any = None) -> None:
        self.config = config
        self.egress = config.egress
        self._secrets = Secrets(config.secrets_dir)
        self._excerpt_bytes = config.error_excerpt_bytes
        self._kafka_bootstrap = config.kafka_bootstrap
        self._kafka_config = dict(config.kafka_config)
        self._producer_factory = producer_factory
        self._producer: Any = None
        self._session: aiohttp.ClientSession | None = None
        # The policy is fixed for the node's life, and jobs call the same URLs again and again.
        self._destinations = functools.lru_cache(maxsize=4096)(self._destination)
        # Calls start one team after another, STARTING at a time (node.calls.FairGate).
        self._starting = FairGate(STARTING)

    async def open(self) -> None:
        # aiohttp rather than httpx here: on a 2-core machine a node made 3.5 times the calls
        # per second with it (bench/bench_fanout.py; docs/architecture.md).
        # The pool holds as many connections as the node has room for calls. Host names are
        # resolved, checked and connected to by address (node/egress.py); no proxy from the
        # environment is used (trust_env stays off), so the address checked is the peer.
        connector = _Connector(
            limit=self.config.max_connections,
            limit_per_host=0,
            resolver=PolicyResolver(self.egress, self.config.resolver),
            socket_factory=guarded_socket(self.egress),
        )
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, trust_env=False
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 5)

    async def call(self, lease: ev.LeaseGranted, spec: JobSpec) -> Result:
        """Make one attempt's call to ``spec``'s target and classify what came back (on the
        caller's loop)."""
        target = spec.target
        await self._starting.enter(lease.tenant)
        start = _Start(self._starting)
        try:
            match target:
                case HttpTarget():
                    result = await self._http(target, lease, spec, start)  # it keeps the timeout
                    return _went_out(result, lease, start)
                case KafkaTarget():
                    result = await asyncio.wait_for(
                        self._kafka(target, lease, spec, start), spec.timeout_sec
                    )
                    return _went_out(result, lease, start)
                case PullTarget():
                    pass  # the pool's workers run it; a lease for one here is a bug, said below
                case _:
                    assert_never(target)
        except TimeoutError:
            return Result(Outcome.FAILED, f"timed out after {spec.timeout_sec} s", ambiguous=True)
        except Exception:
            # A bug here, not an answer: the call may or may not have gone out.
            log.exception("run %s: the call failed unexpectedly", lease.run_id)
            return Result(Outcome.FAILED, "the executor failed during the call", ambiguous=True)
        finally:
            start.over()
        return Result(Outcome.FAILED, f"no executor for {type(target).__name__}", permanent=True)

    async def _http(
        self, target: HttpTarget, lease: ev.LeaseGranted, spec: JobSpec, start: _Start
    ) -> Result:
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
        progress = _Progress(start)
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

    async def ask(self, asked: ev.RunOutcomeAsked, spec: JobSpec) -> Answer:
        """Ask ``spec``'s target's status URL what became of the attempt ``asked`` names (see
        the module), within the egress policy as any call."""
        assert self._session is not None
        target = spec.target
        if not isinstance(target, HttpTarget) or not target.status_url:
            return Answer(OutcomeAnswer.NO_ANSWER, detail="the target has no status_url")
        url, reason = self._destinations(target.status_url)
        if reason is not None:
            log.info("run %s: egress policy: %s", asked.run_id, reason)
            return Answer(OutcomeAnswer.NO_ANSWER, detail=f"egress policy: {reason}"[:MAX_ERROR])
        try:
            headers = self._target_headers(target, asked.tenant)
        except (SecretUnavailable, InvalidDefinition) as err:
            return Answer(OutcomeAnswer.NO_ANSWER, detail=str(err)[:MAX_ERROR])
        headers.update(ask_headers(asked))
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                async with self._session.get(
                    url,
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S),
                ) as response:
                    body = await response.content.read(MAX_ASK_ANSWER)
                    return read_answer(response.status, body)
        except (TimeoutError, aiohttp.ClientError) as err:
            refusal = refusal_in(err)
            if refusal is not None:
                log.info("run %s: egress policy: %s", asked.run_id, refusal)
                detail = f"egress policy: {refusal}"[:MAX_ERROR]
            elif isinstance(err, TimeoutError):
                detail = f"the status URL did not answer within {ASK_TIMEOUT_S} s"
            else:
                log.debug("run %s: ask failed: %r", asked.run_id, err)
                detail = f"the status URL: {UNREACHABLE}"
            return Answer(OutcomeAnswer.NO_ANSWER, detail=detail)

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
        headers = self._target_headers(target, lease.tenant)
        headers.update(run_headers(lease))
        headers["Content-Type"] = "application/json"
        return headers

    def _target_headers(self, target: HttpTarget, tenant: str) -> dict[str, str]:
        """The target's own headers (its credentials), its secrets read."""
        validate_headers(target.headers)  # a job stored before these checks existed
        headers: dict[str, str] = {}
        for name, value in target.headers.items():
            if isinstance(value, str):
                headers[name] = value
            else:
                headers[name] = self._secrets.read(tenant, value.from_file)
        return headers

    async def _kafka(
        self, target: KafkaTarget, lease: ev.LeaseGranted, spec: JobSpec, start: _Start
    ) -> Result:
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
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str | None] = loop.create_future()

        def settle(error: str | None) -> None:
            if not done.done():
                done.set_result(error)

        def delivered(err: Any, _msg: Any) -> None:
            loop.call_soon_threadsafe(settle, None if err is None else str(err))

        self._producer.produce(
            target.topic,
            key=team_id(lease.job_id).encode(),
            value=run_body(lease, spec),
            headers=list(run_headers(lease).items()),
            on_delivery=delivered,
        )
        start.over(went_out=True)  # it is in the producer's hands
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


def _went_out(result: Result, lease: ev.LeaseGranted, start: _Start) -> Result:
    """``result`` with when its call went out, if it did and was armed ahead (its start is
    reported: :func:`node.calls.call_at_start`)."""
    if lease.start_at is None or start.went_out_ms is None:
        return result
    return msgspec.structs.replace(result, went_out_ms=start.went_out_ms)


class _Start:
    """One call's place among those starting (``Caller._starting``), given up once: when it has
    its connection (it went out: ``went_out_ms`` is when), or when it ends without one."""

    __slots__ = ("_gate", "went_out_ms")

    def __init__(self, gate: FairGate) -> None:
        self._gate: FairGate | None = gate
        self.went_out_ms: int | None = None

    def over(self, went_out: bool = False) -> None:
        gate, self._gate = self._gate, None
        if gate is None:
            return
        if went_out:
            self.went_out_ms = round(time.time() * 1000)
        gate.leave()


class _Progress:
    """How far one call got: once connected, the request goes out at once, so a call that
    fails after this may have reached the target; and its start is over."""

    __slots__ = ("connected", "start")

    def __init__(self, start: _Start) -> None:
        self.connected = False
        self.start = start


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
            progress.start.over(went_out=True)
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
