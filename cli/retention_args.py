"""``cronlog serve``'s retention and archive flags, and the units they take.

Durations are a number and a unit (``500ms``, ``45s``, ``90m``, ``12h``, ``30d``) or ``none``
for no bound; sizes are bytes with an optional binary unit (``64MiB``, ``10GiB``) or ``none``.
See docs/operations.md ("Retention and the archive") for the defaults and why.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from eventlog.retention import (
    DEFAULT_COMMAND_RETENTION_MS,
    DEFAULT_RETENTION_MS,
    DEFAULT_SEGMENT_BYTES,
    DEFAULT_SEGMENT_MS,
    Retention,
)
from node.hot_window import DEFAULT_WINDOW_MS

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = re.compile(r"(\d+)(|B|KiB|MiB|GiB|TiB)")
_BYTES = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def duration_ms(text: str) -> int | None:
    """``30d`` -> 2592000000; ``none`` -> None."""
    if text.strip().lower() == "none":
        return None
    found = _DURATION.fullmatch(text.strip())
    if found is None or int(found.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a positive number and ms, s, m, h or d (e.g. 30d), "
            "or none"
        )
    return int(found.group(1)) * _MS[found.group(2)]


def size_bytes(text: str) -> int | None:
    """``64MiB`` -> 67108864; ``none`` -> None."""
    if text.strip().lower() == "none":
        return None
    found = _SIZE.fullmatch(text.strip())
    if found is None or int(found.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: a positive number of bytes, or with KiB, MiB, GiB or TiB "
            "(e.g. 50GiB), or none"
        )
    return int(found.group(1)) * _BYTES[found.group(2)]


def _required(parse: Callable[[str], int | None]) -> Callable[[str], int]:
    def parse_set(text: str) -> int:
        value = parse(text)
        if value is None:
            raise argparse.ArgumentTypeError("this setting needs a value; none is not one")
        return value

    return parse_set


def _days(ms: int | None) -> str:
    return "none" if ms is None else f"{ms // 86_400_000}d"


def add_retention_arguments(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group(
        "retention and archive", "how long the log keeps events, and where they go after"
    )
    group.add_argument(
        "--retention",
        type=duration_ms,
        default=DEFAULT_RETENTION_MS,
        metavar="DURATION",
        help="keep events in the log this long (e.g. 30d, 12h, none; default "
        f"{_days(DEFAULT_RETENTION_MS)}); older ones live on in the archive. Kafka: the events "
        "topic's retention.ms",
    )
    group.add_argument(
        "--retention-bytes",
        type=size_bytes,
        default=None,
        metavar="SIZE",
        help="and at most this much per partition (e.g. 20GiB; default none). Kafka: the events "
        "topic's retention.bytes",
    )
    group.add_argument(
        "--command-retention",
        type=duration_ms,
        default=DEFAULT_COMMAND_RETENTION_MS,
        metavar="DURATION",
        help="Kafka: delete commands nobody decided after this long (default "
        f"{_days(DEFAULT_COMMAND_RETENTION_MS)}; the commands topic's retention.ms). Decided "
        "commands go at the next retention check on both logs; the embedded log never "
        "deletes an undecided one",
    )
    group.add_argument(
        "--segment-bytes",
        type=_required(size_bytes),
        default=DEFAULT_SEGMENT_BYTES,
        metavar="SIZE",
        help="embedded log: seal a segment (the unit retention removes) at this size "
        "(default 64MiB)",
    )
    group.add_argument(
        "--segment-age",
        type=_required(duration_ms),
        default=DEFAULT_SEGMENT_MS,
        metavar="DURATION",
        help="embedded log: ... or when it has been open this long (default 1d)",
    )
    group.add_argument(
        "--archive-dir",
        type=Path,
        metavar="DIR",
        help="archive events here before retention removes them (embedded default: "
        "DATA_DIR/archive; Kafka: none unless given, and then every node must see the same "
        "directory)",
    )
    group.add_argument(
        "--no-archive",
        action="store_true",
        help="embedded: retention deletes events without archiving them (history and replay "
        "from offset 0 then start at the log's start)",
    )
    group.add_argument(
        "--archive-delay",
        type=_required(duration_ms),
        default=300_000,
        metavar="DURATION",
        help="Kafka: archive a partition's new events at the latest this long after they "
        "were written (default 5m)",
    )
    group.add_argument(
        "--history-window",
        type=duration_ms,
        default=DEFAULT_WINDOW_MS,
        metavar="DURATION",
        help="keep finished runs this long in the read model, by slot (default "
        f"{_days(DEFAULT_WINDOW_MS)}; none keeps every run); older ones are answered from the "
        "archive, or are gone with --no-archive",
    )
    group.add_argument(
        "--retention-check",
        type=_required(duration_ms),
        default=60_000,
        metavar="DURATION",
        help="how often to archive and apply retention (default 1m)",
    )


def retention_from(args: argparse.Namespace) -> Retention:
    try:
        return Retention(
            retention_ms=args.retention,
            retention_bytes=args.retention_bytes,
            command_retention_ms=args.command_retention,
            segment_bytes=args.segment_bytes,
            segment_ms=args.segment_age,
        )
    except ValueError as exc:
        raise ValueError(f"retention settings: {exc}") from None
