"""``dump``: the events stream as JSON lines, the view an audit consumer has.

Each line is ``{"partition": P, "offset": O, "event": {...}}`` with the event exactly as stored,
unknown fields included. A record that is not an event (``projections.decoding``) is shown as
``{"partition": P, "offset": O, "foreign": {"bytes": N, "reason": "..."}}`` — where it is and
why it is not an event, never its contents, which whoever wrote it chose — and reported on
stderr; ``--job`` leaves foreign records out (they belong to no job). Partitions are printed
one after another, each in offset order; ``--follow`` then keeps polling every selected
partition for new events until interrupted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

import msgspec

from core.events import AnyEvent
from eventlog.port import EventLog, Record
from projections.decoding import EventDecoder
from tools.replay.progress import Meter, Quiet
from tools.replay.records import BATCH, events

FOLLOW_POLL_S = 0.5

_encoder = msgspec.json.Encoder()


def line(record: Record) -> str:
    return _encoder.encode(
        {"partition": record.partition, "offset": record.offset, "event": msgspec.Raw(record.value)}
    ).decode()


def foreign_line(record: Record, reason: str) -> str:
    return _encoder.encode(
        {
            "partition": record.partition,
            "offset": record.offset,
            "foreign": {"bytes": len(record.value), "reason": reason},
        }
    ).decode()


def dump(
    log: EventLog,
    partitions: list[int],
    from_offset: int = 0,
    job_id: str | None = None,
    follow: bool = False,
    out: TextIO | None = None,
    keep_following: Callable[[], bool] = lambda: True,
    meter: Meter | None = None,
) -> int:
    """Print the selected records; returns how many lines were printed. ``meter`` is told of
    the records read up to the end the log had at the start (not of those followed after)."""
    out = out or sys.stdout
    meter = meter or Quiet()
    ends = {p: log.end_offset("events", p) for p in partitions}
    meter.start("dump", sum(max(0, end - from_offset) for end in ends.values()))
    reasons: dict[tuple[int, int], str] = {}
    decoder = EventDecoder("dump", lambda f: reasons.__setitem__((f.partition, f.offset), f.reason))
    printed = 0

    def show(record: Record) -> None:
        nonlocal printed
        event: AnyEvent | None = decoder.decode(record)
        if event is None:
            if job_id is None:
                reason = reasons.get((record.partition, record.offset), "not an event")
                out.write(foreign_line(record, reason) + "\n")
                printed += 1
        elif job_id is None or event.job_id == job_id:
            out.write(line(record) + "\n")
            printed += 1

    positions = {}
    for partition in partitions:  # to the end each had at the start; following goes on
        position = from_offset
        for record in events(log, partition, from_offset, ends[partition], meter):
            show(record)
            position = record.offset + 1
        positions[partition] = position
    out.flush()
    meter.stop()
    # The end is a moving target while following: each poll waits a little for one partition.
    wait_s = FOLLOW_POLL_S / max(1, len(partitions))
    while follow and keep_following():
        for partition in partitions:
            records = log.read_events(partition, positions[partition], BATCH, wait_s)
            for record in records:
                show(record)
            if records:
                positions[partition] = records[-1].offset + 1
                out.flush()
    return printed
