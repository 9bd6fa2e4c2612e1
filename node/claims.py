"""How a claim is spread over partitions: which to ask, and how many runs each may grant.

A claim for ``limit`` runs of a pool asks several partitions at once, each with a share of the
limit (:func:`split`: as few partitions as can hold it); the shares of one round add up to at
most what is still wanted, and a partition grants at most its share (``core.decide`` grants
no more than a ``ClaimRuns``' limit). So however the rounds go — a partition that answers late,
or never, still granted at most its share — a claim never leases more runs than its limit.

Which partitions to ask: this node's own, when their state holds entries of the pool (the
runner's ``ready`` index, whose length is an upper bound of what they can grant); another
node's only when this node's read model says runs of the pool became ready there
(:class:`ReadyHints`), since asking them goes through the log to their owner and back.

**ReadyHints, worked through.** The read model folds every partition, and tells its observers
each pull run it made pending (``ReadyRun``: tenant, pool, partition, ``available_at``). For each
(tenant, pool) the hints keep, per partition, the earliest instants at which such runs become
ready (at most ``MAX_DUE`` of them) and when an answer last showed the partition drained.

- A partition is *worth asking* at ``now`` if no answer has shown it drained yet (this node has
  not asked it since it started: runs made ready before are not told again), if a noted instant
  has come (``due[0] <= now``), or if its last drained answer is older than ``RECHECK_MS`` (what
  the bound on ``due`` dropped, or a hint lost to eviction, is found within that).
- An answer that granted fewer runs than asked shows the partition drained as of the ask: the
  instants up to the ask are forgotten — unless a run became ready there while the ask was on
  its way (the partition's ``version`` moved), in which case they are all kept: asking once more
  costs less than a run left waiting.
- No answer (the owner is slow or gone) changes nothing: the partition stays worth asking.

Example, RECHECK_MS = 5,000: runs of ("t", "p") become ready on partition 3 at 1,000 and 9,000.
At 2,000 partition 3 is worth asking (1,000 has come); the answer grants two of five asked, so
1,000 is forgotten and 9,000 kept. At 4,000 it is not worth asking (9,000 has not come and the
drained answer is 2 s old); at 7,000 it is (5 s since the drained answer); at 9,000, again.
"""

from __future__ import annotations

import bisect
import random
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from projections.read_model import ReadyRun

MAX_DUE = 32  # instants kept per (tenant, pool, partition)
MAX_POOLS = 10_000  # (tenant, pool) pairs kept; the least recently used one is forgotten first
RECHECK_MS = 5_000  # a drained partition is asked again after this, whatever the hints say


def split(limit: int, capacity: Mapping[int, int | None]) -> dict[int, int]:
    """Shares of ``limit`` for the partitions of ``capacity`` (partition -> at most how many it
    can grant, ``None`` for unknown), never more than a partition's capacity, adding up to at
    most ``limit``; partitions with no share are left out.

    Partitions of known capacity are filled one after another in a random order — the fewest
    asks (a herd's claim is one partition's one batch), and no partition always first, as with
    one ask at a time — and what they cannot hold is shared evenly by those of unknown
    capacity."""
    known = [p for p, cap in capacity.items() if cap is not None and cap > 0]
    unknown = [p for p, cap in capacity.items() if cap is None]
    random.shuffle(known)
    random.shuffle(unknown)
    shares: dict[int, int] = {}
    left = limit
    for p in known:
        if left <= 0:
            break
        cap = capacity[p]
        assert cap is not None
        shares[p] = min(cap, left)
        left -= shares[p]
    if left > 0 and unknown:
        each, odd = divmod(left, len(unknown))
        for i, p in enumerate(unknown):
            if each + (i < odd) > 0:
                shares[p] = each + (i < odd)
    return shares


@dataclass(slots=True)
class _Partition:
    due: list[int] = field(default_factory=list)  # sorted; the earliest MAX_DUE noted
    version: int = 0  # runs noted so far
    drained_at: int | None = None  # the ask that last showed it drained (None: never asked)


class ReadyHints:
    """Per (tenant, pool), the partitions where runs of the pool may be ready; a read model
    observer (``folded`` runs on the read model's thread, the rest on the API's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: OrderedDict[tuple[str, str], dict[int, _Partition]] = OrderedDict()

    def folded(self, positions: dict[int, int], ready: list[ReadyRun]) -> None:
        if not ready:
            return
        with self._lock:
            for run in ready:
                if run.partition < 0:
                    continue
                entry = self._partitions((run.tenant, run.pool)).setdefault(
                    run.partition, _Partition()
                )
                entry.version += 1
                if len(entry.due) < MAX_DUE or run.available_at < entry.due[-1]:
                    bisect.insort(entry.due, run.available_at)
                    del entry.due[MAX_DUE:]

    def _partitions(self, key: tuple[str, str]) -> dict[int, _Partition]:
        partitions = self._pools.get(key)
        if partitions is None:
            partitions = self._pools[key] = {}
            while len(self._pools) > MAX_POOLS:
                self._pools.popitem(last=False)  # forgotten: its partitions are asked again
        else:
            self._pools.move_to_end(key)
        return partitions

    def worth_asking(
        self, tenant: str, pool: str, partitions: list[int], now: int
    ) -> dict[int, int]:
        """Those of ``partitions`` worth asking at ``now``, each with the version of its hints
        (to hand back to :meth:`drained`)."""
        out: dict[int, int] = {}
        with self._lock:
            known = self._partitions((tenant, pool))
            for p in partitions:
                entry = known.setdefault(p, _Partition())
                if (
                    entry.drained_at is None
                    or (entry.due and entry.due[0] <= now)
                    or now - entry.drained_at >= RECHECK_MS
                ):
                    out[p] = entry.version
        return out

    def drained(self, tenant: str, pool: str, partition: int, version: int, asked_at: int) -> None:
        """An ask of ``partition`` at ``asked_at`` (hints at ``version`` then) granted fewer
        runs than it asked for: nothing more was ready there."""
        with self._lock:
            entry = self._partitions((tenant, pool)).setdefault(partition, _Partition())
            entry.drained_at = asked_at
            if entry.version == version:
                del entry.due[: bisect.bisect_right(entry.due, asked_at)]
