"""A punctual, single-threaded partition for core tests: :class:`core.partition.Partition`
driven by a fake clock, its events kept as the log would keep them. The node's runner drives
the same object with a real log and real time."""

from __future__ import annotations

from collections import deque

from core import events as ev
from core.clock import FakeClock, Millis
from core.commands import AnyCommand
from core.jobs import Backoff, HttpTarget, JobSpec
from core.partition import DEFAULT_RETENTION_MS, Partition
from core.state import PartitionState, evolve
from core.timers import TimerKey
from core.wheel import TimingWheel


def spec(**kw: object) -> JobSpec:
    """A job of team-a every minute, calling a loopback target, with a jitter-free backoff;
    ``kw`` changes any field."""
    base: dict[str, object] = dict(
        name="job",
        tenant="team-a",
        target=HttpTarget(url="http://127.0.0.1:9/hook"),
        schedule="* * * * *",
        backoff=Backoff(base_sec=10, factor=2, cap_sec=600, jitter=False),
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


class Sim:
    def __init__(
        self,
        start_ms: Millis,
        partition: int = 0,
        retention_ms: int = DEFAULT_RETENTION_MS,
        lead_ms: int = 0,
        arm_ms: int = 0,
    ) -> None:
        self.clock = FakeClock(start_ms)
        self.partition = Partition(
            partition,
            start_ms,
            tick_ms=10,
            wheel_size=64,
            retention_ms=retention_ms,
            lead_ms=lead_ms,
            arm_ms=arm_ms,
        )
        self.log: list[bytes] = []
        self.ready: deque[str] = deque()  # push-target runs whose start time came
        self.asks: deque[str] = deque()  # runs whose target is to be asked now (core.asking)

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
            if kind == "ask":
                if ident not in self.asks:
                    self.asks.append(ident)
            elif kind != "ready":
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

    def replayed(self) -> bytes:
        """The snapshot of a state rebuilt by folding the log alone (no timers, no decisions):
        equal to the live state's when every decision was recorded in its events."""
        state = PartitionState(self.state.partition)
        for raw in self.log:
            evolve(state, ev.decode(raw))
        return state.snapshot()
