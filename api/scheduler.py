"""The port the HTTP API talks to. The node runtime implements it; ``tests/api/fakes.py`` holds the
in-process reference implementation the API tests run against.

Invariants every implementation keeps:

1. **Durable, then visible.** :meth:`Scheduler.execute` returns only once the events it decided
   are in the log *and* the history (:attr:`Scheduler.reader`) reflects them, so a client that
   reads after a write sees the write. (:meth:`Scheduler.execute_many` with ``visible=False``
   answers once they are durable: for a caller whose answer reads nothing back.)
2. **One owner decides.** A command goes to the partition that owns its job (the job id, or the
   job id inside a run id); that partition's ``core.decide`` is the only judge of it.
3. **Refusals are errors, not events.** A refused command raises a ``core.errors`` error
   (``InvalidDefinition``, ``NotFound``, ``Conflict``, ``LeaseLost``) and changed nothing; a
   command that cannot be decided right now (no owner, not caught up) raises :class:`Unavailable`.
4. **Tenants are scoped by the core.** Every command carries its tenant; a job or run of another
   tenant is ``NotFound`` (heartbeats and completions: ``LeaseLost``).
5. **Waiting is woken, never polled.** :attr:`Scheduler.wakeups` is told of every batch the read
   model folds; a long-polling claim and an event stream wait on it
   (:mod:`projections.wakeups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from core.commands import AnyCommand
from core.errors import CronlogError, Unavailable
from core.events import AnyEvent, LeaseGranted
from eventlog.port import Record
from node.history_reader import HistoryReader
from projections.decoding import EventDecoder
from projections.wakeups import Wakeups

__all__ = ["Scheduler", "Unavailable"]


class Scheduler(Protocol):
    async def execute(self, command: AnyCommand) -> list[AnyEvent]:
        """Route to the owning partition (by the command's job id, or the job id inside a run id),
        decide, and return the events once they are durably in the log AND the read model has
        caught up to them. Raises core.errors (InvalidDefinition, NotFound, Conflict, LeaseLost)
        or Unavailable."""
        ...

    async def execute_many(
        self, commands: Sequence[AnyCommand], *, visible: bool = True
    ) -> list[list[AnyEvent] | CronlogError]:
        """Each command as :meth:`execute` would decide it, all at once: the commands of one
        partition are decided in order, in one batch, and appended in one write. Returns, for
        each command, its events or the error ``execute`` would have raised, once every
        command's events are durable and visible (invariant 1).

        ``visible=False`` answers once they are durable, without waiting for the read model to
        fold them: for a caller that answers from the events alone (a batch of heartbeats,
        whose answer is the new lease expiry of each ``Heartbeat``) and so should not wait on
        a read model that lags under load. Such a caller cannot read its own writes from
        :attr:`reader` when the call returns."""
        ...

    async def claim(
        self, tenant: str, pool: str, worker_id: str, limit: int, horizon_ms: int = 0
    ) -> list[LeaseGranted]:
        """ClaimRuns across every partition (a pool's runs are spread over partitions); with
        ``horizon_ms``, runs ready within it are leased ahead, to start at their instant."""
        ...

    def return_leases(self, leases: Sequence[LeaseGranted], why: str) -> None:
        """Give back leases a claim granted that no worker received (``why``: how the answer
        was lost), so their runs are claimed again at once (on the API's loop; returns at
        once)."""
        ...

    def next_ready(self, tenant: str, pool: str, horizon_ms: int = 0) -> int | None:
        """The earliest ``available_at`` after now plus ``horizon_ms`` of a pending run of
        ``tenant``'s ``pool`` in a partition this node decides (None: none is waiting for a
        time); a claim reaching ``horizon_ms`` ahead can take it that long before it."""
        ...

    def watch_elsewhere(self, tenant: str, pool: str, wait_s: float) -> None:
        """A claim of ``pool`` waits up to ``wait_s``: make runs that become ready on
        partitions whose history is kept elsewhere wake it (:attr:`wakeups`) as runs folded
        here do (on the API's loop; a no-op where every partition's history is here)."""
        ...

    @property
    def wakeups(self) -> Wakeups:
        """Signals for waiting requests, bumped as the read model folds."""
        ...

    @property
    def num_partitions(self) -> int: ...

    def read_events(self, partition: int, from_offset: int, max_records: int) -> list[Record]:
        """Committed records of a partition's events stream from ``from_offset``, at once (no
        waiting; blocking I/O: call it from a worker thread)."""
        ...

    def events_end(self, partition: int) -> int:
        """The offset the partition's next event will get, or later (blocking I/O)."""
        ...

    @property
    def events_decoder(self) -> EventDecoder:
        """Decodes the records an event stream reads, reporting (and counting) foreign ones."""
        ...

    def now_ms(self) -> int: ...

    def ready(self) -> bool:
        """Owns its partitions and has caught up."""
        ...

    @property
    def reader(self) -> HistoryReader:
        """History: jobs, runs (past the hot window from the archive, saying which), listings
        and figures, from wherever each partition's history is kept (:mod:`node.history_reader`)."""
        ...
