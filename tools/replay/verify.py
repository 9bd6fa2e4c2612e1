"""``verify``: each partition's stored state equals a replay of its events from offset 0.

For every partition the events stream is folded through ``evolve`` into a fresh state, up to the
end the log had when the check began. The node's state store is loaded and the events after its
stored offset are folded into it in memory, up to the same end (what ``catch_up`` would do,
without writing the store). The two snapshots must be byte-identical; when they are not, the
report names the jobs and runs that differ, or says only their order does. A store that cannot
be read back (``StoreDamaged``) is a difference too, named as such.

Records of the events stream that are not events are passed over by both folds, as by every
reader of the node, and listed under their partition: the stores can still match, but the log
holds something cronlog did not write, which an operator wants to hear about (exit status 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import StoreDamaged
from core.state import PartitionState, evolve
from eventlog.port import EventLog
from projections.decoding import EventDecoder, ForeignRecord
from projections.state_store import RocksStateStore
from tools.replay.progress import Meter
from tools.replay.records import decoded
from tools.replay.source import Layout, check_unused

SHOWN = 20  # differing ids listed per kind; the rest are counted


@dataclass
class PartitionCheck:
    partition: int
    end: int  # the events offset both states were brought to
    events: int = 0
    problems: list[str] = field(default_factory=list)
    store_missing: bool = False  # this node keeps no store of the partition (Kafka: not owned)
    foreign: list[ForeignRecord] = field(default_factory=list)  # records that are not events

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        head = f"partition {self.partition}: "
        counted = f"{self.events} events"
        if self.foreign:
            counted += f", {len(self.foreign)} FOREIGN records passed over"
        if self.store_missing:
            line = head + f"NO STORE here ({counted}, end offset {self.end})"
        elif self.ok:
            line = head + f"OK ({counted}, end offset {self.end})"
        else:
            line = head + "DIFFERENT\n" + "\n".join(f"  {p}" for p in self.problems)
            if self.foreign:
                line += f"\n  ({counted})"
        shown = [f"  FOREIGN {f.describe()}" for f in self.foreign[:SHOWN]]
        if len(self.foreign) > SHOWN:
            shown.append(f"  ... and {len(self.foreign) - SHOWN} more foreign records")
        return "\n".join([line, *shown])


def replay_partition(
    log: EventLog, partition: int, end: int, decoder: EventDecoder, meter: Meter | None = None
) -> tuple[PartitionState, int]:
    state = PartitionState(partition)
    count = 0
    for _, event in decoded(log, partition, decoder, 0, end, meter):
        if event is not None:
            evolve(state, event)
            count += 1
    return state, count


def verify_partition(
    log: EventLog, layout: Layout, partition: int, meter: Meter | None = None
) -> PartitionCheck:
    end = log.end_offset("events", partition)
    check = PartitionCheck(partition, end)
    decoder = EventDecoder("verify", check.foreign.append)
    replayed, check.events = replay_partition(log, partition, end, decoder, meter)
    path = layout.state_dir(partition)
    if not path.is_dir():
        check.store_missing = True
        return check
    check_unused(path, "state store")
    try:
        with RocksStateStore(path, partition) as store:
            stored, offset = store.load()
    except StoreDamaged as damage:
        check.problems.append(f"the state store is damaged: {damage}")
        return check
    if offset > end:
        check.problems.append(f"state store is at offset {offset}, past the log's end {end}")
        return check
    for _, event in decoded(log, partition, decoder, offset, end):
        if event is not None:
            evolve(stored, event)
    if stored.snapshot() != replayed.snapshot():
        check.problems = differences(stored, replayed)
    return check


def differences(stored: PartitionState, replayed: PartitionState) -> list[str]:
    out: list[str] = []
    if stored.partition != replayed.partition:
        out.append(f"partition number: stored {stored.partition}, replayed {replayed.partition}")
    if stored.last_token != replayed.last_token:
        out.append(
            f"last fencing token: stored {stored.last_token}, replayed {replayed.last_token}"
        )
    for kind, mine, theirs in (
        ("jobs", stored.jobs, replayed.jobs),
        ("runs", stored.runs, replayed.runs),
    ):
        only_stored = [k for k in mine if k not in theirs]
        only_replayed = [k for k in theirs if k not in mine]
        changed = [k for k in mine if k in theirs and mine[k] != theirs[k]]
        for label, ids in (
            ("only in the store", only_stored),
            ("only in the replay", only_replayed),
            ("differ", changed),
        ):
            if ids:
                out.append(f"{kind} {label}: {_listed(ids)}")
        if not (only_stored or only_replayed or changed) and list(mine) != list(theirs):
            out.append(f"{kind}: the same entries in another order")
    return out or ["snapshots differ"]


def _listed(ids: list[str]) -> str:
    shown = ", ".join(ids[:SHOWN])
    return shown if len(ids) <= SHOWN else f"{shown} and {len(ids) - SHOWN} more"
