"""Requests a team holds open on a node: claims that long-poll and event streams.

Each waits without costing a thread (``projections.wakeups``), but each holds a connection and
a little memory for as long as it lasts, so a team holds at most its limit of each at once
(``max_waiting_claims``, ``max_event_streams``; ``api/limits.py``). One over the limit is
answered 429 at once, with ``Retry-After``, and changes nothing.

Across a cluster a team's limit is the whole group's: each member holds up to its share of it
(``core.shares``), which follows where the team's requests are held; a member alone holds the
whole limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

from api.errors import ApiError
from core.shares import PERIOD_MS, Shares, key_of

# The longest a request waits for its node's first share of its team's limit (the owner's
# answer through the log takes milliseconds); past it, the node's default part is enforced.
FIRST_GRANT_WAIT_S = PERIOD_MS / 1000


class Held:
    """Open requests per (kind, tenant); used from the event loop's thread only. With
    ``shares``, a team holds at most this member's share of its limit here."""

    def __init__(
        self, shares: Shares | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._open: dict[tuple[str, str], int] = {}
        self._shares = shares
        self._clock = clock

    def count(self, kind: str, tenant: str) -> int:
        return self._open.get((kind, tenant), 0)

    async def first_share(self, kind: str, tenant: str, limit: int) -> None:
        """Before :meth:`hold` on a node of several: if this node has no share yet of the
        team's limit of ``kind`` (the team was not served here lately), ask its owner now and
        wait for the answer (at most ``FIRST_GRANT_WAIT_S``), so the hold is decided by the
        share rather than by a guess."""
        if self._shares is None:
            return
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not granted.done():
                granted.set_result(None)

        def told() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(settle)

        key = _share_key(kind, tenant)
        if not self._shares.first_grant(key, limit, round(self._clock() * 1000), told):
            return
        try:
            await asyncio.wait_for(granted, FIRST_GRANT_WAIT_S)
        except TimeoutError:
            self._shares.stop_waiting(key, told)

    @contextlib.contextmanager
    def hold(self, kind: str, tenant: str, limit: int) -> Iterator[None]:
        """Count one ``kind`` request of ``tenant`` open while the block runs; 429 if the team
        holds ``limit`` of them already."""
        key = (kind, tenant)
        held = self._open.get(key, 0)
        share_key = _share_key(kind, tenant)
        here = limit
        if self._shares is not None:
            here = self._shares.count(share_key, limit, held, round(self._clock() * 1000))
        if held >= here:
            where = (
                "on this node, as many as it may"
                if here == limit
                else f"on this node, its share here of the {limit} it may hold across the cluster"
            )
            raise ApiError(
                429,
                "too_many_open",
                f"this team holds {held} {kind} open {where}; try again when one has ended",
                headers={"Retry-After": "1"},
            )
        self._open[key] = held + 1
        self._said(share_key, held + 1)
        try:
            yield
        finally:
            left = self._open[key] - 1
            if left:
                self._open[key] = left
            else:
                del self._open[key]
            self._said(share_key, left)

    def _said(self, share_key: str, holding: int) -> None:
        """Tell the shares what the team holds here now (said in the next ask)."""
        if self._shares is not None:
            self._shares.held(share_key, holding)


def _share_key(kind: str, tenant: str) -> str:
    """The key of a team's limit on requests of ``kind`` held open, among the shares."""
    return key_of(tenant, kind.replace(" ", "-"))
