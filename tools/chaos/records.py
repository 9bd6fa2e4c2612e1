"""Append-only JSON-lines records that survive the process that writes them.

Each record is one ``write(2)`` on a file opened ``O_APPEND``: the kernel has it as soon as the
call returns, so a SIGKILL a moment later loses nothing, and several threads (or processes)
appending to one file never interleave within a line. A record cut short (a crash mid-write
would need a power loss here) is skipped by :func:`read` and counted.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


class Recorder:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()  # one write per record; the lock only guards close

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records in ``path`` and how many lines could not be read (none if it is missing)."""
    records: list[dict[str, Any]] = []
    bad = 0
    if not path.exists():
        return records, bad
    with path.open("rb") as f:
        for line in f:
            try:
                value = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(value, dict):
                records.append(value)
            else:
                bad += 1
    return records, bad


def read_all(paths: list[Path]) -> tuple[list[dict[str, Any]], int]:
    records: list[dict[str, Any]] = []
    bad = 0
    for path in paths:
        got, lost = read(path)
        records += got
        bad += lost
    return records, bad
