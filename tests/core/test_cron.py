"""Cron schedules: validation, and the search checked against a brute-force minute scan.

The oracle here knows nothing of croniter or of ``core.cron``'s search: the strategies below
build an expression from sets of allowed values and keep the sets, and the scan walks the
clock minute by minute asking "does this wall reading match the sets?".
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from core.cron import CronSchedule, DayRule, day_rule_matters, next_fire
from core.errors import InvalidDefinition

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
T2024 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ms(text: str, zone: str = "UTC") -> int:
    """Milliseconds for an ISO local reading in ``zone`` (unambiguous readings only)."""
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()) * 1000


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "   ",
        "* * * *",  # 4 fields
        "* * * * * * *",  # 7 fields: croniter's year form, not ours
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * 32 * *",
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",
        "* * * * * 60",
        "0 0 30 2 *",  # never fires
        "0 0 31 4,6,9,11 *",  # never fires
        "@reboot",
        "@every_minute",
        "H * * * *",
        "R * * * *",
        "0 0 15W * *",
        "banana * * * *",
        "0 0 * * mon#6",
        "0 0 * * \u00a0*",
    ],
)
def test_bad_expressions_name_the_schedule_field(expression: str) -> None:
    with pytest.raises(InvalidDefinition) as raised:
        CronSchedule.parse(expression)
    assert raised.value.field == "schedule"


@pytest.mark.parametrize(
    "zone", ["", "Mars/Olympus_Mons", "localtime", "Factory", "../../etc/passwd", "/etc/localtime"]
)
def test_bad_timezones_name_the_timezone_field(zone: str) -> None:
    with pytest.raises(InvalidDefinition) as raised:
        CronSchedule.parse("0 0 * * *", zone)
    assert raised.value.field == "timezone"


def test_leap_day_is_valid_and_waits_for_a_leap_year() -> None:
    schedule = CronSchedule.parse("0 0 29 2 *")
    assert schedule.next_after(ms("2097-03-01T00:00")) == ms("2104-02-29T00:00")


@pytest.mark.parametrize(
    ("alias", "text"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_aliases_normalise_to_five_fields(alias: str, text: str) -> None:
    assert CronSchedule.parse(alias).expression == text


def test_an_equal_range_is_its_one_value() -> None:
    assert CronSchedule.parse("5-5 2-2/3 * jan-jan *").expression == "5 2 * jan *"
    schedule = CronSchedule.parse("5-5 * * * *")
    assert schedule.next_after(T2024) == T2024 + 5 * MINUTE
    assert schedule.next_after(T2024 + 5 * MINUTE) == T2024 + HOUR + 5 * MINUTE


def test_schedules_are_immutable_hashable_and_compare_by_normalised_text() -> None:
    a = CronSchedule.parse("  0   0 * * MON ", "Europe/London")
    b = CronSchedule.parse("0 0 * * mon", "Europe/London")
    assert a == b and hash(a) == hash(b) and a.expression == "0 0 * * mon"
    assert a != CronSchedule.parse("0 0 * * mon", "UTC")
    with pytest.raises(AttributeError):
        a.expression = "x"  # type: ignore[misc]


def test_six_fields_put_seconds_last() -> None:
    schedule = CronSchedule.parse("0 12 * * * 30")
    assert schedule.preview(ms("2024-01-01T00:00"), 2) == [
        ms("2024-01-01T12:00:30"),
        ms("2024-01-02T12:00:30"),
    ]
    every_15s = CronSchedule.parse("* * * * * */15")
    assert every_15s.preview(T2024, 5) == [T2024 + k * 15_000 for k in range(1, 6)]


def test_day_of_month_and_day_of_week_are_or_ed_when_both_restricted() -> None:
    schedule = CronSchedule.parse("0 0 13 * fri")
    fires = schedule.fires_between(ms("2024-09-01T00:00"), ms("2024-10-01T00:00"), 100)
    days = [dt.datetime.fromtimestamp(f / 1000, dt.UTC).day for f in fires]
    assert days == [6, 13, 20, 27]  # 13 September 2024 is a Friday too


def december_days(schedule: CronSchedule) -> list[int]:
    fires = schedule.fires_between(ms("2026-11-30T00:00"), ms("2026-12-31T23:59"), 100)
    return [dt.datetime.fromtimestamp(f / 1000, dt.UTC).day for f in fires]


def test_crontab_rule_ands_the_day_fields_when_one_starts_with_a_star() -> None:
    # 3 December 2026 is a Thursday (4): an even weekday, so crontab fires on it, and only it.
    crontab = CronSchedule.parse("30 1 3 12 */2", "UTC", DayRule.CRONTAB)
    assert december_days(crontab) == [3]
    # croniter's reading ORs them: the 3rd and every Sunday, Tuesday, Thursday and Saturday.
    either = CronSchedule.parse("30 1 3 12 */2", "UTC", DayRule.EITHER)
    assert december_days(either) == sorted(
        {3} | {d for d in range(1, 32) if dt.date(2026, 12, d).isoweekday() % 7 in (0, 2, 4, 6)}
    )
    assert crontab != either
    # A day-of-month starting with "*" ANDs too: odd days that are Mondays.
    odd_mondays = CronSchedule.parse("0 0 */2 12 1", "UTC", DayRule.CRONTAB)
    assert december_days(odd_mondays) == [7, 21]


def test_the_rules_agree_unless_a_stepped_star_meets_a_restricted_field() -> None:
    same = ("0 0 13 * fri", "0 0 * * */2", "0 0 */2 * *", "0 0 1 * *", "0 0 * * 1#2", "0 0 ? * 1-5")
    for text in same:
        assert not day_rule_matters(text)
        crontab = CronSchedule.parse(text, "UTC", DayRule.CRONTAB)
        either = CronSchedule.parse(text, "UTC", DayRule.EITHER)
        assert crontab.preview(T2024, 20) == either.preview(T2024, 20)
    for text in ("30 1 3 12 */2", "0 0 */2 * 1", "0 0 L * */3"):
        assert day_rule_matters(text)


def test_last_day_and_nth_weekday() -> None:
    last = CronSchedule.parse("0 0 L * *")
    assert last.preview(ms("2024-01-31T00:00"), 2) == [
        ms("2024-02-29T00:00"),
        ms("2024-03-31T00:00"),
    ]
    second_monday = CronSchedule.parse("0 9 * * mon#2")
    assert second_monday.next_after(ms("2024-01-01T00:00")) == ms("2024-01-08T09:00")
    last_friday = CronSchedule.parse("0 9 * * L5")
    assert last_friday.next_after(ms("2024-05-01T00:00")) == ms("2024-05-31T09:00")


def test_instants_between_whole_seconds() -> None:
    schedule = CronSchedule.parse("* * * * *")
    assert schedule.next_after(T2024 - 1) == T2024
    assert schedule.next_after(T2024) == T2024 + MINUTE
    assert schedule.next_after(T2024 + 999) == T2024 + MINUTE
    assert schedule.last_at_or_before(T2024, 1) == [T2024]
    assert schedule.last_at_or_before(T2024 - 1, 1) == [T2024 - MINUTE]


def test_next_fire_memoises_the_midnight_herd() -> None:
    after = ms("2031-05-05T00:00")
    before = next_fire.cache_info()
    results = {next_fire("0 0 * * *", "Asia/Tokyo", after, DayRule.CRONTAB) for _ in range(10_000)}
    info = next_fire.cache_info()
    assert results == {ms("2031-05-06T00:00", "Asia/Tokyo")}
    assert info.misses - before.misses == 1
    assert info.hits - before.hits == 9_999


def test_next_fire_rejects_like_parse() -> None:
    with pytest.raises(InvalidDefinition):
        next_fire("0 0 * *", "UTC", 0, DayRule.CRONTAB)


# -- the brute-force oracle ---------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """An expression together with the value sets it is meant to denote."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int] | None  # None: the field is "*"
    months: frozenset[int]
    dows: frozenset[int] | None
    # Under DayRule.CRONTAB: whether a day field starts with "*", which makes the two ANDed.
    star_led: bool = False
    day_rule: DayRule = DayRule.EITHER

    def matches(self, wall: dt.datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        if wall.month not in self.months:
            return False
        dom_ok = self.doms is None or wall.day in self.doms
        dow_ok = self.dows is None or wall.isoweekday() % 7 in self.dows
        if self.day_rule is DayRule.CRONTAB and self.star_led:
            return dom_ok and dow_ok
        if self.doms is not None and self.dows is not None:
            return (wall.day in self.doms) or (wall.isoweekday() % 7 in self.dows)
        return dom_ok and dow_ok


@st.composite
def field(draw: st.DrawFn, low: int, high: int, allow_star: bool = True) -> tuple[str, set[int]]:
    everything = set(range(low, high + 1))
    kind = draw(st.sampled_from(["star", "step", "list", "range", "range_step"]))
    if kind == "star" and allow_star:
        return "*", everything
    if kind == "step":
        step = draw(st.integers(1, max(1, (high - low) // 2)))
        return f"*/{step}", set(range(low, high + 1, step))
    if kind in ("range", "range_step"):
        a = draw(st.integers(low, high))
        b = draw(st.integers(a, high))
        if kind == "range":
            return f"{a}-{b}", set(range(a, b + 1))
        step = draw(st.integers(1, max(1, high - low)))
        return f"{a}-{b}/{step}", set(range(a, b + 1, step))
    values = draw(st.sets(st.integers(low, high), min_size=1, max_size=4))
    return ",".join(str(v) for v in sorted(values)), values


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    minute, minutes = draw(field(0, 59))
    hour, hours = draw(field(0, 23))
    # Keep the day fields loose so most expressions fire within the scan horizon.
    dom, doms = draw(st.one_of(st.just(("*", set(range(1, 32)))), field(1, 31)))
    month, months = draw(st.one_of(st.just(("*", set(range(1, 13)))), field(1, 12)))
    dow, dows = draw(st.one_of(st.just(("*", set(range(7)))), field(0, 6)))
    # croniter rewrites a full day field to "*" when the other one is "*"; mirror its rule.
    dom_star = dom == "*" or (len(doms) == 31 and dow.startswith("*"))
    dow_star = dow == "*" or (len(dows) == 7 and dom.startswith("*"))
    # A day of month that no chosen month has (30 February) never fires: parse refuses it,
    # as tested above; here only expressions that fire.
    longest = max(29 if m == 2 else 30 if m in (4, 6, 9, 11) else 31 for m in months)
    assume(not dow_star or dom_star or min(doms) <= longest)
    return Spec(
        text=f"{minute} {hour} {dom} {month} {dow}",
        minutes=frozenset(minutes),
        hours=frozenset(hours),
        doms=None if dom_star else frozenset(doms),
        months=frozenset(months),
        dows=None if dow_star else frozenset(dows),
        star_led=dom.startswith("*") or dow.startswith("*"),
    )


@st.composite
def crontab_specs(draw: st.DrawFn) -> Spec:
    """Expressions whose day fields the two rules may read differently, with crontab's sets."""
    spec = draw(specs())
    return Spec(
        text=spec.text,
        minutes=spec.minutes,
        hours=spec.hours,
        doms=spec.doms,
        months=spec.months,
        dows=spec.dows,
        star_led=spec.star_led,
        day_rule=DayRule.CRONTAB,
    )


def brute_next(spec: Spec, zone: ZoneInfo, after_ms: int, horizon_minutes: int) -> int | None:
    """First fire after ``after_ms`` by a minute-by-minute scan of real time.

    Real-time schedules fire wherever the wall reading matches; fixed-hour ones fire at the
    first minute whose reading reaches a matching slot that no earlier minute reached.
    """
    real_time = spec.text.split()[1].startswith("*")
    minute = after_ms // MINUTE
    high_water = dt.datetime.fromtimestamp((minute - 240) * 60, zone).replace(tzinfo=None)
    for m in range(minute - 239, minute + horizon_minutes + 1):
        wall = dt.datetime.fromtimestamp(m * 60, zone).replace(tzinfo=None)
        if real_time:
            hit = spec.matches(wall)
        else:
            hit = False
            reading = high_water + dt.timedelta(minutes=1)
            while reading <= wall and not hit:
                hit = spec.matches(reading)
                reading += dt.timedelta(minutes=1)
            high_water = max(high_water, wall)
        if hit and m * MINUTE > after_ms:
            return m * MINUTE
    return None


HORIZON = 3 * 24 * 60
starts = st.integers(T2024, T2024 + 3 * 365 * DAY)


@FAST
@given(spec=specs(), after=starts, zone=st.sampled_from(["UTC", "Asia/Kolkata"]))
def test_next_after_equals_a_minute_scan_without_dst(spec: Spec, after: int, zone: str) -> None:
    schedule = CronSchedule.parse(spec.text, zone)
    expected = brute_next(spec, ZoneInfo(zone), after, HORIZON)
    got = schedule.next_after(after)
    if expected is None:
        assert got > (after // MINUTE + HORIZON) * MINUTE
    else:
        assert got == expected


@FAST
@given(spec=crontab_specs(), after=starts, zone=st.sampled_from(["UTC", "Asia/Kolkata"]))
def test_crontab_rule_equals_a_minute_scan(spec: Spec, after: int, zone: str) -> None:
    try:
        schedule = CronSchedule.parse(spec.text, zone, DayRule.CRONTAB)
    except InvalidDefinition:
        # ANDed day fields can name no real day (the 31st that is a Monday in February only
        # is fine, "0 0 30 2 */2" is not): parse refuses those, as for any rule.
        assume(False)
        raise
    expected = brute_next(spec, ZoneInfo(zone), after, HORIZON)
    got = schedule.next_after(after)
    if expected is None:
        assert got > (after // MINUTE + HORIZON) * MINUTE
    else:
        assert got == expected


def dst_starts(zone: str) -> st.SearchStrategy[int]:
    """Instants within a day of one of the zone's 2024-2026 offset changes."""
    return st.tuples(st.sampled_from(TRANSITIONS[zone]), st.integers(-DAY, DAY)).map(sum)


def offset_changes(zone: str, years: range) -> list[int]:
    tz = ZoneInfo(zone)
    start = int(dt.datetime(years.start, 1, 1, tzinfo=dt.UTC).timestamp())
    end = int(dt.datetime(years.stop, 1, 1, tzinfo=dt.UTC).timestamp())
    changes = []
    previous = dt.datetime.fromtimestamp(start, tz).utcoffset()
    for s in range(start + 3600, end, 3600):
        offset = dt.datetime.fromtimestamp(s, tz).utcoffset()
        if offset != previous:
            changes.append(s * 1000)
            previous = offset
    return changes


DST_ZONES = ["America/New_York", "Australia/Lord_Howe", "America/Santiago", "Europe/London"]
TRANSITIONS = {zone: offset_changes(zone, range(2024, 2027)) for zone in DST_ZONES}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), spec=specs(), zone=st.sampled_from(DST_ZONES))
def test_next_after_equals_a_minute_scan_across_dst(
    data: st.DataObject, spec: Spec, zone: str
) -> None:
    after = data.draw(dst_starts(zone))
    schedule = CronSchedule.parse(spec.text, zone)
    expected = brute_next(spec, ZoneInfo(zone), after, 2 * 24 * 60)
    got = schedule.next_after(after)
    if expected is None:
        assert got > (after // MINUTE + 2 * 24 * 60) * MINUTE
    else:
        assert got == expected


@settings(max_examples=60, deadline=None)
@given(spec=specs(), after=starts)
def test_agrees_with_croniter_in_utc(spec: Spec, after: int) -> None:
    schedule = CronSchedule.parse(spec.text)
    start = dt.datetime.fromtimestamp(after / 1000, dt.UTC)
    # The normalised text: croniter would read an equal range such as "5-5" as "*".
    expected = int(croniter(schedule.expression, start).get_next(float) * 1000)
    assert schedule.next_after(after) == expected


@settings(max_examples=40, deadline=None)
@given(spec=specs(), second=field(0, 59), after=starts)
def test_six_field_form_agrees_with_croniter_in_utc(
    spec: Spec, second: tuple[str, set[int]], after: int
) -> None:
    schedule = CronSchedule.parse(f"{spec.text} {second[0]}")
    start = dt.datetime.fromtimestamp(after / 1000, dt.UTC)
    expected = int(croniter(schedule.expression, start).get_next(float) * 1000)
    assert schedule.next_after(after) == expected


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    spec=specs(),
    zone=st.sampled_from(["UTC", "Asia/Kolkata", *DST_ZONES]),
    window=st.integers(0, 5 * DAY),
    limit=st.integers(0, 40),
)
def test_range_queries_agree_with_iterating_next_after(
    data: st.DataObject, spec: Spec, zone: str, window: int, limit: int
) -> None:
    after = data.draw(dst_starts(zone)) if zone in TRANSITIONS else data.draw(starts)
    schedule = CronSchedule.parse(spec.text, zone)
    until = after + window
    walk: list[int] = []
    at = after
    while len(walk) <= limit:
        at = schedule.next_after(at)
        walk.append(at)
    assert all(a < b for a, b in itertools.pairwise(walk))
    assert schedule.preview(after, limit) == walk[:limit]
    in_range = [f for f in walk if f <= until]
    assert schedule.fires_between(after, until, limit) == in_range[:limit]
    count = schedule.count_between(after, until, limit)
    assert count == (None if len(in_range) > limit else len(in_range))
    if limit:
        last = walk[limit - 1]
        for at_ms in (last, last + 1, walk[limit] - 1):
            assert schedule.last_at_or_before(at_ms, limit) == walk[:limit]


@pytest.mark.parametrize(
    "expression", ["0 0 * * *", "*/7 * * * *", "0 0 29 2 *", "0 12 * * * */20"]
)
def test_last_at_or_before_reaches_back_over_long_gaps(expression: str) -> None:
    schedule = CronSchedule.parse(expression, "Europe/Paris")
    forward = schedule.preview(ms("2000-01-01T00:00"), 5)
    assert schedule.last_at_or_before(forward[-1], 5) == forward
    assert schedule.last_at_or_before(forward[-1] - 1, 4) == forward[:4]
