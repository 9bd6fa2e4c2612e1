"""Damaging a RocksDB directory on disk the way a failing disk does, for the integrity tests.

``flush(path)`` makes sure what was written sits in SST files (not only in the WAL, which
RocksDB would replay into a fresh memtable); ``damage(path, family)`` then flips 4 KiB inside
the largest SST file of a column family — a third of the way in, among the data blocks, whose
checksums RocksDB keeps — and names the file. Call both on a closed database.
"""

from __future__ import annotations

import re
from pathlib import Path

from rocksdict import Options, Rdict

FLIPPED = 4096
_SST_LINE = re.compile(r"^\s*(\d+):(\d+)\[", re.MULTILINE)


def _open(path: Path) -> tuple[Rdict, list[str]]:
    families = Rdict.list_cf(str(path), Options(raw_mode=True))
    db = Rdict(
        str(path),
        options=Options(raw_mode=True),
        column_families={name: Options(raw_mode=True) for name in families if name != "default"},
    )
    return db, families


def flush(path: Path) -> None:
    """Write every column family's memtable to SST files."""
    db, families = _open(path)
    for name in families:
        family = db if name == "default" else db.get_column_family(name)
        family.flush()
        del family
    db.close()


def sst_files(path: Path, family: str = "default") -> list[Path]:
    """The live SST files of ``family``, largest first."""
    db, _ = _open(path)
    handle = db if family == "default" else db.get_column_family(family)
    listing = handle.property_value("rocksdb.sstables") or ""
    del handle
    db.close()
    files = [path / f"{int(number):06d}.sst" for number, _ in _SST_LINE.findall(listing)]
    return sorted(files, key=lambda f: f.stat().st_size, reverse=True)


def flip(file: Path, size: int = FLIPPED, at: float = 1 / 3) -> None:
    """Invert ``size`` bytes of ``file`` starting ``at`` of the way in."""
    data = bytearray(file.read_bytes())
    start = int(len(data) * at)
    assert start + size <= len(data), f"{file} is too small ({len(data)} bytes) to damage"
    data[start : start + size] = bytes(b ^ 0xFF for b in data[start : start + size])
    file.write_bytes(bytes(data))


def damage(path: Path, family: str = "default") -> Path:
    """Flush, then flip 4 KiB in the largest SST file of ``family``; returns that file."""
    flush(path)
    files = sst_files(path, family)
    assert files, f"no SST file holds column family {family!r} of {path}"
    flip(files[0])
    return files[0]
