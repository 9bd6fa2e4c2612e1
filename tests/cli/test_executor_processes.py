"""How many executor processes ``cronlog serve`` starts when the operator does not say."""

from __future__ import annotations

import argparse

import pytest

from cli.serve import add_parser, executor_processes, usable_cores


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_a_node_with_a_second_core_makes_its_calls_in_a_process_of_their_own() -> None:
    unset = _parse().executor_processes
    assert executor_processes(unset, cores=2) == 1
    assert executor_processes(unset, cores=16) == 1
    assert executor_processes(unset, cores=1) == 0


def test_the_operator_s_count_wins_even_zero() -> None:
    assert executor_processes(_parse("--executor-processes", "0").executor_processes, 8) == 0
    assert executor_processes(_parse("--executor-processes", "3").executor_processes, 2) == 3


@pytest.mark.parametrize("value", ["-1", "two"])
def test_a_bad_count_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--executor-processes", value)
    assert "--executor-processes" in capsys.readouterr().err


def test_usable_cores_is_what_the_process_may_run_on() -> None:
    assert usable_cores() >= 1
