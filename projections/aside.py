"""Setting a damaged derived store aside: renamed beside itself, not deleted at once.

A store derived from the log can always be rebuilt, so a damaged one is not repaired in place;
but what damaged it is worth knowing (a disk going bad, a bug), so its files are kept for
whoever looks: ``<name>.damaged-<UTC time>``, next to where it was. Only the newest
:data:`KEPT` of one store are kept: damage that comes back (a disk failing under it) sets the
store aside again and again, and each copy is the size of the store, so the older ones are
deleted, saying so in the log.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

KEPT = 2  # set-aside copies of one store kept: the first damage seen, and the newest, often


def set_aside(path: Path) -> Path:
    """Rename ``path`` to ``<name>.damaged-<UTC time>[-n]`` (``n`` past every copy of the same
    second, so names sort as the copies were made) and delete all but the newest :data:`KEPT`
    of its set-aside copies; returns the new path."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    same_second = [n for (at, n), _ in _copies(path) if at == stamp]
    n = max(same_second) + 1 if same_second else 0
    aside = path.with_name(f"{path.name}.damaged-{stamp}" + (f"-{n}" if n else ""))
    path.rename(aside)
    _keep_newest(path)
    return aside


def _copies(path: Path) -> list[tuple[tuple[str, int], Path]]:
    """The set-aside copies of ``path``, oldest first, each with (its time, its n)."""
    pattern = re.compile(re.escape(path.name) + r"\.damaged-(\d{8}T\d{6}Z)(?:-(\d+))?")
    copies = []
    for found in path.parent.iterdir():
        match = pattern.fullmatch(found.name)
        if match is not None:
            copies.append(((match[1], int(match[2] or 0)), found))
    return sorted(copies)


def _keep_newest(path: Path) -> None:
    old = [found for _, found in _copies(path)[:-KEPT]]
    for found in old:
        shutil.rmtree(found, ignore_errors=True)
    if old:
        log.warning(
            "%s: deleted %d older set-aside copies (%s), keeping the newest %d",
            path,
            len(old),
            ", ".join(f.name for f in old),
            KEPT,
        )
