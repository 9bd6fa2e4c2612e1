"""Instants at the edge: cronlog keeps int milliseconds (UTC); the API speaks RFC 3339.

Out: always UTC with milliseconds, ``2026-11-29T09:00:00.000Z``.
In: RFC 3339 with ``Z`` or an offset, ``2026-11-29T10:00:00+01:00``; a time without one is
refused, because "09:00" alone is a different instant in every timezone. Digits past the
millisecond are dropped (toward the past, so an instant never moves later than it was written).
Instants from 1970 to the end of year 9999 (UTC) are accepted; every instant cronlog shows lies
in that range, so it can always be written back out.
"""

from __future__ import annotations

import datetime as dt
import re
from functools import lru_cache
from zoneinfo import ZoneInfo

from core.clock import MAX_INSTANT, Millis
from core.errors import InvalidDefinition

# ASCII digits only: ``\d`` would take any script's digits.
RFC3339 = (
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
_RFC3339 = re.compile(RFC3339)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


_DAY_MS = 86_400_000
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


@lru_cache(maxsize=1024)
def _date(day: int) -> str:
    """The UTC date ``day`` days after 1970-01-01, ``YYYY-MM-DD``."""
    return dt.date.fromordinal(_EPOCH_ORDINAL + day).isoformat()


def to_rfc3339(ms: Millis) -> str:
    # Every answer holds a few instants, mostly of a few days: the date is remembered, the
    # time of day is arithmetic (a datetime built per instant was a twentieth of a create).
    day, rest = divmod(ms, _DAY_MS)
    seconds, milli = divmod(rest, 1000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{_date(day)}T{hour:02d}:{minute:02d}:{second:02d}.{milli:03d}Z"


def to_local(ms: Millis, zone: ZoneInfo) -> str:
    """``ms`` as a wall-clock reading in ``zone`` with offset: ``2026-03-08T03:00:00-04:00``."""
    return (_EPOCH + dt.timedelta(milliseconds=ms)).astimezone(zone).isoformat(timespec="seconds")


def parse_rfc3339(text: str, field: str) -> Millis:
    """``text`` as epoch milliseconds; ``InvalidDefinition(field)`` if it is not RFC 3339."""
    match = _RFC3339.match(text)
    if match is None:
        raise InvalidDefinition(
            field,
            f"{text!r} is not an RFC 3339 instant with Z or an offset, e.g. 2026-11-29T09:00:00Z",
        )
    day, time, fraction, offset = match.groups()
    micros = (fraction or "").ljust(6, "0")[:6]
    zone = "+00:00" if offset in ("Z", "z") else offset
    try:
        at = dt.datetime.fromisoformat(f"{day}T{time}.{micros}{zone}")
    except ValueError as e:
        raise InvalidDefinition(field, f"{text!r} is not a valid instant: {e}") from None
    delta = at - _EPOCH
    ms = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    if not 0 <= ms <= MAX_INSTANT:
        raise InvalidDefinition(
            field, f"{text!r} is not between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z"
        )
    return ms
