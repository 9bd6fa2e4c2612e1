"""Time travel: what a partition believed as of an offset or an instant.

The answer is the state folded from the nearest snapshot at or before the point plus the
events after it (from offset 0 when no snapshot is kept that early), so its cost is the tail,
not the log's age. ``python -m tools.replay state`` and the operator's ``GET
/v1/operator/state`` both call :func:`state_at` and :func:`describe_state`: one
implementation, one answer.

``offset`` N means the state of the events below N (what the owner had decided when it
appended event N-1); an ``instant`` means the state after the last event decided at or before
it. With both, the earlier point wins. With neither, the log's end as it is now.

A snapshot store keeps only a few snapshots (files: two; Kafka: the newest), so a point in the
past may have none before it and folds from offset 0. ``max_events`` bounds that: a question
that would fold more is refused with :class:`core.errors.TooMuchToFold` before or while it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from core.clock import Millis
from core.errors import StoreDamaged, TooMuchToFold
from core.state import PartitionState, evolve
from eventlog.port import EventLog
from eventlog.snapshots import SnapshotStore, StoredSnapshot
from projections.decoding import EventDecoder
from projections.snapshot import SnapshotUnusable, decode, read_header
from projections.state_store import build

logger = logging.getLogger(__name__)
READ_BATCH = 1000
MAX_SNAPSHOTS_LOOKED_AT = 1000  # a store keeps a handful; the bound only guards the loop


@dataclass
class StateAsOf:
    state: PartitionState
    offset: int  # the next offset the state reflects
    from_snapshot: int | None  # the offset of the snapshot it started from
    folded: int  # events folded after it


def restore(stored: StoredSnapshot, partition: int) -> PartitionState:
    """The state a snapshot holds, checked against the offset it was stored at."""
    snapshot = decode(stored.data, partition)
    try:
        state, offset = build(partition, snapshot.items)
    except StoreDamaged as damage:
        raise SnapshotUnusable(str(damage)) from damage
    if offset != snapshot.offset or offset != stored.offset:
        raise SnapshotUnusable(
            f"snapshot stored at offset {stored.offset} holds a state at offset {offset}"
        )
    return state


def state_at(
    log: EventLog,
    snapshots: SnapshotStore | None,
    partition: int,
    decoder: EventDecoder,
    *,
    offset: int | None = None,
    instant: Millis | None = None,
    max_events: int | None = None,
    on_read: Callable[[int], None] | None = None,
) -> StateAsOf:
    """``partition``'s state as of ``offset`` or ``instant`` (see the module's docstring);
    ``on_read`` is told how many records each read brought."""
    end = log.end_offset("events", partition)
    until = end if offset is None else min(offset, end)
    base = (
        None if snapshots is None else nearest(log, snapshots, partition, decoder, until, instant)
    )
    state, start = PartitionState(partition), 0
    for _ in range(MAX_SNAPSHOTS_LOOKED_AT):
        if base is None:
            break
        try:
            state, start = restore(base, partition), base.offset
            break
        except SnapshotUnusable as exc:  # as a recovery does: the one before it, else the log
            logger.warning(
                "partition %d: the snapshot at offset %d cannot be restored (%s); time travel"
                " tries an older one",
                partition,
                base.offset,
                exc,
            )
            assert snapshots is not None
            base = nearest(log, snapshots, partition, decoder, until, instant, below=base.offset)
    if max_events is not None and instant is None and until - start > max_events:
        raise TooMuchToFold(
            "partition" if offset is None else "offset",
            f"{until - start} events after the nearest snapshot, more than {max_events}",
        )
    folded = 0
    reached = start
    position = start
    while position < until:
        records = log.read_events(partition, position, min(READ_BATCH, until - position))
        if not records:
            break
        if on_read is not None:
            on_read(len(records))
        for record in records:
            if record.offset >= until:
                break
            event = decoder.decode(record)
            if event is not None:
                if instant is not None and event.at > instant:
                    return StateAsOf(state, reached, _offset_of(base), folded)
                if max_events is not None and folded >= max_events:
                    raise TooMuchToFold(
                        "at", f"more than {max_events} events after the nearest snapshot"
                    )
                evolve(state, event)
                folded += 1
            reached = record.offset + 1
        position = records[-1].offset + 1
    return StateAsOf(state, reached, _offset_of(base), folded)


def _offset_of(base: StoredSnapshot | None) -> int | None:
    return None if base is None else base.offset


def nearest(
    log: EventLog,
    snapshots: SnapshotStore,
    partition: int,
    decoder: EventDecoder,
    until: int,
    instant: Millis | None,
    below: int | None = None,
) -> StoredSnapshot | None:
    """The newest snapshot at or before ``until`` (and below ``below``) and, for an
    ``instant``, holding no event decided after it, among those the store keeps. The
    snapshot's own time is not enough: it is the snapshotting node's clock, so the last event
    it holds is read and checked too."""
    candidate = snapshots.latest(partition) if below is None else snapshots.older(partition, below)
    for _ in range(MAX_SNAPSHOTS_LOOKED_AT):
        if candidate is None:
            return None
        if candidate.offset <= until and (
            instant is None
            or (
                _taken_at(candidate) <= instant
                and _last_at(log, partition, decoder, candidate) <= instant
            )
        ):
            return candidate
        candidate = snapshots.older(partition, below=candidate.offset)
    return None


def _last_at(
    log: EventLog, partition: int, decoder: EventDecoder, stored: StoredSnapshot
) -> Millis:
    """When the last event a snapshot holds was decided (0 for a snapshot of nothing; a
    foreign record there says nothing, so the snapshot is taken as it is)."""
    if stored.offset == 0:
        return 0
    records = log.read_events(partition, stored.offset - 1, 1)
    event = decoder.decode(records[0]) if records else None
    return 0 if event is None else event.at


def _taken_at(stored: StoredSnapshot) -> Millis:
    try:
        return read_header(stored.data)[2]
    except SnapshotUnusable:
        return 2**63  # unreadable: never the base of a time travel


def describe_state(
    state: PartitionState, tenant: str | None = None, job: str | None = None
) -> dict[str, Any]:
    """A JSON-ready view of a state: its jobs (status, next slot) and runs (status, attempt,
    worker, lease), of one tenant or one job (the log's id) if asked."""
    jobs = [
        j
        for j in state.jobs.values()
        if (tenant is None or j.spec.tenant == tenant) and (job is None or j.job_id == job)
    ]
    runs = [
        r
        for r in state.runs.values()
        if (tenant is None or r.tenant == tenant) and (job is None or r.job_id == job)
    ]
    return {
        "partition": state.partition,
        "jobs": [
            {
                "job_id": j.job_id,
                "tenant": j.spec.tenant,
                "status": j.status.value,
                "version": j.version,
                "next_slot": j.next_slot,
                "live_runs": list(j.live),
            }
            for j in jobs
        ],
        "runs": [
            msgspec.to_builtins(r, builtin_types=None)
            | {"status": r.status.value, "trigger": r.trigger.value}
            for r in runs
        ],
    }


def report(
    answer: StateAsOf,
    instant: Millis | None,
    tenant: str | None = None,
    job: str | None = None,
) -> dict[str, Any]:
    """What both the tool and the endpoint answer: the view plus where it stands."""
    out = describe_state(answer.state, tenant, job)
    out["as_of"] = {"offset": answer.offset, "instant": instant}
    out["from_snapshot"] = answer.from_snapshot
    out["events_folded"] = answer.folded
    return out
