"""Time as a port. All of cronlog's instants are integer milliseconds since the Unix epoch (UTC).

``core`` never reads a clock: callers pass ``now``. The node runtime owns a :class:`Clock`;
tests drive :class:`FakeClock`.
"""

from __future__ import annotations

import time
from typing import Protocol

Millis = int

# The last instant cronlog speaks of, 9999-12-31T23:59:59.999Z (the end of RFC 3339's years):
# an instant given later is refused, and a job whose next slot would be later has none.
MAX_INSTANT: Millis = 253_402_300_799_999


class Clock(Protocol):
    def now_ms(self) -> Millis: ...


class SystemClock:
    """The one place that reads the wall clock."""

    def now_ms(self) -> Millis:
        return time.time_ns() // 1_000_000


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start_ms: Millis = 0) -> None:
        self._now = start_ms

    def now_ms(self) -> Millis:
        return self._now

    def advance(self, ms: Millis) -> Millis:
        if ms < 0:
            raise ValueError("a clock never goes backwards")
        self._now += ms
        return self._now

    def set(self, ms: Millis) -> None:
        if ms < self._now:
            raise ValueError("a clock never goes backwards")
        self._now = ms
