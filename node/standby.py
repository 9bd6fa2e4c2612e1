"""Warm standbys: partitions a node does not own, followed so that taking one over costs the
last few events (``cronlog serve --standby-replicas N``).

Which partitions: a node follows, for each partition p it owns, the partitions p+1 … p+N
(modulo the partition count) that it does not own itself. Every node does the same from its
own assignment, so partition q is followed by the owners of q-1 … q-N, up to N standbys per
partition, and the choice follows every rebalance without any coordination between nodes.
(Kafka Streams places its standby tasks in the group's assignor instead; cronlog's assignment
is the consumer group's, which it does not replace.) With one node owning everything, as in
the embedded log, nothing is followed.

How: one thread, :class:`StandbyFollower`. For each followed partition it opens the partition's
state store where the runner would (``<data>/state/p<N>``), catches it up once (restoring the
newest snapshot first when it is newer: ``projections.state_store.catch_up``), then keeps the
state in memory and folds and saves every new batch of events, as an owner's recovery would.
When the partition is assigned here, :meth:`StandbyFollower.hand_over` gives the open store
and the in-memory state to the new runner, which then reads only the events the follower had
not seen yet. A standby costs what an owner's state costs in memory, plus the reads.

A failure while following one partition is logged and counted (``on_failed``), its store is
closed, and it is followed again from its store on the next round; the thread never ends on
one.

**Warm before joining** (:meth:`StandbyFollower.prewarm`, on Kafka by default). A node that
joins a group whose members already hold every partition is given some of theirs, and the
owner it takes one from has stopped deciding it by then: a cold take-over (a snapshot restored,
a tail read, in the seconds the rebalance already costs) left that partition's slots 1-3 s late
in a rolling restart, every time a restarted node came back. So before the node joins, it asks
the group what each member holds (:func:`may_be_given` reads which partitions a newcomer can
be given), catches those stores up as standbys, and keeps them followed until its first
assignment, or for :data:`JOINING_KEEP_S`; a partition assigned then is handed over warm, and
the others are let go. It costs the node's start a catch-up of a few partitions' stores.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.state import PartitionState, evolve
from eventlog.port import EventLog
from eventlog.snapshots import SnapshotStore
from node.worker import SupervisedWorker
from projections.decoding import EventDecoder
from projections.state_store import StateStore, catch_up

log = logging.getLogger(__name__)

ROUND_WAIT_S = 0.5  # how long one round waits for new events of the first followed partition
BATCH = 1000
# How long the partitions warmed before joining are followed waiting for the first assignment:
# a join and its rebalance take seconds, more on a loaded machine.
JOINING_KEEP_S = 60.0


def may_be_given(holdings: list[frozenset[int]], num_partitions: int, limit: int) -> list[int]:
    """The partitions a member joining a group whose members hold ``holdings`` may be given, at
    most ``limit`` of them, the likeliest first.

    A balanced assignment (Kafka's cooperative-sticky one, and any other) leaves every member of
    the group with ``num_partitions // members`` or one more. So the newcomer is given what no
    member holds, and otherwise takes from members holding more than that floor; the members
    holding the most give first. Which of a member's partitions goes is the assignor's choice,
    so each of its partitions is a candidate."""
    if limit <= 0:
        return []
    held = set().union(*holdings) if holdings else set()
    found = [p for p in range(num_partitions) if p not in held]
    floor = num_partitions // (len(holdings) + 1)
    givers = sorted((h for h in holdings if len(h) > floor), key=len, reverse=True)
    # One partition from each giver in turn, so a limit spreads over the givers.
    queues = [sorted(h) for h in givers]
    while any(queues) and len(found) < limit:
        for queue in queues:
            if queue and len(found) < limit:
                p = queue.pop(0)
                if p not in found:
                    found.append(p)
    return found[:limit]


def standby_targets(owned: frozenset[int], num_partitions: int, replicas: int) -> list[int]:
    """The partitions a node owning ``owned`` follows with ``replicas`` standbys each."""
    targets: set[int] = set()
    for p in owned:
        for step in range(1, replicas + 1):
            q = (p + step) % num_partitions
            if q not in owned:
                targets.add(q)
    return sorted(targets)


@dataclass
class Warm:
    """A followed partition: its open store, and the state as of ``offset``."""

    store: StateStore
    state: PartitionState
    offset: int


class StandbyFollower(SupervisedWorker):
    _thread_name = "standby"

    def __init__(
        self,
        log_: EventLog,
        open_store: Callable[[int], StateStore],
        owned: Callable[[], frozenset[int]],
        replicas: int,
        snapshots: SnapshotStore | None = None,
        on_failed: Callable[[int, BaseException], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must not be negative, got {replicas}")
        self._log = log_
        self._open_store = open_store
        self._owned = owned
        self.replicas = replicas
        self._snapshots = snapshots
        self._on_failed = on_failed
        self._monotonic = monotonic
        self._decoder = EventDecoder("standby")
        self._warm: dict[int, Warm] = {}
        self._lock = threading.Condition()  # held while a partition is folded or handed over
        self._opening: int | None = None  # a partition whose store is being caught up, unlocked
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.failures = 0
        # Warmed before the node joined (prewarm): followed until the first assignment.
        self._joining: frozenset[int] = frozenset()
        self._joining_until = 0.0

    def start(self) -> None:
        if self.replicas == 0 and not self._joining:
            return
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            warm, self._warm = self._warm, {}
        for w in warm.values():
            _close(w.store)

    def _stopped_flag(self) -> bool:
        return self._stopped.is_set()

    def following(self) -> dict[int, int]:
        """Followed partition -> the next event offset its standby state reflects."""
        with self._lock:
            return {p: w.offset for p, w in self._warm.items()}

    def hand_over(self, partition: int) -> Warm | None:
        """The partition's warm store and state, for its new runner here (None if it was not
        followed); the follower lets go of it. Never waits for a catch-up in progress."""
        with self._lock:
            return self._warm.pop(partition, None)

    def wait_released(self, partition: int, timeout_s: float = 60.0) -> bool:
        """Wait until the follower holds no store of ``partition`` (a first catch-up of it may
        be under way): a runner opening the store waits here, not on RocksDB's lock."""
        with self._lock:
            return self._lock.wait_for(
                lambda: self._opening != partition and partition not in self._warm, timeout_s
            )

    def prewarm(self, partitions: list[int], budget_s: float) -> list[int]:
        """Before the node joins its group: catch up the stores of ``partitions`` (in this
        thread, for ``budget_s`` at most; the rest are left cold) and follow them until the
        first assignment (or :data:`JOINING_KEEP_S`). Returns those warmed."""
        began = self._monotonic()
        with self._lock:
            self._joining = frozenset(partitions)
            self._joining_until = began + JOINING_KEEP_S
        warmed = []
        for p in partitions:
            if self._monotonic() - began > budget_s or self._stopped.is_set():
                break
            try:
                self._follow(p, 0.0)
            except Exception as err:
                self.failures += 1
                log.exception("warming partition %d before joining failed", p)
                if self._on_failed is not None:
                    self._on_failed(p, err)
                continue
            warmed.append(p)
        return warmed

    def _targets(self, owned: frozenset[int]) -> list[int]:
        """What to follow now: the standbys of what is owned, and what was warmed before
        joining until the first assignment came (or the wait for it ran out)."""
        targets = set(standby_targets(owned, self._log.num_partitions, self.replicas))
        with self._lock:
            if self._joining and (owned or self._monotonic() > self._joining_until):
                self._joining = frozenset()
            targets |= self._joining - owned
        return sorted(targets)

    def follow_once(self, wait_s: float = 0.0) -> None:
        """One round: start or stop following as the assignment says, then fold what is new."""
        owned = self._owned()
        targets = self._targets(owned)
        with self._lock:
            for p in [p for p in self._warm if p not in targets]:
                _close(self._warm.pop(p).store)
        for i, p in enumerate(targets):
            if self._stopped.is_set():
                return
            try:
                self._follow(p, wait_s if i == 0 else 0.0)
            except Exception as err:
                self.failures += 1
                log.exception("standby of partition %d failed; following it again", p)
                with self._lock:
                    failed = self._warm.pop(p, None)
                if failed is not None:
                    _close(failed.store)
                if self._on_failed is not None:
                    self._on_failed(p, err)
        self.rounds += 1

    def _follow(self, partition: int, wait_s: float) -> None:
        with self._lock:
            if partition in self._owned():
                return  # assigned here since the round began: the runner has it
            warm = self._warm.get(partition)
            if warm is None:
                self._opening = partition
        if warm is None:
            # The first catch-up (a snapshot restored, a tail read) runs unlocked: a hand-over
            # meanwhile finds nothing, and the runner waits in wait_released.
            try:
                self._open(partition)
            finally:
                with self._lock:
                    self._opening = None
                    self._lock.notify_all()
            return
        # Waiting for records happens outside the lock too, so a hand-over never waits for it.
        records = self._log.read_events(partition, warm.offset, BATCH, timeout_s=wait_s)
        if not records:
            return
        with self._lock:
            if self._warm.get(partition) is not warm:
                return  # handed over meanwhile
            batch = self._decoder.decode_all(records)
            for _, event in batch:
                evolve(warm.state, event)
            warm.offset = records[-1].offset + 1
            warm.store.save(warm.state, batch, through=warm.offset)

    def _open(self, partition: int) -> None:
        store = self._open_store(partition)
        try:
            state = catch_up(
                store, self._log, partition, decoder=self._decoder, snapshots=self._snapshots
            )
            warm = Warm(store, state, store.offset())
        except BaseException:
            _close(store)
            raise
        with self._lock:
            if partition in self._owned():
                _close(store)  # assigned here meanwhile: the runner opens the store itself
            else:
                self._warm[partition] = warm

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.follow_once(ROUND_WAIT_S)
            except Exception:  # the assignment could not be read: try again next round
                self.failures += 1
                log.exception("standby round failed")
            if not self._warm:
                self._stopped.wait(ROUND_WAIT_S)


def _close(store: StateStore) -> None:
    try:
        store.close()
    except Exception:
        log.exception("closing a standby's store failed")
