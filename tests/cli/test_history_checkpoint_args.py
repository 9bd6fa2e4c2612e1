"""``cronlog serve``'s history checkpoint flags: the grace period before files are collected."""

from __future__ import annotations

import argparse

import pytest

from cli.serve import add_parser
from projections.history_checkpoint import DEFAULT_GRACE_MS


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_the_grace_period_defaults_to_the_library_s_and_takes_a_duration() -> None:
    assert _parse().history_checkpoint_grace == DEFAULT_GRACE_MS == 15 * 60_000
    assert _parse("--history-checkpoint-grace", "1h").history_checkpoint_grace == 3_600_000


def test_a_grace_period_of_none_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--history-checkpoint-grace", "none")
    assert "--history-checkpoint-grace" in capsys.readouterr().err
