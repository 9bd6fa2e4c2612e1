"""Reading a partition's events stream in order, decoded the way the node's readers decode it.

Every tool decodes with a :class:`projections.decoding.EventDecoder` (:func:`tool_decoder`), so
a record that is not an event is treated alike everywhere: reported once on stderr (partition,
offset, size, why), gathered for the tool's summary (``verify`` lists them, ``rebuild`` and
``stats`` count them), and passed over.
"""

from __future__ import annotations

from collections.abc import Iterator

from core.events import AnyEvent
from eventlog.port import EventLog, Record
from projections.decoding import EventDecoder, ForeignRecord
from tools.replay.progress import Meter, Quiet

BATCH = 1000


def tool_decoder(found: list[ForeignRecord]) -> EventDecoder:
    """A decoder for one run of a tool, appending every foreign record to ``found``."""
    return EventDecoder("replay", found.append)


def events(
    log: EventLog,
    partition: int,
    from_offset: int = 0,
    until: int | None = None,
    meter: Meter | None = None,
) -> Iterator[Record]:
    """``partition``'s records from ``from_offset`` up to ``until`` (exclusive), or to the end
    the log has now when ``until`` is None; ``meter`` is told of each batch read."""
    meter = meter or Quiet()
    end = log.end_offset("events", partition) if until is None else until
    offset = from_offset
    while offset < end:
        records = log.read_events(partition, offset, BATCH)
        if not records:
            return
        meter.advance(len(records))
        for record in records:
            if record.offset >= end:
                return
            yield record
        offset = records[-1].offset + 1


def decoded(
    log: EventLog,
    partition: int,
    decoder: EventDecoder,
    from_offset: int = 0,
    until: int | None = None,
    meter: Meter | None = None,
) -> Iterator[tuple[Record, AnyEvent | None]]:
    """Each record with its event, or with None for a foreign record (reported once)."""
    for record in events(log, partition, from_offset, until, meter):
        yield record, decoder.decode(record)
