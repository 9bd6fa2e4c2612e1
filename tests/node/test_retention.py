"""Retention never prunes what a recovery still needs.

A partition's state store is left behind the log (a node stopped mid-catch-up, or a store that
lost its unsynced tail): retention then runs with every segment long expired and no archive,
so the recovery floor is all that stands between the store and the events it still has to
fold. After pruning the node is "killed" (everything closed as it stands) and restarted: the
store catches up from the log alone and equals the state folded from the whole history.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from core import events as ev
from core.errors import CronlogError, Pruned, Unavailable
from core.state import PartitionState, evolve
from eventlog.embedded import EmbeddedLog
from eventlog.retention import Retention, Segment, commands_may_go_below, sealed_below
from node.retention import EmbeddedRetention, KafkaRetention, RetentionMetrics, recovery_floor
from node.worker import PeriodicWorker
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import RocksStateStore, catch_up
from tests.projections.histories import Writers, busy_partition

DAY = 86_400_000


def _folded(values: list[bytes]) -> bytes:
    state = PartitionState(0)
    for value in values:
        evolve(state, ev.decode(value))
    return state.snapshot()


def _history(tmp_path: Path) -> tuple[list[bytes], int]:
    """A log of one partition in 2 KiB segments; the state store caught up to a third of it,
    the read model to all of it. Returns the events and the store's offset."""
    values = busy_partition(seed=3, steps=300, partition=0).log
    third = len(values) // 3
    with EmbeddedLog.open(tmp_path / "log", 1, segment_bytes=2048) as log:
        writers = Writers(log)
        writers.append(0, values[:third], chunk=25)
        with RocksStateStore.open(tmp_path / "node", 0) as store:
            catch_up(store, log, 0)
        writers.append(0, values[third:], chunk=25)
        writers.close()
        with ReadModel.open(tmp_path / "node") as model:
            ReadModelRunner(log, model).run_once()
        assert len(log.segments("events", 0)) > 10
    return values, third


def _prune_a_year_later(tmp_path: Path, floor_of: str) -> int:
    """Open everything as a node would, run one retention pass a year on; return the start."""
    with (
        EmbeddedLog.open(tmp_path / "log", 1, segment_bytes=2048) as log,
        RocksStateStore.open(tmp_path / "node", 0) as store,
        ReadModel.open(tmp_path / "node") as model,
    ):

        def floor(partition: int) -> int | None:
            state_store = store.durable_offset() if floor_of == "both" else None
            read_model = model.durable_positions().get(partition, 0)
            if floor_of == "read model only":  # what a floor that forgot the store would say
                return read_model
            return recovery_floor(state_store=state_store, read_model=read_model)

        loop = EmbeddedRetention(
            log,
            Retention(retention_ms=DAY),
            floor,
            RetentionMetrics(CollectorRegistry()),
            archiver=None,
        )
        loop.run_once(now_ms=log.segments("events", 0)[-1].last_ms + 365 * DAY)
        return log.start_offset("events", 0)


def test_pruning_stops_at_the_state_stores_checkpoint_and_recovery_still_equals(
    tmp_path: Path,
) -> None:
    values, store_offset = _history(tmp_path)
    start = _prune_a_year_later(tmp_path, "both")
    assert 0 < start <= store_offset, "retention pruned nothing, or past what the store needs"
    # Killed here; the restart recovers from the store and the log alone.
    with (
        EmbeddedLog.open(tmp_path / "log", 1) as log,
        RocksStateStore.open(tmp_path / "node", 0) as store,
    ):
        state = catch_up(store, log, 0)
    assert state.snapshot() == _folded(values)


def test_a_floor_that_forgot_the_state_store_would_have_broken_recovery(tmp_path: Path) -> None:
    """The check above can fail: prune by the read model alone and the store cannot recover."""
    _, store_offset = _history(tmp_path)
    assert _prune_a_year_later(tmp_path, "read model only") > store_offset
    with (
        EmbeddedLog.open(tmp_path / "log", 1) as log,
        RocksStateStore.open(tmp_path / "node", 0) as store,
        pytest.raises(Pruned),
    ):
        catch_up(store, log, 0)


def test_an_unknown_checkpoint_prunes_nothing(tmp_path: Path) -> None:
    _history(tmp_path)
    assert _prune_a_year_later(tmp_path, "unknown") == 0


def test_the_floor_is_the_least_known_checkpoint_and_takes_a_snapshot_offset() -> None:
    assert recovery_floor(state_store=40, read_model=90) == 40
    assert recovery_floor(state_store=40, read_model=90, snapshot=25) == 25
    assert recovery_floor(state_store=None, read_model=90, snapshot=25) is None
    assert recovery_floor(state_store=40, read_model=None) is None


def test_commands_an_owner_has_not_decided_stay_however_old_and_decided_ones_go(
    tmp_path: Path,
) -> None:
    """``P.commands`` keeps only what an owner can still need: every sealed segment wholly
    below the owner's command position goes at the next pass, however young (the command
    retention is Kafka's backstop for commands nobody decided), and nothing at or above it,
    however old."""
    values = [b"command %03d " % i + b"x" * 60 for i in range(80)]
    with EmbeddedLog.open(tmp_path / "log", 1, segment_bytes=512) as log:
        offsets = [log.submit(0, value) for value in values]
        decided = offsets[49] + 1  # the owner decided the first 50
        writers = Writers(log)
        writers.writer(0).append([], commands_through=decided)
        writers.close()
        assert log.command_position(0) == decided
        segments = log.segments("commands", 0)
        assert len(segments) > 5
        loop = EmbeddedRetention(
            log,
            Retention(retention_ms=DAY, command_retention_ms=DAY),
            lambda p: None,  # the events' floor unknown: only commands may go
            RetentionMetrics(CollectorRegistry()),
            archiver=None,
        )
        loop.run_once(now_ms=segments[-1].last_ms)  # younger than the command retention
        start = log.start_offset("commands", 0)
        # Pruned up to the last sealed boundary at or below the position, never past it.
        assert start == max(s.first for s in segments if s.first <= decided) > 0
        kept = log.read_commands(0, decided, max_records=1000)
        assert [r.value for r in kept] == values[decided:]
        assert log.start_offset("events", 0) == 0
        loop.run_once(now_ms=segments[-1].last_ms + 365 * DAY)  # a year on: undecided stay
        assert log.start_offset("commands", 0) == start
        assert [r.value for r in log.read_commands(0, decided, 1000)] == values[decided:]


class _Trims:
    """A log whose trim of partition 0 fails, as a broker refusing DeleteRecords would."""

    def __init__(self) -> None:
        self.trimmed: list[int] = []

    def trim_commands(self, partition: int) -> tuple[int, int] | None:
        if partition == 0:
            raise CronlogError("DeleteRecords: TOPIC_AUTHORIZATION_FAILED")
        self.trimmed.append(partition)
        return 10, 25


def test_a_failed_trim_of_the_commands_is_counted_and_the_other_partitions_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trims = _Trims()
    metrics = RetentionMetrics(CollectorRegistry())
    loop = KafkaRetention(trims, lambda: [0, 1], metrics, archiver=None, retention_ms=None)
    with caplog.at_level("ERROR", logger="node.retention"):
        loop.run_once(now_ms=0)
    assert trims.trimmed == [1]
    assert metrics.failures._value.get() == 1
    assert metrics.pruned_records.labels("commands")._value.get() == 15
    assert "trimming the commands of partition 0 failed" in caplog.text


class _Away:
    """A log whose trim finds the broker away (librdkafka's timeout, a retriable error)."""

    def trim_commands(self, partition: int) -> tuple[int, int] | None:
        raise Unavailable("chaos.commands[3] not trimmed now: Local: Timed out")


def test_a_trim_a_broker_away_stopped_is_one_warning_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A broker kill in a chaos run logged each owner's failed trim at ERROR with a traceback
    # through librdkafka's futures: operators page on those, and nothing was wrong but the
    # broker's absence, which the next pass outlives.
    metrics = RetentionMetrics(CollectorRegistry())
    loop = KafkaRetention(_Away(), lambda: [3], metrics, archiver=None, retention_ms=None)
    with caplog.at_level("WARNING", logger="node.retention"):
        loop.run_once(now_ms=0)
    assert metrics.failures._value.get() == 1
    [record] = [r for r in caplog.records if r.name == "node.retention"]
    assert record.levelname == "WARNING" and record.exc_info is None
    assert "partition 3 failed (chaos.commands[3] not trimmed now" in record.getMessage()


def test_commands_may_go_below_the_durable_position_in_whole_sealed_segments() -> None:
    assert commands_may_go_below(None, 0) is None  # the position unknown: nothing goes
    assert commands_may_go_below(7, 7) is None and commands_may_go_below(3, 7) is None
    assert commands_may_go_below(12, 7) == 12
    segments = [Segment(0, 5, 50, 0, 0), Segment(5, 9, 40, 0, 0), Segment(9, 20, 90, 0, 0)]
    assert sealed_below(segments, 4) is None
    assert sealed_below(segments, 8) == 5
    assert sealed_below(segments, 20) == 9  # the active segment always stays


def test_a_retention_loop_is_a_periodic_worker_whose_failed_pass_is_logged_and_the_next_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The retention loops are the node's one periodic-loop primitive: a pass that fails as a
    whole (not one partition's: a bug) is logged and counted, and the thread goes on."""
    asked: list[int] = []
    second_pass = threading.Event()

    def wall_ms() -> int:
        asked.append(1)
        if len(asked) == 1:
            raise RuntimeError("the first pass broke")
        second_pass.set()
        return 0

    metrics = RetentionMetrics(CollectorRegistry())
    with EmbeddedLog.open(tmp_path / "log", 1) as log:
        loop = EmbeddedRetention(
            log,
            Retention(retention_ms=DAY),
            lambda partition: None,
            metrics,
            archiver=None,
            interval_s=0.01,
            wall_ms=wall_ms,
        )
        assert isinstance(loop, PeriodicWorker) and loop.name == "retention"
        loop.start()
        try:
            assert second_pass.wait(10)
            assert loop.alive and loop.started
        finally:
            loop.stop()
    assert metrics.failures._value.get() == 1
    [failed] = [r for r in caplog.records if r.name == "node.retention"]
    assert failed.levelno == logging.ERROR and failed.exc_info is not None
    assert "retention: a pass failed" in failed.getMessage()
    assert not loop.alive and not loop.started
