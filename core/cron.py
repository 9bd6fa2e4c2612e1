"""Cron schedules: which UTC instants a cron expression fires at, in a given IANA timezone.

Instants are ``int`` milliseconds since the Unix epoch, UTC (:data:`core.clock.Millis`). Fire
instants always fall on a whole second (a whole minute for 5-field expressions, except a fire
moved to a DST transition, which lands wherever the transition is).

Syntax
------
Parsing and validation are croniter's (so the usual ``*``, lists, ranges, steps, names,
``L`` in day-of-month, ``mon#2`` and ``L5`` in day-of-week are accepted); the search for fire
times and the DST rule are ours. Two forms:

* 5 fields, minute resolution: ``minute hour day-of-month month day-of-week``.
* 6 fields, second resolution, **seconds last** (croniter's order, not Quartz's):
  ``minute hour day-of-month month day-of-week second``. ``0 12 * * * 30`` fires at
  12:00:30 every day.

The aliases ``@hourly @daily @midnight @weekly @monthly @yearly @annually`` are rewritten to
their 5-field text.

Day-of-month and day-of-week: the :class:`DayRule`
--------------------------------------------------
When both day fields are restricted a day matches if either does; when one is unrestricted
the other alone decides. The two rules differ on what "unrestricted" means:

* ``DayRule.CRONTAB`` (Vixie cron, cronie, and every job the API registers): a field that
  *starts with* ``*`` is unrestricted, so ``30 1 3 12 */2`` fires on the 3rd of
  December when that is a Sunday, Tuesday, Thursday or Saturday (the two fields are ANDed).
* ``DayRule.EITHER`` (croniter's reading, which cronlog followed before the rule became a
  field of the job): only a field that is exactly ``*`` is unrestricted, so the same text
  fires on the 3rd *and* on every even weekday of December. Jobs registered before the
  job's ``day_rule`` existed decode with this rule, so replaying an old log fires exactly the
  slots it fired then.

DST: the stated rule
--------------------
A local slot is one wall-clock reading the expression matches (a date and a time of day).

* **Fixed-hour schedules** (the hour field is anything other than ``*`` or ``*/n``: a number,
  a list, a range, a stepped range such as ``1-5/2``). Each local slot fires exactly once, at
  the first instant the local clock reads that time *or later*. A slot skipped by a
  spring-forward therefore fires at the transition; a slot repeated by a fall-back fires at
  its first occurrence only. Several skipped slots collapse into the one transition instant.
* **Real-time schedules** (the hour field is ``*`` or ``*/n``). A fire is any instant whose
  local wall clock matches. A repeated hour fires twice (they are two real hours), a skipped
  hour does not fire at all.

The second occurrence of a repeated slot is the one instant where a fixed-hour schedule
deliberately does *not* fire although the wall clock matches. ``suppressed_between`` lists
those instants so the scheduler can record each one as skipped (a slot skipped by a
spring-forward is not suppressed: it fires at the transition).

Worked example, America/New_York, ``30 1 * * *`` (fixed) and ``30 * * * *`` (real time)::

    2024-11-03 (fall back 02:00 EDT -> 01:00 EST)
      05:30Z = 01:30 EDT   fixed fires    real-time fires
      06:30Z = 01:30 EST   suppressed     real-time fires
    2024-03-10 (spring forward 02:00 EST -> 03:00 EDT), ``30 2 * * *``
      07:00Z = 03:00 EDT   fixed fires (02:30 does not exist; the transition is its slot)

How the search works
--------------------
A fixed-hour slot ``c`` fires at ``g(c)``, the first instant whose wall reading is ``>= c``.
``g`` is non-decreasing in ``c``, so the next fire after ``t`` is ``g`` of the first slot
``c`` later than the wall reading at ``t`` with ``g(c) > t`` (slots in the remainder of a
repeated hour are skipped: their first occurrence has passed). For real-time schedules each
slot has zero, one or two instants (``fold=0``/``fold=1`` in :pep:`495` terms); when ``t`` is
in the first pass of a repeated hour, the second occurrences of slots we already passed are
also candidates. All arithmetic is in whole seconds; ``zoneinfo`` supplies the offsets.

This module is pure: it reads no clock. ``zoneinfo`` loads zone data once per zone.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from bisect import bisect_left, bisect_right
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo

from croniter import croniter

from core.errors import InvalidDefinition

__all__ = [
    "CronSchedule",
    "DayRule",
    "clear_caches",
    "day_rule_matters",
    "next_fire",
    "split_seconds",
    "suppressed_since_previous",
    "with_seconds",
]

_ALIASES: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD_NAMES: Final = ("minute", "hour", "day-of-month", "month", "day-of-week", "second")
_FULL: Final = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6), (0, 59))
# Zone names that resolve to whatever the host is configured with, or to nothing at all.
_HOST_ZONES: Final = frozenset({"localtime", "posixrules", "Factory"})
# A valid calendar rule matches within 28 years (2000-2027 holds every kind of year), and
# the longest gap between two matching days is 8 years (29 February around 2100).
_SEARCH_YEARS: Final = 30
_EQUAL_RANGE: Final = re.compile(r"^(\w+)-\1(?:/\d+)?$", re.ASCII)
_ONE_SECOND: Final = dt.timedelta(seconds=1)
_ONE_DAY: Final = dt.timedelta(days=1)
_EPOCH: Final = dt.datetime(1970, 1, 1)
# Offset changes are looked for by sampling the offset once a day and bisecting where it
# differs. That is exact while no zone changes its offset twice within a day: in tzdata the
# closest pair since 1970 is about seven days apart (Brazil, October 2000; tested). A fall-back
# also repeats less than a day of wall time (the largest since 1970 is seven hours).
_DAY_SECONDS: Final = 86_400


class DayRule(enum.StrEnum):
    """How day-of-month and day-of-week combine (see the module docstring)."""

    EITHER = "either"  # croniter: only an exact "*" is unrestricted
    CRONTAB = "crontab"  # Vixie cron and cronie: a field starting with "*" is unrestricted


class _Fields:
    """The expanded fields of one expression and the wall-clock slot search over them."""

    __slots__ = (
        "both_days",
        "dom_last",
        "dom_star",
        "doms",
        "dow_star",
        "dows",
        "hours",
        "minutes",
        "months",
        "nth",
        "real_time",
        "seconds",
    )

    def __init__(self, fields: list[str], day_rule: DayRule) -> None:
        expanded, nth = _expand(" ".join(fields))
        minutes, hours, doms, months, dows = expanded[:5]
        self.minutes = _sorted_ints(minutes, 0)
        self.hours = _sorted_ints(hours, 1)
        self.seconds = _sorted_ints(expanded[5], 5) if len(expanded) == 6 else (0,)
        self.months = frozenset(_sorted_ints(months, 3))
        self.dom_star = doms == ["*"]
        self.dom_last = "l" in doms
        self.doms = frozenset(_sorted_ints([d for d in doms if d != "l"], 2))
        self.dow_star = dows == ["*"]
        self.nth: dict[int, frozenset[int | str]] = {
            int(day): frozenset(which) for day, which in nth.items()
        }
        self.dows = frozenset(d for d in _sorted_ints(dows, 4) if d not in self.nth)
        hour = fields[1]
        self.real_time = hour == "*" or hour.startswith("*/")
        # Whether a day must match both day fields (True) or either one.
        self.both_days = day_rule is DayRule.CRONTAB and (
            fields[2].startswith("*") or fields[4].startswith("*")
        )

    # -- days ----------------------------------------------------------------------------

    def day_matches(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        if self.dom_star and self.dow_star:
            return True
        if self.dom_star:
            return self._dow_matches(day)
        if self.dow_star:
            return self._dom_matches(day)
        if self.both_days:
            return self._dom_matches(day) and self._dow_matches(day)
        return self._dom_matches(day) or self._dow_matches(day)

    def _dom_matches(self, day: dt.date) -> bool:
        return day.day in self.doms or (self.dom_last and (day + _ONE_DAY).day == 1)

    def _dow_matches(self, day: dt.date) -> bool:
        weekday = day.isoweekday() % 7  # Sunday is 0, as in cron
        if weekday in self.dows:
            return True
        which = self.nth.get(weekday)
        if which is None:
            return False
        if (day.day - 1) // 7 + 1 in which:
            return True
        return "l" in which and (day + dt.timedelta(days=7)).month != day.month

    def next_day(self, day: dt.date) -> dt.date | None:
        """The first matching day strictly after ``day`` (None past the search horizon)."""
        horizon = day.year + _SEARCH_YEARS
        try:
            while True:
                if day.month in self.months:
                    day += _ONE_DAY
                else:  # jump to the first of the next month
                    day = (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
                if day.year > horizon:
                    return None
                if self.day_matches(day):
                    return day
        except OverflowError:
            return None

    def prev_day(self, day: dt.date) -> dt.date | None:
        """The last matching day strictly before ``day`` (None past the search horizon)."""
        horizon = day.year - _SEARCH_YEARS
        try:
            while True:
                if day.month in self.months:
                    day -= _ONE_DAY
                else:  # jump to the last day of the previous month
                    day = day.replace(day=1) - _ONE_DAY
                if day.year < horizon:
                    return None
                if self.day_matches(day):
                    return day
        except OverflowError:
            return None

    # -- slots (naive local wall-clock datetimes) ------------------------------------------

    def next_slot(self, after: dt.datetime) -> dt.datetime | None:
        """The first local slot strictly later than the wall reading ``after``."""
        start = after.replace(microsecond=0) + _ONE_SECOND
        day = start.date()
        if self.day_matches(day):
            tod = self._time_at_or_after(start.hour, start.minute, start.second)
            if tod is not None:
                return dt.datetime.combine(day, tod)
        found = self.next_day(day)
        if found is None:
            return None
        return dt.datetime.combine(found, dt.time(self.hours[0], self.minutes[0], self.seconds[0]))

    def prev_slot(self, before: dt.datetime) -> dt.datetime | None:
        """The last local slot strictly earlier than the wall reading ``before``."""
        end = before - _ONE_SECOND if before.microsecond == 0 else before.replace(microsecond=0)
        day = end.date()
        if self.day_matches(day):
            tod = self._time_at_or_before(end.hour, end.minute, end.second)
            if tod is not None:
                return dt.datetime.combine(day, tod)
        found = self.prev_day(day)
        if found is None:
            return None
        return dt.datetime.combine(
            found, dt.time(self.hours[-1], self.minutes[-1], self.seconds[-1])
        )

    def _time_at_or_after(self, hour: int, minute: int, second: int) -> dt.time | None:
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        i = bisect_left(hours, hour)
        if i < len(hours) and hours[i] == hour:
            j = bisect_left(minutes, minute)
            if j < len(minutes) and minutes[j] == minute:
                k = bisect_left(seconds, second)
                if k < len(seconds):
                    return dt.time(hour, minute, seconds[k])
                j += 1
            if j < len(minutes):
                return dt.time(hour, minutes[j], seconds[0])
            i += 1
        if i < len(hours):
            return dt.time(hours[i], minutes[0], seconds[0])
        return None

    def _time_at_or_before(self, hour: int, minute: int, second: int) -> dt.time | None:
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        i = bisect_right(hours, hour) - 1
        if i >= 0 and hours[i] == hour:
            j = bisect_right(minutes, minute) - 1
            if j >= 0 and minutes[j] == minute:
                k = bisect_right(seconds, second) - 1
                if k >= 0:
                    return dt.time(hour, minute, seconds[k])
                j -= 1
            if j >= 0:
                return dt.time(hour, minutes[j], seconds[-1])
            i -= 1
        if i >= 0:
            return dt.time(hours[i], minutes[-1], seconds[-1])
        return None

    def ever_fires(self) -> bool:
        # Any calendar rule that matches some day matches one in 2000-2027 (see _SEARCH_YEARS).
        day = dt.date(1999, 12, 31)
        found = self.next_day(day)
        return found is not None and found.year < 2028


def _expand(text: str) -> tuple[list[list[int | str]], dict[int | str, set[int | str]]]:
    try:
        expanded, nth = croniter.expand(text)
    except (ValueError, TypeError) as exc:  # croniter's errors subclass ValueError
        raise InvalidDefinition("schedule", f"{text!r}: {exc}") from None
    return [list(f) for f in expanded], dict(nth)


def _sorted_ints(values: list[int | str], index: int) -> tuple[int, ...]:
    if values == ["*"]:
        low, high = _FULL[index]
        return tuple(range(low, high + 1))
    return tuple(sorted(int(v) for v in values))


def _normalise(expression: str) -> list[str]:
    text = expression.strip().lower()
    if not text:
        raise InvalidDefinition("schedule", "the cron expression is empty")
    if not text.isascii():
        raise InvalidDefinition("schedule", f"{expression!r}: only ASCII characters are allowed")
    if text.startswith("@"):
        alias = _ALIASES.get(text)
        if alias is None:
            known = ", ".join(sorted(_ALIASES))
            raise InvalidDefinition("schedule", f"{expression!r}: unknown alias (known: {known})")
        text = alias
    fields = text.split()
    if len(fields) not in (5, 6):
        raise InvalidDefinition(
            "schedule",
            f"{expression!r} has {len(fields)} fields; expected 5 (minute hour day-of-month "
            "month day-of-week) or 6 (the same, then second)",
        )
    for index, field in enumerate(fields):
        items = field.split(",")
        # croniter reads an equal range ("5-5", "jan-jan") as the whole field; cron means
        # the one value, and so do we.
        items = [_EQUAL_RANGE.sub(r"\1", item) for item in items]
        fields[index] = ",".join(items)
        for item in items:
            if item in ("h", "r") or item.startswith(("h(", "r(", "h/", "r/")):
                raise InvalidDefinition(
                    "schedule",
                    f"{expression!r}: hashed or random values ({item!r} in the "
                    f"{_FIELD_NAMES[index]} field) are not supported",
                )
    if "w" in fields[2]:
        raise InvalidDefinition(
            "schedule", f"{expression!r}: nearest-weekday 'W' in day-of-month is not supported"
        )
    return fields


def _zone(name: str) -> ZoneInfo:
    if not name or name in _HOST_ZONES:
        raise InvalidDefinition("timezone", f"{name!r} is not an IANA timezone name")
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise InvalidDefinition("timezone", f"{name!r} is not a known IANA timezone") from exc


def _to_utc(wall: dt.datetime, zone: ZoneInfo, fold: int) -> int:
    """Seconds since the epoch for a local reading; ``fold`` picks as :pep:`495` says."""
    local = wall.replace(tzinfo=zone, fold=fold)
    offset = local.utcoffset()
    assert offset is not None
    return (wall - _EPOCH - offset) // _ONE_SECOND


def _wall(seconds: int, zone: ZoneInfo) -> dt.datetime:
    """The local wall reading at an instant, naive, with ``fold=1`` on a repeated reading."""
    return dt.datetime.fromtimestamp(seconds, zone).replace(tzinfo=None)


def _year_of(seconds: int) -> int:
    try:
        return (_EPOCH + dt.timedelta(seconds=seconds)).year
    except OverflowError:
        return 1 if seconds < 0 else 9999


def _year_start(year: int) -> int:
    return (dt.datetime(year, 1, 1) - _EPOCH) // _ONE_SECOND


def _offset(zone: ZoneInfo, seconds: int) -> int:
    offset = dt.datetime.fromtimestamp(seconds, zone).utcoffset()
    assert offset is not None
    return offset // _ONE_SECOND


@lru_cache(maxsize=4096)
def _fall_backs(zone: ZoneInfo, year: int) -> tuple[tuple[int, int, int], ...]:
    """The zone's fall-backs in UTC ``year``: ``(transition, repeated, offset after)`` in
    seconds, where ``transition`` is the first instant on the new offset (in
    ``(1 January, next 1 January]``) and ``repeated`` how much wall time occurs twice."""
    if not 1 < year < 9999:
        return ()
    found: list[tuple[int, int, int]] = []
    before, end = _year_start(year), _year_start(year + 1)
    offset = _offset(zone, before)
    while before < end:
        after = min(before + _DAY_SECONDS, end)
        later = _offset(zone, after)
        if later != offset:
            transition = _transition(zone, before, after)
            if later < offset:
                found.append((transition, offset - later, later))
        before, offset = after, later
    return tuple(found)


def _transition(zone: ZoneInfo, before: int, after: int) -> int:
    """The first second in ``(before, after]`` whose UTC offset differs from ``before``'s."""
    start_offset = dt.datetime.fromtimestamp(before, zone).utcoffset()
    while after - before > 1:
        mid = (before + after) // 2
        if dt.datetime.fromtimestamp(mid, zone).utcoffset() == start_offset:
            before = mid
        else:
            after = mid
    return after


class CronSchedule:
    """A validated cron expression in an IANA timezone. Immutable and hashable.

    Build with :meth:`parse`. ``expression`` is the normalised text (lower case, single
    spaces, aliases expanded); two schedules are equal when text and timezone are.
    """

    __slots__ = ("_day_rule", "_expression", "_fields", "_hash", "_timezone", "_zone")

    _expression: str
    _timezone: str
    _day_rule: DayRule
    _fields: _Fields
    _zone: ZoneInfo
    _hash: int

    def __init__(
        self, expression: str, timezone: str, day_rule: DayRule, fields: _Fields, zone: ZoneInfo
    ) -> None:
        for name, value in (
            ("_expression", expression),
            ("_timezone", timezone),
            ("_day_rule", day_rule),
            ("_fields", fields),
            ("_zone", zone),
            ("_hash", hash((expression, timezone, day_rule))),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CronSchedule is immutable")

    @property
    def expression(self) -> str:
        """The normalised expression text."""
        return self._expression

    @property
    def timezone(self) -> str:
        """The IANA timezone name, as given."""
        return self._timezone

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronSchedule):
            return NotImplemented
        return (
            self.expression == other.expression
            and self.timezone == other.timezone
            and self._day_rule is other._day_rule
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"CronSchedule({self.expression!r}, {self.timezone!r}, {self._day_rule.value!r})"

    @property
    def day_rule(self) -> DayRule:
        """How the two day fields combine."""
        return self._day_rule

    @classmethod
    def parse(
        cls, expression: str, timezone: str = "UTC", day_rule: DayRule = DayRule.EITHER
    ) -> CronSchedule:
        """Validate and compile. Raises :class:`InvalidDefinition` naming the field.

        ``expression`` has 5 fields (``minute hour day-of-month month day-of-week``) or 6
        fields with **seconds as the sixth, last field** (croniter's order), or is one of
        the ``@hourly``-style aliases. Rejected (field ``"schedule"``): empty text, another
        field count, out-of-range values, hashed/random ``H``/``R`` values, ``W``, and
        expressions that can never fire such as ``0 0 30 2 *``. An unknown zone is rejected
        with field ``"timezone"``. ``day_rule`` says how the day fields combine (the module
        docstring); a job passes its own. Parsed schedules are cached.
        """
        return _parse(expression, timezone, DayRule(day_rule))

    @property
    def follows_real_time(self) -> bool:
        """True when the hour field is ``*`` or ``*/n`` (see the module's DST rule)."""
        return self._fields.real_time

    # -- queries -------------------------------------------------------------------------

    def next_after(self, after_ms: int) -> int:
        """The first fire instant strictly after ``after_ms`` (UTC milliseconds).

        Raises ``OverflowError`` if there is none before the end of year 9999.
        """
        return _next_after(self, after_ms)

    def fires_between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Fire instants in ``(after_ms, until_ms]``, ascending, at most ``limit`` of them."""
        fires: list[int] = []
        at = after_ms
        while len(fires) < limit:
            try:
                at = self.next_after(at)
            except OverflowError:  # none before the end of year 9999
                break
            if at > until_ms:
                break
            fires.append(at)
        return fires

    def count_between(self, after_ms: int, until_ms: int, cap: int) -> int | None:
        """How many fires lie in ``(after_ms, until_ms]``, or None if more than ``cap``."""
        count = len(self.fires_between(after_ms, until_ms, cap + 1))
        return None if count > cap else count

    def last_at_or_before(self, at_ms: int, n: int) -> list[int]:
        """The last ``n`` fire instants ``<= at_ms``, ascending (fewer if the search horizon
        of 30 years before the earliest one found runs out)."""
        if n <= 0:
            return []
        zone = self._zone
        slot = _wall(at_ms // 1000, zone) + _ONE_SECOND  # slots <= the reading at at_ms
        wanted = n
        stepped = 0
        while True:
            # Step back ``wanted`` slots, then list the fires forward from there: the fire
            # set does not depend on where a forward scan starts, so this is exact.
            exhausted = False
            while stepped < wanted:
                earlier = self._fields.prev_slot(slot)
                if earlier is None:
                    exhausted = True
                    break
                slot = earlier
                stepped += 1
            low = min(_to_utc(slot, zone, 0), _to_utc(slot, zone, 1)) * 1000 - 1
            fires = self.fires_between(low, at_ms, 1 << 62)
            if len(fires) >= n or exhausted:
                return fires[-n:]
            wanted *= 2

    def preview(self, after_ms: int, n: int) -> list[int]:
        """The next ``n`` fire instants after ``after_ms``, ascending (fewer near the end of
        year 9999)."""
        return self.fires_between(after_ms, 1 << 62, n)

    def suppressed_between(self, after_ms: int, until_ms: int) -> list[int]:
        """Instants in ``(after_ms, until_ms]`` where the wall clock matches but we do not fire.

        These are the second occurrences of local slots repeated by a fall-back, for
        fixed-hour schedules (the DST rule fires a repeated slot at its first occurrence
        only). Ascending. Empty for real-time schedules, which fire at both occurrences, and
        for intervals without a fall-back; a spring-forward suppresses nothing (a skipped slot
        fires at the transition). New York, ``30 1 * * *``: on 3 November 2024 it fires at
        01:30 EDT (05:30Z), and 01:30 EST (06:30Z) is suppressed.

        Cost: the zone's fall-backs are found once per zone and UTC year (a day-by-day scan
        of the offset, cached), so an interval without one costs a cache look-up per year it
        spans; each fall-back inside it adds a slot search over its repeated wall time.
        """
        if self._fields.real_time or until_ms <= after_ms:
            return []
        # An instant u (whole seconds) lies in (after_ms, until_ms] iff after < u <= until.
        after, until = after_ms // 1000, until_ms // 1000
        found: list[int] = []
        for year in range(_year_of(after - _DAY_SECONDS), _year_of(until) + 1):
            for transition, repeated, offset in _fall_backs(self._zone, year):
                if transition <= until and transition + repeated > after + 1:
                    found += self._second_occurrences(transition, repeated, offset, after, until)
        return found

    def suppressed_since_previous(self, fire_ms: int, until_ms: int) -> list[int]:
        """:meth:`suppressed_between` from the fire before ``fire_ms`` to ``until_ms``.

        A scheduler that handles a schedule's fires in order asks this with the first and
        the last fire it handles in one step: consecutive steps cover consecutive intervals,
        so each suppressed instant is reported by exactly one step (the one that handles the
        first fire after it). Cheap when no fall-back is near: if a fire lies between the end
        of the zone's latest repeated wall time and ``fire_ms``, the previous fire is past
        it and nothing is suppressed, and that fire is found by a memoised :meth:`next_after`
        from a point that stays the same for months. Otherwise the previous fire is looked up
        (memoised per ``(schedule, fire_ms, until_ms)``, for herds).
        """
        if self._fields.real_time or until_ms < fire_ms:
            return []
        until = until_ms // 1000
        year = _year_of(until)
        clear_from = (_year_start(max(year - 1, 1)) + _DAY_SECONDS) * 1000
        for y in (year, year - 1):
            passed = [(t, r) for t, r, _ in _fall_backs(self._zone, y) if t <= until]
            if passed:
                clear_from = (passed[-1][0] + passed[-1][1]) * 1000
                break
        try:
            if self.next_after(clear_from - 1) < fire_ms:
                return []
        except OverflowError:
            return []
        return list(_suppressed_since_previous(self, fire_ms, until_ms))

    def _second_occurrences(
        self, transition: int, repeated: int, offset: int, after: int, until: int
    ) -> list[int]:
        """Suppressed instants of one fall-back: the wall readings from the one at
        ``transition`` (offset ``offset`` seconds) for ``repeated`` seconds occur twice."""
        fields, zone = self._fields, self._zone
        start = _EPOCH + dt.timedelta(seconds=transition + offset)
        end = start + dt.timedelta(seconds=repeated)
        found: list[int] = []
        slot = fields.next_slot(start - _ONE_SECOND)
        while slot is not None and slot < end:
            first, second = _to_utc(slot, zone, 0), _to_utc(slot, zone, 1)
            if first < second and after < second <= until:
                found.append(second * 1000)
            slot = fields.next_slot(slot)
        return found

    # -- the search ------------------------------------------------------------------------

    def _compute_next(self, after_ms: int) -> int:
        after = after_ms // 1000  # a fire u (whole seconds) is > after_ms iff u > after
        search = self._next_real_time if self._fields.real_time else self._next_fixed
        return search(after) * 1000

    def _next_fixed(self, after: int) -> int:
        fields, zone = self._fields, self._zone
        reading = _wall(after, zone)
        while True:
            slot = fields.next_slot(reading)
            if slot is None:
                raise OverflowError(f"{self!r} has no fire after {after * 1000}")
            reading = slot
            first = _to_utc(slot, zone, 0)
            second = _to_utc(slot, zone, 1)
            # fold=0 maps a skipped reading past the gap, fold=1 before it (PEP 495).
            fire = first if first <= second else _transition(zone, second, first)
            if fire > after:  # false only for the rest of a repeated hour
                return fire

    def _next_real_time(self, after: int) -> int:
        fields, zone = self._fields, self._zone
        now = _wall(after, zone)
        best: int | None = None
        if now.fold == 0:
            first, second = _to_utc(now, zone, 0), _to_utc(now, zone, 1)
            if first < second:
                # First pass of a repeated hour: slots we already passed come round again
                # at ``slot - offset_after``, which is later than ``after`` once
                # ``slot > now - (second - after)``.
                passed = fields.next_slot(now - dt.timedelta(seconds=second - after))
                while passed is not None and passed <= now:
                    once, again = _to_utc(passed, zone, 0), _to_utc(passed, zone, 1)
                    if once < again and again > after:
                        best = again
                        break
                    passed = fields.next_slot(passed)
        reading = now
        while True:
            slot = fields.next_slot(reading)
            if slot is None:
                if best is not None:
                    return best
                raise OverflowError(f"{self!r} has no fire after {after * 1000}")
            reading = slot
            first, second = _to_utc(slot, zone, 0), _to_utc(slot, zone, 1)
            if first > second:  # skipped by a spring-forward: no such real instant
                continue
            fire = first if first > after else second
            if fire > after:
                return fire if best is None else min(best, fire)


@lru_cache(maxsize=4096)
def _parse(expression: str, timezone: str, day_rule: DayRule) -> CronSchedule:
    fields = _normalise(expression)
    zone = _zone(timezone)
    compiled = _compile(" ".join(fields), day_rule)
    if not compiled.ever_fires():
        raise InvalidDefinition("schedule", f"{expression!r} never fires")
    return CronSchedule(" ".join(fields), timezone, day_rule, compiled, zone)


@lru_cache(maxsize=4096)
def _compile(text: str, day_rule: DayRule) -> _Fields:
    return _Fields(text.split(), day_rule)


@lru_cache(maxsize=65536)
def _next_after(schedule: CronSchedule, after_ms: int) -> int:
    return schedule._compute_next(after_ms)


@lru_cache(maxsize=4096)
def _suppressed_since_previous(
    schedule: CronSchedule, fire_ms: int, until_ms: int
) -> tuple[int, ...]:
    previous = schedule.last_at_or_before(fire_ms - 1, 1)
    after = previous[0] if previous else fire_ms - 1
    return tuple(schedule.suppressed_between(after, until_ms))


@lru_cache(maxsize=65536)
def next_fire(expression: str, timezone: str, after_ms: int, day_rule: DayRule) -> int:
    """``CronSchedule.parse(expression, timezone, day_rule).next_after(after_ms)``, memoised.

    Many jobs share a schedule and are advanced from the same slot (the midnight herd:
    50,000 jobs on ``0 0 * * *``), so the key repeats and all but the first are cache hits.
    """
    return _parse(expression, timezone, day_rule).next_after(after_ms)


@lru_cache(maxsize=65536)
def suppressed_since_previous(
    expression: str, timezone: str, fire_ms: int, until_ms: int, day_rule: DayRule
) -> tuple[int, ...]:
    """``CronSchedule.parse(expression, timezone, day_rule).suppressed_since_previous(fire_ms,
    until_ms)``, memoised on the key a herd of jobs on one schedule shares (as
    :func:`next_fire` is)."""
    schedule = _parse(expression, timezone, day_rule)
    return tuple(schedule.suppressed_since_previous(fire_ms, until_ms))


@lru_cache(maxsize=4096)
def day_rule_matters(expression: str) -> bool:
    """Whether the two :class:`DayRule` read ``expression`` differently: one day field starts
    with ``*`` but is not the whole field, and the other is restricted (``30 1 3 12 */2``).
    Raises :class:`InvalidDefinition` as :meth:`CronSchedule.parse` does. Memoised: every
    create asks it, and a team registers many jobs on few schedules."""
    fields = _compile(" ".join(_normalise(expression)), DayRule.CRONTAB)
    return fields.both_days and not (fields.dom_star or fields.dow_star)


def with_seconds(expression: str, seconds: str | None) -> str:
    """A 5-field expression (or an alias) and a seconds field, as the text this module reads:
    seconds last. No seconds (None): the expression as given.

    The API takes the seconds apart (its ``seconds`` field) because a sixth field is read two
    ways: Quartz puts seconds first (``*/10 * * * * *``: every ten seconds), croniter and this
    module last (the same text: every second of every tenth minute). Asking for the field by
    name leaves nothing to guess."""
    if seconds is None:
        return expression
    text = expression.strip()
    five = _ALIASES.get(text.lower(), " ".join(text.split()))
    return f"{five} {seconds.strip()}"


def split_seconds(expression: str) -> tuple[str, str | None]:
    """``with_seconds`` undone: the 5-field expression and the seconds field (None for a
    5-field expression or an alias)."""
    fields = expression.split()
    if len(fields) == 6:
        return " ".join(fields[:5]), fields[5]
    return expression, None


def clear_caches() -> None:
    """Forget every memoised parse and fire time (for benchmarks and tests)."""
    next_fire.cache_clear()
    suppressed_since_previous.cache_clear()
    _next_after.cache_clear()
    _parse.cache_clear()
    _compile.cache_clear()
    _suppressed_since_previous.cache_clear()
    _fall_backs.cache_clear()
