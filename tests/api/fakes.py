"""An in-process :class:`api.scheduler.Scheduler`: the reference the API tests run against.

No canned answers: four :class:`core.partition.Partition` objects (the one the node's runner
drives) that commands are routed to with ``eventlog.port.partition_for``, decided at the time
of a :class:`core.clock.FakeClock`. Every event goes through the event codec (as it would
through the log) into the real :class:`projections.read_model.ReadModel` before ``execute``
returns, so the API reads its own writes exactly as the port promises.

:meth:`advance` moves the clock and decides every slot and lease timer that came due, each at
its own deadline. There are no push executors: runs of HTTP and Kafka targets stay pending,
which is all the API tests need.
"""

from __future__ import annotations

from collections.abc import Sequence

from api.scheduler import Unavailable
from core.clock import FakeClock, Millis
from core.commands import (
    AnyCommand,
    CancelJob,
    CancelRun,
    ClaimRuns,
    CompleteRun,
    HeartbeatRun,
    PauseJob,
    PutJob,
    ReplayRun,
    ResumeJob,
    ReturnLease,
    StartRun,
    TriggerRun,
    UpstreamSucceeded,
)
from core.decide import job_id_of_run
from core.errors import CronlogError
from core.events import AnyEvent, LeaseGranted, decode, encode
from core.partition import Partition
from core.state import RunStatus
from eventlog.port import Record, partition_for
from node.history_reader import Held, HistoryReader, every_partition
from node.hot_window import DEFAULT_WINDOW_MS
from projections.decoding import EventDecoder
from projections.history import ArchivedRuns, History
from projections.read_model import ReadModel
from projections.wakeups import Wakeups

PARTITIONS = 4


def routing_key(command: AnyCommand) -> str:
    match command:
        case PutJob() | PauseJob() | ResumeJob() | CancelJob() | TriggerRun() | UpstreamSucceeded():
            return command.job_id
        case (
            StartRun() | HeartbeatRun() | CompleteRun() | CancelRun() | ReplayRun() | ReturnLease()
        ):
            return job_id_of_run(command.run_id)
    raise TypeError(f"{type(command).__name__} is not routed by job")


class FakeScheduler:
    def __init__(self, history: ReadModel, clock: FakeClock) -> None:
        self.clock = clock
        self.partitions = [Partition(p, clock.now_ms()) for p in range(PARTITIONS)]
        self.events: list[AnyEvent] = []  # everything decided, in order (the log)
        self.offsets = [0] * PARTITIONS
        self.available = True  # False: every command raises Unavailable
        self.is_ready = True
        self.returned: list[tuple[list[LeaseGranted], str]] = []  # return_leases' calls
        self.folding = True  # False: decided events wait in `unfolded` (a read model that lags)
        self.unfolded: list[tuple[AnyEvent, int, int]] = []
        self._history = history
        self.records: list[list[Record]] = [[] for _ in range(PARTITIONS)]  # the events stream
        self._wakeups = Wakeups(clock.now_ms)
        self._decoder = EventDecoder("events_stream")
        history.observe(self._wakeups)
        # Its events stream is never pruned: it stands for archive + log alike.
        self._run_history = History(
            history, clock, DEFAULT_WINDOW_MS, ArchivedRuns(self, None, EventDecoder("history"))
        )
        # one model holds every partition (a test may swap it: read it each time)
        self._reader = HistoryReader(
            PARTITIONS,
            lambda p: every_partition(Held(self._history, self._run_history))(p),
            lambda: [Held(self._history, self._run_history)],
            archived=lambda: self._run_history.archived is not None,
            past_window=lambda run_id: self._run_history.past_window(run_id),
        )

    # -- the port ---------------------------------------------------------------------------

    async def execute(self, command: AnyCommand) -> list[AnyEvent]:
        self._check_available()
        return self._decide(partition_for(routing_key(command), PARTITIONS), command)

    async def execute_many(
        self, commands: Sequence[AnyCommand], *, visible: bool = True
    ) -> list[list[AnyEvent] | CronlogError]:
        # ``visible`` changes nothing here: the read model folds as each event is decided (or,
        # with ``folding`` False, lags whatever the caller asked), and nothing waits for it.
        self._check_available()
        results: list[list[AnyEvent] | CronlogError] = []
        for command in commands:
            try:
                results.append(await self.execute(command))
            except CronlogError as err:
                results.append(err)
        return results

    async def claim(
        self, tenant: str, pool: str, worker_id: str, limit: int, horizon_ms: int = 0
    ) -> list[LeaseGranted]:
        self._check_available()
        granted: list[LeaseGranted] = []
        for p in range(PARTITIONS):
            if len(granted) >= limit:
                break
            ask = ClaimRuns(
                tenant=tenant,
                pool=pool,
                worker_id=worker_id,
                limit=limit - len(granted),
                horizon_ms=horizon_ms,
            )
            granted += [e for e in self._decide(p, ask) if isinstance(e, LeaseGranted)]
        return granted

    def return_leases(self, leases: Sequence[LeaseGranted], why: str) -> None:
        """Decided at once here (the node's is a task of the loop)."""
        self.returned.append((list(leases), why))
        for lease in leases:
            command = ReturnLease(run_id=lease.run_id, fencing_token=lease.fencing_token)
            self._decide(partition_for(routing_key(command), PARTITIONS), command)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    @property
    def wakeups(self) -> Wakeups:
        return self._wakeups

    @property
    def num_partitions(self) -> int:
        return PARTITIONS

    def read_events(self, partition: int, from_offset: int, max_records: int) -> list[Record]:
        return self.records[partition][max(0, from_offset) :][:max_records]

    def events_end(self, partition: int) -> int:
        return len(self.records[partition])

    def start_offset(self, stream: str, partition: int) -> int:
        return 0

    def end_offset(self, stream: str, partition: int) -> int:
        return len(self.records[partition])

    @property
    def events_decoder(self) -> EventDecoder:
        return self._decoder

    def next_ready(self, tenant: str, pool: str, horizon_ms: int = 0) -> int | None:
        now = self.clock.now_ms() + horizon_ms
        later = [
            run.available_at
            for partition in self.partitions
            for run in partition.state.runs.values()
            if run.status is RunStatus.PENDING
            and run.tenant == tenant
            and partition.state.pool_of(run) == pool
            and run.available_at > now
        ]
        return min(later, default=None)

    def ready(self) -> bool:
        return self.is_ready

    @property
    def history(self) -> ReadModel:
        return self._history

    @property
    def run_history(self) -> History:
        return self._run_history

    @property
    def reader(self) -> HistoryReader:
        return self._reader

    def watch_elsewhere(self, tenant: str, pool: str, wait_s: float) -> None:
        pass  # one read model folds every partition

    # -- driving it -------------------------------------------------------------------------

    def advance(self, ms: Millis) -> None:
        """Move the clock forward by ``ms``, deciding each slot and lease timer at its deadline
        (as a node that never falls behind would); the clock then rests at the end."""
        until = self.clock.now_ms() + ms
        while True:
            deadlines = [
                (deadline, p)
                for p, partition in enumerate(self.partitions)
                if (deadline := partition.next_deadline()) is not None and deadline <= until
            ]
            if not deadlines:
                break
            deadline, p = min(deadlines)
            self.clock.set(max(deadline, self.clock.now_ms()))
            self.partitions[p].advance(self.clock.now_ms())
            self._fire(p)
        self.clock.set(until)
        for p, partition in enumerate(self.partitions):
            partition.advance(until)
            self._fire(p)

    def _fire(self, p: int) -> None:
        partition = self.partitions[p]
        while (key := partition.next_due()) is not None:
            if key[0] not in ("ready", "ask"):  # no push executors here
                self._record(p, partition.fire(key, self.clock.now_ms()))

    def fold(self) -> None:
        """Fold what waits into the read model (at once unless a test set ``folding`` False)."""
        for event, p, offset in self.unfolded:
            self._history.process(event, p, offset)
        self.unfolded.clear()

    def _check_available(self) -> None:
        if not self.available:
            raise Unavailable("no owner for the partition (a test said so)")

    def _decide(self, p: int, command: AnyCommand) -> list[AnyEvent]:
        events = self.partitions[p].handle(command, self.clock.now_ms())
        self._record(p, events)  # timers that came due wait for advance(), as before a node looks
        return events

    def _record(self, p: int, events: list[AnyEvent]) -> None:
        for event in events:
            data = encode(event)
            event = decode(data)  # as the log stores and replays it
            self.records[p].append(Record(p, self.offsets[p], data))
            self.unfolded.append((event, p, self.offsets[p]))
            if self.folding:
                self.fold()
            self.offsets[p] += 1
            self.events.append(event)
