"""What retention keeps: segments, the settings, and the pure rule that picks what to prune.

A stream-partition of the embedded log is cut into **segments**, contiguous offset ranges
closed ("sealed") when they reach ``segment_bytes`` or have been open ``segment_ms``; the last
segment is the active one and is never pruned. Kafka cuts its partitions the same way (its
``segment.bytes``/``segment.ms``) and applies ``retention.ms``/``retention.bytes`` per whole
segment, which is the rule :func:`prune_before` states for the embedded log, with two floors
Kafka does not know of::

    segments   [0 .. 100) [100 .. 250) [250 .. 300) [300 .. 340)   <- active, never pruned
    expired?       yes         yes          no           -
    keep_from = min(recovery floor, archived through) = 260
    prune_before(...) = 250: the first two go; [250, 300) stays (it has not expired, and it
    holds offsets at and above 260, which recovery or the archive still need)

A segment goes when it is sealed, ends at or below ``keep_from``, and either its newest record
is older than ``retention_ms`` or the partition is over ``retention_bytes`` without it;
pruning stops at the first segment that must stay, so what remains is always contiguous.
**Commands** follow another rule, :func:`commands_may_go_below`, the same on both logs: a
partition's commands may go as soon as they are below its durable command position (the one
committed with the events that decided them, where a new owner starts), whatever their age.
The embedded log removes the sealed segments wholly below it (:func:`sealed_below`); Kafka
deletes up to it exactly (DeleteRecords). Kafka keeps ``command_retention_ms`` as a backstop
for a partition nobody owns: the only bound on commands nobody decided.

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DAY_MS = 86_400_000
DEFAULT_RETENTION_MS = 30 * DAY_MS  # the seeds' hot window: 30 days of history in the log
DEFAULT_COMMAND_RETENTION_MS = 7 * DAY_MS
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_SEGMENT_MS = DAY_MS


@dataclass(frozen=True, slots=True)
class Segment:
    """A contiguous range of one stream-partition: offsets ``[first, end)``."""

    first: int
    end: int
    bytes: int  # what its records take in the log (values, keys and framing)
    first_ms: int  # wall-clock time its first record was appended
    last_ms: int  # ... and its newest


@dataclass(frozen=True, slots=True)
class Retention:
    """How long the log keeps records. ``None`` means no bound of that kind.

    ``retention_ms``/``retention_bytes`` bound the events stream (bytes per partition, as
    Kafka's ``retention.bytes``). Decided commands go at once (:func:`commands_may_go_below`);
    ``command_retention_ms`` is Kafka's backstop for commands nobody decided (the commands
    topic's ``retention.ms``; see docs/operations.md for why 7 days is safe).
    """

    retention_ms: int | None = DEFAULT_RETENTION_MS
    retention_bytes: int | None = None
    command_retention_ms: int | None = DEFAULT_COMMAND_RETENTION_MS
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_ms: int = DEFAULT_SEGMENT_MS

    def __post_init__(self) -> None:
        for name in ("retention_ms", "retention_bytes", "command_retention_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive (or unset for no bound), got {value}")
        if self.segment_bytes <= 0 or self.segment_ms <= 0:
            raise ValueError("segment_bytes and segment_ms must be positive")


def prune_before(
    segments: Sequence[Segment],
    *,
    now_ms: int,
    keep_from: int,
    retention_ms: int | None,
    retention_bytes: int | None,
) -> int | None:
    """The first offset to keep: every segment wholly below it may go. ``None`` when nothing
    goes. ``segments`` are one stream-partition's, oldest first; ``keep_from`` is the lowest
    offset something still needs (module docstring)."""
    total = sum(s.bytes for s in segments)
    cut: int | None = None
    for segment in segments[:-1]:  # the active segment always stays
        if segment.end > keep_from:
            break
        expired = retention_ms is not None and now_ms - segment.last_ms >= retention_ms
        oversized = retention_bytes is not None and total > retention_bytes
        if not (expired or oversized):
            break
        total -= segment.bytes
        cut = segment.end
    return cut


def commands_may_go_below(position: int | None, start: int) -> int | None:
    """How far a partition's commands may be deleted: up to ``position``, its durable command
    position, below which every command was decided in a transaction that committed the
    position with the events (so neither a new owner, which starts there, nor a fenced one,
    which can commit nothing more, reads below it again). ``start`` is the stream's first
    offset now. None when the position is unknown or nothing below it is left."""
    if position is None or position <= start:
        return None
    return position


def sealed_below(segments: Sequence[Segment], offset: int) -> int | None:
    """The first offset to keep when removing only whole sealed segments below ``offset``: the
    end of the last sealed segment that ends at or below it. None when there is none."""
    cut: int | None = None
    for segment in segments[:-1]:  # the active segment always stays
        if segment.end > offset:
            break
        cut = segment.end
    return cut
