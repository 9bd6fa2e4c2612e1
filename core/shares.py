"""A team's limits held across the cluster: each member's share of a limit, handed out by one owner.

A limit such as "100 requests a second for this token" or "8 event streams for this team" is
kept by every member of the group (a node, or a worker process of one) for the requests it
serves. So that the team gets its limit across the cluster rather than on every member, each
member enforces a **share** of it, and one member, the **owner** of the team (the owner of
the partition the team's name hashes to), decides the shares:

- Every period (a second), a member sends the owner an :class:`Ask` for each limit of the
  team it served lately: the limit, how much it **wanted** over the period (requests a second
  asked, refused ones included; or the most it held or was asked to hold at once), what it
  **uses** now (a count's holdings) and the share **in force** on it.
- The owner (:class:`ShareBook`) divides the limit by what the members want, each at most what
  it wants and the rest in equal parts (max-min fairness; what nobody wants in equal parts to
  every member, as headroom), then hands out what the others leave: a member's share grows only
  into what no other member holds, has in force or was granted, so a share moves from one
  member to another only once the first has taken the smaller one (its next ask says so).
  Shares shrink at once.
- A member (:class:`Shares`) enforces the share it was last granted. Before its first grant on
  a limit (a team it has not served for ten minutes, or just after it joined) it enforces the
  limit times the fraction of the partitions it owns, which over the members sums to the
  limit; a member that owns every partition is alone and enforces the whole limit, without
  asking anybody.

What a team gets across the cluster, and how far from its limit (the tolerance): the shares
granted never sum above the limit with what the others hold or enforce. While a limit is new
in the owner's book (``YOUNG_PERIODS``), the default parts of the members that have not asked
yet count as enforced, so the members starting together never exceed it either. A member that
starts serving a team later enforces its default part beside the others' shares until its
first grant: up to a period (a rate; a count waits for its grant, :meth:`Shares.first_grant`).
A member that stops asking (it died, or lost the owner) keeps its share in the owner's book for
``SILENT_PERIODS`` before the others may take it. Figures: docs/security.md ("Across the
cluster") and docs/reliability.md ("A team's limits across the cluster").

Pure: no I/O, no clock; time is an argument in milliseconds on the caller's monotonic scale.
Both classes are thread-safe (a lock each): the API's loop, the executors and the reporter
thread share a member's :class:`Shares`; asks from the log and from the member itself share the
owner's :class:`ShareBook`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

PERIOD_MS = 1_000  # a member asks for its shares this often
IDLE_ASK_PERIODS = 10  # a limit a member did not use lately is asked for this seldom
SILENT_PERIODS = 30  # the owner forgets a member it has not heard from on a limit in this long
# A rate new in the owner's book keeps, for this long, the default parts of the members that
# have not asked yet: each may be enforcing it (its first ask is at most a period away).
YOUNG_PERIODS = 2
FORGET_PERIODS = 600  # a member forgets a limit it did not use in this long (ten minutes)


def key_of(tenant: str, kind: str, name: str = "") -> str:
    """One limit's key: the team first (a tenant name holds no ``/``), then what it limits."""
    return f"{tenant}/{kind}/{name}"


def tenant_of(key: str) -> str:
    return key.partition("/")[0]


class Ask(msgspec.Struct, array_like=True, frozen=True):
    """A member's word on one limit, once a period."""

    key: str
    limit: float
    wanted: float  # a rate: per second over the period; a count: the most at once
    in_force: float  # the share the member enforces now
    used: float = 0.0  # a count's holdings now (a rate: 0)
    whole: bool = False  # a count: shares are whole numbers
    part: float = 0.0  # the member's part of the partitions: its default share's fraction


@dataclass(slots=True)
class _Entry:
    wanted: float
    in_force: float
    used: float
    granted: float
    seen_ms: int
    part: float = 0.0


def fair_division(limit: float, wanted: dict[str, float]) -> dict[str, float]:
    """Max-min fair shares of ``limit``: each member at most what it wants, the members that
    want more than an equal part sharing what the others leave equally. Sums to at most
    ``limit``; to less only when everybody has what it wants."""
    shares: dict[str, float] = {}
    left = limit
    order = sorted(wanted.items(), key=lambda item: item[1])
    for i, (member, want) in enumerate(order):
        give = min(max(0.0, want), left / (len(order) - i))
        shares[member] = give
        left -= give
    return shares


class ShareBook:
    """The owner's record of one set of limits: who asked what, and what each was granted."""

    def __init__(self, period_ms: int = PERIOD_MS) -> None:
        self._period_ms = period_ms
        self._lock = threading.Lock()
        self._limits: dict[str, dict[str, _Entry]] = {}
        self._born: dict[str, int] = {}  # when each limit entered the book

    def grant(self, member: str, asks: Iterable[Ask], now_ms: int) -> list[float]:
        """The shares of ``member``, one for each of its ``asks``, in order."""
        with self._lock:
            return [self._grant(member, ask, now_ms) for ask in asks]

    def members(self, key: str) -> int:
        with self._lock:
            return len(self._limits.get(key, {}))

    def forget_silent(self, now_ms: int) -> None:
        """Drop the members silent for ``SILENT_PERIODS`` (and limits nobody asks for)."""
        with self._lock:
            for key in list(self._limits):
                self._expire(key, now_ms)

    def _expire(self, key: str, now_ms: int) -> dict[str, _Entry]:
        entries = self._limits[key]
        oldest = now_ms - SILENT_PERIODS * self._period_ms
        for member in [m for m, e in entries.items() if e.seen_ms < oldest]:
            del entries[member]
        if not entries:
            del self._limits[key]
            self._born.pop(key, None)
        return entries

    def _grant(self, member: str, ask: Ask, now_ms: int) -> float:
        entries = self._limits.setdefault(ask.key, {})
        born = self._born.setdefault(ask.key, now_ms)
        entry = entries.get(member)
        if entry is None:
            entry = entries[member] = _Entry(0.0, 0.0, 0.0, 0.0, now_ms)
        entry.wanted, entry.in_force, entry.used = ask.wanted, ask.in_force, ask.used
        entry.part = ask.part
        entry.seen_ms = now_ms
        entries = self._expire(ask.key, now_ms)
        wanted = {m: max(e.wanted, e.used) for m, e in entries.items()}
        targets = fair_division(ask.limit, wanted)
        # What nobody wants goes to the members as headroom: a member held to exactly its last
        # want would refuse its next request or call and wait a round trip. (A refused count is
        # asked for again at once, so a freed share still reaches it.) Each member's part of
        # it is its part of the partitions, so the members that have not asked yet find their
        # parts free: split over the members seen so far, the first to ask took it all, and
        # the next was refused its first request until the first asked again, a period later.
        # A member that owns none (just joined) or does not say its part (older) gets an equal
        # part of it.
        spare = ask.limit - sum(targets.values())
        target = targets[member] + spare * (ask.part if ask.part > 0 else 1 / len(entries))
        # What the others hold, enforce or were granted: a share grows only into the rest.
        others = sum(max(e.granted, e.in_force, e.used) for m, e in entries.items() if m != member)
        if not ask.whole and now_ms - born < YOUNG_PERIODS * self._period_ms:
            # the members not heard from yet enforce their default parts of a rate meanwhile
            # (a count's first hold waits for its grant instead)
            unseen = max(0.0, 1.0 - sum(e.part for e in entries.values()))
            others += unseen * ask.limit
        share = max(0.0, min(target, ask.limit - others))
        if ask.whole:
            share = float(math.floor(share + 1e-9))
        entry.granted = share
        return share


@dataclass(slots=True)
class _Item:
    limit: float
    whole: bool
    share: float | None = None  # None: never granted; the default fraction holds
    wanted: float = 0.0  # this period's: a rate's asks, a count's most at once
    used: float = 0.0
    asked_ms: int | None = None  # when it was last asked for
    active_ms: int = 0  # when it was last wanted
    said: float = 0.0  # what its last ask said was wanted, and used
    moved: bool = False  # its holdings or its share changed since its last ask
    urgent: bool = False  # a count to ask for before the period ends (Shares.urgent_asks)
    first_ms: int | None = None  # when its first grant was first waited for


class Shares:
    """A member's shares of the limits it enforces.

    ``fraction()`` is the part of the partitions the member owns (1.0: all of them, or no
    cluster at all): a limit's default share before the owner's first grant, and "alone" when
    it is whole. ``least`` is the smallest part the default share counts (one partition's):
    a member that owns nothing yet (it just joined, or its partitions are being handed over)
    would otherwise refuse every request until the owner answers, and the owner may be the
    member that just died."""

    def __init__(
        self,
        fraction: Callable[[], float] = lambda: 1.0,
        *,
        least: float = 0.0,
        period_ms: int = PERIOD_MS,
    ) -> None:
        self._fraction = fraction
        self._least = least
        self._period_ms = period_ms
        self._lock = threading.Lock()
        self._items: dict[str, _Item] = {}
        self._period_start_ms: int | None = None
        # Counts waiting for their first grant: who to tell when it comes, and who asks now.
        self._first: dict[str, list[Callable[[], None]]] = {}
        self._ask_now: Callable[[], None] = lambda: None

    def asks_now_with(self, wake: Callable[[], None]) -> None:
        """``wake()`` has the member ask at once for the counts :meth:`first_grant` waits on."""
        self._ask_now = wake

    def first_grant(self, key: str, limit: int, now_ms: int, told: Callable[[], None]) -> bool:
        """A count this member has no grant of yet: ask the owner at once, and call ``told()``
        when the answer comes (from the thread that takes it). False when there is nothing to
        wait for (a grant is in force, or the member is alone), or no more (the owner left its
        first ask a period unanswered: the member's default part holds until it answers): decide
        now."""
        if self.alone():
            return False
        with self._lock:
            item = self._item(key, float(limit), True, now_ms)
            if item.share is not None:
                return False
            if item.first_ms is None:
                item.first_ms = now_ms
            elif now_ms - item.first_ms >= self._period_ms:
                return False
            waiting = self._first.setdefault(key, [])
            if told not in waiting:  # one who asks again waits once
                waiting.append(told)
        self._ask_now()
        return True

    def stop_waiting(self, key: str, told: Callable[[], None]) -> None:
        """``told`` no longer waits for the first grant of ``key`` (it gave up)."""
        with self._lock:
            waiting = self._first.get(key)
            if waiting is not None and told in waiting:
                waiting.remove(told)
                if not waiting:
                    del self._first[key]

    def urgent_asks(self) -> list[Ask]:
        """The asks of the counts that should not wait for the period (the period's wants
        stay): those waiting for their first grant, and those whose holdings fell, that were
        refused, or whose share moved (so a share given up here reaches another member, and
        one freed elsewhere reaches this one, within a round trip rather than a period or
        two)."""
        with self._lock:
            asks = []
            for key, item in self._items.items():
                first = key in self._first
                if not (first or item.urgent):
                    continue
                item.urgent = False
                wanted = max(item.wanted, item.used + 1 if first else item.used)
                in_force = 0.0 if first else self._share(item)
                asks.append(Ask(key, item.limit, wanted, in_force, item.used, True, self._part()))
            return asks

    def alone(self) -> bool:
        return self._fraction() >= 1.0

    def rate(self, key: str, limit: float, now_ms: int, asked: int = 1) -> float:
        """This member's share of the rate ``limit`` (per second), with ``asked`` requests
        counted as wanted."""
        alone = self.alone()
        with self._lock:
            item = self._item(key, limit, False, now_ms)
            item.wanted += asked
            if alone:  # a grant from before is no share once others come: their parts are
                item.share = None
                return limit
            return self._share(item)

    def count(
        self, key: str, limit: int, holding: int, now_ms: int, wanting: int | None = None
    ) -> int:
        """This member's share of the count ``limit``, asked by one more holder while it holds
        ``holding``: the holder may come in if the answer is above ``holding``. ``wanting``:
        how many it would hold if it could (default: one more)."""
        alone = self.alone()
        with self._lock:
            item = self._item(key, float(limit), True, now_ms)
            want = holding + 1 if wanting is None else max(wanting, holding)
            item.wanted = max(item.wanted, float(want))
            item.used = float(holding)
            if alone:
                item.share = None
                return limit
            share = int(self._share(item))
            refused = share <= holding and item.share is not None and not item.urgent
            item.urgent = item.urgent or refused
        if refused:
            self._ask_now()
        return share

    def held(self, key: str, holding: int) -> None:
        """A count's holdings changed (one ended): said in the next ask."""
        with self._lock:
            item = self._items.get(key)
            if item is None or item.used == holding:
                return
            fell = item.whole and holding < item.used and not item.urgent
            item.used = float(holding)
            item.moved = True
            item.urgent = item.urgent or fell
        if fell:
            self._ask_now()

    def due(self, now_ms: int) -> list[Ask]:
        """The asks of the period that ends now, for the owners; the period's wants start
        again. A limit wanted in it is asked for; one not wanted lately every
        ``IDLE_ASK_PERIODS`` (so the owner keeps the member's share in its book), and at once
        when what it wants or holds fell to nothing (so the owner can hand that to others)."""
        with self._lock:
            start = self._period_start_ms if self._period_start_ms is not None else now_ms
            self._period_start_ms = now_ms
            seconds = max(now_ms - start, self._period_ms) / 1000.0
            asks: list[Ask] = []
            for key, item in list(self._items.items()):
                if now_ms - item.active_ms > FORGET_PERIODS * self._period_ms and not item.used:
                    del self._items[key]
                    continue
                wanted = item.wanted / seconds if not item.whole else item.wanted
                idle = not item.wanted and not item.used and not item.moved and not item.said
                seldom = (
                    item.asked_ms is not None
                    and now_ms - item.asked_ms < IDLE_ASK_PERIODS * self._period_ms
                )
                item.wanted = 0.0
                if idle and seldom:
                    continue
                item.asked_ms = now_ms
                item.said, item.moved = wanted + item.used, False
                in_force = self._share(item)
                asks.append(
                    Ask(key, item.limit, wanted, in_force, item.used, item.whole, self._part())
                )
            return asks

    def granted(self, asks: Iterable[Ask], shares: Iterable[float]) -> None:
        """The owner's answer to ``asks``."""
        told: list[Callable[[], None]] = []
        urgent = False
        with self._lock:
            for ask, share in zip(asks, shares, strict=True):
                item = self._items.get(ask.key)
                if item is not None and item.limit == ask.limit:
                    item.share = share
                    # The owner counts the share the ask said was in force until the next ask
                    # says what is now: a share that moved is said at the next period.
                    item.moved = item.moved or share != ask.in_force
                    if item.whole and share < ask.in_force:
                        # Said at once: the owner counts the larger share until it hears.
                        urgent = item.urgent = True
                    told += self._first.pop(ask.key, [])
        for tell in told:
            tell()
        if urgent:
            self._ask_now()

    def in_force(self, key: str) -> float | None:
        with self._lock:
            item = self._items.get(key)
            return None if item is None else self._share(item)

    def _item(self, key: str, limit: float, whole: bool, now_ms: int) -> _Item:
        item = self._items.get(key)
        if item is None or item.limit != limit:  # new, or the limits file changed
            item = self._items[key] = _Item(limit, whole)
        item.active_ms = now_ms
        return item

    def _part(self) -> float:
        return min(1.0, max(0.0, self._fraction()))

    def _share(self, item: _Item) -> float:
        if item.share is not None:
            return item.share
        default = item.limit * max(self._part(), self._least)
        return float(math.floor(default)) if item.whole else default
