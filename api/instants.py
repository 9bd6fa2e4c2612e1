"""Instants at the edge: cronlog keeps int milliseconds (UTC); the API speaks RFC 3339.

Out: always UTC with milliseconds, ``2026-11-29T09:00:00.000Z``.
In: RFC 3339 with ``Z`` or an offset, ``2026-11-29T10:00:00+01:00``; a time without one is
refused, because "09:00" alone is a different instant in every timezone. Digits past the
millisecond are dropped (toward the past, so an instant never moves later than it was written).
"""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

from core.clock import Millis
from core.errors import InvalidDefinition

_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def to_rfc3339(ms: Millis) -> str:
    at = _EPOCH + dt.timedelta(milliseconds=ms)
    return (
        f"{at.year:04d}-{at.month:02d}-{at.day:02d}T"
        f"{at.hour:02d}:{at.minute:02d}:{at.second:02d}.{at.microsecond // 1000:03d}Z"
    )


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
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
