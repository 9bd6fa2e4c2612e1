"""Setting a damaged derived store aside: renamed beside itself, never deleted.

A store derived from the log can always be rebuilt, so a damaged one is not repaired in place;
but what damaged it is worth knowing (a disk going bad, a bug), so its files are kept for
whoever looks: ``<name>.damaged-<UTC time>``, next to where it was.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

ATTEMPTS = 100  # names tried when a store was set aside more than once in one second


def set_aside(path: Path) -> Path:
    """Rename ``path`` to a free ``<name>.damaged-<UTC time>[-n]``; returns the new path."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    for n in range(ATTEMPTS):
        aside = path.with_name(f"{path.name}.damaged-{stamp}" + (f"-{n}" if n else ""))
        if not aside.exists():
            path.rename(aside)
            return aside
    raise FileExistsError(f"no free name to set {path} aside after {ATTEMPTS} tries")
