"""The dependency relay: it rereads a partition's recent events when a node takes it over, and
retries each relay until it is delivered, the partition moves away or the node stops."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from core import events as ev
from core.commands import AnyCommand, UpstreamSucceeded
from core.errors import LogCorrupted, Pruned, Unavailable
from eventlog.memory import MemoryLog
from eventlog.port import EventLog
from node.relay import DependencyRelay, RelayMetrics
from projections.decoding import EventDecoder, ForeignRecord
from tests.projections.histories import Writers


class Dependants:
    """Every partition's dependants index, as the relay asks it."""

    async def dependants_many(self, upstreams: list[tuple[str, str]]) -> dict[str, list[str]]:
        return {upstream: [f"after-{upstream}"] for _, upstream in upstreams}


def completed(job_id: str, slot: int, fencing_token: int = 0) -> bytes:
    return ev.encode(
        ev.RunCompleted(
            at=slot + 5,
            job_id=job_id,
            tenant="t1",
            run_id=f"{job_id}.{slot}",
            scheduled_for=slot,
            started_at=slot + 1,
            fencing_token=fencing_token,
        )
    )


def _recording(
    count: int,
) -> tuple[list[AnyCommand], threading.Event, Callable[[AnyCommand], Awaitable[list[ev.AnyEvent]]]]:
    """An ``execute`` that keeps what it is sent, and an event set once it has ``count``."""
    sent: list[AnyCommand] = []
    done = threading.Event()

    async def execute(command: AnyCommand) -> list[ev.AnyEvent]:
        sent.append(command)
        if len(sent) == count:
            done.set()
        return []

    return sent, done, execute


def test_recovery_relays_past_a_foreign_record_and_reports_it() -> None:
    """A record that was not an event killed the relay's reread on every restart, so the
    successes after it never reached their dependants."""
    log = MemoryLog(1, gaps=True)
    writers = Writers(log)
    writers.append(0, [completed("a", 1000)])
    [foreign] = writers.append(0, [b'{"job_id": "a", "payload": null}'])
    writers.append(0, [completed("b", 2000)])
    sent, both, execute = _recording(2)

    seen: list[ForeignRecord] = []
    relay = DependencyRelay(
        log,
        lambda: Dependants(),  # type: ignore[arg-type,return-value]
        execute,
        EventDecoder("relay", seen.append),
        owns=lambda partition: True,
    )
    relay.start()
    try:
        relay.recovered(0)
        assert both.wait(10), sent
    finally:
        relay.stop()
    assert sent == [
        UpstreamSucceeded(job_id="after-a", upstream_job_id="a", scheduled_for=1000),
        UpstreamSucceeded(job_id="after-b", upstream_job_id="b", scheduled_for=2000),
    ]
    assert [(f.reader, f.offset) for f in seen] == [("relay", foreign)]
    writers.close()
    log.close()


# -- retrying ------------------------------------------------------------------------------------


class Backoff:
    """The relay's backoff waits, recorded and over at once: no time passes in these tests."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(0)  # lets the loop run what else is ready, as a real wait would


class FlakyExecute:
    """A node's ``execute`` that fails with ``failures[i]`` on its i-th call, then answers."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls: list[AnyCommand] = []
        self.delivered = threading.Event()

    async def __call__(self, command: AnyCommand) -> list[ev.AnyEvent]:
        self.calls.append(command)
        if len(self.calls) <= len(self.failures):
            raise self.failures[len(self.calls) - 1]
        self.delivered.set()
        return []


def success(job_id: str = "up", slot: int = 60_000) -> ev.RunCompleted:
    event = ev.decode(completed(job_id, slot))
    assert isinstance(event, ev.RunCompleted)
    return event


def relay_of(
    execute: Callable[[AnyCommand], Awaitable[list[ev.AnyEvent]]],
    registry: CollectorRegistry,
    *,
    log: EventLog | None = None,
    owns: Callable[[int], bool] = lambda partition: True,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> DependencyRelay:
    relay = DependencyRelay(
        log or MemoryLog(1),
        lambda: Dependants(),  # type: ignore[arg-type,return-value]
        execute,
        owns=owns,
        metrics=RelayMetrics(registry),
        sleep=sleep or Backoff(),
    )
    relay.start()
    return relay


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_relay_that_fails_more_than_eight_times_is_still_delivered() -> None:
    """A relay used to give up after its 8th failure: the dependant never ran for that slot,
    and nothing said so."""
    registry = CollectorRegistry()
    backoff = Backoff()
    execute = FlakyExecute(*(Unavailable("partition 3 is not answering") for _ in range(12)))
    relay = relay_of(execute, registry, sleep=backoff)
    try:
        relay.appended(0, [7], [success()])
        assert execute.delivered.wait(10), execute.calls
    finally:
        relay.stop()
    assert (
        execute.calls
        == [UpstreamSucceeded(job_id="after-up", upstream_job_id="up", scheduled_for=60_000)] * 13
    )
    assert backoff.waits == [0.5, 1, 2, 4, 8, 16] + [30] * 6
    assert sample(registry, "cronlog_relay_failures_total") == 12
    assert sample(registry, "cronlog_relay_retrying") == 0
    assert sample(registry, "cronlog_relay_abandoned_total", reason="moved") == 0
    assert sample(registry, "cronlog_relay_abandoned_total", reason="stopped") == 0


def test_a_relay_stops_retrying_once_its_partition_is_owned_elsewhere() -> None:
    registry = CollectorRegistry()
    owned = {2}
    asked_after_move = threading.Event()

    def owns(partition: int) -> bool:
        if partition not in owned:
            asked_after_move.set()
        return partition in owned

    backoff = Backoff()

    async def sleep(seconds: float) -> None:
        await backoff(seconds)
        if len(backoff.waits) == 3:
            owned.clear()  # the group gave partition 2 to another node meanwhile

    execute = FlakyExecute(*(Unavailable("partition 3 is not answering") for _ in range(100)))
    relay = relay_of(execute, registry, owns=owns, sleep=sleep)
    try:
        relay.appended(2, [7], [success()])
        assert asked_after_move.wait(10)
        # The relay gives up in the loop's step that asked (the stop below waits behind it).
    finally:
        relay.stop()
    assert len(execute.calls) == 3
    assert backoff.waits == [0.5, 1, 2]
    assert sample(registry, "cronlog_relay_abandoned_total", reason="moved") == 1
    assert sample(registry, "cronlog_relay_abandoned_total", reason="stopped") == 0
    assert sample(registry, "cronlog_relay_failures_total") == 3
    assert sample(registry, "cronlog_relay_retrying") == 0


def test_a_relay_retrying_when_the_node_stops_is_counted_as_given_up() -> None:
    registry = CollectorRegistry()
    waiting = threading.Event()

    async def sleep(seconds: float) -> None:
        waiting.set()
        await asyncio.Event().wait()  # a backoff the node stops in the middle of

    execute = FlakyExecute(Unavailable("partition 3 is not answering"))
    relay = relay_of(execute, registry, sleep=sleep)
    try:
        relay.appended(0, [7], [success()])
        assert waiting.wait(10)
        assert sample(registry, "cronlog_relay_retrying") == 1
        # The loop holds tasks weakly: a relay waiting on a future only it holds was collected
        # by the next collection (the whole suite's), never cancelled and never counted.
        gc.collect()
    finally:
        relay.stop()
    assert sample(registry, "cronlog_relay_abandoned_total", reason="stopped") == 1
    assert sample(registry, "cronlog_relay_retrying") == 0
    assert not execute.delivered.is_set()


class FlakyLog:
    """A log whose first read of events fails with ``failure``: by default as a broker that is
    briefly away does."""

    def __init__(self, log: MemoryLog, failure: Exception | None = None) -> None:
        self._log = log
        self._failure = failure or Unavailable("the log's partition 0 is not answering")
        self.reads = 0

    def read_events(self, partition: int, from_offset: int, max_records: int = 1000) -> object:
        self.reads += 1
        if self.reads == 1:
            raise self._failure
        return self._log.read_events(partition, from_offset, max_records)

    def __getattr__(self, name: str) -> object:
        return getattr(self._log, name)


def test_a_reread_whose_first_read_fails_still_relays_the_recent_successes() -> None:
    """One failed read used to end the new owner's reread for good: the successes the previous
    owner may not have relayed were never relayed."""
    log = MemoryLog(1, gaps=True)
    writers = Writers(log)
    writers.append(0, [completed("a", 1000)])
    writers.append(0, [completed("b", 2000)])
    registry = CollectorRegistry()
    backoff = Backoff()
    sent, both, execute = _recording(2)

    flaky = FlakyLog(log)
    relay = relay_of(execute, registry, log=flaky, sleep=backoff)  # type: ignore[arg-type]
    try:
        relay.recovered(0)
        assert both.wait(10), sent
    finally:
        relay.stop()
    assert sorted(sent, key=lambda c: c.job_id) == [
        UpstreamSucceeded(job_id="after-a", upstream_job_id="a", scheduled_for=1000),
        UpstreamSucceeded(job_id="after-b", upstream_job_id="b", scheduled_for=2000),
    ]
    assert backoff.waits == [0.5]
    assert flaky.reads >= 2
    assert sample(registry, "cronlog_relay_failures_total") == 1
    writers.close()
    log.close()


def test_a_reread_goes_on_past_events_pruned_under_it(caplog: pytest.LogCaptureFixture) -> None:
    log = MemoryLog(1)
    writers = Writers(log)
    writers.append(0, [completed("a", 1000)])
    [b] = writers.append(0, [completed("b", 2000)])
    registry = CollectorRegistry()
    execute = FlakyExecute()
    pruned = Pruned("events of partition 0 start at b", stream="events", partition=0, start=b)
    relay = relay_of(execute, registry, log=FlakyLog(log, pruned))  # type: ignore[arg-type]
    try:
        relay.recovered(0)
        assert execute.delivered.wait(10)
    finally:
        relay.stop()
    assert execute.calls == [
        UpstreamSucceeded(job_id="after-b", upstream_job_id="b", scheduled_for=2000)
    ]
    assert f"events 0 to {b - 1} were pruned" in caplog.text
    assert sample(registry, "cronlog_relay_failures_total") == 0
    writers.close()
    log.close()


def test_an_unexpected_exception_is_retried_and_its_traceback_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Anything but a CronlogError used to end the relay: the success was dropped."""
    caplog.set_level(logging.INFO, logger="node.relay")
    registry = CollectorRegistry()
    execute = FlakyExecute(*(RuntimeError("a bug in routing") for _ in range(3)))
    relay = relay_of(execute, registry)
    try:
        relay.appended(0, [7], [success()])
        assert execute.delivered.wait(10), execute.calls
    finally:
        relay.stop()
    assert len(execute.calls) == 4
    failed = [r for r in caplog.records if "a bug in routing" in r.getMessage() or r.exc_info]
    assert [(r.levelno, r.exc_info is not None) for r in failed] == [
        (logging.ERROR, True),
        (logging.WARNING, False),
        (logging.WARNING, False),
    ]
    assert "relay of up.60000's success to after-up" in failed[0].getMessage()
    assert sample(registry, "cronlog_relay_failures_total") == 3


def test_a_damaged_log_stops_a_relay_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    backoff = Backoff()
    failed = threading.Event()
    calls: list[AnyCommand] = []

    async def execute(command: AnyCommand) -> list[ev.AnyEvent]:
        calls.append(command)
        failed.set()
        raise LogCorrupted("events of partition 3: checksum mismatch at offset 12")

    relay = relay_of(execute, registry, sleep=backoff)
    try:
        relay.appended(0, [7], [success()])
        assert failed.wait(10)
    finally:
        relay.stop()  # waits behind the step that raised (the relay ends there)
    assert len(calls) == 1
    assert backoff.waits == []
    [stopped] = [r for r in caplog.records if r.name == "node.relay"]
    assert stopped.levelno == logging.ERROR
    assert "dependency relay stopped" in stopped.getMessage()
    assert "checksum mismatch at offset 12" in stopped.getMessage()


def test_lookups_that_come_while_one_is_under_way_go_together_in_the_next() -> None:
    """A steady rate of successes makes one lookup a round, not one a batch: with history kept
    by owners each lookup is a question to every other owner."""
    from node.relay import _Lookups

    asked: list[list[tuple[str, str]]] = []
    release = asyncio.Event()

    async def ask(upstreams: list[tuple[str, str]]) -> dict[str, list[str]]:
        asked.append(upstreams)
        if len(asked) == 1:
            await release.wait()  # the first lookup is under way while more come
        return {job: [f"after-{job}"] for _, job in upstreams}

    async def scenario() -> list[dict[str, list[str]]]:
        lookups = _Lookups(ask, linger_s=0.0)
        first = asyncio.ensure_future(lookups.ask([("t", "a")]))
        await asyncio.sleep(0)  # its round starts and asks
        await asyncio.sleep(0)
        later = [asyncio.ensure_future(lookups.ask([("t", j)])) for j in ("b", "c", "b")]
        await asyncio.sleep(0)
        release.set()
        return [await first, *[await f for f in later]]

    answers = asyncio.run(scenario())
    assert asked == [[("t", "a")], [("t", "b"), ("t", "c")]]  # two lookups for four asks
    assert answers[0] == {"a": ["after-a"]}
    assert all(answer == {"b": ["after-b"], "c": ["after-c"]} for answer in answers[1:])


def test_the_successes_of_batches_appended_together_are_relayed_together() -> None:
    """A steady rate appends a success or two a batch: a hand-off each (a wake of the loop, a
    task, a lookup) was 7 % of the node's main process at 500 runs a second. The batches that
    come within the gathering go to the loop together, a partition's successes in one relay."""
    asked: list[list[str]] = []

    class Recorded(Dependants):
        async def dependants_many(self, upstreams: list[tuple[str, str]]) -> dict[str, list[str]]:
            asked.append([job for _, job in upstreams])
            return await super().dependants_many(upstreams)

    sent, done, execute = _recording(4)
    relay = DependencyRelay(
        MemoryLog(2),
        lambda: Recorded(),  # type: ignore[arg-type,return-value]
        execute,
        owns=lambda partition: True,
        metrics=RelayMetrics(CollectorRegistry()),
        gather_s=0.5,  # the four appends below take microseconds
    )
    relay.start()
    try:
        relay.appended(0, [1], [success("a")])
        relay.appended(1, [1], [success("x")])
        relay.appended(0, [2], [success("b")])
        relay.appended(0, [3], [success("c")])
        assert done.wait(10)
    finally:
        relay.stop()
    # four batches of two partitions: one lookup of their dependants (one a batch before)
    assert [sorted(jobs) for jobs in asked] == [["a", "b", "c", "x"]]
    assert sorted(c.job_id for c in sent if isinstance(c, UpstreamSucceeded)) == [
        "after-a", "after-b", "after-c", "after-x",
    ]  # fmt: skip
