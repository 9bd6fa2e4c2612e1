"""Reading RocksDB's own reports the same way everywhere cronlog keeps data in it (the embedded
log, the state stores, the read model).

rocksdict raises a bare ``Exception`` carrying RocksDB's status text, and its iterators just
stop being valid on an error: a loop ``while it.valid()`` cannot tell the end of the data from
a block whose checksum failed. Every scan therefore asks :func:`iterator_error` once its loop
ends, and every open sorts a failure with :func:`is_damage`.

**Memory.** Every RocksDB a process opens takes its block cache and its memtables from one
budget (:func:`bounded`): one LRU block cache of :data:`BLOCK_CACHE_BYTES` shared by all of
them, and a write buffer manager that charges every memtable to that same cache and flushes
once they hold :data:`WRITE_BUFFER_BYTES` together. Left to its defaults each database would
keep a block cache of its own (32 MiB) and memtables of up to 64 MiB each, so a node's RocksDB
memory would grow with its number of partitions and with the data scanned at recovery, not with
anything an operator chose. Scans that read a whole store once (a recovery's load) do not fill
the cache (:func:`scan_reads`).

**Open and close.** Every database opens with :func:`open_store` and closes with
:func:`close_store`. One still open when the interpreter exits is closed then, with a warning:
RocksDB's background threads (a flush, a compaction) outlive the interpreter's exit, and the
C++ library's static objects are destroyed under them, so a flush that opens the table it has
just written reads freed memory and the process dies of signal 11 on its way out (measured:
4 exits in 100 with 4 stores written to and left open, none in 100 with them closed this way).

**Disk.** :func:`bounded` also bounds RocksDB's info log (:data:`INFO_LOG_BYTES`) and its
write-ahead log (:data:`WAL_BYTES`), so what a database keeps beside its data does not grow
with the node's age.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import shutil
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rocksdict import (
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    ReadOptions,
    WriteBufferManager,
)

log = logging.getLogger(__name__)

MIB = 2**20
# Overridable per process (``cronlog serve --rocksdb-memory-mb``) before anything is opened.
BLOCK_CACHE_BYTES = int(os.environ.get("CRONLOG_ROCKSDB_MEMORY_MB", "64")) * MIB
WRITE_BUFFER_BYTES = BLOCK_CACHE_BYTES // 2
# One memtable of one store: small stores flush often, which costs nothing much at these sizes.
MEMTABLE_BYTES = 8 * MIB
# RocksDB's own info log (``LOG`` in each database's directory) gains lines with every flush and
# compaction (retention compacts after each prune) and is never cut by default: a node's disk
# would grow with its age however short its retention. Each database keeps at most this many
# files of at most this many bytes (the current one and the last one rolled).
INFO_LOG_BYTES = 4 * MIB
INFO_LOGS_KEPT = 2
# A write-ahead log file goes once every column family has flushed what it holds; the embedded
# log's meta family is written little, so without a bound its WAL would keep files alive until
# RocksDB's default (four times all memtables: 256 MiB for the log). Past this, RocksDB flushes
# the families that hold the oldest file.
WAL_BYTES = 4 * MEMTABLE_BYTES

_shared: tuple[Cache, WriteBufferManager] | None = None
_shared_lock = threading.Lock()


def set_memory_budget(total_bytes: int) -> None:
    """The bytes RocksDB may hold in this process (block cache and memtables together); to be
    called before the first database opens."""
    global BLOCK_CACHE_BYTES, WRITE_BUFFER_BYTES, _shared
    if total_bytes < 8 * MIB:
        raise ValueError(f"a RocksDB memory budget under 8 MiB is too small: {total_bytes}")
    with _shared_lock:
        BLOCK_CACHE_BYTES, WRITE_BUFFER_BYTES = total_bytes, total_bytes // 2
        _shared = None


def _budget() -> tuple[Cache, WriteBufferManager]:
    global _shared
    with _shared_lock:
        if _shared is None:
            cache = Cache(BLOCK_CACHE_BYTES)
            manager = WriteBufferManager.new_write_buffer_manager_with_cache(
                WRITE_BUFFER_BYTES, False, cache
            )
            _shared = (cache, manager)
        return _shared


_open: dict[int, tuple[str, Rdict]] = {}  # token -> (path, database): every one not closed
_open_lock = threading.Lock()
_tokens = itertools.count()
# Tokens whose owner was collected. The owner's finalizer runs wherever the collector does: in
# any thread, at any allocation, possibly while that very thread holds ``_open_lock`` (the lock
# is not reentrant, so taking it there would stop the thread for good). It only appends here
# (atomic); whoever takes the lock next drops them.
_forgotten: collections.deque[int] = collections.deque()


def open_store(owner: object | None, path: str | Path, **kwargs: Any) -> Rdict:
    """``Rdict(path, **kwargs)``, known until :func:`close_store` closes it, so that one left open
    is closed before the interpreter exits (see the module docstring). ``owner`` is the object
    that holds it: should the owner be collected without closing it (a constructor that raised
    after the open), the database is forgotten and rocksdict's own drop closes it, as before."""
    db = Rdict(str(path), **kwargs)
    token = next(_tokens)
    with _open_lock:
        _drop_forgotten()
        _open[token] = (str(path), db)
    if owner is not None:
        weakref.finalize(owner, _forgotten.append, token).atexit = False
    return db


def close_store(db: Rdict) -> None:
    """Close ``db`` (rocksdict's ``close``: its memtables flushed, its background work waited
    for); it is no longer closed at exit."""
    with _open_lock:
        _drop_forgotten()
        for token in [token for token, (_, held) in _open.items() if held is db]:
            del _open[token]
    db.close()


def open_stores() -> list[str]:
    """The paths of the databases this process has open."""
    with _open_lock:
        _drop_forgotten()
        return [path for path, _ in _open.values()]


def _drop_forgotten() -> None:
    """With ``_open_lock`` held: forget the databases whose owners were collected."""
    while _forgotten:
        _open.pop(_forgotten.popleft(), None)


EXIT_LOCK_WAIT_S = 5.0


def _close_left_open() -> None:
    """At the interpreter's exit (before the C++ statics go): close what is still open.
    Registered after ``logging``'s own exit handler (imported above), so it runs before it and
    its warnings are written.

    Exit is never held up by the registry's lock: a daemon thread may have been stopped while
    it held it (the lock guards a few dictionary operations, so a wait of seconds means that).
    The stores are then closed all the same, from a copy."""
    locked = _open_lock.acquire(timeout=EXIT_LOCK_WAIT_S)
    if not locked:
        log.warning("RocksDB's registry of open stores was held for %s s at exit", EXIT_LOCK_WAIT_S)
    try:
        _drop_forgotten()
        left = list(_open.values())
        _open.clear()
    finally:
        if locked:
            _open_lock.release()
    for path, db in left:
        log.warning("RocksDB store %s was still open at exit: closed now", path)
        try:
            db.flush()
            # A handle elsewhere (a column family's, an iterator) can keep the database alive
            # past close(): stop its compactions and wait for what runs, whatever holds it.
            db.cancel_all_background(True)
            db.close()
        except Exception as exc:  # closed already, or damaged: what matters is its threads
            log.warning("RocksDB store %s: %s", path, exc)


atexit.register(_close_left_open)


BLOOM_BITS_PER_KEY = 10  # about 1 % false positives, 1.25 bytes a key


def bounded(options: Options, *, point_lookups: bool = False) -> Options:
    """``options`` drawing on the process's one RocksDB memory budget (see the module
    docstring); returns them. ``point_lookups``: a store read by key (the read model, the
    state stores) keeps a Bloom filter in each table, so a lookup of a key that is not there
    (every new job's id, in the read model's fold) skips the tables instead of searching each:
    measured on a store of 300,000 jobs in 7-12 tables, 34-74 µs a miss without, 2-7 µs with."""
    cache, manager = _budget()
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    if point_lookups:
        table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_manager(manager)
    options.set_write_buffer_size(MEMTABLE_BYTES)
    options.set_max_write_buffer_number(2)
    options.set_max_log_file_size(INFO_LOG_BYTES)
    options.set_keep_log_file_num(INFO_LOGS_KEPT)
    options.set_max_total_wal_size(WAL_BYTES)
    return options


def cache_usage() -> int:
    """Bytes the shared block cache holds now (memtables charged to it included)."""
    return _budget()[0].get_usage()


def scan_reads() -> ReadOptions:
    """:func:`checked_reads` for a scan of a whole store: its blocks would only push out the
    ones that serve lookups."""
    options = checked_reads()
    options.fill_cache(False)  # type: ignore[call-arg]  # the stub drops the flag it takes
    return options


def checked_reads() -> ReadOptions:
    """Read options that verify each block's checksum (RocksDB's default, stated: it is the
    point)."""
    options = ReadOptions()
    options.set_verify_checksums(True)
    return options


def iterator_error(it: Any) -> Exception | None:
    """The error an iterator stopped on, or None if it reached the end of its data.

    Returned without its traceback: the traceback's frames hold the iterator, and a live
    iterator keeps the database's LOCK."""
    try:
        it.status()
    except Exception as exc:
        return exc.with_traceback(None)
    return None


def is_damage(exc: Exception) -> bool:
    """Whether an error rocksdict raised says the data is damaged, rather than, say, locked by
    another process or not permitted."""
    text = str(exc)
    return "Corruption" in text or "checksum mismatch" in text


def unreadable_tables(tables: Sequence[Path], scratch: Path) -> dict[str, str]:
    """The table files among ``tables`` that RocksDB cannot read back whole (a block whose
    checksum fails, a footer or index it cannot parse), each with what RocksDB said.

    RocksDB checks a block only when a read reaches it, and rocksdict exposes no call that
    checks a file. Its repair does, in C++: it reads every entry of every table it finds (every
    block, checksums verified) and moves one it cannot read into ``lost/``. So the tables are
    hard-linked into ``scratch`` (a directory of its own on their file system, emptied first
    and removed after) and repaired there; the originals are not touched (RocksDB never writes
    a table file once written, and only the links are moved). It costs a read of the tables
    given, no more: a caller passes only those not checked before."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700, parents=True)
    try:
        for table in tables:
            os.link(table, scratch / table.name)
        Rdict.repair(str(scratch), Options(raw_mode=True))
        lost = scratch / "lost"
        names = (
            sorted(p.name for p in lost.iterdir() if p.suffix == ".sst") if lost.is_dir() else []
        )
        if not names:
            return {}
        said = (scratch / "LOG").read_text(errors="replace").splitlines()
        found = {}
        for name in names:
            mark = f"Table #{int(name.partition('.')[0])}: ignoring "
            reason = next((line.partition(mark)[2] for line in said if mark in line), "")
            found[name] = reason.replace(str(scratch) + "/", "") or "unreadable"
        return found
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
