"""Job definitions: what a team asks cronlog to run, and the checks that keep bad ones out.

A :class:`JobSpec` is immutable and travels inside events (``JobRegistered``, ``JobUpdated``), so
it is part of the public event contract: new fields get defaults, nothing is retyped or removed.

Exactly one of three ways to say *when*:

- ``schedule``: a cron expression (5 fields, or 6 with seconds last) read in ``timezone``,
  its day fields combined by ``day_rule`` (``core.cron.DayRule``);
- ``run_at``: one instant (a one-shot job);
- ``interval_sec``: every N seconds from ``start_at`` (or from registration).

A job with ``depends_on`` has none of them: it is triggered each time all of its upstream jobs
have succeeded since it last ran (see ``docs/architecture.md``).

Any of them may be bounded by ``start_at`` and ``end_at`` (both inclusive): no slot before the
one, none after the other. A cron job's first slot is its first fire at or after ``start_at``;
an interval job's slots are ``start_at + k * interval_sec``; a one-shot's ``run_at`` must lie
between them; a dependency-triggered job ignores upstream successes for slots outside them.
Once ``end_at`` has passed, a recurring job has no next slot (the read model calls it
``finished``).
"""

from __future__ import annotations

import enum
import re
import zlib
from typing import Any, assert_never

import msgspec

from core.clock import MAX_INSTANT, Millis
from core.cron import CronSchedule, DayRule, next_fire
from core.errors import InvalidDefinition
from core.ids import SEPARATOR, team_id

JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
POOL = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# Matched whole (fullmatch): "$" would let a trailing newline through.
SECRET_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
# RFC 9110's token: the characters a header name may hold.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Printable ASCII and tab, not starting or ending with white space (which parsers strip).
HEADER_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?")
# A label: "nightly", "team=payments", "env:prod". No "/": the read model's tag index keys
# are "tt/<tenant>/<tag>/<job_id>", so a "/" would let one tag's listing see another's.
TAG = re.compile(r"[A-Za-z0-9_.:=-]{1,64}")  # matched whole (fullmatch)

MAX_PAYLOAD_BYTES = 64 * 1024
# Arrays and objects inside one another: deeper JSON would overrun the recursion limit of the
# threads that encode it again (the runner, the read model), long after the API said yes.
MAX_PAYLOAD_DEPTH = 64
MAX_NAME_CHARS = 200
MAX_DEPENDS_ON = 1000  # the most any tenant may be allowed (api/limits.py sets each one's)
MAX_ATTEMPTS = 100
MAX_CATCH_UP = 1000
MAX_PRIORITY = 9
MAX_CALLS_PER_SEC = 100_000
MAX_HEADERS = 32
MAX_HEADER_NAME = 128
MAX_HEADER_VALUE = 4096
MAX_HEADERS_BYTES = 16 * 1024
MAX_TAGS = 16
# Headers that frame the message or the connection, or that cronlog sets itself on every call:
# a job never sets them.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "content-type",
        "content-encoding",
        "idempotency-key",
    }
)
RESERVED_HEADER_PREFIXES = ("proxy-", "x-cronlog-")
DAY_MS = 86_400_000


class MisfirePolicy(enum.StrEnum):
    """What to do with slots the scheduler woke up too late for (more than the grace period)."""

    SKIP = "skip"  # forget them: right for metric rollups
    FIRE_ONCE = "fire_once"  # run only the most recent: the default
    CATCH_UP = "catch_up"  # run the most recent ``catch_up_limit`` of them, oldest first


class OverlapPolicy(enum.StrEnum):
    """What to do when a slot arrives while an earlier run of the job is still live."""

    ALLOW = "allow"  # run both
    SKIP = "skip"  # record the new slot as skipped
    BUFFER_ONE = "buffer_one"  # hold the new run until the live one ends; at most one waits
    CANCEL_OTHER = "cancel_other"  # cancel the live run, start the new one


class SecretRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A header value kept out of the log: the executor reads the team's secret ``from_file``
    from the node's secrets directory (``<secrets>/<tenant>/<name>``) at each call."""

    from_file: str


class HttpTarget(msgspec.Struct, frozen=True, tag="http", gc=False):
    url: str
    headers: dict[str, str | SecretRef] = {}
    # What the downstream tolerates: the team's calls to this URL's origin share the rate.
    max_calls_per_sec: float | None = None
    # Where the target answers what became of a run's attempt (the SDK's guard serves it): a
    # critical run whose outcome is unknown is asked about there instead of being set aside
    # (core.asking). Never the job's own URL: only a guard answers it.
    status_url: str | None = None


class KafkaTarget(msgspec.Struct, frozen=True, tag="kafka", gc=False):
    topic: str


class PullTarget(msgspec.Struct, frozen=True, tag="pull", gc=False):
    pool: str


Target = HttpTarget | KafkaTarget | PullTarget


class Backoff(msgspec.Struct, frozen=True, gc=False):
    """Retry delays: ``min(cap, base * factor ** (n - 1))`` before retry ``n``, with full jitter.

    Full jitter draws the delay uniformly from ``[0, that bound]`` (the "full jitter" variant of
    the AWS Architecture Blog's "Exponential Backoff And Jitter", 2015); the draw is a hash of
    the run and attempt, so deciding twice gives the same delay.
    """

    base_sec: float = 10.0
    factor: float = 2.0
    cap_sec: float = 3600.0
    jitter: bool = True


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    name: str
    tenant: str
    target: Target
    schedule: str | None = None
    run_at: Millis | None = None
    interval_sec: float | None = None
    start_at: Millis | None = None
    timezone: str = "UTC"
    payload: Any = None
    max_attempts: int = 4
    backoff: Backoff = Backoff()
    timeout_sec: float = 60.0
    lease_sec: float = 30.0
    priority: int = 5
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE
    misfire_grace_sec: float = 60.0
    catch_up_limit: int = 10
    overlap_policy: OverlapPolicy = OverlapPolicy.ALLOW
    allow_jitter_sec: float = 0.0
    critical: bool = False
    depends_on: tuple[str, ...] = ()
    end_at: Millis | None = None  # no slot after it (start_at: none before it)
    # How the schedule's day fields combine (core.cron). The default is the rule every job
    # logged before this field had, so their replay fires what they fired; the API gives new
    # schedules DayRule.CRONTAB.
    day_rule: DayRule = DayRule.EITHER
    tags: tuple[str, ...] = ()  # labels to find the job by (GET /v1/jobs?tag=)

    @property
    def recurring(self) -> bool:
        return self.schedule is not None or self.interval_sec is not None

    @property
    def pool(self) -> str | None:
        match self.target:
            case PullTarget(pool=pool):
                return pool
            case HttpTarget() | KafkaTarget():
                return None  # called by the node's executors
            case _:
                assert_never(self.target)


def payload_of(spec: JobSpec) -> Any:
    """The job's payload as a document, whether the spec holds it decoded (from an event or a
    request) or encoded (the partition state's compact form: ``core.state.compact_spec``)."""
    payload = spec.payload
    if isinstance(payload, msgspec.Raw):
        return msgspec.msgpack.decode(payload)
    return payload


def _positive(field: str, value: float, *, upper: float | None = None) -> None:
    if not value > 0:
        raise InvalidDefinition(field, f"must be positive, got {value!r}")
    if upper is not None and value > upper:
        raise InvalidDefinition(field, f"must be at most {upper}, got {value!r}")


def canonical(spec: JobSpec) -> JobSpec:
    """``spec`` as it reads back from the log (enums, floats), so a live state and its replay
    hold equal values: a spec built in code with ``base_sec=5`` would otherwise differ from the
    ``5.0`` a decoder gives."""
    return msgspec.json.decode(msgspec.json.encode(spec), type=JobSpec)


# Specs this process made canonical and validated (:func:`checked`), by identity, each kept
# alive by the entry so its id is not reused: a partition deciding a command whose spec came
# from here (the API's, in this process) need not judge it again (:func:`judged`), which was a
# tenth of a batch's CPU. A command from anywhere else (through the log, from another node, a
# replay) carries a spec decoded anew, never one of these, and is judged in full. The outcome
# of a decision is the same either way: only its cost differs. Entries are taken by the
# partition; those never taken (a create refused after its check, one forwarded to another
# node) are dropped all at once past CHECKED_KEPT, and a spec dropped early is judged again.
CHECKED_KEPT = 8192
_checked: dict[int, JobSpec] = {}


def checked(spec: JobSpec) -> JobSpec:
    """``spec`` validated (raising :class:`InvalidDefinition` naming the first bad field), as it
    reads back from the log (:func:`canonical`), and remembered as judged."""
    validate(spec)
    spec = canonical(spec)
    if len(_checked) >= CHECKED_KEPT:
        _checked.clear()
    _checked[id(spec)] = spec
    return spec


def judged(spec: JobSpec) -> JobSpec:
    """``spec`` canonical and validated, for a partition to decide on: one that :func:`checked`
    judged in this process as it is, else judged now (raising as :func:`validate` does)."""
    if _checked.pop(id(spec), None) is spec:
        return spec
    spec = canonical(spec)
    validate(spec)
    return spec


def validate_job_id(job_id: str) -> None:
    """A team's job id."""
    if not JOB_ID.match(job_id):
        raise InvalidDefinition("job_id", "must be 1-64 characters of A-Z a-z 0-9 _ -")


def is_log_job_id(job_id: str, tenant: str) -> bool:
    """Whether ``job_id`` is the log's id of one of ``tenant``'s jobs (:mod:`core.ids`): scoped
    by that tenant, or a bare id from before ids were scoped."""
    scope, _, bare = job_id.rpartition(SEPARATOR)
    return bool(JOB_ID.match(bare)) and scope in ("", tenant)


def validate(spec: JobSpec) -> None:
    """Raise :class:`InvalidDefinition` naming the first bad field; return if ``spec`` is sound."""
    if not spec.name.strip() or len(spec.name) > MAX_NAME_CHARS:
        raise InvalidDefinition("name", f"must be 1-{MAX_NAME_CHARS} characters and not blank")
    if not TENANT.match(spec.tenant):
        raise InvalidDefinition("tenant", "must be 1-64 characters of A-Z a-z 0-9 _ . -")
    whens = [f for f in ("schedule", "run_at", "interval_sec") if getattr(spec, f) is not None]
    if spec.depends_on:
        if whens:
            raise InvalidDefinition(
                whens[0], "a job with depends_on is triggered by its upstream jobs; give no time"
            )
        if len(spec.depends_on) > MAX_DEPENDS_ON:
            raise InvalidDefinition("depends_on", f"must list at most {MAX_DEPENDS_ON} jobs")
        for upstream in spec.depends_on:
            # The log's id of one of the team's own jobs (core.ids), or a bare id from before
            # ids were scoped.
            if not is_log_job_id(upstream, spec.tenant):
                raise InvalidDefinition("depends_on", f"{team_id(upstream)!r} is not a job id")
        if len(set(spec.depends_on)) != len(spec.depends_on):
            raise InvalidDefinition("depends_on", "lists a job twice")
    elif len(whens) != 1:
        raise InvalidDefinition(
            "schedule",
            "give exactly one of schedule, run_at or interval_sec"
            + (f" (got {', '.join(whens)})" if whens else ""),
        )
    validate_tags(spec.tags)
    # CronSchedule.parse raises InvalidDefinition naming "schedule" or "timezone".
    CronSchedule.parse(spec.schedule or "0 0 * * *", spec.timezone, spec.day_rule)
    for name, at in (
        ("run_at", spec.run_at),
        ("start_at", spec.start_at),
        ("end_at", spec.end_at),
    ):
        if at is not None and not 0 <= at <= MAX_INSTANT:
            raise InvalidDefinition(name, "must be an instant from 1970 to the end of year 9999")
    if spec.interval_sec is not None:
        _positive("interval_sec", spec.interval_sec, upper=366 * 86400)
        if spec.interval_sec < 1:
            raise InvalidDefinition("interval_sec", "must be at least 1 second")
    if spec.start_at is not None and spec.end_at is not None and spec.end_at < spec.start_at:
        raise InvalidDefinition("end_at", "must not be before start_at")
    if spec.run_at is not None and not in_window(spec, spec.run_at):
        raise InvalidDefinition("run_at", "must lie between start_at and end_at")
    if _depth(spec.payload) > MAX_PAYLOAD_DEPTH:
        raise InvalidDefinition("payload", f"must nest at most {MAX_PAYLOAD_DEPTH} levels deep")
    payload_bytes = len(msgspec.json.encode(spec.payload))
    if payload_bytes > MAX_PAYLOAD_BYTES:
        raise InvalidDefinition("payload", f"must encode to at most {MAX_PAYLOAD_BYTES} bytes")
    _validate_target(spec.target, payload_bytes)
    if not 1 <= spec.max_attempts <= MAX_ATTEMPTS:
        raise InvalidDefinition("max_attempts", f"must be between 1 and {MAX_ATTEMPTS}")
    _positive("backoff.base_sec", spec.backoff.base_sec, upper=DAY_MS / 1000)
    _positive("backoff.cap_sec", spec.backoff.cap_sec, upper=7 * DAY_MS / 1000)
    if not 1 <= spec.backoff.factor <= 10:
        raise InvalidDefinition("backoff.factor", "must be between 1 and 10")
    _positive("timeout_sec", spec.timeout_sec, upper=DAY_MS / 1000)
    _positive("lease_sec", spec.lease_sec, upper=3600)
    if spec.lease_sec < 1:
        raise InvalidDefinition("lease_sec", "must be at least 1 second")
    if not 0 <= spec.priority <= MAX_PRIORITY:
        raise InvalidDefinition("priority", f"must be between 0 and {MAX_PRIORITY}")
    if not 0 <= spec.misfire_grace_sec <= DAY_MS / 1000:
        raise InvalidDefinition("misfire_grace_sec", "must be between 0 and 86400")
    if not 1 <= spec.catch_up_limit <= MAX_CATCH_UP:
        raise InvalidDefinition("catch_up_limit", f"must be between 1 and {MAX_CATCH_UP}")
    if not 0 <= spec.allow_jitter_sec <= DAY_MS / 1000:
        raise InvalidDefinition("allow_jitter_sec", "must be between 0 and 86400")


def validate_tags(tags: tuple[str, ...]) -> None:
    if len(tags) > MAX_TAGS:
        raise InvalidDefinition("tags", f"must list at most {MAX_TAGS} tags, got {len(tags)}")
    for tag in tags:
        if not TAG.fullmatch(tag):
            raise InvalidDefinition(
                "tags", f"{tag[:80]!r} is not a tag: 1-64 characters of A-Z a-z 0-9 _ . : = -"
            )
    if len(set(tags)) != len(tags):
        raise InvalidDefinition("tags", "lists a tag twice")


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar: 0), without recursing."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list | tuple):
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > MAX_PAYLOAD_DEPTH:
                break  # enough to refuse it
        # Only containers are stacked: most of a payload is scalars (checked once per create,
        # twice a job: at the API and in the partition).
        for child in item:
            if isinstance(child, dict | list | tuple):
                stack.append((child, depth))
    return deepest


_HTTP_URL = re.compile(r"^https?://[^\s/?#]+")


def _validate_target(target: Target, payload_bytes: int) -> None:
    match target:
        case HttpTarget(url=url, headers=headers, max_calls_per_sec=rate, status_url=status):
            if not _HTTP_URL.match(url) or len(url) > 2048:
                raise InvalidDefinition("target", "an HTTP target must be an http(s):// URL")
            if status is not None:
                if not _HTTP_URL.match(status) or len(status) > 2048:
                    raise InvalidDefinition("target.status_url", "must be an http(s):// URL")
                if status == url:
                    # A request to the job's own URL could be taken for a call and run it.
                    raise InvalidDefinition(
                        "target.status_url", "must not be the target's url: a guard answers it"
                    )
            if rate is not None and not 0.01 <= rate <= MAX_CALLS_PER_SEC:
                raise InvalidDefinition(
                    "target.max_calls_per_sec", f"must be between 0.01 and {MAX_CALLS_PER_SEC}"
                )
            headers_bytes = validate_headers(headers)
            if payload_bytes + headers_bytes > MAX_PAYLOAD_BYTES:
                raise InvalidDefinition(
                    "target.headers",
                    f"the headers ({headers_bytes} bytes) and the payload ({payload_bytes} bytes)"
                    f" together must be at most {MAX_PAYLOAD_BYTES} bytes",
                )
        case KafkaTarget(topic=topic):
            if not TOPIC.match(topic) or topic in (".", ".."):
                raise InvalidDefinition("target", f"{topic!r} is not a valid Kafka topic name")
        case PullTarget(pool=pool):
            if not POOL.match(pool):
                raise InvalidDefinition("target", f"{pool!r} is not a valid pool name")
        case _:
            assert_never(target)


def validate_headers(headers: dict[str, str | SecretRef]) -> int:
    """Raise :class:`InvalidDefinition` naming the first bad header; return the bytes the
    headers take (names and values as written; a secret reference counts its name)."""
    if len(headers) > MAX_HEADERS:
        raise InvalidDefinition("target.headers", f"at most {MAX_HEADERS} headers")
    seen: set[str] = set()
    size = 0
    for name, value in headers.items():
        if not 1 <= len(name) <= MAX_HEADER_NAME or not HEADER_NAME.fullmatch(name):
            raise InvalidDefinition(
                "target.headers",
                f"{name[:MAX_HEADER_NAME]!r} is not a header name (1-{MAX_HEADER_NAME}"
                " characters of A-Z a-z 0-9 and !#$%&'*+-.^_`|~)",
            )
        field = f"target.headers.{name}"
        lower = name.lower()
        if lower in RESERVED_HEADERS or lower.startswith(RESERVED_HEADER_PREFIXES):
            raise InvalidDefinition(
                field, "cronlog sets this header itself, or it frames the connection"
            )
        if lower in seen:
            raise InvalidDefinition(field, "the header is named twice")
        seen.add(lower)
        if isinstance(value, SecretRef):
            if not SECRET_NAME.fullmatch(value.from_file):
                raise InvalidDefinition(
                    field, "from_file must name a secret: 1-128 characters of A-Z a-z 0-9 _ . -"
                )
            size += len(name) + len(value.from_file)
            continue
        check_header_value(field, value)
        size += len(name) + len(value)
    if size > MAX_HEADERS_BYTES:
        raise InvalidDefinition("target.headers", f"must total at most {MAX_HEADERS_BYTES} bytes")
    return size


def check_header_value(field: str, value: str) -> None:
    """Raise :class:`InvalidDefinition` unless ``value`` can be sent as a header's value as it
    is: no line breaks or other control characters, which would let it forge headers."""
    if len(value) > MAX_HEADER_VALUE:
        raise InvalidDefinition(field, f"a header value is at most {MAX_HEADER_VALUE} characters")
    if not HEADER_VALUE.fullmatch(value):
        raise InvalidDefinition(
            field,
            "a header value is printable ASCII (tabs inside it too), with no line breaks or"
            " other control characters and no white space at either end",
        )


# -- when does a job fire ---------------------------------------------------------------------


def reach_ahead_ms(spec: JobSpec, arm_ms: int, *, critical: bool = False) -> int:
    """How far ahead of now a job under ``allow`` keeps its runs materialised, one after
    another (``core.decide._goes_ahead``, ``core.timers.slot_timer``): a push job's calls are
    armed that far ahead, so a job due more often than that keeps every call of the arming
    time armed. Not a pull job's (its workers claim; one run ahead at most), and not a critical
    job's: a node killed before armed starts leaves each such lease ambiguous (asked about, or
    set aside ``outcome_unknown``), so a critical job keeps one armed at most. ``critical``:
    a critical job's too, for the last batch of a node that hands its partitions over and
    makes the calls it armed as it drains (``core.partition.Partition.arm_ahead``)."""
    if spec.pool is not None or (spec.critical and not critical):
        return 0
    return arm_ms


def in_window(spec: JobSpec, slot: Millis) -> bool:
    """Whether ``slot`` lies between the job's ``start_at`` and ``end_at`` (inclusive)."""
    return (spec.start_at is None or slot >= spec.start_at) and (
        spec.end_at is None or slot <= spec.end_at
    )


def _until(spec: JobSpec, until: Millis) -> Millis:
    return until if spec.end_at is None else min(until, spec.end_at)


def _after(spec: JobSpec, after: Millis) -> Millis:
    return after if spec.start_at is None else max(after, spec.start_at - 1)


def first_slot(spec: JobSpec, registered_at: Millis) -> Millis | None:
    """The first slot of a newly registered job (a one-shot's ``run_at`` even if it has passed:
    a job the API acknowledged must run); None once ``end_at`` has passed."""
    if spec.run_at is not None:
        return spec.run_at
    if spec.interval_sec is not None:
        anchor = spec.start_at if spec.start_at is not None else registered_at
        if anchor >= registered_at:
            return anchor if in_window(spec, anchor) else None
        return next_slot(spec, registered_at - 1, anchor)
    if spec.schedule is not None:
        return _next_fire(spec, registered_at)
    return None


def _next_fire(spec: JobSpec, after: Millis) -> Millis | None:
    assert spec.schedule is not None
    try:
        fire = next_fire(spec.schedule, spec.timezone, _after(spec, after), spec.day_rule)
    except OverflowError:  # no fire before the end of year 9999
        return None
    return fire if spec.end_at is None or fire <= spec.end_at else None


def next_slot(spec: JobSpec, after: Millis, anchor: Millis) -> Millis | None:
    """The first slot strictly after ``after`` (and within ``start_at``/``end_at``); ``anchor``
    is an interval job's first slot."""
    if spec.interval_sec is not None:
        every = round(spec.interval_sec * 1000)
        slot = anchor if after < anchor else anchor + ((after - anchor) // every + 1) * every
        return slot if slot <= _until(spec, MAX_INSTANT) else None
    if spec.schedule is not None:
        return _next_fire(spec, after)
    return None  # one-shot and dependency-triggered jobs have no next slot


def slots_between(
    spec: JobSpec, after: Millis, until: Millis, anchor: Millis, limit: int
) -> list[Millis]:
    """Slots in ``(after, until]``, ascending, at most ``limit`` of them (the earliest)."""
    out: list[Millis] = []
    cursor = after
    while len(out) < limit:
        slot = next_slot(spec, cursor, anchor)
        if slot is None or slot > until:
            break
        out.append(slot)
        cursor = slot
    return out


def last_slots(spec: JobSpec, after: Millis, until: Millis, anchor: Millis, n: int) -> list[Millis]:
    """The latest ``n`` slots in ``(after, until]``, ascending."""
    after, until = _after(spec, after), _until(spec, until)
    if until <= after:
        return []
    if spec.interval_sec is not None:
        every = round(spec.interval_sec * 1000)
        if until < anchor:
            return []
        last = anchor + ((until - anchor) // every) * every
        out = [s for s in (last - i * every for i in range(n)) if s > after and s >= anchor]
        return sorted(out)
    if spec.schedule is not None:
        schedule = CronSchedule.parse(spec.schedule, spec.timezone, spec.day_rule)
        fires = schedule.last_at_or_before(until, n)
        return [s for s in fires if s > after]
    return []


def count_slots(spec: JobSpec, after: Millis, until: Millis, anchor: Millis) -> int | None:
    """How many slots fall in ``(after, until]``; ``None`` when too many to count cheaply."""
    after, until = _after(spec, after), _until(spec, until)
    if until <= after:
        return 0
    if spec.interval_sec is not None:
        every = round(spec.interval_sec * 1000)
        start = max(after + 1, anchor)
        if until < start:
            return 0
        first = anchor + -(-(start - anchor) // every) * every
        return 0 if first > until else (until - first) // every + 1
    if spec.schedule is not None:
        schedule = CronSchedule.parse(spec.schedule, spec.timezone, spec.day_rule)
        return schedule.count_between(after, until, 10_000)
    return 0


def jitter_ms(job_id: str, slot: Millis, window_sec: float) -> Millis:
    """A stable offset in ``[0, window)`` that spreads a herd of jobs sharing one slot."""
    window = round(window_sec * 1000)
    if window <= 0:
        return 0
    return zlib.crc32(f"{job_id}@{slot}".encode()) % window


def unit_fraction(*parts: object) -> float:
    """A deterministic draw in ``[0, 1)`` from its arguments (for jittered backoff)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) / 2**32


def retry_delay_ms(spec: JobSpec, run_id: str, retry: int) -> Millis:
    """The backoff before retry number ``retry`` (1 for the first retry)."""
    b = spec.backoff
    bound = min(b.cap_sec, b.base_sec * b.factor ** (retry - 1)) * 1000
    if b.jitter:
        bound *= unit_fraction(run_id, retry)
    return round(bound)
