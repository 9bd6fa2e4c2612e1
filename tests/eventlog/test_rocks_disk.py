"""RocksDB's own info log is bounded: a store that flushes and compacts all day keeps a few
files of it, not one that grows with the node's age."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from eventlog import rocks

CAP = 16 * 1024


def _info_logs(path: Path) -> list[Path]:
    return [p for p in path.iterdir() if p.name == "LOG" or p.name.startswith("LOG.old")]


def test_the_info_log_is_rolled_and_old_ones_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rocks, "INFO_LOG_BYTES", CAP)
    db = Rdict(str(tmp_path / "db"), rocks.bounded(Options(raw_mode=True)))
    first_roll = None
    try:
        for i in range(1000):  # each flush and compaction adds lines to the info log
            db.put(b"k%d" % i, b"v" * 100)
            db.flush()
            db.compact_range(None, None)
            rolled = any(p.name.startswith("LOG.old") for p in _info_logs(tmp_path / "db"))
            if rolled and first_roll is None:
                first_roll = i
            # three times the lines that filled the first file: more files than are kept
            if first_roll is not None and i >= 3 * (first_roll + 1):
                break
    finally:
        db.close()
    assert first_roll is not None, "the info log never rolled"
    logs = _info_logs(tmp_path / "db")
    assert len(logs) <= rocks.INFO_LOGS_KEPT
    # a file is rolled once it passes the cap: at most one flush's lines over it each
    assert sum(p.stat().st_size for p in logs) <= rocks.INFO_LOGS_KEPT * CAP * 1.5
