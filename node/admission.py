"""Which run's call may start now: the node's room, each team's share, each downstream's rate.

The executors ask before every start (:meth:`Admission.reserve`); a run that may not start yet
waits here and is handed back later, its room already reserved, by :meth:`Admission.release`
(a call ended) or :meth:`Admission.due` (a rate limit has a token again). Three limits:

- **Room**: at most ``max_in_flight`` calls at once on the node.
- **A team's share**: at most ``max_per_tenant`` of them for one team (on a node of several,
  ``shares``: the team's cap across the cluster, of which this node holds its share, as the
  team's runs here want it; a run held back by it is looked at again each period). When room
  is short, the teams' queues are served in turn (round-robin), each team's most urgent run
  first (priority with ageing, the order pull claims use), so one team's burst waits behind
  itself.
- **Room kept for the others**: the last ``reserved`` calls of the room go only to teams that
  hold fewer than ``reserved_per_team`` calls. Turns share room only as calls end, and a team
  whose calls each hold a connection for minutes frees none for minutes: without a reserve, a
  team arriving after it would wait that long. With it, the teams that filled the open room
  leave the reserve alone, and every team with few calls in flight starts at once, up to
  ``reserved // reserved_per_team`` such teams together (:func:`default_reserve` is the node's
  rule: a tenth of the room, in shares of a hundredth).
- **A downstream's rate**: a job's HTTP target may say ``max_calls_per_sec``; the calls of one
  team to one origin (scheme, host, port) then share a token bucket of that rate, with a burst
  of one second's worth. A throttled run waits in its bucket, first come first served, and
  neither holds room nor blocks its team's other runs. On a node of several (``shares``), the
  rate is the cluster's: the bucket refills at this node's share of it (``core.shares``), and
  a throttled run looks again at least once a share's period.

Not thread-safe: the executors call it under their lock. Time is passed in as a clock
(``time.monotonic`` in the node, a fake one in tests).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.shares import PERIOD_MS, Shares, key_of


@dataclass(frozen=True, slots=True)
class RateLimit:
    key: tuple[str, str]  # (tenant, origin)
    per_sec: float


@dataclass(slots=True)
class Ticket:
    """A run asking to start: who to hand it back to, and what limits it counts against; once
    it waits, since when (the admission's clock) and why, for the report of a late start."""

    runner: Any  # the PartitionRunner to grant it to
    run_id: str
    tenant: str
    urgency: int  # smaller first: core.state.ageing_key
    limit: RateLimit | None = None
    waiting_since: float | None = None
    why: str = ""

    def waited(self, now: float) -> tuple[float, str] | None:
        """How long it waited and why (None: it did not)."""
        if self.waiting_since is None:
            return None
        return now - self.waiting_since, self.why


@dataclass(slots=True)
class _Bucket:
    per_sec: float
    tokens: float
    stamp: float
    waiting: deque[Ticket] = field(default_factory=deque)

    def refill(self, now: float) -> None:
        burst = max(1.0, self.per_sec)
        if self.tokens > burst:  # a share that shrank
            self.tokens = burst
        self.tokens = min(burst, self.tokens + (now - self.stamp) * self.per_sec)
        self.stamp = now

    def seconds_to_token(self) -> float:
        if self.per_sec <= 0:  # no share here for now: looked at again when it may have one
            return SHARE_LOOK_S
        return max(0.0, (1.0 - self.tokens) / self.per_sec)


# A throttled run on a node of several looks again this often: its share may have grown.
SHARE_LOOK_S = PERIOD_MS / 1000.0

# The node's room unless told (``cronlog serve --max-calls``): the seeds' 10,000 runs executing
# at once. What an open call costs is measured in docs/operations.md ("Calls in flight").
DEFAULT_ROOM = 10_000


def _cap_key(tenant: str) -> str:
    """The key of a team's cap on its calls in flight, among the limits' shares."""
    return key_of(tenant, "running-calls")


def default_reserve(max_in_flight: int) -> tuple[int, int]:
    """The node's room kept for the others, and how much of it one team may hold: a tenth of
    the room, in shares of a hundredth (10,000 calls: 1,000 kept, at most 100 a team, so ten
    teams with few calls start at once whatever the rest hold). None below ten calls of room."""
    reserved = max_in_flight // 10
    return reserved, max(1, max_in_flight // 100) if reserved else 0


class Admission:
    def __init__(
        self,
        max_in_flight: int,
        max_per_tenant: int | None = None,
        clock: Callable[[], float] | None = None,
        *,
        reserved: int = 0,
        reserved_per_team: int = 0,
    ) -> None:
        if max_in_flight < 1 or (max_per_tenant is not None and max_per_tenant < 1):
            raise ValueError("the executors' limits must be at least 1")
        if not 0 <= reserved < max_in_flight:
            raise ValueError("the room kept for the others must be less than the room")
        if reserved and reserved_per_team < 1:
            raise ValueError("a team's share of the room kept must be at least 1")
        self._clock = clock or time.monotonic
        self._max = max_in_flight
        self._max_per_tenant = max_per_tenant or max_in_flight
        self._open = max_in_flight - reserved  # the room any team may fill
        self._reserved_per_team = reserved_per_team
        self.in_flight = 0  # reserved or running calls
        self._by_tenant: dict[str, int] = {}
        self._queued: dict[str, list[tuple[int, int, Ticket]]] = {}  # waiting for room
        self._turns: deque[str] = deque()  # the teams with queued runs, in turn order
        self._arrivals = itertools.count()
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        # The buckets with runs waiting: all that due() and next_due_s() look at, so a call
        # ending costs nothing for the many origins nobody waits on.
        self._throttled: dict[tuple[str, str], _Bucket] = {}
        self._draining = False
        # This node's shares of the downstreams' rates and of each team's cap, on a node of
        # several (None: whole); ``on_share()`` is called when a team's first share of its cap
        # arrives (from the thread that took it), to look at its waiting runs again.
        self.shares: Shares | None = None
        self.on_share: Callable[[], None] = lambda: None

    # -- asking and giving back -------------------------------------------------------------

    def reserve(self, ticket: Ticket) -> bool:
        """Room for ``ticket``'s call now (taken), or False: it waits here until granted."""
        if self._draining:
            return False  # left pending: the partition's next owner starts it
        bucket = self._bucket(ticket.limit, asked=1)
        if bucket is not None and (bucket.waiting or bucket.tokens < 1.0):
            assert ticket.limit is not None
            ticket.waiting_since = self._clock()
            ticket.why = (
                f"its team's calls to {ticket.limit.key[1]} may start"
                f" {ticket.limit.per_sec:g} a second (max_calls_per_sec)"
            )
            self._throttle(ticket, bucket, first=False)
            return False
        if not self._queued.get(ticket.tenant) and self._has_room(ticket.tenant):
            self._take(ticket.tenant, bucket)
            return True
        ticket.waiting_since = self._clock()
        ticket.why = self._no_room(ticket.tenant)
        self._enqueue(ticket)
        return False

    def holds_few(self, tenant: str) -> bool:
        """Whether ``tenant`` holds few of the node's calls: no more than a team's share of
        the room kept for the others (a hundredth of the room when none is kept)."""
        few = self._reserved_per_team or max(1, self._max // 100)
        return self._by_tenant.get(tenant, 0) <= few

    def release(self, tenant: str) -> list[Ticket]:
        """A call of ``tenant`` ended (or a reservation went unused): the runs granted the
        freed room, their room reserved."""
        self.in_flight -= 1
        held = self._by_tenant[tenant] - 1
        if held:
            self._by_tenant[tenant] = held
        else:
            del self._by_tenant[tenant]
        self._holding(tenant, held)
        return self._grants()

    def due(self) -> list[Ticket]:
        """Throttled runs whose rate allows them now: those with room are granted (their room
        reserved); the others join their team's queue for room."""
        granted: list[Ticket] = []
        if self._draining:
            return granted
        now = self._clock()
        for key, bucket in list(self._throttled.items()):
            self._share_of(bucket)
            bucket.refill(now)
            while bucket.waiting and bucket.tokens >= 1.0:
                ticket = bucket.waiting.popleft()
                if not self._queued.get(ticket.tenant) and self._has_room(ticket.tenant):
                    self._take(ticket.tenant, bucket)
                    granted.append(ticket)
                else:
                    self._enqueue(ticket)  # it takes its token when its turn for room comes
                    break  # the token stays for it
            if not bucket.waiting:
                del self._throttled[key]
        if self.shares is not None:  # a team's share of its cap may have grown
            granted += self._grants()
        return granted

    def next_due_s(self) -> float | None:
        """Seconds until a throttled run's bucket has a token again; None if none waits."""
        now = self._clock()
        waits = []
        for bucket in self._throttled.values():
            self._share_of(bucket)
            bucket.refill(now)
            waits.append(bucket.seconds_to_token())
        if (waits or self._queued) and self.shares is not None:
            waits.append(SHARE_LOOK_S)
        return min(waits) if waits else None

    def drain(self) -> None:
        """Start nothing more; forget what waits (it stays pending in its partition)."""
        self._draining = True
        self._queued.clear()
        self._turns.clear()
        for bucket in self._throttled.values():
            bucket.waiting.clear()
        self._throttled.clear()

    # -- what waits -------------------------------------------------------------------------

    @property
    def waiting_for_room(self) -> int:
        return sum(len(q) for q in self._queued.values())

    @property
    def waiting_for_rate(self) -> int:
        return sum(len(b.waiting) for b in self._throttled.values())

    # -- inside -----------------------------------------------------------------------------

    def _bucket(self, limit: RateLimit | None, asked: int = 0) -> _Bucket | None:
        if limit is None:
            return None
        now = self._clock()
        rate = limit.per_sec  # the latest job's word for the origin
        if self.shares is not None:
            tenant, origin = limit.key
            key = key_of(tenant, "calls-to", origin)
            rate = self.shares.rate(key, limit.per_sec, round(now * 1000), asked)
        bucket = self._buckets.get(limit.key)
        if bucket is None:
            tokens = max(1.0, rate) if rate > 0 else 0.0
            bucket = self._buckets[limit.key] = _Bucket(rate, tokens, now)
        elif bucket.per_sec != rate:
            bucket.refill(now)  # what came at the old rate stays
        bucket.per_sec = rate
        bucket.refill(now)
        return bucket

    def _share_of(self, bucket: _Bucket) -> None:
        """A throttled bucket's rate, this node's share of it now (a node of several)."""
        if self.shares is not None and bucket.waiting:
            self._bucket(bucket.waiting[0].limit)

    def _throttle(self, ticket: Ticket, bucket: _Bucket, *, first: bool) -> None:
        assert ticket.limit is not None
        if first:
            bucket.waiting.appendleft(ticket)
        else:
            bucket.waiting.append(ticket)
        self._throttled[ticket.limit.key] = bucket

    def _no_room(self, tenant: str) -> str:
        """Why ``tenant``'s run may not start now, in words."""
        held = self._by_tenant.get(tenant, 0)
        if self.in_flight >= self._max:
            return f"the node's room was full ({self.in_flight} calls in flight, --max-calls)"
        cap = self._cap(tenant, held)
        if held >= cap:
            if cap < self._max_per_tenant:
                return (
                    f"its team held this node's share of its cap ({held} calls in flight of"
                    f" {self._max_per_tenant} across the cluster, --max-calls-per-team)"
                )
            return f"its team held its share ({held} calls in flight, --max-calls-per-team)"
        if self._has_room(tenant):
            return "its team's earlier runs were waiting for room"
        return (
            f"the rest of the room is kept for teams with few calls (its team held {held} of"
            f" the {self.in_flight} calls in flight, --reserved-calls)"
        )

    def _has_room(self, tenant: str) -> bool:
        held = self._by_tenant.get(tenant, 0)
        if self.in_flight >= self._max or held >= self._cap(tenant, held):
            return False
        return self.in_flight < self._open or held < self._reserved_per_team

    def _cap_shares(self) -> Shares | None:
        """This node's shares, where a team's cap is the cluster's (a cap set, on a node of
        several); None where the cap is whole here."""
        return self.shares if self._max_per_tenant < self._max else None

    def _cap(self, tenant: str, held: int) -> int:
        """The calls ``tenant`` may hold here: its cap, or this node's share of it (asking
        for the calls its queued runs want)."""
        shares = self._cap_shares()
        if shares is None:
            return self._max_per_tenant
        key = _cap_key(tenant)
        now = round(self._clock() * 1000)
        wanting = held + max(1, len(self._queued.get(tenant, ())))
        share = shares.count(key, self._max_per_tenant, held, now, wanting)
        if shares.first_grant(key, self._max_per_tenant, now, self.on_share):
            # No share yet: none here until the owner's answer (asked now; milliseconds), so
            # another node granted the whole cap meanwhile is never exceeded. An owner silent
            # for a period leaves this node its part of the partitions (Shares.first_grant).
            return 0
        return share

    def _holding(self, tenant: str, held: int) -> None:
        shares = self._cap_shares()
        if shares is not None:
            shares.held(_cap_key(tenant), held)

    def _take(self, tenant: str, bucket: _Bucket | None) -> None:
        if bucket is not None:
            bucket.tokens -= 1.0
        self.in_flight += 1
        held = self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1
        self._holding(tenant, held)

    def _enqueue(self, ticket: Ticket) -> None:
        queue = self._queued.get(ticket.tenant)
        if queue is None:
            queue = self._queued[ticket.tenant] = []
            self._turns.append(ticket.tenant)
        heapq.heappush(queue, (ticket.urgency, next(self._arrivals), ticket))
        if self._cap_shares() is not None:  # the team's want here grew by this run
            self._cap(ticket.tenant, self._by_tenant.get(ticket.tenant, 0))

    def _grants(self) -> list[Ticket]:
        """Reserve room for queued runs, one team after another, each team's most urgent
        first; a run whose downstream has no token moves to its bucket and frees its turn."""
        granted: list[Ticket] = []
        if self._draining:
            return granted
        skipped = 0  # teams in a row that are at their own limit
        while self._turns and self.in_flight < self._max and skipped < len(self._turns):
            tenant = self._turns[0]
            self._turns.rotate(-1)  # whoever is served, the next turn is the next team's
            if not self._has_room(tenant):
                skipped += 1
                continue
            skipped = 0
            queue = self._queued[tenant]
            _, _, ticket = heapq.heappop(queue)
            if not queue:
                del self._queued[tenant]
                self._turns.remove(tenant)
            bucket = self._bucket(ticket.limit)
            if bucket is not None and bucket.tokens < 1.0:
                self._throttle(ticket, bucket, first=True)  # it was first in line for a token
                continue
            self._take(tenant, bucket)
            granted.append(ticket)
        return granted
