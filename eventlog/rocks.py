"""Reading RocksDB's own reports the same way everywhere cronlog keeps data in it (the embedded
log, the state stores, the read model).

rocksdict raises a bare ``Exception`` carrying RocksDB's status text, and its iterators just
stop being valid on an error: a loop ``while it.valid()`` cannot tell the end of the data from
a block whose checksum failed. Every scan therefore asks :func:`iterator_error` once its loop
ends, and every open sorts a failure with :func:`is_damage`.
"""

from __future__ import annotations

from typing import Any

from rocksdict import ReadOptions


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
