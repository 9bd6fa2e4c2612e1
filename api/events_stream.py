"""``GET /v1/events``: the audit stream over HTTP, as Server-Sent Events.

A team's token reads its own team's events; the operator's token reads every team's (or one
team's, ``tenant=``). Every event is the one the log holds (``docs/events.md``), wrapped as
``tools.replay dump`` prints it::

    id: 1204-0-77-310
    data: {"partition":0,"offset":1203,"event":{"type":"LeaseGranted","at":...}}

Why Server-Sent Events rather than JSON lines: the format carries a resume point with every
event (``id``) and says how to resume (a client sends it back as ``Last-Event-ID``, which
browsers' ``EventSource`` does by itself), comments keep an idle connection alive through
proxies, and the status UI and any HTTP client can read it without a library of ours.

**Where to start.** ``cursor`` (or the ``Last-Event-ID`` header) resumes right after the event
that carried it; else ``from``: ``start``, ``end`` (only what comes next), or an RFC 3339
instant (each partition from its first event decided at or after it, found by bisecting the
partition's offsets on the events' ``at``). The cursor is the next offset of every partition
(``1204-0-77-310``), so resuming loses and repeats nothing, whatever the filter. Events of one
partition come in the log's order; partitions are read in turn, so two events of different
jobs may come in another order than they were decided.

**Following.** Without ``follow`` the stream ends once it has reached the end the log had when
it started (or after ``limit`` events): a read of history. With ``follow=true`` it stays open
and sends each new event as the read model folds it (woken by ``projections.wakeups``, never
polling; a partition whose history is kept by another node, ``--history-on owner``, folds
nothing here, so for those the stream looks at the log's end every ``ELSEWHERE_S``), with a
comment every ``KEEPALIVE_S`` when idle (and the cursor, when filtered-out
events moved it). It ends when the server stops; a client resumes with the last ``id``.

**Bounded.** A stream reads at most ``READ_BATCH`` records of one partition at a time, and
sends them before it reads more: a consumer that reads slowly holds its own stream back (the
server's socket buffer fills and the next send waits) and nothing else, and costs at most one
batch of memory. A team holds at most ``max_event_streams`` open on a node (``api.held``).

It reads through the node's own log handle: on the embedded log while the node runs, and on
Kafka from any node, every partition, whoever owns it.
"""

from __future__ import annotations

import contextlib
import re
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from api.auth import Tokens
from api.edge import authenticate, query_int
from api.errors import ApiError, bad_request
from api.held import Held
from api.instants import RFC3339, parse_rfc3339
from api.limits import Limits
from api.scheduler import Scheduler
from core.errors import InvalidDefinition
from core.events import AnyEvent
from core.ids import log_job_id
from core.jobs import JOB_ID, TENANT
from eventlog.port import Record

READ_BATCH = 100  # records of one partition read (and held) at a time
KEEPALIVE_S = 15.0
# A partition whose history another node keeps (--history-on owner) folds nothing here to wake
# a stream: a following stream looks at where that partition's log ends this often.
ELSEWHERE_S = 0.25
RETRY_MS = 2000  # how long a client waits before it reconnects (the ``retry:`` field)
DEFAULT_LIMIT = 1000  # events a stream that does not follow sends at most, unless told
MAX_LIMIT = 100_000
MAX_BISECT_STEPS = 70  # more than enough for any offset (2**64)
CURSOR = r"^[0-9]{1,18}(-[0-9]{1,18}){0,1023}$"
LAST_EVENT_ID = r"^([0-9]{1,18}(-[0-9]{1,18}){0,1023})?$"  # empty: a client with no id yet
FROM = r"^(start|end|" + RFC3339.strip("^$") + r")$"
_CURSOR = re.compile(CURSOR)
OPERATOR = "the operator"


@dataclass(frozen=True, slots=True)
class Reader:
    """Who reads: a team (its own events), or the operator (``tenant`` None: every team's)."""

    tenant: str | None
    key: str  # whose streams are counted together
    max_streams: int


def _reader(request: Request, operator: Tokens | None) -> Reader:
    authorization = request.headers.get("authorization")
    if operator is not None and operator.tenant_of(authorization) is not None:
        limits: Limits = request.state.limits
        wanted = request.query_params.get("tenant")
        if wanted is not None and not TENANT.match(wanted):
            raise bad_request("tenant", "must be 1-64 characters of A-Z a-z 0-9 _ . -")
        return Reader(wanted, OPERATOR, limits.defaults.max_event_streams)
    call = authenticate(request)
    wanted = request.query_params.get("tenant")
    if wanted is not None and wanted != call.tenant:
        raise ApiError(403, "forbidden", "a team's token reads its own team's events only")
    return Reader(call.tenant, call.tenant, call.limits.max_event_streams)


def _follow(request: Request) -> bool:
    value = request.query_params.get("follow", "false").lower()
    if value not in ("true", "false"):
        raise bad_request("follow", "must be true or false")
    return value == "true"


def parse_cursor(text: str, partitions: int, field: str) -> list[int]:
    if not _CURSOR.match(text):
        raise bad_request(field, "must be the id of an event this stream sent")
    offsets = [int(part) for part in text.split("-")]
    if len(offsets) != partitions:
        raise InvalidDefinition(
            field, f"names {len(offsets)} partitions; this log has {partitions}"
        )
    return offsets


def format_cursor(offsets: list[int]) -> str:
    return "-".join(map(str, offsets))


async def _first_at_or_after(scheduler: Scheduler, partition: int, instant: int) -> int:
    """The offset of the partition's first event decided at or after ``instant`` (its end if
    none): a bisection over offsets, reading one record a step. ``at`` grows along a partition
    with the clock of whichever node owned it, so this is exact while their clocks agree."""
    decoder = scheduler.events_decoder
    low, high = 0, await run_in_threadpool(scheduler.events_end, partition)
    for _ in range(MAX_BISECT_STEPS):
        if low >= high:
            break
        middle = (low + high) // 2
        found = await run_in_threadpool(scheduler.read_events, partition, middle, 1)
        if not found:
            high = middle
            continue
        event = decoder.decode(found[0])
        if event is None or event.at < instant:
            low = found[0].offset + 1
        else:
            high = middle
    return low


async def _start(request: Request, scheduler: Scheduler, follow: bool) -> list[int]:
    partitions = scheduler.num_partitions
    # A Last-Event-ID that is not a cursor is refused even beside a cursor that wins over it:
    # the request is malformed either way.
    resumed = (request.headers.get("last-event-id") or "").strip()
    after = parse_cursor(resumed, partitions, "Last-Event-ID") if resumed else None
    given = request.query_params.get("cursor")
    if given is not None:
        return parse_cursor(given, partitions, "cursor")
    if after is not None:
        return after
    start = request.query_params.get("from", "end" if follow else "start")
    if start == "start":
        return [0] * partitions
    if start == "end":
        return [await run_in_threadpool(scheduler.events_end, p) for p in range(partitions)]
    if not re.match(FROM, start):
        raise bad_request("from", "must be start, end or an RFC 3339 instant")
    instant = parse_rfc3339(start, "from")
    return [await _first_at_or_after(scheduler, p, instant) for p in range(partitions)]


def operator_tokens(operator_token: str | None) -> Tokens | None:
    """What the app keeps as ``operator``: the token that reads every team's events."""
    return Tokens({operator_token: OPERATOR}) if operator_token else None


def _selects(reader: Reader, job: str | None) -> Callable[[AnyEvent], bool]:
    tenant = reader.tenant
    if tenant is None:
        return lambda event: True
    if job is None:
        return lambda event: event.tenant == tenant
    scoped = log_job_id(tenant, job)
    # a job from before ids were scoped is named by its bare id (core.ids)
    return lambda event: event.tenant == tenant and event.job_id in (scoped, job)


class _Ends:
    """Where partitions' logs end, read at most once an ``ELSEWHERE_S`` for all the streams
    of a node that follow them (each would otherwise ask the log, a broker on Kafka, four
    times a second a partition)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._read: dict[int, tuple[float, int]] = {}

    async def end(self, partition: int) -> int:
        now = time.monotonic()
        read = self._read.get(partition)
        if read is not None and now - read[0] < ELSEWHERE_S:
            return read[1]
        end = await run_in_threadpool(self._scheduler.events_end, partition)
        self._read[partition] = (now, end)
        return end


_ENDS: weakref.WeakKeyDictionary[Any, _Ends] = weakref.WeakKeyDictionary()


def _ends_of(scheduler: Scheduler) -> _Ends:
    ends = _ENDS.get(scheduler)
    if ends is None:
        ends = _ENDS[scheduler] = _Ends(scheduler)
    return ends


def _data(record: Record) -> bytes:
    """The SSE ``data`` of one event: on one line whatever the record holds."""
    value = record.value
    if b"\n" in value or b"\r" in value:
        value = msgspec.json.encode(msgspec.json.decode(value))
    return b'{"partition":%d,"offset":%d,"event":%s}' % (record.partition, record.offset, value)


async def events(request: Request) -> Response:
    """``GET /v1/events``."""
    reader = _reader(request, request.state.operator)
    scheduler: Scheduler = request.state.scheduler
    follow = _follow(request)
    job = request.query_params.get("job")
    if job is not None:
        if not JOB_ID.match(job):
            raise bad_request("job", "must be 1-64 characters of A-Z a-z 0-9 _ -")
        if reader.tenant is None:
            raise InvalidDefinition("job", "the operator names a job with its tenant= too")
    # following: no end but the server's, unless asked
    limit = query_int(request, 0 if follow else DEFAULT_LIMIT, MAX_LIMIT, "max_events")
    held: Held = request.state.held
    await held.first_share("event streams", reader.key, reader.max_streams)
    holding = held.hold("event streams", reader.key, reader.max_streams)
    holding.__enter__()
    try:
        cursor = await _start(request, scheduler, follow)
        ends = [await run_in_threadpool(scheduler.events_end, p) for p in range(len(cursor))]
    except BaseException:
        holding.__exit__(None, None, None)
        raise
    stream = _stream(scheduler, cursor, ends, follow, _selects(reader, job), limit)
    return StreamingResponse(
        _releasing(stream, holding),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _releasing(
    stream: AsyncIterator[bytes], holding: contextlib.AbstractContextManager[None]
) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            yield chunk
    finally:
        holding.__exit__(None, None, None)


async def _stream(
    scheduler: Scheduler,
    cursor: list[int],
    ends: list[int],
    follow: bool,
    selects: Callable[[AnyEvent], bool],
    limit: int,
) -> AsyncIterator[bytes]:
    """The stream's bytes, from ``cursor``. ``ends``: the log's end offsets at the start, where
    a stream that does not ``follow`` stops; ``limit``: the most events to send (0: none)."""
    wakeups = scheduler.wakeups
    decoder = scheduler.events_decoder
    partitions = len(cursor)
    until = None if follow else list(ends)
    # Where each partition has more to read, as far as is known: the end at the start, then
    # the read model's positions as it folds.
    known = list(ends)
    sent = 0
    sent_cursor = format_cursor(cursor)
    elsewhere: list[int] = []
    idle_s = 0.0
    yield f"retry: {RETRY_MS}\n\n".encode()
    while True:  # each turn reads what is new, or waits for a wake (bounded by the keepalive)
        seen = wakeups.events.version
        if until is None:
            kept = scheduler.reader.positions()
            elsewhere = [p for p in range(partitions) if p not in kept]
            for p, position in kept.items():
                if p < partitions:
                    known[p] = max(known[p], position)
            for p in elsewhere:
                known[p] = max(known[p], await _ends_of(scheduler).end(p))
        progressed = False
        for p in range(partitions):
            end = known[p] if until is None else until[p]
            if cursor[p] >= end:
                continue
            records = await run_in_threadpool(scheduler.read_events, p, cursor[p], READ_BATCH)
            if until is not None:
                records = [r for r in records if r.offset < until[p]]
            if not records:
                known[p] = cursor[p]  # nothing more to read there (Kafka's markers take offsets)
                if until is not None:
                    until[p] = cursor[p]
                continue
            progressed = True
            for record in records:
                cursor[p] = record.offset + 1
                event = decoder.decode(record)
                if event is None or not selects(event):
                    continue
                sent_cursor = format_cursor(cursor)
                yield b"id: " + sent_cursor.encode() + b"\ndata: " + _data(record) + b"\n\n"
                sent += 1
                if limit and sent >= limit:
                    return
        if progressed:
            idle_s = 0.0
            continue
        if until is not None or wakeups.closed:
            if until is not None and format_cursor(cursor) != sent_cursor:
                yield f"id: {format_cursor(cursor)}\n\n".encode()  # resume after the filtered
            return
        wait_s = min(ELSEWHERE_S, KEEPALIVE_S - idle_s) if elsewhere else KEEPALIVE_S - idle_s
        if await wakeups.sleep(wakeups.events, seen, wait_s):
            continue
        idle_s += wait_s
        if idle_s >= KEEPALIVE_S:
            # Idle: a comment keeps proxies from closing the connection, and an id alone moves
            # the client's resume point past events it was not sent (it dispatches nothing).
            idle_s = 0.0
            line = b": keepalive\n"
            if format_cursor(cursor) != sent_cursor:
                sent_cursor = format_cursor(cursor)
                line += b"id: " + sent_cursor.encode() + b"\n"
            yield line + b"\n"
