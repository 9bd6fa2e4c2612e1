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
- **A standing watch is a long poll, not a poll.** The asker says what its last answer from
  the partition told it (:class:`Told`: every instant up to ``covered_ms``). The owner answers
  at once only with news: a run ready by then at an instant the asker was not told (a retry, a
  trigger, a new job's slot), or the asker's horizon grown ``REFRESH_MS`` shorter than
  ``AHEAD_MS``; else it holds the watch, answered at the first fold of a run ready within the
  told horizon or, at a fold after the horizon has shrunk that much, with the instants known
  then. Runs are materialised a lead time (30 s) ahead, beyond any horizon told, so a steady
  flow of runs costs a partition's watch about one answer every ``AHEAD_MS - REFRESH_MS``
  rather than one every ``MIN_REWATCH_S``.
- Asker side, :class:`Watching`: at most one watch in flight per team, pool and partition, and
  a partition answered moments ago is watched again only ``MIN_REWATCH_S`` after that answer (a
  run the owner reported ready but another worker took first cannot make a claim spin).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from projections.model_fold import ReadyRun

log = logging.getLogger(__name__)

_NEVER = float("inf")

MAX_WATCHES = 256  # watches held per (team, pool, partition) on the owner
MIN_REWATCH_S = 0.5  # a partition that answered is not watched again sooner than this
AHEAD_MS = 10_000  # an answer names the runs that become ready within this long
MAX_INSTANTS = 32  # ... the earliest this many (node.claims keeps as many per partition)

# A standing watch is answered again, without news, once its asker's horizon is this much
# shorter than AHEAD_MS (so the asker always knows at least AHEAD_MS - REFRESH_MS ahead).
REFRESH_MS = 4_000

# The answer: when runs become ready (empty: none known), or None: the partition is not owned
# here any more, and the asker watches again (reaching its new owner) rather than waiting.
Send = Callable[[list[int] | None], None]


@dataclass(frozen=True, slots=True)
class Told:
    """What a watch's asker already knows of the partition's pool: the instants its last
    answer named (``instants``, ascending), which were every instant up to ``covered_ms``."""

    covered_ms: int
    instants: tuple[int, ...]

    @classmethod
    def of_answer(cls, asked_ms: int, instants: list[int]) -> Told:
        """What an answer to a watch asked at ``asked_ms`` told: every instant up to
        ``AHEAD_MS`` after it, or, an answer cut at ``MAX_INSTANTS``, up to its last."""
        at = tuple(sorted(instants))
        covered = at[-1] if len(at) >= MAX_INSTANTS else asked_ms + AHEAD_MS
        return cls(covered, at)

    def news(self, at: list[int]) -> bool:
        """Whether ``at`` holds an instant within the horizon that the asker was not told."""
        return any(t <= self.covered_ms and t not in self.instants for t in at)

    def refresh_at(self) -> int:
        """When the asker should hear again without news: once its horizon has grown
        ``REFRESH_MS`` shorter than ``AHEAD_MS``, or half the instants it was told have
        passed (a busy partition's answer, cut at ``MAX_INSTANTS``, covers little time)."""
        at = self.covered_ms - AHEAD_MS + REFRESH_MS
        if len(self.instants) >= 2:
            at = min(at, self.instants[len(self.instants) // 2])
        return at

    def stale(self, now_ms: int) -> bool:
        return now_ms >= self.refresh_at()


@dataclass(slots=True)
class _Watch:
    until_ms: int
    send: Send
    told: Told | None = None
    known: Callable[[], list[int]] | None = None  # the partition's instants now (a refresh)


def _answer(watch: _Watch, at: list[int] | None) -> None:
    """Answer one watch taken off the list with ``at`` (None: what its partition knows now);
    a failure is logged, and the others are answered still (the asker of this one watches
    again once its wait ends)."""
    try:
        if at is None:
            at = watch.known() if watch.known is not None else []
        watch.send(at)
    except Exception:
        log.exception("a ready watch could not be answered")


class ReadyWatches:
    """The owner's side: watches of its partitions' pools, answered from its folds."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._watches: dict[tuple[str, str, int], list[_Watch]] = {}
        self._sweep_at: int | float = _NEVER  # the first instant a held watch may be stale

    def add(
        self,
        tenant: str,
        pool: str,
        partition: int,
        until_ms: int,
        send: Send,
        known: list[int],
        told: Told | None = None,
        refresh: Callable[[], list[int]] | None = None,
    ) -> None:
        """Watch ``pool`` of ``tenant`` on ``partition`` until ``until_ms``; ``known``: when
        runs of it are (or become) ready as the partition's state says now, which answers at
        once, unless the asker was ``told`` all of it already and its horizon is not stale;
        ``refresh()``: those instants again, for an answer when the horizon has grown stale."""
        if known and (told is None or told.news(known) or told.stale(self._now_ms())):
            send(known)
            return
        dropped: list[_Watch] = []
        with self._lock:
            now = self._now_ms()
            key = (tenant, pool, partition)
            live = [w for w in self._watches.get(key, ()) if w.until_ms > now]
            live.append(_Watch(until_ms, send, told, refresh))
            if told is not None:
                self._sweep_at = min(self._sweep_at, told.refresh_at())
            if len(live) > MAX_WATCHES:
                dropped, live = live[: len(live) - MAX_WATCHES], live[-MAX_WATCHES:]
            self._watches[key] = live
        for watch in dropped:
            watch.send([])

    def folded(self, positions: dict[int, int], ready: list[ReadyRun]) -> None:
        if not ready:
            return
        answered: list[tuple[_Watch, list[int]]] = []
        refreshed: list[_Watch] = []
        with self._lock:
            if not self._watches:
                return
            now = self._now_ms()
            instants: dict[tuple[str, str, int], list[int]] = {}
            for run in ready:
                instants.setdefault((run.tenant, run.pool, run.partition), []).append(
                    run.available_at
                )
            # The watches a fold may answer: those of the partitions and pools it folded runs
            # of, and every watch only once one may have grown stale (not every watch on
            # every fold: the fold's thread pays for this)
            sweep = now >= self._sweep_at
            if sweep:
                self._sweep_at = _NEVER
            for key in (
                list(self._watches) if sweep else [k for k in instants if k in self._watches]
            ):
                found = sorted(set(instants.get(key, ())))[:MAX_INSTANTS]
                kept: list[_Watch] = []
                for watch in self._watches[key]:
                    if watch.until_ms <= now:
                        continue  # its asker has stopped waiting
                    if watch.told is None:
                        if found:
                            answered.append((watch, found))
                        else:
                            kept.append(watch)
                    elif watch.told.news(found) or watch.told.stale(now):
                        refreshed.append(watch)  # answered with all it knows now
                    else:
                        kept.append(watch)
                        if sweep:
                            self._sweep_at = min(self._sweep_at, watch.told.refresh_at())
                if kept:
                    self._watches[key] = kept
                else:
                    del self._watches[key]
        for watch, at in answered:
            _answer(watch, at)
        for watch in refreshed:
            _answer(watch, None)

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
    """The asker's side: which watches are in flight, when each partition last answered, and
    what that answer told (sent with the next watch of it: :class:`Told`)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._flying: set[tuple[str, str, int]] = set()
        self._answered: dict[tuple[str, str, int], tuple[float, Told | None]] = {}

    def start(
        self, tenant: str, pool: str, partitions: list[int]
    ) -> list[tuple[int, float, Told | None]]:
        """Those of ``partitions`` to watch for ``pool`` that have no watch in flight (marked in
        flight now), each with how long to wait before it is sent (the rest of
        ``MIN_REWATCH_S`` after its last answer) and what that answer told. Never skipped: a
        claim that waits must have a watch on every other owner's partition, or a run there
        would not wake it."""
        now = self._monotonic()
        out = []
        with self._lock:
            for p in partitions:
                key = (tenant, pool, p)
                if key in self._flying:
                    continue
                self._flying.add(key)
                since, told = self._answered.get(key, (-1e9, None))
                out.append((p, max(0.0, MIN_REWATCH_S - (now - since)), told))
        return out

    def ended(
        self, tenant: str, pool: str, partition: int, answered: bool, told: Told | None = None
    ) -> None:
        """The watch of ``partition`` ended, ``answered`` (``told``: what the answer said,
        None when the partition moved) or not (no answer: watched again at once)."""
        key = (tenant, pool, partition)
        with self._lock:
            self._flying.discard(key)
            if answered:
                self._answered[key] = (self._monotonic(), told)
                if len(self._answered) > 4 * MAX_WATCHES:  # old entries: nothing to hold back
                    cutoff = self._monotonic() - 2 * AHEAD_MS / 1000
                    self._answered = {k: v for k, v in self._answered.items() if v[0] >= cutoff}
