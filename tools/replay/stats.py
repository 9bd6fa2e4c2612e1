"""``stats``: what each partition holds and how far the derived stores are behind it.

Per partition: the end offsets of the events and commands streams, where the events stream's
hot log starts (retention) and how far the archive reaches, events per type (records
that are not events counted as ``(foreign)``), and, where the data directory has them, the
state store's offset and the read model's position (``damaged`` for a store that cannot be read
back). A store's
lag is the log's end minus its next offset (offsets need not be contiguous, so on Kafka this is
an upper bound on the events behind, not their count).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

import msgspec

from archive.reading import ArchivedLog
from core.errors import StoreDamaged
from eventlog.port import EventLog
from projections.decoding import EventDecoder
from projections.read_model import ReadModel
from projections.state_store import RocksStateStore
from tools.replay.records import decoded
from tools.replay.source import Layout, check_unused

FOREIGN = "(foreign)"


@dataclass
class PartitionStats:
    partition: int
    events_end: int
    commands_end: int
    by_type: dict[str, int] = field(default_factory=dict)
    state_offset: int | None = None  # None: no state store in this data directory
    read_model_position: int | None = None  # None: no read model in this data directory
    damaged: list[str] = field(default_factory=list)  # stores that cannot be read back
    log_start: int = 0  # the hot log's first offset: retention removed what is below it
    archived_through: int | None = None  # None: no archive

    @property
    def state_lag(self) -> int | None:
        return None if self.state_offset is None else max(0, self.events_end - self.state_offset)

    @property
    def read_model_lag(self) -> int | None:
        if self.read_model_position is None:
            return None
        return max(0, self.events_end - self.read_model_position)


def collect(log: EventLog, layout: Layout | None) -> list[PartitionStats]:
    found = []
    decoder = EventDecoder("stats")
    for partition in range(log.num_partitions):
        stats = PartitionStats(
            partition, log.end_offset("events", partition), log.end_offset("commands", partition)
        )
        if isinstance(log, ArchivedLog):
            stats.log_start = log.log.start_offset("events", partition)
            stats.archived_through = log.archive.archived_through(partition)
        else:
            stats.log_start = log.start_offset("events", partition)
        counts = Counter(
            FOREIGN if event is None else type(event).__name__
            for _, event in decoded(log, partition, decoder, 0, stats.events_end)
        )
        stats.by_type = dict(sorted(counts.items()))
        if layout is not None and layout.state_dir(partition).is_dir():
            check_unused(layout.state_dir(partition), "state store")
            try:
                with RocksStateStore(layout.state_dir(partition), partition) as store:
                    stats.state_offset = store.load()[1]
            except StoreDamaged as damage:
                stats.damaged.append(f"state store: {damage}")
        found.append(stats)
    if layout is not None and layout.read_model_dir.is_dir():
        check_unused(layout.read_model_dir, "read model")
        try:
            with ReadModel(layout.read_model_dir) as model:
                for stats in found:
                    stats.read_model_position = model.position(stats.partition)
        except StoreDamaged as damage:
            for stats in found:
                stats.damaged.append(f"read model: {damage}")
    return found


def report(found: list[PartitionStats], as_json: bool, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if as_json:
        for stats in found:
            out.write(
                msgspec.json.encode(
                    {
                        "partition": stats.partition,
                        "events_end": stats.events_end,
                        "commands_end": stats.commands_end,
                        "log_start": stats.log_start,
                        "archived_through": stats.archived_through,
                        "events_by_type": stats.by_type,
                        "state_offset": stats.state_offset,
                        "state_lag": stats.state_lag,
                        "read_model_position": stats.read_model_position,
                        "read_model_lag": stats.read_model_lag,
                        "damaged": stats.damaged,
                    }
                ).decode()
                + "\n"
            )
        return
    for stats in found:
        state = (
            "-" if stats.state_offset is None else f"{stats.state_offset} (lag {stats.state_lag})"
        )
        model = (
            "-"
            if stats.read_model_position is None
            else f"{stats.read_model_position} (lag {stats.read_model_lag})"
        )
        archived = (
            "" if stats.archived_through is None else f", archived to {stats.archived_through}"
        )
        out.write(
            f"partition {stats.partition}: events end {stats.events_end} (log from "
            f"{stats.log_start}{archived}), commands end {stats.commands_end}, state store at "
            f"{state}, read model at {model}\n"
        )
        for damage in stats.damaged:
            out.write(f"  DAMAGED {damage}\n")
        for kind, count in stats.by_type.items():
            out.write(f"  {kind:<18} {count}\n")
    total: Counter[str] = Counter()
    for stats in found:
        total.update(stats.by_type)
    out.write(f"total: {sum(total.values())} events\n")
    for kind, count in sorted(total.items()):
        out.write(f"  {kind:<18} {count}\n")
