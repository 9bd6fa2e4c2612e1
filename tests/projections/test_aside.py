"""A store set aside again and again keeps only its newest copies: each is the store's size
(the finding: ~4 MB of ``read_model.damaged-*`` a round, with no end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projections import aside


def test_only_the_newest_set_aside_copies_are_kept_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "read_model"
    other = tmp_path / "p1.damaged-20200101T000000Z"  # another store's: not this one's to delete
    other.mkdir()
    made = []
    for round_ in range(aside.KEPT + 3):
        store.mkdir()
        (store / "000009.sst").write_bytes(b"x" * 100 * round_)
        made.append(aside.set_aside(store))
    left = sorted(tmp_path.glob("read_model.damaged-*"))
    assert left == sorted(made[-aside.KEPT :])
    assert other.exists() and not store.exists()
    assert "deleted 1 older set-aside copies" in caplog.text
    assert f"keeping the newest {aside.KEPT}" in caplog.text
