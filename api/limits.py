"""Per-tenant limits: how much one team may hold and ask for.

The operator passes ``cronlog serve --limits FILE``, a TOML file with the defaults every team
gets and overrides for some of them; a setting an override leaves out comes from the
defaults, and one the file leaves out from :class:`TenantLimits`::

    [defaults]
    max_jobs = 5000
    requests_per_sec = 20

    [tenants.team-a]        # a team with a large worker fleet and many jobs
    max_jobs = 50000
    requests_per_sec = 500
    request_burst = 1000

Every value has a ceiling of its own (below), so no file can lift a bound the log and the
partitions rely on. A file that cannot be read, names an unknown setting or gives a value out
of range is refused at startup with a message naming the file, the section and the setting.
What each limit means and how it is enforced: ``docs/security.md``, "Quotas and bounds".
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from core.jobs import MAX_DEPENDS_ON, MAX_NAME_CHARS, TENANT
from projections.read_model import MAX_LIMIT

MAX_JOBS_CEILING = 10_000_000
MAX_RATE_CEILING = 100_000.0
MAX_WAITING_CEILING = 100_000


class TenantLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One team's limits; the defaults are what a shared scheduler's operator starts from."""

    # Jobs that are not cancelled. Each costs memory on its partition's owner for as long as
    # it lives (its definition, payload up to 64 KiB included).
    max_jobs: Annotated[int, Meta(ge=1, le=MAX_JOBS_CEILING)] = 10_000
    # Upstream jobs one job may wait for.
    max_depends_on: Annotated[int, Meta(ge=0, le=MAX_DEPENDS_ON)] = 50
    # A job's name, in characters.
    max_name_chars: Annotated[int, Meta(ge=1, le=MAX_NAME_CHARS)] = MAX_NAME_CHARS
    # The most items one page of a listing holds; a larger ``limit`` is served as this many.
    max_page_size: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] = 200
    # Requests per second per bearer token (a token bucket), and the burst it may spend at
    # once. Pull workers sharing a token share its rate.
    requests_per_sec: Annotated[float, Meta(gt=0, le=MAX_RATE_CEILING)] = 100.0
    request_burst: Annotated[int, Meta(ge=1, le=int(MAX_RATE_CEILING))] = 200
    # Requests held open at once, across the cluster (core.shares): claims long-polling
    # (``wait_sec``), and event streams (``GET /v1/events``). Past them: 429 at once.
    max_waiting_claims: Annotated[int, Meta(ge=0, le=MAX_WAITING_CEILING)] = 256
    max_event_streams: Annotated[int, Meta(ge=0, le=MAX_WAITING_CEILING)] = 8


class LimitsError(ValueError):
    """A limits file that cannot be used; the message names the file, section and setting."""


@dataclass(frozen=True)
class Limits:
    """The defaults and the per-tenant overrides, resolved: ``limits.of(tenant)``."""

    defaults: TenantLimits = field(default_factory=TenantLimits)
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)

    def of(self, tenant: str) -> TenantLimits:
        return self.tenants.get(tenant, self.defaults)


def _resolve(where: str, base: dict[str, Any], given: object) -> TenantLimits:
    if not isinstance(given, dict):
        raise LimitsError(f"{where}: expected a table of settings")
    try:
        return msgspec.convert({**base, **given}, TenantLimits)
    except msgspec.ValidationError as e:
        # msgspec says "... - at `$.max_jobs`" or "... unknown field `max_jbs`": keep the words,
        # say where in the file.
        raise LimitsError(f"{where}: {str(e).replace('`$.', '`')}") from None


def parse_limits(text: str, source: str = "limits") -> Limits:
    """The limits a TOML text describes; :class:`LimitsError` names what is wrong."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LimitsError(f"{source}: not TOML: {e}") from None
    unknown = sorted(set(document) - {"defaults", "tenants"})
    if unknown:
        raise LimitsError(f"{source}: unknown section [{unknown[0]}] (known: defaults, tenants)")
    defaults = _resolve(f"{source} [defaults]", {}, document.get("defaults", {}))
    base = msgspec.structs.asdict(defaults)
    tenants = document.get("tenants", {})
    if not isinstance(tenants, dict):
        raise LimitsError(f"{source}: tenants must be tables, [tenants.NAME]")
    resolved: dict[str, TenantLimits] = {}
    for tenant, given in tenants.items():
        if not TENANT.match(tenant):
            raise LimitsError(f"{source} [tenants.{tenant}]: not a tenant name (A-Z a-z 0-9 _ . -)")
        resolved[tenant] = _resolve(f"{source} [tenants.{tenant}]", base, given)
    return Limits(defaults, resolved)


def read_limits(path: Path) -> Limits:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LimitsError(f"{path}: cannot be read: {e}") from None
    return parse_limits(text, str(path))
