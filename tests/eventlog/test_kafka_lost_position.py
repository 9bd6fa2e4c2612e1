"""A new owner that finds no command position says why: either the topic's retention deleted
commands nobody decided, or the positions were lost (a positions topic not compacted, or a log
from before it whose positions were the group's offsets, which the broker expires), after which
the commands decided since the last trim are decided again."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, TopicPartition

from eventlog.kafka import _warn_if_commands_were_deleted


class Watermarks:
    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        return (self.low, self.high)


def _said(caplog: pytest.LogCaptureFixture, committed: int, low: int) -> list[str]:
    consumer: Any = Watermarks(low, low + 10)
    tp = TopicPartition("cronlog.commands", 3, committed)
    with caplog.at_level(logging.ERROR, logger="eventlog.kafka"):
        _warn_if_commands_were_deleted(consumer, tp, max(committed, 0), 1.0)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_no_committed_position_over_a_trimmed_topic_names_expired_offsets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    [said] = _said(caplog, OFFSET_INVALID, 120)
    assert "cronlog.commands[3]: commands 0..119 were deleted" in said
    assert "offsets.retention.minutes" in said and "decided again from 120" in said


def test_a_position_below_the_topic_start_names_the_commands_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    [said] = _said(caplog, 40, 120)
    assert "commands 40..119 were deleted" in said


@pytest.mark.parametrize(("committed", "low"), [(OFFSET_INVALID, 0), (120, 120), (130, 120)])
def test_nothing_is_said_when_nothing_is_missing(
    caplog: pytest.LogCaptureFixture, committed: int, low: int
) -> None:
    assert _said(caplog, committed, low) == []
