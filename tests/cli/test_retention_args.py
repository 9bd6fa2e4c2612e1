"""``cronlog serve``'s retention flags: the units they take, and a clear refusal naming the flag."""

from __future__ import annotations

import argparse

import pytest

from cli.retention_args import add_retention_arguments, duration_ms, retention_from, size_bytes
from eventlog.retention import DAY_MS


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="serve", exit_on_error=False)
    add_retention_arguments(parser)
    return parser.parse_args(list(argv))


def test_units_and_none() -> None:
    assert duration_ms("30d") == 30 * DAY_MS and duration_ms("90m") == 90 * 60_000
    assert duration_ms("500ms") == 500 and duration_ms("none") is None
    assert size_bytes("64MiB") == 64 * 2**20 and size_bytes("1000") == 1000
    assert size_bytes("None") is None


def test_the_defaults_a_user_gets() -> None:
    retention = retention_from(_parse())
    assert retention.retention_ms == 30 * DAY_MS and retention.retention_bytes is None
    assert retention.command_retention_ms == 7 * DAY_MS
    assert retention.segment_bytes == 64 * 2**20 and retention.segment_ms == DAY_MS


def test_the_history_window_default_and_forever() -> None:
    assert _parse().history_window == 30 * DAY_MS
    assert _parse("--history-window", "7d").history_window == 7 * DAY_MS
    assert _parse("--history-window", "none").history_window is None  # every run kept hot


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--retention", "0d"], "--retention"),
        (["--retention", "30 days"], "--retention"),
        (["--retention-bytes", "-5"], "--retention-bytes"),
        (["--segment-bytes", "none"], "--segment-bytes"),
        (["--history-window", "a month"], "--history-window"),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(argparse.ArgumentError, match=message):
        _parse(*argv)
