"""An in-process :class:`api.scheduler.Scheduler`: the reference the API tests run against.

No canned answers: four partitions, each a :class:`core.state.PartitionState` that commands are
routed to with ``eventlog.port.partition_for``, decided by ``core.decide.decide`` at the time of
a :class:`core.clock.FakeClock`, folded with ``core.state.evolve``. Every event goes through the
event codec (as it would through the log) into the real :class:`projections.read_model.ReadModel`
before ``execute`` returns, so the API reads its own writes exactly as the port promises.

Timers are a dict per partition kept by ``core.timers.timers_after``; :meth:`advance` moves the
clock and decides every slot and lease timer that came due. There are no push executors: runs
of HTTP and Kafka targets stay pending, which is all the API tests need.
"""

from __future__ import annotations

from api.scheduler import Unavailable
from core.clock import FakeClock, Millis
from core.commands import (
    AnyCommand,
    CancelJob,
    CancelRun,
    ClaimRuns,
    CompleteRun,
    HeartbeatRun,
    LeaseDue,
    PauseJob,
    PutJob,
    ReplayRun,
    ResumeJob,
    SlotDue,
    StartRun,
    TriggerRun,
    UpstreamSucceeded,
)
from core.decide import decide, job_id_of_run
from core.events import AnyEvent, LeaseGranted, decode, encode
from core.state import PartitionState, evolve
from core.timers import TimerKey, timers_after
from eventlog.port import partition_for
from projections.read_model import ReadModel

PARTITIONS = 4


def routing_key(command: AnyCommand) -> str:
    match command:
        case PutJob() | PauseJob() | ResumeJob() | CancelJob() | TriggerRun() | UpstreamSucceeded():
            return command.job_id
        case StartRun() | HeartbeatRun() | CompleteRun() | CancelRun() | ReplayRun():
            return job_id_of_run(command.run_id)
    raise TypeError(f"{type(command).__name__} is not routed by job")


class FakeScheduler:
    def __init__(self, history: ReadModel, clock: FakeClock) -> None:
        self.clock = clock
        self.partitions = [PartitionState(p) for p in range(PARTITIONS)]
        self.timers: list[dict[TimerKey, Millis]] = [{} for _ in range(PARTITIONS)]
        self.events: list[AnyEvent] = []  # everything decided, in order (the log)
        self.offsets = [0] * PARTITIONS
        self.available = True  # False: every command raises Unavailable
        self.is_ready = True
        self._history = history

    # -- the port ---------------------------------------------------------------------------

    async def execute(self, command: AnyCommand) -> list[AnyEvent]:
        self._check_available()
        return self._decide(partition_for(routing_key(command), PARTITIONS), command)

    async def claim(self, tenant: str, pool: str, worker_id: str, limit: int) -> list[LeaseGranted]:
        self._check_available()
        granted: list[LeaseGranted] = []
        for p in range(PARTITIONS):
            if len(granted) >= limit:
                break
            ask = ClaimRuns(
                tenant=tenant, pool=pool, worker_id=worker_id, limit=limit - len(granted)
            )
            granted += [e for e in self._decide(p, ask) if isinstance(e, LeaseGranted)]
        return granted

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def ready(self) -> bool:
        return self.is_ready

    @property
    def history(self) -> ReadModel:
        return self._history

    # -- driving it -------------------------------------------------------------------------

    def advance(self, ms: Millis) -> None:
        """Move the clock forward by ``ms``, deciding each slot and lease timer at its deadline
        (as a node that never falls behind would); the clock then rests at the end."""
        until = self.clock.now_ms() + ms
        while True:
            due = [
                (deadline, p, key)
                for p, timers in enumerate(self.timers)
                for key, deadline in timers.items()
                if deadline <= until and key[0] != "ready"
            ]
            if not due:
                break
            deadline, p, key = min(due)
            self.clock.set(max(deadline, self.clock.now_ms()))
            del self.timers[p][key]  # the decision's events re-arm it if still needed
            kind, ident = key
            self._decide(p, SlotDue(job_id=ident) if kind == "slot" else LeaseDue(run_id=ident))
        self.clock.set(until)

    def _check_available(self) -> None:
        if not self.available:
            raise Unavailable("no owner for the partition (a test said so)")

    def _decide(self, p: int, command: AnyCommand) -> list[AnyEvent]:
        state = self.partitions[p]
        events = decide(state, command, self.clock.now_ms())
        for event in events:
            event = decode(encode(event))  # as the log stores and replays it
            evolve(state, event)
            for key, deadline in timers_after(state, event):
                if deadline is None:
                    self.timers[p].pop(key, None)
                else:
                    self.timers[p][key] = deadline
            self._history.process(event, p, self.offsets[p])
            self.offsets[p] += 1
            self.events.append(event)
        return events
