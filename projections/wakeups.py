"""What wakes the API's waiting requests when the read model folds: claims that long-poll a
pool, and event streams.

Both wait in the event loop for something the read model folds on its own threads, so both
are woken from there (:class:`Wakeups` is a read model :class:`~projections.read_model.Observer`)
and neither polls:

- an **event stream** (``GET /v1/events``) that has read everything waits on :attr:`events`,
  bumped after every batch the read model folds: the events up to the model's positions are
  committed, so there is something new to read;
- a **write** that must be readable before it is answered (read-your-writes) waits in
  :meth:`Wakeups.folded_past` until the model's position of its partition passes its last
  event's offset: woken once, by the fold that passes it, in the event loop (no thread of the
  pool blocked per waiting request);
- a **claim** with ``wait_sec`` that found nothing waits on its pool's signal, bumped when a run
  of that pool becomes ready (``ReadyRun``: materialised, released, replayed, retried, moved in).
  A run that becomes ready later (jitter, a retry's backoff) is remembered by when, and wakes
  the pool's claims too: each then sleeps until the earliest such instant, and claims again.
  The read model of every node folds every partition, so in a cluster a claim wakes for runs
  of partitions other nodes own too.

A waiter notes a signal's version *before* it looks (claims, reads), and waits only while the
version is unchanged: a wake between its look and its wait is never lost. Signals are made for
the pools somebody waits on and dropped with the last waiter; the ready instants are kept for
every pool, at most ``MAX_DUE_PER_POOL`` of the earliest for at most ``MAX_POOLS`` pools (a
claim past those bounds learns of a ready run by looking at the node's own partitions, or at
its deadline).

:meth:`close` (the server is stopping) wakes everyone for good, so long polls and streams end
instead of holding the server's graceful stop.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Iterator

from projections.read_model import ReadyRun

log = logging.getLogger(__name__)

MAX_DUE_PER_POOL = 1024
MAX_POOLS = 10_000


class AsyncSignal:
    """A version that grows with every :meth:`bump` (from any thread); asyncio tasks wait for it
    to move past the one they saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.version = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def bump(self) -> None:
        with self._lock:
            self.version += 1
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits there
                loop.call_soon_threadsafe(_settle, future)

    async def wait(self, seen: int, timeout_s: float) -> bool:
        """Until the version moves past ``seen`` (True) or ``timeout_s`` passes (False)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with self._lock:
            if self.version != seen:
                return True
            self._waiters.append(entry)
        try:
            await asyncio.wait_for(future, max(0.0, timeout_s))
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._waiters.remove(entry)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _settle_all(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        _settle(future)


_Write = tuple[int, int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class Wakeups:
    """The node's signals; ``clock()`` is the node's time in epoch milliseconds."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.events = AsyncSignal()
        self.closing = AsyncSignal()
        self.closed = False
        self._pools: dict[tuple[str, str], tuple[AsyncSignal, int]] = {}  # signal, waiters
        self._due: dict[tuple[str, str], list[int]] = {}
        self._dropped_pools = 0
        # partition -> heap of (offset, n, loop, future): writes waiting to become readable
        self._writes: dict[int, list[_Write]] = {}
        self._order = itertools.count()

    # -- the read model's side ----------------------------------------------------------------

    def folded(self, positions: dict[int, int], ready: list[ReadyRun]) -> None:
        now = self._clock()
        wake: set[tuple[str, str]] = set()
        readable: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        with self._lock:
            for partition, position in positions.items():
                waiting = self._writes.get(partition)
                while waiting and waiting[0][0] < position:
                    _, _, loop, future = heapq.heappop(waiting)
                    readable.setdefault(loop, []).append(future)
            for run in ready:
                key = (run.tenant, run.pool)
                if run.available_at > now:
                    self._remember(key, run.available_at, now)
                # A run ready later wakes the claims too: each then sleeps until that instant.
                wake.add(key)
            signals = [self._pools[key][0] for key in wake if key in self._pools]
        for signal in signals:
            signal.bump()
        for loop, futures in readable.items():
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits there
                loop.call_soon_threadsafe(_settle_all, futures)
        if positions:
            self.events.bump()

    async def folded_past(
        self, partition: int, offset: int, position: Callable[[int], int], timeout_s: float
    ) -> bool:
        """Wait until ``position(partition)`` (the read model's) is past ``offset``; False when
        ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:  # folded() takes it after the model moved: no wake falls between
            if position(partition) > offset:
                return True
            heapq.heappush(
                self._writes.setdefault(partition, []), (offset, next(self._order), loop, future)
            )
        # One timer, where wait_for would add a future, a task switch and callbacks to every
        # write; a timed-out entry goes with the first fold past it.
        timer = loop.call_later(timeout_s, _settle, future)
        try:
            await future
        finally:
            timer.cancel()
        return position(partition) > offset

    def _remember(self, key: tuple[str, str], at: int, now: int) -> None:
        due = self._due.get(key)
        if due is None:
            if len(self._due) >= MAX_POOLS:
                self._forget_passed(now)
                if len(self._due) >= MAX_POOLS:
                    self._dropped_pools += 1
                    if self._dropped_pools == 1:
                        log.warning("over %d pools have runs due later; not all kept", MAX_POOLS)
                    return
            due = self._due[key] = []
        del due[: bisect.bisect_right(due, now)]
        bisect.insort(due, at)
        del due[MAX_DUE_PER_POOL:]

    def _forget_passed(self, now: int) -> None:
        for key in [k for k, due in self._due.items() if not due or due[-1] <= now]:
            del self._due[key]

    # -- the API's side -------------------------------------------------------------------------

    def next_due(self, tenant: str, pool: str, now: int) -> int | None:
        """The earliest instant after ``now`` at which a known run of the pool becomes ready."""
        with self._lock:
            due = self._due.get((tenant, pool))
            if not due:
                return None
            del due[: bisect.bisect_right(due, now)]
            if not due:
                del self._due[(tenant, pool)]
                return None
            return due[0]

    @contextlib.contextmanager
    def pool(self, tenant: str, pool: str) -> Iterator[AsyncSignal]:
        """The signal of a pool's ready runs, kept while the block runs."""
        key = (tenant, pool)
        with self._lock:
            signal, waiters = self._pools.get(key, (None, 0))
            if signal is None:
                signal = AsyncSignal()
            self._pools[key] = (signal, waiters + 1)
        try:
            yield signal
        finally:
            with self._lock:
                signal, waiters = self._pools[key]
                if waiters <= 1:
                    del self._pools[key]
                else:
                    self._pools[key] = (signal, waiters - 1)

    def waiting_pools(self) -> int:
        with self._lock:
            return len(self._pools)

    def close(self) -> None:
        """The server is stopping: every waiter wakes, and waits no more from here on."""
        self.closed = True
        self.closing.bump()
        self.events.bump()
        with self._lock:
            signals = [signal for signal, _ in self._pools.values()]
        for signal in signals:
            signal.bump()

    async def sleep(self, signal: AsyncSignal, seen: int, timeout_s: float) -> bool:
        """Wait for ``signal`` past ``seen``, at most ``timeout_s``, or until :meth:`close`.
        True when woken (by the signal or the close), False on the timeout."""
        closing = self.closing.version  # before looking at ``closed``: see close()
        if self.closed:
            return True
        woke = asyncio.ensure_future(signal.wait(seen, timeout_s))
        stop = asyncio.ensure_future(self.closing.wait(closing, timeout_s))
        try:
            done, _ = await asyncio.wait({woke, stop}, return_when=asyncio.FIRST_COMPLETED)
            return any(task.result() for task in done)
        finally:
            for task in (woke, stop):
                task.cancel()
            await asyncio.gather(woke, stop, return_exceptions=True)
