"""RocksDB stores left open at the interpreter's exit (eventlog.rocks.open_store): RocksDB's
background threads outlive the interpreter, and the C++ library's statics are destroyed under a
flush that still runs, which kills the process with signal 11 on its way out (docs/reliability.md).
So a store still open at exit is closed then, with a warning that names it."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from rocksdict import Options

from eventlog import rocks

ROOT = Path(__file__).resolve().parents[2]


def _exit_with(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(
        f"""
        import logging, sys
        sys.path.insert(0, {str(ROOT)!r})
        logging.basicConfig(level=logging.WARNING)
        from rocksdict import Options
        from eventlog import rocks
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        db = rocks.open_store(None, {str(tmp_path / "store")!r}, options=options)
        for i in range(1000):
            db[b"k%d" % i] = b"v" * 100
        """
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_store_left_open_is_closed_at_exit_and_named(tmp_path: Path) -> None:
    done = _exit_with(tmp_path, "sys.exit(0)\n")
    assert done.returncode == 0, done.stderr
    assert f"RocksDB store {tmp_path / 'store'} was still open at exit: closed now" in done.stderr
    # closed, not dropped: its memtable was flushed into a table
    assert list((tmp_path / "store").glob("*.sst"))


def test_a_store_closed_before_exit_is_not_named(tmp_path: Path) -> None:
    done = _exit_with(tmp_path, "rocks.close_store(db)\nprint(rocks.open_stores())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "still open at exit" not in done.stderr


class _Owner:
    pass


def test_a_store_whose_owner_is_collected_unclosed_is_forgotten_and_closed_by_its_drop(
    tmp_path: Path,
) -> None:
    """As a constructor that raised after its open leaves it: the database is not held open by
    the registry (the path can be opened again)."""
    path = tmp_path / "store"
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    owner = _Owner()
    owner.db = rocks.open_store(owner, path, options=options)  # type: ignore[attr-defined]
    assert str(path) in rocks.open_stores()
    del owner
    gc.collect()
    assert str(path) not in rocks.open_stores()
    again = rocks.open_store(None, path, options=options)  # its LOCK was released
    rocks.close_store(again)
    assert str(path) not in rocks.open_stores()


def test_an_owner_collected_while_its_thread_holds_the_registrys_lock_does_not_stop_it(
    tmp_path: Path,
) -> None:
    """The collector runs an owner's finalizer in whatever thread allocates, possibly one inside
    ``open_store`` or ``close_store`` with the registry's lock held. A finalizer that took that
    (non-reentrant) lock stopped its thread for good, and a node or a test waiting on the
    thread with it."""
    path = tmp_path / "store"
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    owner = _Owner()
    owner.db = rocks.open_store(owner, path, options=options)  # type: ignore[attr-defined]
    holder = [owner]
    del owner

    def collect_with_the_lock_held() -> None:
        with rocks._open_lock:
            holder.clear()  # the last reference: the finalizer runs here, in this thread
            gc.collect()

    thread = threading.Thread(target=collect_with_the_lock_held, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the owner's finalizer waited on the lock its thread held"
    assert str(path) not in rocks.open_stores()
