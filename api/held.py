"""Requests a team holds open on a node: claims that long-poll and event streams.

Each waits without costing a thread (``projections.wakeups``), but each holds a connection and
a little memory for as long as it lasts, so a team holds at most its limit of each at once
(``max_waiting_claims``, ``max_event_streams``; ``api/limits.py``). One over the limit is
answered 429 at once, with ``Retry-After``, and changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from api.errors import ApiError


class Held:
    """Open requests per (kind, tenant); used from the event loop's thread only."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], int] = {}

    def count(self, kind: str, tenant: str) -> int:
        return self._open.get((kind, tenant), 0)

    @contextlib.contextmanager
    def hold(self, kind: str, tenant: str, limit: int) -> Iterator[None]:
        """Count one ``kind`` request of ``tenant`` open while the block runs; 429 if the team
        holds ``limit`` of them already."""
        key = (kind, tenant)
        held = self._open.get(key, 0)
        if held >= limit:
            raise ApiError(
                429,
                "too_many_open",
                f"this team holds {held} {kind} open on this node, as many as it may; try again"
                " when one has ended",
                headers={"Retry-After": "1"},
            )
        self._open[key] = held + 1
        try:
            yield
        finally:
            left = self._open[key] - 1
            if left:
                self._open[key] = left
            else:
                del self._open[key]
