"""One partition's behaviour, whole and pure: its state, the timers that state needs, and the
loop every driver runs — decide, fold, arm the timers.

The node's runner, the core tests' harness and the API tests' fake all drive this object, so
there is one place where a decision becomes state and timers::

    p = Partition(3, now)                          # or Partition.restore(snapshot, now)
    p.handle(PutJob(...), now)                     # decide, fold, arm: the decided events
    p.advance(now)                                 # timers whose deadline passed are now due
    while (key := p.next_due()) is not None:
        if key[0] == "ready":                      # a push run may start: the driver decides
            ...                                    # whether there is room (StartRun)
        else:
            p.fire(key, now)                       # SlotDue / LeaseDue
    p.next_deadline()                              # when to look again

It reads no clock (``now`` is an argument) and does no I/O; appending the events durably is the
driver's business, which is why ``handle`` returns them. A refused command raises its
``core.errors`` error and changes nothing.

A job that ended (``core.state.has_ended``) is forgotten ``retention_ms`` after it ended: a
``("forget", job_id)`` timer decides ``ForgetDue``, which appends ``JobForgotten`` if the job is
still over. The retention is a setting, not state: it only says when that decision is taken,
and replaying the log folds what was decided, whatever the setting is now.

``snapshot()`` gives the canonical state as bytes with a format version in front, and
``restore()`` takes them back (rebuilding every timer from the state): a snapshot of a state
equals the snapshot of the state that replaying its events gives.
"""

from __future__ import annotations

from collections import deque

from core import events as ev
from core.clock import Millis
from core.commands import AnyCommand, ForgetDue, LeaseDue, SlotDue
from core.decide import decide
from core.errors import CronlogError, InvalidDefinition
from core.state import PartitionState, evolve
from core.timers import TimerKey, all_timers, forget_timer, timers_after
from core.wheel import TimingWheel

SNAPSHOT_FORMAT = 1
# How long a job that ended stays known: a repeated request within it (a create, a cancel, a
# trigger) is answered from the job; after it the job is history only (docs/architecture.md).
DEFAULT_RETENTION_MS = 24 * 3_600_000


class Partition:
    def __init__(
        self,
        number: int,
        now: Millis,
        state: PartitionState | None = None,
        *,
        tick_ms: int = 10,
        wheel_size: int = 512,
        retention_ms: int = DEFAULT_RETENTION_MS,
    ) -> None:
        if retention_ms < 0:
            raise ValueError(f"retention_ms must not be negative, got {retention_ms}")
        self.number = number
        self.retention_ms = retention_ms
        self.state = state if state is not None else PartitionState(number)
        self.wheel: TimingWheel[TimerKey] = TimingWheel(now, tick_ms=tick_ms, wheel_size=wheel_size)
        self._due: deque[TimerKey] = deque()
        for key, deadline in all_timers(self.state, retention_ms):
            self._arm(key, deadline)

    # -- deciding ------------------------------------------------------------------------------

    def handle(self, command: AnyCommand, now: Millis) -> list[ev.AnyEvent]:
        """Decide ``command`` at ``now`` and fold what it decided; the events, to append."""
        events = decide(self.state, command, now)
        for event in events:
            self.fold(event)
        return events

    def fold(self, event: ev.AnyEvent) -> None:
        """Fold one event in and change the timers it calls for (replay uses this too)."""
        evolve(self.state, event)
        changes = timers_after(self.state, event)
        changes.append(forget_timer(self.state, event.job_id, self.retention_ms))
        for key, deadline in changes:
            if deadline is None:
                self.wheel.cancel(key)
                # A due key stays queued: firing it decides against the state, which refuses.
            else:
                self._arm(key, deadline)

    def fire(self, key: TimerKey, now: Millis) -> list[ev.AnyEvent]:
        """Decide a slot or lease timer that came due. A timer can lose a race with a request
        (the job was paused, the run completed): then nothing is decided."""
        kind, ident = key
        command: AnyCommand
        if kind == "slot":
            command = SlotDue(job_id=ident)
        elif kind == "lease":
            command = LeaseDue(run_id=ident)
        elif kind == "forget":
            command = ForgetDue(job_id=ident, retention_ms=self.retention_ms)
        else:
            raise ValueError(f"a {kind!r} timer is the driver's to act on, not a command")
        try:
            return self.handle(command, now)
        except CronlogError:
            return []

    # -- time ----------------------------------------------------------------------------------

    def advance(self, now: Millis) -> None:
        """Move the wheel to ``now``: every timer whose deadline passed becomes due."""
        for _, key in self.wheel.advance(now):
            self._due.append(key)

    def next_due(self) -> TimerKey | None:
        """The next timer that came due, oldest first (None when none is)."""
        return self._due.popleft() if self._due else None

    def has_due(self) -> bool:
        return bool(self._due)

    def next_deadline(self) -> Millis | None:
        """The earliest armed deadline not yet due."""
        return self.wheel.next_deadline()

    def _arm(self, key: TimerKey, deadline: Millis) -> None:
        if not self.wheel.add(key, deadline):  # already due
            self._due.append(key)

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The canonical state as bytes, behind a format version (equal states, equal bytes)."""
        return bytes([SNAPSHOT_FORMAT]) + self.state.snapshot()

    @classmethod
    def restore(cls, data: bytes, now: Millis, **settings: int) -> Partition:
        """The partition a snapshot describes, its timers armed as of ``now``."""
        if not data or data[0] != SNAPSHOT_FORMAT:
            found = data[0] if data else None
            raise InvalidDefinition(
                "snapshot", f"format {found} is not {SNAPSHOT_FORMAT}, the one this build reads"
            )
        state = PartitionState.restore(data[1:])
        return cls(state.partition, now, state, **settings)
