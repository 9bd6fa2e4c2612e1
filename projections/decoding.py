"""Records of an events stream, decoded as events or reported as foreign: the one place every
reader of a partition's events decodes them.

A partition's events stream should hold only events its owners appended. On Kafka it can hold
other records too: anything allowed to produce to ``<prefix>.events`` can put one there (a job
whose ``kafka://`` target named that topic once did), and the topic keeps it forever. Such a
*foreign* record is neither an error that stops a reader nor something to skip in silence.
Every reader — runner recovery (``state_store.catch_up``), the read model, the dependency
relay, the replay tools — decodes through an :class:`EventDecoder`, which, for a record that
does not decode:

- logs one warning naming the reader, the partition, the offset, the size and why;
- tells its observer (a node counts ``cronlog_foreign_records_total{reader}``; ``verify``
  lists them);
- returns None, and the reader goes on with the next record.

Skipping is safe because no owner ever folded the record into a partition's state: the owner
decides from its in-memory state and appends only what it decided, so replaying the stream
without the foreign records rebuilds exactly the state it had. Each decoder reports a record
once, however often its reader reads it again (the relay rereads recent events on every
recovery).

Damage to the log itself (a checksum that fails, a missing offset) is not this module's: the
log raises :class:`core.errors.LogCorrupted` before any record reaches a decoder.
"""

from __future__ import annotations

import logging
import threading
import typing
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from core.events import AnyEvent, decode
from eventlog.port import Record

log = logging.getLogger(__name__)

REMEMBERED = 10_000  # foreign records a decoder remembers having reported
REASON_CHARS = 200  # the decoder's message is the record's doing: keep a log line a line


class _Kind(msgspec.Struct):
    """What an event's record says it is, and nothing else of it."""

    type: str


_kind_decoder = msgspec.json.Decoder(_Kind)
KINDS = frozenset(str(kind.__struct_config__.tag) for kind in typing.get_args(AnyEvent))


@dataclass(frozen=True, slots=True)
class ForeignRecord:
    """A record of an events stream that is not an event this build can read."""

    reader: str
    partition: int
    offset: int
    size: int
    reason: str

    def describe(self) -> str:
        return (
            f"partition {self.partition} offset {self.offset}: not an event "
            f"({self.size} bytes: {self.reason})"
        )


Observer = Callable[[ForeignRecord], None]


class EventDecoder:
    """Decodes the records one reader reads; thread-safe.

    ``EventDecoder("read_model", observe)`` — ``reader`` names the reader in logs and metrics;
    ``observe`` is called once per foreign record.
    """

    def __init__(self, reader: str, observe: Observer | None = None) -> None:
        self.reader = reader
        self._observe = observe
        self._lock = threading.Lock()
        self._reported: OrderedDict[tuple[int, int], None] = OrderedDict()

    def decode(self, record: Record) -> AnyEvent | None:
        """The record's event, or None for a foreign record (reported)."""
        try:
            return decode(record.value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._report(record, str(exc)[:REASON_CHARS])
            return None

    def decode_kind(self, record: Record, kinds: frozenset[str]) -> AnyEvent | None:
        """The record's event if it is of one of ``kinds`` (their tags: ``"RunCompleted"``);
        None for an event of another kind, which is not decoded further (a reader that wants
        one kind out of many reads each record's tag only), and for a foreign record
        (reported, as :meth:`decode` does)."""
        try:
            kind = _kind_decoder.decode(record.value).type
        except (msgspec.DecodeError, msgspec.ValidationError):
            kind = None
        if kind in KINDS and kind not in kinds:
            return None
        return self.decode(record)  # one of ``kinds``; or not an event: then reported

    def decode_all(self, records: Iterable[Record]) -> list[tuple[int, AnyEvent]]:
        """(offset, event) for every record that decodes, in order; the others reported."""
        out: list[tuple[int, AnyEvent]] = []
        for record in records:
            event = self.decode(record)
            if event is not None:
                out.append((record.offset, event))
        return out

    def _report(self, record: Record, reason: str) -> None:
        where = (record.partition, record.offset)
        with self._lock:
            if where in self._reported:
                self._reported.move_to_end(where)
                return
            self._reported[where] = None
            if len(self._reported) > REMEMBERED:
                self._reported.popitem(last=False)
        foreign = ForeignRecord(
            self.reader, record.partition, record.offset, len(record.value), reason
        )
        log.warning("%s: %s; skipped", self.reader, foreign.describe())
        if self._observe is not None:
            self._observe(foreign)
