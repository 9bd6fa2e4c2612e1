"""The hot part of an embedded node's data directory stays flat under a steady load run for ten
times its retention window, while the archive takes what leaves the log (bench/disk_flat.py,
short form: a 3 s retention, 40 s of load)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import disk_flat
from tests.node.targets import Target

pytestmark = pytest.mark.slow
RETENTION_S = 3.0
DURATION_S = 40.0  # two retentions of warm-up, then eleven
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
    first, last = result.thirds()
    assert len(first) >= 10 and len(last) >= 10
    growth = result.growth()
    assert growth <= disk_flat.DEFAULT_FACTOR, result.summary()
    # What left the log went to the archive, which keeps growing.
    assert max(s.archive for s in last) > 2 * max(s.archive for s in first) > 0
