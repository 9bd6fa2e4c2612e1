"""A punctual, single-threaded partition for core tests: decide + evolve + the timing wheel,
driven by a fake clock. The node runtime does the same with a real log and real time."""

from __future__ import annotations

from collections import deque

from core import events as ev
from core.clock import FakeClock, Millis
from core.commands import AnyCommand, LeaseDue, SlotDue
from core.decide import decide
from core.state import PartitionState, evolve
from core.timers import TimerKey, timers_after
from core.wheel import TimingWheel


class Sim:
    def __init__(self, start_ms: Millis, partition: int = 0) -> None:
        self.clock = FakeClock(start_ms)
        self.state = PartitionState(partition)
        self.wheel: TimingWheel[TimerKey] = TimingWheel(start_ms, tick_ms=10, wheel_size=64)
        self.log: list[bytes] = []
        self.ready: deque[str] = deque()  # push-target runs whose start time came
        self._due: deque[TimerKey] = deque()

    @property
    def now(self) -> Millis:
        return self.clock.now_ms()

    def do(self, command: AnyCommand) -> list[ev.AnyEvent]:
        """Decide ``command`` now, append and fold its events, then run timers that fell due."""
        events = self._decide(command)
        self._drain()
        return events

    def _decide(self, command: AnyCommand) -> list[ev.AnyEvent]:
        events = decide(self.state, command, self.now)
        for event in events:
            self.log.append(ev.encode(event))
            evolve(self.state, event)
            for key, deadline in timers_after(self.state, event):
                if deadline is None:
                    self.wheel.cancel(key)
                elif not self.wheel.add(key, deadline):
                    self._due.append(key)
        return events

    def _drain(self) -> None:
        while self._due:
            self._fire(self._due.popleft())

    def _fire(self, key: TimerKey) -> None:
        kind, ident = key
        if kind == "slot":
            self._decide(SlotDue(job_id=ident))
        elif kind == "lease":
            self._decide(LeaseDue(run_id=ident))
        elif ident not in self.ready:
            self.ready.append(ident)

    def advance(self, ms: Millis) -> None:
        """Let ``ms`` pass, firing every timer at its own deadline, as a punctual node would."""
        target = self.now + ms
        while True:
            deadline = self.wheel.next_deadline()
            if deadline is None or deadline > target:
                break
            self.clock.set(max(deadline, self.now))
            for _, key in self.wheel.advance(self.now):
                self._due.append(key)
            self._drain()
        self.clock.set(target)
        for _, key in self.wheel.advance(target):
            self._due.append(key)
        self._drain()

    def jump(self, ms: Millis) -> None:
        """Let ``ms`` pass with the node down: timers fire late, all at the new time."""
        self.clock.advance(ms)
        for _, key in self.wheel.advance(self.now):
            self._due.append(key)
        self._drain()

    def events(self) -> list[ev.AnyEvent]:
        return [ev.decode(b) for b in self.log]

    def of_type(self, kind: type) -> list[ev.AnyEvent]:
        return [e for e in self.events() if isinstance(e, kind)]
