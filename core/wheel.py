"""A hierarchical timing wheel (Varghese & Lauck): the partition scheduler's index of timers.

Each timer says "key K is due at T": a job's next slot, a run's lease expiry, the end of a
run's retry backoff. The wheel is an index only. When a key fires the caller re-reads the
partition state and decides, so a stale timer is harmless; re-arming a key replaces its timer.
Time is passed in (integer milliseconds since the epoch); the wheel never reads a clock.

The structure
-------------
A wheel of ``n`` buckets with tick ``u`` is a ring: bucket ``i`` holds the timers whose
deadline falls in one tick, ``[v*u, (v+1)*u)`` with ``v % n == i``, and the ring as a whole
covers ``n*u`` milliseconds from the wheel's current tick. A deadline beyond that span is an
overflow and goes to the next wheel up, whose tick is the whole span of the one below
(``n*u``), and so on; overflow wheels are created only when a deadline first needs them.
With the defaults (10 ms, 512 buckets) the levels span 5.12 s, 43.7 min, 15.5 days and 21.8
years, so a timer a year out sits in level 3 and moves down at most three times.

Each bucket is an insertion-ordered dict from key to timer, and a dict from key to the bucket
holding it covers the whole wheel, so arming and cancelling a timer are O(1) dict operations
(plus the choice of level, O(number of levels)). A timer is one integer, its deadline and its
arming number packed together (``deadline << SEQ_BITS | seq``): a partition holds one timer
per job, a million times over, and an object per timer would cost twice the memory. Non-empty
buckets are queued in a small heap keyed by the time they need attention: an overflow bucket
at its start, when its timers must move to finer wheels; a level-0 bucket at the earliest
deadline it was given. ``advance`` pops only the buckets whose key has passed, so a day of
idle time costs nothing but the buckets that actually hold timers, never one step per tick.

Deadlines are exact, not tick-granular: ``advance(now)`` returns a timer only once
``deadline <= now``. A level-0 bucket whose tick has begun may still hold timers that are not
due (``now`` is 1005, the bucket covers [1000, 1010) and one timer is due at 1008); those go
back into the same bucket, re-keyed by their earliest deadline, and wait. For the same reason
``add`` refuses (returns False) only a deadline that is already due, ``deadline <= now``.
That is Kafka's "already expired, run it now" convention at the resolution of the clock: with
cronlog's millisecond deadlines the current tick is the current millisecond. Refusing the
rest of the tick as Kafka does would hand the caller timers up to a tick early, and a caller
that re-checks "is it due yet?" and re-arms would spin until the clock moved.

Worked example
--------------
Tick u = 10 ms, n = 4 buckets, the wheel starts at t = 0::

    level  tick  span      buckets at t = 0
    0      10    [0,40)    [0,10)   [10,20)   [20,30)   [30,40)
    1      40    [0,160)   [0,40)   [40,80)   [80,120)  [120,160)
    2      160   [0,640)   [0,160)  [160,320) [320,480) [480,640)

``add("a", 7)``: 7 < 0 + 40, so level 0, tick 7 // 10 = 0, bucket [0,10), keyed 7.
``add("b", 137)``: beyond level 0's span; 137 < 0 + 160, so level 1, tick 137 // 40 = 3,
bucket [120,160), keyed at its start, 120.
``add("c", 500)``: beyond level 1 too, so level 2 is created now; tick 500 // 160 = 3,
bucket [480,640), keyed 480.
``add("d", 0)``: already due: returns False and stores nothing; the caller fires "d" itself.

The heap holds 7, 120, 480 and ``next_deadline()`` is 7.

``advance(5)``: no key has passed; nothing is touched.
``advance(130)``: bucket@7 is popped and "a" fires. Bucket@120 is popped: "b" (137) is not
due, so it is placed again from the new time. Level 0 now spans [130,170), so "b" drops
straight to level-0 bucket [130,140) (slot 13 % 4 = 1), keyed 137. Returns ``[(7, "a")]``.
``advance(490)``: bucket@137 fires "b". Bucket@480 cascades "c": level 0 spans [490,530), so
"c" lands in [500,510), keyed 500. ``next_deadline()`` is now exactly 500.
``advance(10_000)``: bucket@500 fires "c"; the 950 ticks in between were never visited.

Ordering and time
-----------------
``advance`` returns fired timers ordered by deadline, then by the order in which they were
armed (a re-arm counts as a new arming). Time never goes backwards: an ``advance`` to an
earlier instant than the wheel's current time is ignored and returns nothing, since a
stepped-back wall clock should not stop a partition; the wheel keeps its later time.

The wheel is not thread-safe; one partition's scheduler owns it.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from operator import itemgetter
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# The arming number's bits in a packed timer: 2**48 armings, 89 years at 100,000 a second.
SEQ_BITS = 48


class _Bucket(Generic[K]):
    """The timers of one tick of one level. Reused when the ring comes round again."""

    __slots__ = ("due", "queued", "timers", "vid")

    def __init__(self) -> None:
        self.timers: dict[K, int] = {}  # key -> deadline << SEQ_BITS | arming number
        self.vid = -1  # which tick (deadline // level tick) the bucket currently holds
        self.due = 0  # heap key: never later than the earliest deadline inside
        self.queued = 0  # token of the bucket's live heap entry; 0 when not queued


class _Level(Generic[K]):
    __slots__ = ("buckets", "current", "span", "tick")

    def __init__(self, tick: int, size: int, now: int) -> None:
        self.tick = tick
        self.span = tick * size
        self.current = now - now % tick  # start of the tick containing now
        self.buckets: list[_Bucket[K] | None] = [None] * size


class TimingWheel(Generic[K]):
    """Timers keyed by ``K``, armed with exact millisecond deadlines. See the module docstring."""

    def __init__(self, start_ms: int, tick_ms: int = 10, wheel_size: int = 512) -> None:
        if tick_ms < 1:
            raise ValueError(f"tick_ms must be at least 1, got {tick_ms}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size}")
        self._now = start_ms
        self._size = wheel_size
        self._levels: list[_Level[K]] = [_Level(tick_ms, wheel_size, start_ms)]
        self._timers: dict[K, _Bucket[K]] = {}  # key -> the bucket holding its timer
        self._queue: list[tuple[int, int, _Bucket[K]]] = []  # (due, token, bucket)
        self._tokens = 0
        self._seq = 0

    @property
    def now_ms(self) -> int:
        """The wheel's current time: the latest instant it was advanced to (or its start)."""
        return self._now

    def add(self, key: K, deadline_ms: int, arming: int | None = None) -> bool:
        """Arm (or re-arm: replaces any existing timer for key) a timer.

        Returns False, and stores nothing, when the deadline is already due
        (``deadline_ms <= now``): the caller fires it now. A re-arm to a due deadline
        therefore also removes the key's previous timer. ``arming`` is a number
        :meth:`reserve` gave: the timer is ordered among equal deadlines as if it had been
        armed when the number was reserved.
        """
        old = self._timers.pop(key, None)
        if old is not None:
            del old.timers[key]
        if deadline_ms <= self._now:
            return False
        if arming is None:
            self._seq += 1
            arming = self._seq
        self._place(key, deadline_ms << SEQ_BITS | arming)
        return True

    def reserve(self) -> int:
        """An arming number for a timer to be added later (:meth:`add`'s ``arming``)."""
        self._seq += 1
        return self._seq

    def cancel(self, key: K) -> bool:
        """Remove the key's timer in O(1). True if there was one."""
        bucket = self._timers.pop(key, None)
        if bucket is None:
            return False
        del bucket.timers[key]
        return True

    def advance(self, now_ms: int) -> list[tuple[int, K]]:
        """Move time to ``now_ms`` and return every timer whose deadline is ``<= now_ms``.

        The result is ordered by (deadline, arming order). Timers not yet due that were in
        a bucket whose time came move to finer wheels (cascading). A ``now_ms``
        earlier than the wheel's time is ignored and returns ``[]``.
        """
        if now_ms <= self._now:
            return []
        self._now = now_ms
        queue = self._queue
        # Empty every bucket whose time has come before placing anything again: the ring
        # slots they occupy may be the ones the re-placed timers need.
        taken: list[tuple[K, int]] = []
        while queue and queue[0][0] <= now_ms:
            _, token, bucket = heapq.heappop(queue)
            if token != bucket.queued:
                continue  # superseded by a later entry for the same bucket
            bucket.queued = 0
            if bucket.timers:
                taken.extend(bucket.timers.items())
                bucket.timers.clear()
        for level in self._levels:
            level.current = now_ms - now_ms % level.tick
        fired: list[tuple[int, K]] = []
        timers = self._timers
        for key, timer in taken:
            if timer >> SEQ_BITS <= now_ms:
                del timers[key]
                fired.append((timer, key))
            else:
                self._place(key, timer)
        # (deadline, arming order); arming numbers are unique, so keys are never compared
        fired.sort(key=itemgetter(0))
        return [(timer >> SEQ_BITS, key) for timer, key in fired]

    def next_deadline(self) -> int | None:
        """A time to sleep until: never later than the earliest pending deadline.

        It is the earliest deadline itself unless a timer was cancelled or an overflow
        bucket must cascade before it; then it is that earlier instant, and advancing to it
        simply returns nothing. Always later than the wheel's current time; None when no
        timer is armed.
        """
        queue = self._queue
        while queue:
            _, token, bucket = queue[0]
            if token == bucket.queued and bucket.timers:
                return queue[0][0]
            heapq.heappop(queue)
            if token == bucket.queued:
                bucket.queued = 0
        return None

    def deadline_of(self, key: K) -> int | None:
        bucket = self._timers.get(key)
        return None if bucket is None else bucket.timers[key] >> SEQ_BITS

    def __len__(self) -> int:
        return len(self._timers)

    def __contains__(self, key: object) -> bool:
        return key in self._timers

    def __repr__(self) -> str:
        return (
            f"TimingWheel(now_ms={self._now}, timers={len(self._timers)}, "
            f"levels={len(self._levels)})"
        )

    def _place(self, key: K, timer: int) -> None:
        """Put a timer that is not yet due (deadline > now) into the finest wheel spanning it."""
        deadline = timer >> SEQ_BITS
        levels = self._levels
        index = 0
        level = levels[0]
        while deadline >= level.current + level.span:
            index += 1
            if index == len(levels):
                levels.append(_Level(level.span, self._size, self._now))
            level = levels[index]
        vid = deadline // level.tick
        slot = vid % self._size
        bucket = level.buckets[slot]
        if bucket is None:
            bucket = level.buckets[slot] = _Bucket()
        # Level 0 is keyed by its earliest deadline so a sleeping caller wakes exactly on
        # time; an overflow bucket is keyed by its start, when its timers must move down.
        # Above level 0 the start is always in the future: the level below spans it.
        due = deadline if index == 0 else vid * level.tick
        if bucket.vid != vid:
            # The ring came round: the bucket's previous tick has passed, so it is empty.
            assert not bucket.timers, (bucket.vid, vid)
            bucket.vid = vid
            self._enqueue(bucket, due)
        elif not bucket.queued or due < bucket.due:
            self._enqueue(bucket, due)
        bucket.timers[key] = timer
        self._timers[key] = bucket

    def _enqueue(self, bucket: _Bucket[K], due: int) -> None:
        self._tokens += 1
        bucket.due = due
        bucket.queued = self._tokens
        heapq.heappush(self._queue, (due, self._tokens, bucket))
