"""The clock faults' machinery works with the Python the nodes run on: under the preload a
process's wall clock moves and steps back while its sleeps, waits and asyncio keep time."""

from __future__ import annotations

import sys

from tools.chaos import skew


def test_libfaketime_moves_the_wall_clock_of_the_nodes_python_and_nothing_else(
    tmp_path: object,
) -> None:
    skew.check(sys.executable)  # raises SkewUnavailable, saying why, otherwise
