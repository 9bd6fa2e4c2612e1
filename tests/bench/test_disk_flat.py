"""The hot part of an embedded node's data directory stays flat under a steady load run for ten
times its retention window, while the archive takes what leaves the log (bench/disk_flat.py,
short form: a 3 s retention, 30 s of load, the node stopped and measured at 10 s and at the
end)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import disk_flat
from tests.node.targets import Target

pytestmark = pytest.mark.slow
RETENTION_S = 3.0
DURATION_S = 30.0  # three retentions of warm-up, then seven
JOBS = 20


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target().start()
    yield t
    t.stop()


def test_the_hot_data_stays_flat_and_the_archive_grows(tmp_path: Path, target: Target) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    result = disk_flat.run(
        data_dir,
        target.url,
        retention_s=RETENTION_S,
        duration_s=DURATION_S,
        jobs=JOBS,
        calls=lambda: len(target.calls),
    )
    # The load ran: about a call per job per second.
    assert result.runs_fired >= JOBS * DURATION_S / 2
    third, end = result.settled
    # The log is what retention bounds: without it, it holds three times as much at the end
    # as at a third (measured: 2.7x), with it about as much (1.08x in runs alone). Once in CI,
    # beside another test process, it was 1.53x: the log at a third was a quarter smaller than
    # in any run alone, with as many runs fired. The bound sits between the two.
    assert end.log <= 2.0 * third.log, result.summary()
    # The whole hot part: the state stores' few small files merge only every fourth flush,
    # so at these sizes (tens of KiB) they saw by more than the log does.
    assert result.growth() <= 2.0, result.summary()
    # What left the log went to the archive, which keeps growing.
    assert end.archive > 2 * third.archive > 0
