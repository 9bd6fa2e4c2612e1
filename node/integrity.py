"""The start's check that nothing derived from the log is ahead of it.

Every store a node keeps is derived from the log and written after it: a partition's state store
saves a batch only once the log has taken it, a snapshot is of a saved state, and the read model
and its history checkpoints fold what the log holds. So each is at most as far on as the log's
end. One that is further on says the log lost records it had acknowledged: the embedded log's
write-ahead log cut short after a crash (its newest batches and the ends recorded with them
gone together, so the log itself reads as whole), or a log restored from an older backup
without its stores. Served on, the stores would answer for records the log no longer holds, and
the partition's next appends would reuse those offsets for other events.

:func:`check_not_ahead` reads each partition's stored offset (read-only, before anything opens
the stores), the read model's positions, the newest snapshot and the newest history checkpoint,
and raises :class:`core.errors.LogCorrupted` naming every partition a store is ahead on and how
many records are missing: ``cronlog serve`` exits 3 with it (docs/operations.md, "A damaged
log", says what to do).

Worked example: 20 creates acknowledged on partition 1 (offsets 0..19), kill -9, the WAL cut:
the log reopens ending at offset 16 while ``state/p1`` holds ``m/offset`` 20: "events partition
1 ends at offset 16, but the state store of partition 1 and the read model hold events up to
offset 19: 4 records (offsets 16..19) missing".
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from archive.store import ObjectStore
from core.errors import LogCorrupted
from eventlog.port import EventLog
from eventlog.rocks import checked_reads, close_store, iterator_error, open_store
from eventlog.snapshots import SnapshotStore
from projections import history_checkpoint
from projections.model_keys import POSITIONS, from_u64, partition_of, prefix_end
from projections.state_store import OFFSET

log = logging.getLogger(__name__)

_U64 = struct.Struct(">Q")


def check_not_ahead(
    log_: EventLog,
    data_dir: Path,
    snapshots: SnapshotStore | None = None,
    history_store: ObjectStore | None = None,
    *,
    where: str,
) -> None:
    """Raise LogCorrupted if a store of the node at ``data_dir`` (its state stores, its read
    model), a snapshot or the newest history checkpoint holds records past the end of the log's
    events stream (``where``: the log, as the message names it). A store that cannot be read is
    left to its own damage checks."""
    ends = {p: log_.end_offset("events", p) for p in range(log_.num_partitions)}
    ahead: list[tuple[int, str, int]] = []  # (partition, what, records it holds)
    for partition, end in ends.items():
        held = _stored_offset(data_dir / "state" / f"p{partition}")
        if held is not None and held > end:
            ahead.append((partition, f"the state store of partition {partition}", held))
        newest = None
        if snapshots is not None:
            try:
                newest = snapshots.latest(partition)
            except Exception as exc:  # its own restore reports it
                log.warning(
                    "partition %d: snapshots unreadable at the start check: %s", partition, exc
                )
        if newest is not None and newest.offset > end:
            ahead.append(
                (partition, f"the newest snapshot of partition {partition}", newest.offset)
            )
    models = [data_dir / "read_model", *sorted((data_dir / "history").glob("p*/read_model"))]
    for model in models:  # one of every partition, or one a partition (--history-on owner)
        for partition, held in sorted(_model_positions(model).items()):
            if held > ends.get(partition, 0):
                ahead.append((partition, "the read model", held))
    if history_store is not None:
        manifest = history_checkpoint.newest(history_store)
        for partition, held in sorted((manifest.positions if manifest else {}).items()):
            if held > ends.get(partition, 0):
                ahead.append((partition, "the newest history checkpoint", held))
        for partition, end in ends.items():  # each partition's own (--history-on owner)
            own = history_checkpoint.newest(
                history_checkpoint.partition_store(history_store, partition)
            )
            held = (own.positions if own else {}).get(partition, 0)
            if held > end:
                ahead.append(
                    (partition, f"the newest history checkpoint of partition {partition}", held)
                )
    if not ahead:
        return
    lines = []
    for partition in sorted({p for p, _, _ in ahead}):
        end = ends.get(partition, 0)
        found = [(what, held) for p, what, held in ahead if p == partition]
        held = max(h for _, h in found)
        missing = held - end
        lines.append(
            f"events partition {partition} ends at offset {end}, but "
            + " and ".join(what for what, _ in found)
            + f" hold{'s' if len(found) == 1 else ''} events up to offset {held - 1}:"
            + f" {missing} record{'s' if missing != 1 else ''}"
            + (f" (offsets {end}..{held - 1})" if missing > 1 else f" (offset {end})")
            + " missing"
        )
    first = ahead[0]
    raise LogCorrupted(
        f"event log {where} lost records it had acknowledged: " + "; ".join(lines),
        stream="events",
        partition=first[0],
        offset=ends.get(first[0], 0),
    )


def _stored_offset(path: Path) -> int | None:
    """A state store's next event offset, read without writing (None: no store, or one that
    cannot be read: its runner's load finds that)."""
    db = _open_read_only(path)
    if db is None:
        return None
    try:
        stored = db.get(OFFSET)
        return None if stored is None else int(_U64.unpack(stored)[0])
    except Exception as exc:
        log.warning("state store %s: offset unreadable at the start check: %s", path, exc)
        return None
    finally:
        close_store(db)


def _model_positions(path: Path) -> dict[int, int]:
    """The read model's positions as stored (``m/pos/``), read without writing."""
    db = _open_read_only(path)
    if db is None:
        return {}
    try:
        options = checked_reads()
        options.set_iterate_upper_bound(prefix_end(POSITIONS))
        it = db.iter(options)
        it.seek(POSITIONS)
        found: dict[int, int] = {}
        while it.valid():
            found[partition_of(it.key()[len(POSITIONS) :])] = from_u64(it.value())
            it.next()
        error = iterator_error(it)
        del it  # a live iterator keeps the LOCK
        if error is not None:
            log.warning("read model %s: positions unreadable at the start check: %s", path, error)
            return {}
        return found
    finally:
        close_store(db)


def _open_read_only(path: Path) -> Rdict | None:
    if not (path / "CURRENT").exists():
        return None
    try:
        # The WAL is replayed (into memory only): a store's newest batches may be there alone.
        return open_store(
            None,
            path,
            options=Options(raw_mode=True),
            access_type=AccessType.read_only(False),
        )
    except Exception as exc:  # damage: the store's own open sets it aside
        log.warning("%s unreadable at the start check: %s", path, exc)
        return None
