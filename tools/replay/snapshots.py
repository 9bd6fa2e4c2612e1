"""Snapshots, checked and used: ``verify --from-snapshot`` and ``state --at`` (time travel).

``verify --from-snapshot`` holds each partition's newest snapshot against the log. The events
are folded from offset 0; at the snapshot's offset the fold must equal the snapshot's state,
byte for byte (the snapshot is what the owner folded), and at the log's end it must equal the
snapshot with the tail after it folded in (what a new owner restoring it would decide from).
A snapshot that cannot be decoded, or one past the log's end, is a difference.

``state --offset OFFSET`` or ``--at INSTANT``: what the partition believed then, from the
nearest snapshot at or before that point plus the events after it (from offset 0 when there is
none), by :mod:`projections.time_travel`, as the node's ``GET /v1/operator/state`` answers it.
An instant means the state after the last event decided at or before it. Printed as JSON:
every job (status, next slot) and every run (status, attempt, worker, lease) the state held,
optionally of one tenant or one job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.clock import Millis
from core.state import PartitionState, evolve
from eventlog.port import EventLog
from eventlog.snapshots import FileSnapshots, SnapshotStore
from projections import time_travel
from projections.decoding import ForeignRecord
from projections.snapshot import SnapshotUnusable
from tools.replay.progress import Meter
from tools.replay.records import decoded, tool_decoder
from tools.replay.verify import differences


@dataclass
class SnapshotCheck:
    partition: int
    end: int
    offset: int | None = None  # the snapshot's, None when there is none
    tail: int = 0  # events after it
    problems: list[str] = field(default_factory=list)
    foreign: list[ForeignRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        head = f"partition {self.partition}: "
        if self.offset is None and self.ok:
            return head + f"NO SNAPSHOT (end offset {self.end})"
        if self.ok:
            return (
                head + f"OK (snapshot at offset {self.offset} equals the log folded to it;"
                f" with its tail of {self.tail} events, the log folded to {self.end})"
            )
        return head + "DIFFERENT\n" + "\n".join(f"  {p}" for p in self.problems)


def open_snapshots(args: Any, data_dir: Path) -> SnapshotStore:
    """The snapshots the node keeps: ``<data>/snapshots`` or, with ``--kafka``, the topic."""
    if args.kafka:
        from eventlog.kafka_snapshots import KafkaSnapshots

        return KafkaSnapshots.open(
            args.kafka,
            args.partitions,
            prefix=args.topic_prefix,
            replication_factor=-1,
            min_insync_replicas=None,
        )
    return FileSnapshots(data_dir / "snapshots")


def verify_partition(
    log: EventLog, snapshots: SnapshotStore, partition: int, meter: Meter | None = None
) -> SnapshotCheck:
    end = log.end_offset("events", partition)
    check = SnapshotCheck(partition, end)
    stored = snapshots.latest(partition)
    if stored is None:
        return check
    check.offset = stored.offset
    if stored.offset > end:
        check.problems.append(f"snapshot at offset {stored.offset} is past the log's end {end}")
        return check
    try:
        restored = time_travel.restore(stored, partition)
    except SnapshotUnusable as exc:
        check.problems.append(f"the snapshot cannot be restored: {exc}")
        return check
    decoder = tool_decoder(check.foreign)
    folded = PartitionState(partition)
    compared = False
    broken = False  # the tail could not be folded into the snapshot's state
    for record, event in decoded(log, partition, decoder, 0, end, meter):
        if not compared and record.offset >= stored.offset:
            _compare("at the snapshot's offset", restored, folded, check)
            compared = True
        if event is None:
            continue
        evolve(folded, event)
        if record.offset >= stored.offset and not broken:
            check.tail += 1
            try:
                evolve(restored, event)
            except Exception as exc:  # a state the log's events do not fit
                check.problems.append(
                    f"the tail does not fold into the snapshot: event at offset"
                    f" {record.offset} ({type(event).__name__}) failed with {exc!r}"
                )
                broken = True
    if not compared:
        _compare("at the snapshot's offset", restored, folded, check)
    if not broken:
        _compare("at the log's end", restored, folded, check)
    return check


def _compare(
    where: str, restored: PartitionState, folded: PartitionState, check: SnapshotCheck
) -> None:
    if restored.snapshot() != folded.snapshot():
        check.problems += [f"{where}: {p}" for p in differences(restored, folded)]


def state_at(
    log: EventLog,
    snapshots: SnapshotStore,
    partition: int,
    *,
    offset: int | None = None,
    instant: Millis | None = None,
    meter: Meter | None = None,
) -> tuple[PartitionState, int, int | None, int]:
    """The partition's state as of ``offset`` (the events below it) or ``instant`` (the events
    decided at or before it): (state, the next offset it reflects, the offset of the snapshot
    it started from or None, events folded). The node's operator endpoint answers the same
    through :func:`projections.time_travel.state_at`."""
    found: list[ForeignRecord] = []
    answer = time_travel.state_at(
        log,
        snapshots,
        partition,
        tool_decoder(found),
        offset=offset,
        instant=instant,
        on_read=None if meter is None else meter.advance,
    )
    return answer.state, answer.offset, answer.from_snapshot, answer.folded


describe_state = time_travel.describe_state


def print_state(report: dict[str, Any]) -> None:
    print(json.dumps(report, indent=2, sort_keys=True))
