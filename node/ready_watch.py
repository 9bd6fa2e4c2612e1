"""Ready runs of a pool on partitions whose history another node keeps, made known to a waiting
claim.

A claim that finds nothing waits (``wait_sec``), woken when the read model folds a run of its
pool that became ready (``projections.wakeups``), and it asks other nodes' partitions where
that fold saw such runs (``node.claims.ReadyHints``). With history kept with its partition
(``--history-on owner``) a node folds only the partitions it owns, so of the others it would
see nothing: their runs would wait for the claim's next turn. So a waiting claim **watches**
the partitions it does not own: one question per partition and pool (``watch_ready``, through
the log like any question about another owner's history) that the owner answers as soon as
the partition holds runs of the team's pool that are ready, or will be within
``AHEAD_MS`` (their ``available_at`` instants, the earliest ``MAX_INSTANTS``: runs are
materialised a lead time ahead, so the owner knows the coming seconds' runs already), or at the
first fold of such a run. The answer is handed to the asking node's hints and wake-ups as if its
own fold had seen the runs, so the waiting claim wakes at each instant and asks that partition.

- Owner side, :class:`ReadyWatches`: a read model observer; a watch waits in memory (at most
  ``MAX_WATCHES`` per team and pool and partition, the oldest answered "nothing" when more
  come) and is answered at the first fold of a run of its pool, or dropped once past
  ``until`` (the asker has stopped waiting by then).
- Asker side, :class:`Watching`: at most one watch in flight per team, pool and partition, and
  a partition answered moments ago is watched again only ``MIN_REWATCH_S`` after that answer (a
  run the owner reported ready but another worker took first cannot make a claim spin).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from projections.model_fold import ReadyRun

MAX_WATCHES = 256  # watches held per (team, pool, partition) on the owner
MIN_REWATCH_S = 0.5  # a partition that answered is not watched again sooner than this
AHEAD_MS = 10_000  # an answer names the runs that become ready within this long
MAX_INSTANTS = 32  # ... the earliest this many (node.claims keeps as many per partition)

# The answer: when runs become ready (empty: none known), or None: the partition is not owned
# here any more, and the asker watches again (reaching its new owner) rather than waiting.
Send = Callable[[list[int] | None], None]


@dataclass(slots=True)
class _Watch:
    until_ms: int
    send: Send


class ReadyWatches:
    """The owner's side: watches of its partitions' pools, answered from its folds."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._watches: dict[tuple[str, str, int], list[_Watch]] = {}

    def add(
        self, tenant: str, pool: str, partition: int, until_ms: int, send: Send, known: list[int]
    ) -> None:
        """Watch ``pool`` of ``tenant`` on ``partition`` until ``until_ms``; ``known``: when
        runs of it are (or become) ready as the partition's state says now, which answers at
        once."""
        if known:
            send(known)
            return
        dropped: list[_Watch] = []
        with self._lock:
            now = self._now_ms()
            key = (tenant, pool, partition)
            live = [w for w in self._watches.get(key, ()) if w.until_ms > now]
            live.append(_Watch(until_ms, send))
            if len(live) > MAX_WATCHES:
                dropped, live = live[: len(live) - MAX_WATCHES], live[-MAX_WATCHES:]
            self._watches[key] = live
        for watch in dropped:
            watch.send([])

    def folded(self, positions: dict[int, int], ready: list[ReadyRun]) -> None:
        if not ready:
            return
        answered: list[tuple[_Watch, list[int]]] = []
        with self._lock:
            if not self._watches:
                return
            now = self._now_ms()
            instants: dict[tuple[str, str, int], list[int]] = {}
            for run in ready:
                instants.setdefault((run.tenant, run.pool, run.partition), []).append(
                    run.available_at
                )
            for key, found in instants.items():
                for watch in self._watches.pop(key, ()):
                    if watch.until_ms > now:
                        answered.append((watch, sorted(set(found))[:MAX_INSTANTS]))
        for watch, at in answered:
            watch.send(at)

    def lost(self, partition: int) -> None:
        """The partition moved away: its watches end saying so (None), and the askers watch
        again at once, reaching its new owner."""
        ended: list[_Watch] = []
        with self._lock:
            for key in [k for k in self._watches if k[2] == partition]:
                ended += self._watches.pop(key)
        for watch in ended:
            watch.send(None)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._watches.values())


class Watching:
    """The asker's side: which watches are in flight, and when each partition last answered."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._flying: set[tuple[str, str, int]] = set()
        self._answered: dict[tuple[str, str, int], float] = {}

    def start(self, tenant: str, pool: str, partitions: list[int]) -> list[tuple[int, float]]:
        """Those of ``partitions`` to watch for ``pool`` that have no watch in flight (marked in
        flight now), each with how long to wait before it is sent: the rest of
        ``MIN_REWATCH_S`` after its last answer. Never skipped: a claim that waits must have
        a watch on every other owner's partition, or a run there would not wake it."""
        now = self._monotonic()
        out = []
        with self._lock:
            for p in partitions:
                key = (tenant, pool, p)
                if key in self._flying:
                    continue
                self._flying.add(key)
                since = now - self._answered.get(key, -1e9)
                out.append((p, max(0.0, MIN_REWATCH_S - since)))
        return out

    def ended(self, tenant: str, pool: str, partition: int, answered: bool) -> None:
        key = (tenant, pool, partition)
        with self._lock:
            self._flying.discard(key)
            if answered:
                self._answered[key] = self._monotonic()
                if len(self._answered) > 4 * MAX_WATCHES:  # old entries: nothing to hold back
                    cutoff = self._monotonic() - MIN_REWATCH_S
                    self._answered = {k: t for k, t in self._answered.items() if t >= cutoff}
