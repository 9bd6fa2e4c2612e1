"""One error tree for cronlog. Every error names the ids it concerns; HTTP mapping lives in api/."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.events import AnyEvent


class CronlogError(Exception):
    """Base of every error cronlog raises on purpose."""


class InvalidDefinition(CronlogError):
    """A job definition or command argument is invalid. ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(CronlogError):
    """A job or run id that this partition (or this tenant) does not know."""


class Conflict(CronlogError):
    """The command is valid but contradicts the current state (wrong version, wrong state)."""


class LeaseLost(Conflict):
    """The caller's fencing token is not the live lease of the run: abandon the work."""


class Fenced(CronlogError):
    """This writer lost ownership of a partition; a newer writer has taken over."""


class Unavailable(CronlogError):
    """The owning partition cannot decide right now (failover, catching up, a failed write):
    nothing was decided; try again."""


class HistoryRefilling(Unavailable):
    """The read model has not yet folded up to what the node knows the log holds (it was
    restored from a checkpoint, set aside, or is folding from the first event): a history
    answer now could miss what exists. The message says how far it is."""


class HistoryMoved(Unavailable):
    """A question about a partition's history reached a node that keeps it no more (the
    partition moved while the question travelled): asking again reaches its new owner."""


class NotYetReadable(Unavailable):
    """Decided and durable, but the read model did not show it in time: ``events`` are what
    was decided (a caller that must not drop them, a claim's leases, takes them from here;
    one whose answer does not read the read model may answer with them)."""

    def __init__(self, message: str, events: Sequence[AnyEvent]) -> None:
        super().__init__(message)
        self.events = list(events)


class LogCorrupted(CronlogError):
    """The log, cronlog's source of truth, holds damage: a checksum that does not match, a
    missing offset, a record the log did not write. Nothing may be decided or served from it;
    the message names the stream, the partition, the offset and, where known, the file."""

    def __init__(
        self,
        message: str,
        *,
        stream: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        file: str | None = None,
    ) -> None:
        super().__init__(message)
        self.stream = stream
        self.partition = partition
        self.offset = offset
        self.file = file


class StoreDamaged(CronlogError):
    """A store derived from the log (a partition's state store, the read model) cannot be
    read back as it was written. It is set aside and rebuilt from the log."""


class EgressDenied(InvalidDefinition):
    """A target outside the operator's egress policy (``core/egress.py``)."""

    def __init__(self, reason: str, field: str = "target") -> None:
        super().__init__(field, f"egress policy: {reason}")


class Pruned(CronlogError):
    """The records asked for have left the hot log (retention removed them): the partition's
    ``stream`` now starts at ``start``. A reader that needs them reads the archive
    (``archive.reading.ArchivedLog`` does that for every reader of the log)."""

    def __init__(self, message: str, *, stream: str, partition: int, start: int) -> None:
        super().__init__(message)
        self.stream = stream
        self.partition = partition
        self.start = start


class TooMuchToFold(InvalidDefinition):
    """A question about the past (time travel) whose answer would fold more events than the
    asker allows; ``field`` names the point asked for (``offset`` or ``at``)."""
