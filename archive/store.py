"""The object-store port the archive writes to, and its one adapter so far: a directory.

Shaped like S3 and its kin so that such a backend is one more adapter of four calls.
Invariants every adapter keeps:

1. **Durable on return.** ``put`` returns once the object survives a crash (a directory: the
   file and its directory entry are fsynced).
2. **Whole objects.** A ``get`` returns an object exactly as one ``put`` wrote it, never a
   part: a ``put`` over an existing key replaces it atomically (a directory: rename).
3. **Keys are paths.** ``/``-separated segments of ``[A-Za-z0-9._-]``, none ``.`` or ``..``;
   ``list(prefix)`` returns every key starting with ``prefix``, sorted.
4. **Deleting is idempotent.** ``delete`` of a key that is not there does nothing; once it
   returns, ``get`` of the key raises :class:`ArchiveMissing`.

A put over a key someone else wrote meanwhile wins blindly; the archive writes each key from
one writer (a partition's owner) at a time, and an S3 adapter can add a conditional put.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

from core.errors import CronlogError

_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")


class ArchiveMissing(CronlogError):
    """No object under the key asked for."""


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing what was there (invariants 1 and 2)."""

    def get(self, key: str) -> bytes:
        """The object under ``key``; :class:`ArchiveMissing` if there is none."""

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted."""

    def delete(self, key: str) -> None:
        """Remove the object under ``key``, if any (invariant 4)."""


def check_key(key: str) -> str:
    parts = key.split("/")
    if not key or any(p in (".", "..") or not _SEGMENT.fullmatch(p) for p in parts):
        raise ValueError(f"archive key {key!r} is not a '/'-separated path of [A-Za-z0-9._-]")
    return key


class DirectoryStore:
    """``DirectoryStore(root)``: each key is a file under ``root``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def put(self, key: str, data: bytes) -> None:
        path = self.root / check_key(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def get(self, key: str) -> bytes:
        try:
            return (self.root / check_key(key)).read_bytes()
        except FileNotFoundError:
            raise ArchiveMissing(f"archive {self.root} has no {key}") from None

    def delete(self, key: str) -> None:
        (self.root / check_key(key)).unlink(missing_ok=True)

    def list(self, prefix: str) -> list[str]:
        # Walk only the directory the prefix names: the archive's event files are many.
        folder = prefix.rpartition("/")[0]
        top = self.root / check_key(folder) if folder else self.root
        if not top.is_dir():
            return []
        keys = (
            p.relative_to(self.root).as_posix()
            for p in top.rglob("*")
            if p.is_file() and not p.name.startswith(".put-")
        )
        return sorted(k for k in keys if k.startswith(prefix))


class PrefixedStore:
    """``store`` seen under ``prefix`` (which ends with ``/``): each key is ``prefix + key``
    there, and ``list`` gives keys without it. One partition's history checkpoints live under
    a prefix of their own (``node.owned_history``), with the layout a whole model's have."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        if not prefix.endswith("/"):
            raise ValueError(f"a prefix ends with '/', not {prefix!r}")
        check_key(prefix[:-1])
        self.store = store
        self.prefix = prefix

    def put(self, key: str, data: bytes) -> None:
        self.store.put(self.prefix + key, data)

    def get(self, key: str) -> bytes:
        return self.store.get(self.prefix + key)

    def list(self, prefix: str) -> list[str]:
        return [key[len(self.prefix) :] for key in self.store.list(self.prefix + prefix)]

    def delete(self, key: str) -> None:
        self.store.delete(self.prefix + key)
