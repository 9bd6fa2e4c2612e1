"""Long operations tell a meter how much there is and how much is done: the bar's count and
ETA on a terminal come from these figures, and a summary ends each operation either way."""

from __future__ import annotations

import io

import pytest

from eventlog.embedded import EmbeddedLog
from tests.tools.test_replay import PARTITIONS, DataDir, data_dir, run  # noqa: F401
from tools.replay import dump, rebuild, verify
from tools.replay.progress import Bar, Quiet, meter_for
from tools.replay.source import Layout


class Recording:
    """A meter that keeps what it was told."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, int]] = []
        self.done: dict[str, int] = {}
        self.stopped = False

    def start(self, what: str, total: int) -> None:
        self.stages.append((what, total))
        self.done[what] = 0

    def advance(self, done: int = 1) -> None:
        self.done[self.stages[-1][0]] += done

    def stop(self) -> None:
        self.stopped = True


def test_dump_verify_and_rebuild_count_every_record(data_dir: DataDir) -> None:  # noqa: F811
    records = sum(len(values) for values in data_dir.logs.values())
    with EmbeddedLog.open(data_dir.path / "log", PARTITIONS) as log:
        meter = Recording()
        dump.dump(log, list(range(PARTITIONS)), out=io.StringIO(), meter=meter)
        assert meter.stages == [("dump", records)] and meter.done["dump"] == records
        assert meter.stopped

        meter = Recording()
        meter.start("verify", records)
        for p in range(PARTITIONS):
            assert verify.verify_partition(log, Layout(data_dir.path), p, meter).ok
        assert meter.done["verify"] == records

        meter = Recording()
        rebuild.rebuild(
            log, Layout(data_dir.path), state=True, read_model=True, out=io.StringIO(),
            meter=meter,
        )  # fmt: skip
        assert meter.stages == [("state stores", records), ("read model", records)]
        assert meter.done == {"state stores": records, "read model": records}
        assert meter.stopped


def test_verify_ends_with_a_summary_and_draws_no_bar_off_a_terminal(
    data_dir: DataDir,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, ["verify", "--data-dir", str(data_dir.path)])
    assert code == 0
    assert "partitions match a replay from offset 0" in out and " events in " in out
    assert "\x1b[" not in out + err  # no control characters where nobody reads a terminal


def test_a_bar_is_chosen_for_a_terminal_only() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(meter_for(None, io.StringIO()), Quiet)
    bar = meter_for(None, Terminal())
    assert isinstance(bar, Bar)
    bar.start("x", 10)
    bar.advance(5)
    bar.stop()
    assert isinstance(meter_for(False, Terminal()), Quiet)
