"""``GET /v1/stats``: a team's own scheduling figures over a window, for plots.

The read model keeps each team's figures a minute at a time (``projections/figures.py``); this
handler adds them up into ``step_min``-minute points over the last ``window_min`` minutes, the
quantiles read from the merged delay buckets. Every step of the window is a point, those with
nothing counted included, so a plot's time axis has no holes.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.edge import authenticate, json_response, query_int
from api.instants import to_rfc3339
from core.errors import InvalidDefinition
from projections.figures import MINUTE_MS, Minute, merged, quantile

MAX_WINDOW_MIN = 14 * 24 * 60  # the read model keeps 14 days
MAX_STEP_MIN = 24 * 60
MAX_POINTS = 1440
DEFAULT_WINDOW_MIN = 60


class StatsFigures(msgspec.Struct, kw_only=True):
    """What a team's runs did over a span of time."""

    started: int
    delay_p50_ms: float | None
    delay_p99_ms: float | None
    delay_max_ms: int | None
    delay_mean_ms: float | None
    succeeded: int
    failed: int
    retried: int
    dead: int
    cancelled: int
    skipped: int


class StatsPoint(StatsFigures, kw_only=True):
    """The figures of one step, from ``at`` on."""

    at: str


class StatsOut(msgspec.Struct, kw_only=True):
    """A team's figures over the window ``[since, until)``, a point every ``step_min``."""

    since: str
    until: str
    step_min: int
    points: list[StatsPoint]
    total: StatsFigures
    runs_by_state: dict[str, int]


def default_step(window_min: int) -> int:
    """The smallest step that keeps a window within 120 points."""
    return max(1, -(-window_min // 120))


def _figures(minute: Minute) -> StatsFigures:
    p50, p99 = quantile(minute, 0.5), quantile(minute, 0.99)
    return StatsFigures(
        started=minute.started,
        delay_p50_ms=None if p50 is None else round(p50, 1),
        delay_p99_ms=None if p99 is None else round(p99, 1),
        delay_max_ms=minute.delay_max_ms if minute.started else None,
        delay_mean_ms=round(minute.delay_sum_ms / minute.started, 1) if minute.started else None,
        succeeded=minute.succeeded,
        failed=minute.failed,
        retried=minute.retried,
        dead=minute.dead,
        cancelled=minute.cancelled,
        skipped=minute.skipped,
    )


async def team_stats(request: Request) -> Response:
    call = authenticate(request)
    window = query_int(request, DEFAULT_WINDOW_MIN, MAX_WINDOW_MIN, "window_min")
    step = query_int(request, default_step(window), MAX_STEP_MIN, "step_min")
    if -(-window // step) > MAX_POINTS:
        raise InvalidDefinition(
            "step_min", f"gives more than {MAX_POINTS} points over {window} minutes"
        )
    now = call.scheduler.now_ms()
    until = now - now % MINUTE_MS + MINUTE_MS  # the current minute is the last one shown
    since = until - window * MINUTE_MS
    history = call.scheduler.reader
    minutes = await history.minutes(call.tenant, since, until)
    step_ms = step * MINUTE_MS
    buckets: list[list[Minute]] = [[] for _ in range(-(-window // step))]
    for at, minute in minutes:
        buckets[(at - since) // step_ms].append(minute)
    points = [
        StatsPoint(
            at=to_rfc3339(since + i * step_ms), **msgspec.structs.asdict(_figures(merged(b)))
        )
        for i, b in enumerate(buckets)
    ]
    return json_response(
        StatsOut(
            since=to_rfc3339(since),
            until=to_rfc3339(until),
            step_min=step,
            points=points,
            total=_figures(merged(m for _, m in minutes)),
            runs_by_state=await history.counts(call.tenant),
        )
    )
