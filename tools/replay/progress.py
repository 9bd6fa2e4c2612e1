"""Progress of a long operation (dump, verify, rebuild, backfill): a bar with a count, the rate
and an ETA on a terminal, nothing otherwise.

The tools tell a :class:`Meter` how much there is (``start``) and how much is done
(``advance``); what shows it is chosen once, by whether standard error is a terminal
(``meter_for``), so a tool piped into a file or ``jq`` writes no control characters. Each
tool prints its own summary at the end either way.
"""

from __future__ import annotations

import sys
from typing import Protocol, TextIO


class Meter(Protocol):
    def start(self, what: str, total: int) -> None:
        """A new stage of the operation: ``total`` units to do (records, slots)."""

    def advance(self, done: int = 1) -> None: ...

    def stop(self) -> None:
        """The operation ended (or failed): take the bar off the terminal."""


class Quiet:
    """Shows nothing: not a terminal, or progress not wanted."""

    def start(self, what: str, total: int) -> None:
        pass

    def advance(self, done: int = 1) -> None:
        pass

    def stop(self) -> None:
        pass


class Bar:
    """rich's progress bar on ``stream``: what, a bar, done/total, rate, elapsed and ETA."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=stream),
            transient=True,
        )
        self._task: object | None = None
        self._progress.start()

    def start(self, what: str, total: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, visible=False)  # type: ignore[arg-type]
        self._task = self._progress.add_task(what, total=max(total, 1))

    def advance(self, done: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, done)  # type: ignore[arg-type]

    def stop(self) -> None:
        self._progress.stop()


def meter_for(wanted: bool | None, stream: TextIO | None = None) -> Meter:
    """A bar when ``wanted`` (None: when ``stream``, standard error by default, is a
    terminal), else :class:`Quiet`."""
    stream = stream or sys.stderr
    show = stream.isatty() if wanted is None else wanted
    return Bar(stream) if show else Quiet()
