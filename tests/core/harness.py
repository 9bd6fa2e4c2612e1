"""A punctual, single-threaded partition for core tests: :class:`core.partition.Partition`
driven by a fake clock, its events kept as the log would keep them. The node's runner drives
the same object with a real log and real time."""

from __future__ import annotations

from collections import deque

from core import events as ev
from core.clock import FakeClock, Millis
from core.commands import AnyCommand
from core.partition import DEFAULT_RETENTION_MS, Partition
from core.state import PartitionState
from core.timers import TimerKey
from core.wheel import TimingWheel


class Sim:
    def __init__(
        self,
        start_ms: Millis,
        partition: int = 0,
        retention_ms: int = DEFAULT_RETENTION_MS,
        lead_ms: int = 0,
    ) -> None:
        self.clock = FakeClock(start_ms)
        self.partition = Partition(
            partition,
            start_ms,
            tick_ms=10,
            wheel_size=64,
            retention_ms=retention_ms,
            lead_ms=lead_ms,
        )
        self.log: list[bytes] = []
        self.ready: deque[str] = deque()  # push-target runs whose start time came

    @property
    def now(self) -> Millis:
        return self.clock.now_ms()

    @property
    def state(self) -> PartitionState:
        return self.partition.state

    @property
    def wheel(self) -> TimingWheel[TimerKey]:
        return self.partition.wheel

    def do(self, command: AnyCommand) -> list[ev.AnyEvent]:
        """Decide ``command`` now, append and fold its events, then run timers that fell due."""
        events = self.partition.handle(command, self.now)
        self._append(events)
        self._drain()
        return events

    def _append(self, events: list[ev.AnyEvent]) -> None:
        self.log.extend(ev.encode(event) for event in events)

    def _drain(self) -> None:
        while (key := self.partition.next_due()) is not None:
            kind, ident = key
            if kind != "ready":
                self._append(self.partition.fire(key, self.now))
            elif ident not in self.ready:
                self.ready.append(ident)

    def advance(self, ms: Millis) -> None:
        """Let ``ms`` pass, firing every timer at its own deadline, as a punctual node would."""
        target = self.now + ms
        while True:
            deadline = self.partition.next_deadline()
            if deadline is None or deadline > target:
                break
            self.clock.set(max(deadline, self.now))
            self.partition.advance(self.now)
            self._drain()
        self.clock.set(target)
        self.partition.advance(target)
        self._drain()

    def jump(self, ms: Millis) -> None:
        """Let ``ms`` pass with the node down: timers fire late, all at the new time."""
        self.clock.advance(ms)
        self.partition.advance(self.now)
        self._drain()

    def events(self) -> list[ev.AnyEvent]:
        return [ev.decode(b) for b in self.log]

    def of_type(self, kind: type) -> list[ev.AnyEvent]:
        return [e for e in self.events() if isinstance(e, kind)]
