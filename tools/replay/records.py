"""Reading a partition's events stream in order, and the few fields the tools filter on.

The tools decode only what they need (``type``, ``job_id``) with a lenient struct, so an event
type or field this build does not know is still counted and printed (``docs/events.md``, rule 3
and 4); folding into a state uses the real codec.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from eventlog.port import EventLog, Record

BATCH = 1000


class Head(msgspec.Struct):
    """The fields every event has that the tools look at."""

    type: str
    job_id: str = ""


_head_decoder = msgspec.json.Decoder(Head)


def head(record: Record) -> Head:
    return _head_decoder.decode(record.value)


def events(
    log: EventLog, partition: int, from_offset: int = 0, until: int | None = None
) -> Iterator[Record]:
    """``partition``'s events from ``from_offset`` up to ``until`` (exclusive), or to the end
    the log has now when ``until`` is None."""
    end = log.end_offset("events", partition) if until is None else until
    offset = from_offset
    while offset < end:
        records = log.read_events(partition, offset, BATCH)
        if not records:
            return
        for record in records:
            if record.offset >= end:
                return
            yield record
        offset = records[-1].offset + 1
