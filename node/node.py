"""A cronlog node: the partitions it owns, its executors, the read model, and the API's port.

The same node runs on the embedded log (one machine, every partition) and on Kafka (several
nodes; the consumer group decides who owns what). It learns ownership only through the log's
membership callbacks:

- ``assigned``: for each partition, open its state store and start a
  :class:`~node.runner.PartitionRunner` (which catches up and rebuilds its wheel before
  deciding anything);
- ``revoked``: stop those runners at once.

Requests for a partition this node owns go straight to its runner. Requests for a partition
owned elsewhere are refused as unavailable for now (forwarding them is the cluster issue's
next step). Every answer is given only once its events are durable in the log and the read
model has caught up with them, so a client reads its own writes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from pathlib import Path

from core import events as ev
from core.clock import Clock, SystemClock
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
    StartRun,
    TriggerRun,
    UpstreamSucceeded,
)
from core.decide import job_id_of_run
from core.errors import CronlogError, Unavailable
from eventlog.port import EventLog, Membership, partition_for
from node.executors import Executors
from node.runner import Decided, PartitionRunner, Request
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import RocksStateStore

log = logging.getLogger(__name__)

READ_YOUR_WRITES_S = 5.0


def routing_key(command: AnyCommand) -> str:
    """The job id that decides which partition a command goes to."""
    match command:
        case PutJob() | PauseJob() | ResumeJob() | CancelJob() | TriggerRun() | UpstreamSucceeded():
            return command.job_id
        case StartRun() | HeartbeatRun() | CompleteRun() | CancelRun() | ReplayRun():
            return job_id_of_run(command.run_id)
    raise TypeError(f"{type(command).__name__} is not routed by job")


class Node:
    def __init__(
        self,
        log_: EventLog,
        data_dir: Path,
        *,
        node_id: str = "node-1",
        clock: Clock | None = None,
        executors: Executors | None = None,
    ) -> None:
        self.node_id = node_id
        self._log = log_
        self._data_dir = Path(data_dir)
        self._clock = clock or SystemClock()
        self.executors = executors or Executors(node_id)
        self._runners: dict[int, PartitionRunner] = {}
        self._stores: dict[int, RocksStateStore] = {}
        self._lock = threading.Lock()
        self._membership: Membership | None = None
        self._poller: threading.Thread | None = None
        self._stopping = threading.Event()
        self._assigned = threading.Event()
        self._history = ReadModel.open(self._data_dir)
        self._history_runner = ReadModelRunner(log_, self._history)

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.executors.start()
        self._history_runner.start()
        self._membership = self._log.join(self)
        self._poller = threading.Thread(target=self._poll, name="membership", daemon=True)
        self._poller.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._poller is not None:
            self._poller.join(10)
        if self._membership is not None:
            self._membership.close()  # revokes every partition first
        self.revoked(list(self._runners))
        self.executors.stop()
        self._history_runner.stop()
        self._history.close()

    def _poll(self) -> None:
        assert self._membership is not None
        while not self._stopping.is_set():
            try:
                records = self._membership.poll(0.2)
            except CronlogError:
                if self._stopping.is_set():
                    return
                log.exception("membership poll failed")
                continue
            for record in records:
                self._from_log(record.partition, record.offset, record.value)

    def _from_log(self, partition: int, offset: int, value: bytes) -> None:
        from core.commands import decode

        runner = self._runners.get(partition)
        if runner is None:
            return
        try:
            command = decode(value)
        except Exception:
            log.warning("partition %d: undecodable command at %d skipped", partition, offset)
            command = None
        if command is not None:
            runner.submit(Request(command, offset=offset))

    # -- ownership (called from inside Membership.poll) -------------------------------------

    def assigned(self, partitions: list[int]) -> None:
        assert self._membership is not None
        for p in partitions:
            store = RocksStateStore.open(self._data_dir, p)
            runner = PartitionRunner(
                p, self._log, self._membership.writer(p), store, self._clock, self.executors
            )
            with self._lock:
                self._stores[p] = store
                self._runners[p] = runner
            runner.start()
        self._assigned.set()
        log.info("%s owns partitions %s", self.node_id, sorted(self._runners))

    def revoked(self, partitions: list[int]) -> None:
        for p in partitions:
            with self._lock:
                runner = self._runners.pop(p, None)
                store = self._stores.pop(p, None)
            if runner is not None:
                runner.stop()
            if store is not None:
                store.close()

    # -- the API's port ------------------------------------------------------------------------

    @property
    def history(self) -> ReadModel:
        return self._history

    def now_ms(self) -> int:
        return self._clock.now_ms()

    def ready(self) -> bool:
        runners = list(self._runners.values())
        return bool(runners) and all(r.caught_up.is_set() and not r.stopped for r in runners)

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until this node owns partitions and every one has caught up."""
        deadline = time.monotonic() + timeout_s
        if not self._assigned.wait(timeout_s):
            return False
        for runner in list(self._runners.values()):
            if not runner.caught_up.wait(max(0.0, deadline - time.monotonic())):
                return False
        return self.ready()

    def owned(self) -> list[int]:
        return sorted(self._runners)

    async def execute(self, command: AnyCommand) -> list[ev.AnyEvent]:
        partition = partition_for(routing_key(command), self._log.num_partitions)
        return await self._execute_on(partition, command)

    async def _execute_on(self, partition: int, command: AnyCommand) -> list[ev.AnyEvent]:
        runner = self._runners.get(partition)
        if runner is None:
            raise Unavailable(f"partition {partition} is not owned by {self.node_id}")
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Decided | CronlogError] = loop.create_future()

        def deliver(result: Decided | CronlogError) -> None:
            if not answer.done():
                answer.set_result(result)

        def settle(result: Decided | CronlogError) -> None:
            loop.call_soon_threadsafe(deliver, result)

        runner.submit(Request(command, reply=settle))
        result = await answer
        if isinstance(result, CronlogError):
            raise result
        if result.offsets:
            await asyncio.to_thread(
                self._history.wait_for, partition, result.offsets[-1], READ_YOUR_WRITES_S
            )
        return result.events

    async def claim(
        self, tenant: str, pool: str, worker_id: str, limit: int
    ) -> list[ev.LeaseGranted]:
        granted: list[ev.LeaseGranted] = []
        partitions = [p for p, r in list(self._runners.items()) if r.state.ready.get(pool)]
        random.shuffle(partitions)  # no partition is always asked first
        for p in partitions:
            if len(granted) >= limit:
                break
            command = ClaimRuns(
                tenant=tenant, pool=pool, worker_id=worker_id, limit=limit - len(granted)
            )
            try:
                events = await self._execute_on(p, command)
            except Unavailable:
                continue
            granted += [e for e in events if isinstance(e, ev.LeaseGranted)]
        return granted
