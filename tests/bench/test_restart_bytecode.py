"""bench.restart times nodes as an installed cronlog runs: from compiled bytecode, even where
the environment says not to write any (PYTHONDONTWRITEBYTECODE)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import restart


def test_the_nodes_a_restart_starts_keep_their_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    assert not restart.bytecode_cached()
    source = tmp_path / "source"
    source.mkdir()
    (source / "started.py").write_text("STARTED = True\n")
    restart.cache_bytecode(tmp_path / "pycache")
    assert restart.bytecode_cached()
    # a node is a child of the benchmark: it inherits its environment
    subprocess.run([sys.executable, "-c", "import started"], cwd=source, env=os.environ, check=True)
    assert list((tmp_path / "pycache").rglob("started.*.pyc"))
    assert not (source / "__pycache__").exists()  # kept apart, not in the checkout
