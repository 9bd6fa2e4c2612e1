"""What a call is made from and what it comes to, apart from the HTTP client that makes it
(:mod:`node.caller`): the node's own process reads these (the executors' admission and the
outcomes they record) and imports the client only when it makes calls itself, not when an
executor process does (:mod:`node.call_process`), which keeps aiohttp out of a node's start."""

from __future__ import annotations

import email.utils
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from core.commands import Outcome
from core.egress import EgressPolicy
from node.admission import DEFAULT_ROOM

if TYPE_CHECKING:
    from aiohttp.abc import AbstractResolver

MAX_ERROR = 500
DEFAULT_ERROR_EXCERPT = 200
MAX_ERROR_EXCERPT = 1024  # every failed attempt's error is kept in the log for good
UNREACHABLE = "unreachable"
NOT_CALLED = "not called: the lease ran out before the call"


def retry_after_ms(value: str | None, now: datetime | None = None) -> int | None:
    """``Retry-After`` as delay-seconds or an HTTP date, in milliseconds."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value) * 1000
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    delta = when - (now or datetime.now(UTC))
    return max(0, int(delta.total_seconds() * 1000))


class Result(msgspec.Struct, frozen=True):
    outcome: Outcome
    error: str = ""
    permanent: bool = False
    ambiguous: bool = False
    retry_after_ms: int | None = None


def classify(status: int, retry_after: str | None = None, text: str = "") -> Result:
    """An HTTP answer as an attempt's outcome (the table in :mod:`node.caller`'s docstring)."""
    if 200 <= status < 300:
        return Result(Outcome.SUCCEEDED)
    error = (f"HTTP {status}: {text}" if text else f"HTTP {status}")[:MAX_ERROR].strip()
    if status in (408, 429) or status >= 500:
        return Result(
            Outcome.FAILED,
            error,
            ambiguous=status == 504,
            retry_after_ms=retry_after_ms(retry_after),
        )
    return Result(Outcome.FAILED, error, permanent=True)


@dataclass(frozen=True)
class CallerConfig:
    """What a :class:`Caller` is built from (picklable: an executor process gets a copy).

    ``egress``: where calls may go (default: the public internet only). ``secrets_dir``: where
    header secret references are read (None: the node offers none). ``max_connections``: the
    connection pool's size. ``resolver``: what host names are resolved with before the policy
    filters them (default: the system's; in-process callers only)."""

    egress: EgressPolicy = field(default_factory=EgressPolicy)
    secrets_dir: Path | None = None
    error_excerpt_bytes: int = DEFAULT_ERROR_EXCERPT
    max_connections: int = DEFAULT_ROOM
    kafka_bootstrap: str | None = None
    kafka_config: tuple[tuple[str, str], ...] = ()
    resolver: AbstractResolver | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.error_excerpt_bytes <= MAX_ERROR_EXCERPT:
            raise ValueError(f"error_excerpt_bytes must be between 0 and {MAX_ERROR_EXCERPT}")
