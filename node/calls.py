"""What a call is made from and what it comes to, apart from the HTTP client that makes it
(:mod:`node.caller`): the node's own process reads these (the executors' admission and the
outcomes they record) and imports the client only when it makes calls itself, not when an
executor process does (:mod:`node.call_process`), which keeps aiohttp out of a node's start."""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec

from core.commands import Outcome
from core.egress import EgressPolicy
from core.events import LeaseGranted
from core.ids import idempotency_key, team_id
from core.jobs import JobSpec, payload_of
from core.turns import Turns
from node.admission import DEFAULT_ROOM

if TYPE_CHECKING:
    from aiohttp.abc import AbstractResolver

MAX_ERROR = 500
DEFAULT_ERROR_EXCERPT = 200
MAX_ERROR_EXCERPT = 1024  # every failed attempt's error is kept in the log for good
UNREACHABLE = "unreachable"
# Calls one caller (a process) has starting at once: resolving, checking and connecting, before
# the request goes out (FairGate). On loopback a start costs about a third of a millisecond.
STARTING = 512
NOT_CALLED = "not called: the lease ran out before the call"
# The cycle collector's thresholds in the processes that make a herd's calls (a node's, an
# executor process's): a herd allocates tens of thousands of short-lived objects a second, and at
# Python's default (a collection every 700 net allocations, a full one walking every live object
# by turns) an executor process holding a herd's 50,000 armed calls spent half its CPU
# collecting (bench/results/perfherd.md, "The executor process and the cycle collector").
COLLECTOR_THRESHOLDS = (50_000, 20, 20)


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


class FairGate:
    """Calls starting at once, at most ``limit``, the waiting ones let in one team after
    another (:class:`core.turns.Turns`): a call is *starting* from its turn until it has a
    connection (or has ended), after which it only waits for its answer and holds nothing here.

    A herd of one team's 5,000 calls handed over together would otherwise all be connecting at
    once, and another team's call handed over a moment later would wait behind every one of
    them (measured: up to 0.75 s on a 2-core machine); here it waits behind at most one start
    of each team, and a herd's connections are made ``limit`` at a time. For the loop the
    caller runs on; not thread-safe."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._free = limit
        self._waiting: Turns[asyncio.Future[None]] = Turns()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def enter(self, team: str) -> None:
        """Wait for ``team``'s turn to start a call; :meth:`leave` once it has started."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(team, turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave()  # let in as it was cancelled: the place goes to the next
            raise

    def leave(self) -> None:
        """A start has ended: the next waiting call's turn, if any."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # a waiter cancelled meanwhile has no turn to take
                turn.set_result(None)
                return
        self._free += 1


class Result(msgspec.Struct, frozen=True):
    outcome: Outcome
    error: str = ""
    permanent: bool = False
    ambiguous: bool = False
    retry_after_ms: int | None = None
    # a call armed ahead (its lease's ``start_at``): how long after that instant it started
    started_late_ms: int | None = None
    # a call armed ahead: when it went out (its connection had, or its record handed to the
    # producer), in ms by the clock of the process that made it; None if it never went out
    went_out_ms: int | None = None


async def wait_for_start(lease: LeaseGranted) -> int | None:
    """Wait until ``lease``'s ``start_at`` (a call armed ahead) by this process's clock, never
    before it; then how late the start is, in ms (None for a lease that starts at once). The
    lease was decided on this machine's clock, so the wait is the wall-clock difference, slept
    on the monotonic clock."""
    if lease.start_at is None:
        return None
    wait_ms = lease.start_at - time.time() * 1000
    if wait_ms > 0:
        await asyncio.sleep(wait_ms / 1000)
    # a sleep may end a hair early by the wall clock (it counts on the monotonic one)
    while (now := time.time() * 1000) < lease.start_at:
        await asyncio.sleep((lease.start_at - now) / 1000)
    return max(0, round(now - lease.start_at))


class _Calls(Protocol):
    async def call(self, lease: LeaseGranted, spec: JobSpec) -> Result: ...


async def call_at_start(caller: _Calls, lease: LeaseGranted, spec: JobSpec) -> Result:
    """``caller``'s call for ``lease``, made at the lease's start (a call armed ahead waits for
    it: :func:`wait_for_start`), the result saying how late that start was: when the call went
    out, not when its wait ended. Between the two a busy process's call waits for its team's
    turn and its connection, and a start taken at the wait's end said on time a call that
    reached its target seconds late (``bench.flood_three``)."""
    late_ms = await wait_for_start(lease)
    result = await caller.call(lease, spec)
    if late_ms is None:
        return result
    assert lease.start_at is not None  # a wait that ended has an instant it waited for
    if result.went_out_ms is not None:
        late_ms = max(late_ms, result.went_out_ms - lease.start_at)
    return msgspec.structs.replace(result, started_late_ms=late_ms)


def classify(status: int, retry_after: str | None = None, text: str = "") -> Result:
    """An HTTP answer as an attempt's outcome (the table in :mod:`node.caller`'s docstring)."""
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


@dataclass(frozen=True)
class CallerConfig:
    """What a :class:`Caller` is built from (picklable: an executor process gets a copy).

    ``egress``: where calls may go (default: the public internet only). ``secrets_dir``: where
    header secret references are read (None: the node offers none). ``max_connections``: the
    connection pool's size. ``resolver``: what host names are resolved with before the policy
    filters them (default: the system's; in-process callers only)."""

    egress: EgressPolicy = field(default_factory=EgressPolicy)
    secrets_dir: Path | None = None
    error_excerpt_bytes: int = DEFAULT_ERROR_EXCERPT
    max_connections: int = DEFAULT_ROOM
    kafka_bootstrap: str | None = None
    kafka_config: tuple[tuple[str, str], ...] = ()
    resolver: AbstractResolver | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.error_excerpt_bytes <= MAX_ERROR_EXCERPT:
            raise ValueError(f"error_excerpt_bytes must be between 0 and {MAX_ERROR_EXCERPT}")


# -- what a push run is sent (an HTTP call's body and headers; a Kafka record's) --------------


def iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def run_body(lease: LeaseGranted, spec: JobSpec) -> bytes:
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
            "payload": payload_of(spec),
        }
    )


def run_headers(lease: LeaseGranted) -> dict[str, str]:
    return {
        "Idempotency-Key": idempotency_key(lease.job_id, lease.scheduled_for),
        "X-Cronlog-Run-Id": team_id(lease.run_id),
        "X-Cronlog-Attempt": str(lease.attempt),
        "X-Cronlog-Fencing-Token": str(lease.fencing_token),
    }
