"""The one decoder every reader of an events stream uses: an event, or a foreign record
reported once (log line with partition and offset, observer) and passed over."""

from __future__ import annotations

import logging

import pytest

from core import events as ev
from eventlog.port import Record
from projections.decoding import EventDecoder, ForeignRecord

EVENT = ev.JobPaused(at=1, job_id="j", tenant="t", version=2)
FOREIGN = [
    b"\x00\x01binary",  # not JSON
    b'{"job_id": "j", "run_id": "j.1", "payload": {}}',  # JSON, not an event (a target's body)
    b'{"type": "SomethingNew", "at": 1, "job_id": "j", "tenant": "t"}',  # a type unknown here
    b"",
]


def test_an_event_decodes_and_nothing_is_reported() -> None:
    seen: list[ForeignRecord] = []
    decoder = EventDecoder("reader", seen.append)
    assert decoder.decode(Record(3, 7, ev.encode(EVENT))) == EVENT
    assert seen == []


@pytest.mark.parametrize("value", FOREIGN)
def test_a_foreign_record_is_reported_with_its_partition_and_offset(
    value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[ForeignRecord] = []
    decoder = EventDecoder("read_model", seen.append)
    with caplog.at_level(logging.WARNING, logger="projections.decoding"):
        assert decoder.decode(Record(3, 7, value)) is None
    [foreign] = seen
    assert (foreign.reader, foreign.partition, foreign.offset, foreign.size) == (
        "read_model",
        3,
        7,
        len(value),
    )
    assert foreign.reason
    [line] = [r.getMessage() for r in caplog.records]
    assert "read_model" in line and "partition 3 offset 7" in line and "skipped" in line


def test_each_foreign_record_is_reported_once_however_often_it_is_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[ForeignRecord] = []
    decoder = EventDecoder("relay", seen.append)
    records = [Record(0, 1, b"nope"), Record(0, 2, ev.encode(EVENT)), Record(1, 1, b"nope")]
    with caplog.at_level(logging.WARNING, logger="projections.decoding"):
        for _ in range(3):
            assert decoder.decode_all(records) == [(2, EVENT)]
    assert [(f.partition, f.offset) for f in seen] == [(0, 1), (1, 1)]
    assert len(caplog.records) == 2


def test_the_reason_is_bounded() -> None:
    seen: list[ForeignRecord] = []
    EventDecoder("r", seen.append).decode(Record(0, 0, b'{"type": "' + b"x" * 10_000 + b'"}'))
    assert len(seen[0].reason) <= 200


@pytest.mark.parametrize("value", FOREIGN)
def test_reading_one_kind_still_reports_every_foreign_record(value: bytes) -> None:
    seen: list[ForeignRecord] = []
    decoder = EventDecoder("relay", seen.append)
    assert decoder.decode_kind(Record(3, 7, value), frozenset({"RunCompleted"})) is None
    assert [(f.reader, f.offset) for f in seen] == [("relay", 7)]


def test_reading_one_kind_gives_its_events_and_passes_the_others_over() -> None:
    seen: list[ForeignRecord] = []
    decoder = EventDecoder("relay", seen.append)
    record = Record(3, 7, ev.encode(EVENT))
    assert decoder.decode_kind(record, frozenset({"JobPaused"})) == EVENT
    assert decoder.decode_kind(record, frozenset({"RunCompleted"})) is None
    assert seen == []
