"""The stated DST rule, pinned with exact UTC instants.

Fixed-hour schedules: a skipped local slot fires once, at the transition; a repeated one
fires once, at its first occurrence. Real-time schedules (hour ``*`` or ``*/n``) fire at every
real instant whose wall reading matches. Transition instants come from zoneinfo (found by a
scan below), not from memory; the expected values are then spelled out as UTC text so a
reader can check them against the zone's rules.
"""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest

from core.cron import CronSchedule

SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR


def utc(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()) * SECOND


def transitions(zone: str, year: int) -> list[tuple[int, dt.timedelta, dt.timedelta]]:
    """(instant ms, offset before, offset after) for each offset change in ``year``."""
    tz = ZoneInfo(zone)

    def offset(s: int) -> dt.timedelta:
        value = dt.datetime.fromtimestamp(s, tz).utcoffset()
        assert value is not None
        return value

    start = int(dt.datetime(year, 1, 1, tzinfo=dt.UTC).timestamp())
    end = int(dt.datetime(year + 1, 1, 1, tzinfo=dt.UTC).timestamp())
    found = []
    for s in range(start, end, 3600):
        if offset(s) != offset(s + 3600):
            low, high = s, s + 3600
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if offset(mid) == offset(s) else (low, mid)
            found.append((high * SECOND, offset(low), offset(high)))
    return found


def spring(zone: str, year: int) -> int:
    (instant,) = [t for t, before, after in transitions(zone, year) if after > before]
    return instant


def fall(zone: str, year: int) -> int:
    (instant,) = [t for t, before, after in transitions(zone, year) if after < before]
    return instant


def fires(expression: str, zone: str, after: int, until: int) -> list[int]:
    return CronSchedule.parse(expression, zone).fires_between(after, until, 10_000)


NY = "America/New_York"


def test_the_transitions_we_rely_on() -> None:
    assert spring(NY, 2024) == utc("2024-03-10T07:00")  # 02:00 EST -> 03:00 EDT
    assert fall(NY, 2024) == utc("2024-11-03T06:00")  # 02:00 EDT -> 01:00 EST
    assert spring("Europe/London", 2024) == utc("2024-03-31T01:00")
    assert fall("Europe/London", 2024) == utc("2024-10-27T01:00")
    assert spring("Australia/Sydney", 2024) == utc("2024-10-05T16:00")  # 02:00 -> 03:00
    assert fall("Australia/Sydney", 2024) == utc("2024-04-06T16:00")  # 03:00 -> 02:00
    assert spring("America/Santiago", 2024) == utc("2024-09-08T04:00")  # 00:00 -> 01:00
    assert fall("America/Santiago", 2024) == utc("2024-04-07T03:00")  # 24:00 -> 23:00
    assert spring("America/Havana", 2024) == utc("2024-03-10T05:00")  # 00:00 -> 01:00
    assert fall("America/Havana", 2024) == utc("2024-11-03T05:00")  # 01:00 -> 00:00
    assert spring("Australia/Lord_Howe", 2024) == utc("2024-10-05T15:30")  # 02:00 -> 02:30
    assert fall("Australia/Lord_Howe", 2024) == utc("2024-04-06T15:00")  # 02:00 -> 01:30


# -- New York, fixed hour ------------------------------------------------------------------


def test_new_york_repeated_slot_fires_once_at_its_first_occurrence() -> None:
    got = fires("30 1 * * *", NY, utc("2024-11-02T00:00"), utc("2024-11-05T00:00"))
    assert got == [
        utc("2024-11-02T05:30"),  # 01:30 EDT
        utc("2024-11-03T05:30"),  # 01:30 EDT; 01:30 EST (06:30Z) does not fire
        utc("2024-11-04T06:30"),  # 01:30 EST
    ]


def test_new_york_skipped_slot_fires_once_at_the_transition() -> None:
    got = fires("30 2 * * *", NY, utc("2024-03-09T00:00"), utc("2024-03-12T00:00"))
    assert got == [
        utc("2024-03-09T07:30"),  # 02:30 EST
        spring(NY, 2024),  # 02:30 does not exist: 03:00 EDT
        utc("2024-03-11T06:30"),  # 02:30 EDT
    ]


def test_new_york_weekday_schedule_on_a_sunday_transition() -> None:
    # Transitions fall on Sundays, so "30 2 * * 1-5" is unaffected ...
    got = fires("30 2 * * 1-5", NY, utc("2024-03-08T00:00"), utc("2024-03-12T00:00"))
    assert got == [utc("2024-03-08T07:30"), utc("2024-03-11T06:30")]
    # ... and a Sunday one moves to the transition.
    got = fires("30 2 * * 0", NY, utc("2024-03-09T00:00"), utc("2024-03-12T00:00"))
    assert got == [spring(NY, 2024)]


def test_new_york_midnight_is_untouched() -> None:
    got = fires("0 0 * * *", NY, utc("2024-03-09T00:00"), utc("2024-03-12T00:00"))
    assert got == [utc("2024-03-09T05:00"), utc("2024-03-10T05:00"), utc("2024-03-11T04:00")]
    got = fires("0 0 * * *", NY, utc("2024-11-02T00:00"), utc("2024-11-05T00:00"))
    assert got == [utc("2024-11-02T04:00"), utc("2024-11-03T04:00"), utc("2024-11-04T05:00")]


def test_new_york_hour_range_is_fixed_hour() -> None:
    # Spring: 01:00 EST; 02:00 is skipped and 03:00 EDT is the transition itself: one fire.
    got = fires("0 1-3 * * *", NY, utc("2024-03-10T00:00"), utc("2024-03-10T23:00"))
    assert got == [utc("2024-03-10T06:00"), utc("2024-03-10T07:00")]
    # Fall: 01:00 EDT only, then 02:00 and 03:00 EST.
    got = fires("0 1-3 * * *", NY, utc("2024-11-03T00:00"), utc("2024-11-03T23:00"))
    assert got == [utc("2024-11-03T05:00"), utc("2024-11-03T07:00"), utc("2024-11-03T08:00")]


def test_new_york_skipped_slots_collapse_into_one_fire() -> None:
    got = fires("*/20 2 * * *", NY, utc("2024-03-10T00:00"), utc("2024-03-10T23:00"))
    assert got == [spring(NY, 2024)]
    got = fires("*/20 1 * * *", NY, utc("2024-11-03T00:00"), utc("2024-11-03T23:00"))
    assert got == [utc("2024-11-03T05:00"), utc("2024-11-03T05:20"), utc("2024-11-03T05:40")]


# -- New York, real time -------------------------------------------------------------------


def local_day(zone: str, day: str) -> tuple[int, int]:
    tz = ZoneInfo(zone)
    start = dt.datetime.fromisoformat(day).replace(tzinfo=tz)
    end = start.replace(tzinfo=None) + dt.timedelta(days=1)
    return int(start.timestamp()) * SECOND, int(end.replace(tzinfo=tz).timestamp()) * SECOND


@pytest.mark.parametrize(("day", "hours"), [("2024-03-10", 23), ("2024-11-03", 25)])
def test_new_york_hourly_neither_loses_nor_doubles_a_real_hour(day: str, hours: int) -> None:
    start, end = local_day(NY, day)
    got = fires("0 * * * *", NY, start - 1, end - 1)
    assert len(got) == hours
    assert got[0] == start and all(b - a == HOUR for a, b in itertools.pairwise(got))


def test_new_york_every_15_minutes_through_the_repeated_hour() -> None:
    start, end = local_day(NY, "2024-11-03")
    got = fires("*/15 * * * *", NY, start - 1, end - 1)
    assert len(got) == 25 * 4
    assert all(b - a == 15 * MINUTE for a, b in itertools.pairwise(got))
    assert utc("2024-11-03T05:45") in got and utc("2024-11-03T06:00") in got  # 01:45 EDT, 01:00 EST


def test_new_york_two_hourly_follows_the_wall_reading() -> None:
    # Spring: 00:00 EST, then 02:00 does not exist, then 04:00 EDT.
    got = fires("0 */2 * * *", NY, utc("2024-03-10T04:00"), utc("2024-03-10T09:00"))
    assert got == [utc("2024-03-10T05:00"), utc("2024-03-10T08:00")]
    # Fall: 00:00 EDT, 02:00 EST (three real hours later).
    got = fires("0 */2 * * *", NY, utc("2024-11-03T03:00"), utc("2024-11-03T08:00"))
    assert got == [utc("2024-11-03T04:00"), utc("2024-11-03T07:00")]


# -- other zones ---------------------------------------------------------------------------


def test_london() -> None:
    assert fires(
        "30 1 * * *", "Europe/London", utc("2024-03-30T12:00"), utc("2024-04-01T00:00")
    ) == [
        spring("Europe/London", 2024)  # 01:30 GMT is skipped: fires at 02:00 BST
    ]
    assert fires(
        "30 1 * * *", "Europe/London", utc("2024-10-26T12:00"), utc("2024-10-28T00:00")
    ) == [
        utc("2024-10-27T00:30"),  # 01:30 BST; not again at 01:30 GMT
    ]


def test_sydney_southern_hemisphere() -> None:
    zone = "Australia/Sydney"
    # October: 02:00 AEST -> 03:00 AEDT.
    assert fires("30 2 * * *", zone, utc("2024-10-05T00:00"), utc("2024-10-06T12:00")) == [
        spring(zone, 2024)
    ]
    # April: 03:00 AEDT -> 02:00 AEST; 02:30 AEDT (15:30Z) fires, 02:30 AEST (16:30Z) not.
    assert fires("30 2 * * *", zone, utc("2024-04-06T00:00"), utc("2024-04-07T12:00")) == [
        utc("2024-04-06T15:30")
    ]
    start, end = local_day(zone, "2024-04-07")
    assert len(fires("0 * * * *", zone, start - 1, end - 1)) == 25


def test_santiago_gap_at_midnight() -> None:
    zone = "America/Santiago"
    got = fires("0 0 * * *", zone, utc("2024-09-06T12:00"), utc("2024-09-09T12:00"))
    assert got == [
        utc("2024-09-07T04:00"),  # 00:00 -04
        spring(zone, 2024),  # 00:00 does not exist on 8 September: 01:00 -03
        utc("2024-09-09T03:00"),  # 00:00 -03
    ]
    # April: 24:00 -03 -> 23:00 -04 on 6 April; 23:30 fires once, at -03.
    got = fires("30 23 * * *", zone, utc("2024-04-06T12:00"), utc("2024-04-07T12:00"))
    assert got == [utc("2024-04-07T02:30")]
    # A day-of-week schedule keeps its local date: Sunday 00:00 fires on Sunday at 01:00.
    assert fires("0 0 * * sun", zone, utc("2024-09-07T00:00"), utc("2024-09-09T00:00")) == [
        spring(zone, 2024)
    ]


def test_havana_midnight_gap_and_overlap() -> None:
    zone = "America/Havana"
    assert fires("0 0 * * *", zone, utc("2024-03-09T12:00"), utc("2024-03-10T12:00")) == [
        spring(zone, 2024)  # 01:00 CDT
    ]
    # 3 November: 01:00 CDT -> 00:00 CST; 00:30 fires at CDT only.
    assert fires("30 0 * * *", zone, utc("2024-11-02T12:00"), utc("2024-11-03T12:00")) == [
        utc("2024-11-03T04:30")
    ]


def test_lord_howe_half_hour_shift() -> None:
    zone = "Australia/Lord_Howe"
    # 6 October 2024: 02:00 +10:30 -> 02:30 +11.
    t = spring(zone, 2024)
    after, until = utc("2024-10-05T12:00"), utc("2024-10-06T12:00")
    assert fires("0 2 * * *", zone, after, until) == [t]
    assert fires("15 2 * * *", zone, after, until) == [t]
    assert fires("45 2 * * *", zone, after, until) == [utc("2024-10-05T15:45")]  # 02:45 +11
    assert fires("0,15,30 2 * * *", zone, after, until) == [t]
    # 7 April 2024: 02:00 +11 -> 01:30 +10:30; 01:45 fires at +11 only.
    after, until = utc("2024-04-06T12:00"), utc("2024-04-07T12:00")
    assert fires("45 1 * * *", zone, after, until) == [utc("2024-04-06T14:45")]
    # Real time: the repeated half hour fires twice, the skipped one not at all.
    got = fires("*/30 * * * *", zone, utc("2024-04-06T13:59"), utc("2024-04-06T16:30"))
    assert got == [
        utc("2024-04-06T14:00"),  # 01:00 +11
        utc("2024-04-06T14:30"),  # 01:30 +11
        utc("2024-04-06T15:00"),  # 01:30 +10:30
        utc("2024-04-06T15:30"),  # 02:00 +10:30
        utc("2024-04-06T16:00"),
        utc("2024-04-06T16:30"),
    ]
    got = fires("0 * * * *", zone, utc("2024-10-05T14:00"), utc("2024-10-05T16:30"))
    assert got == [utc("2024-10-05T14:30"), utc("2024-10-05T16:00")]  # 01:00 +10:30, 03:00 +11


def test_samoa_skipped_a_whole_day() -> None:
    # Pacific/Apia went from 29 December 2011 23:59:59 -10 to 31 December 00:00 +14.
    zone = "Pacific/Apia"
    got = fires("0 12 * * *", zone, utc("2011-12-29T12:00"), utc("2011-12-31T12:00"))
    assert got == [
        utc("2011-12-29T22:00"),  # 29 Dec 12:00 -10
        utc("2011-12-30T10:00"),  # 30 Dec never happened: the transition, 31 Dec 00:00 +14
        utc("2011-12-30T22:00"),  # 31 Dec 12:00 +14
    ]


@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo", "Asia/Kolkata"])
def test_zones_without_dst_are_plain_arithmetic(zone: str) -> None:
    got = fires("0 0 * * *", zone, utc("2024-01-01T00:00"), utc("2025-01-01T00:00"))
    assert len(got) == 366 and all(b - a == DAY for a, b in itertools.pairwise(got))


@pytest.mark.parametrize(
    "zone", [NY, "Europe/London", "Australia/Sydney", "America/Santiago", "Australia/Lord_Howe"]
)
@pytest.mark.parametrize("expression", ["30 1 * * *", "30 2 * * *", "0 0 * * *", "0 1-3 * * *"])
def test_fixed_hour_never_fires_two_instants_for_one_local_slot(zone: str, expression: str) -> None:
    tz = ZoneInfo(zone)
    got = fires(expression, zone, utc("2024-01-01T00:00"), utc("2025-01-01T00:00"))
    readings = [dt.datetime.fromtimestamp(f / SECOND, tz).replace(tzinfo=None) for f in got]
    assert len(set(readings)) == len(readings)
    # ... and every local day that has the slot gets exactly one fire per slot.
    per_day = len(CronSchedule.parse(expression, "UTC").fires_between(0, DAY, 100))
    assert len(got) <= 366 * per_day
    assert len(got) >= 366 * per_day - 2  # at most the spring day loses collapsed slots


# -- suppressed repeats --------------------------------------------------------------------


def suppressed(expression: str, zone: str, after: int, until: int) -> list[int]:
    return CronSchedule.parse(expression, zone).suppressed_between(after, until)


def test_suppressed_new_york_second_occurrence() -> None:
    s = utc("2024-11-03T06:30")  # 01:30 EST; 01:30 EDT (05:30Z) fires
    year = utc("2024-01-01T00:00"), utc("2025-01-01T00:00")
    assert suppressed("30 1 * * *", NY, *year) == [s]
    # (after, until] in milliseconds
    assert suppressed("30 1 * * *", NY, s - 1, s) == [s]
    assert suppressed("30 1 * * *", NY, s, s + DAY) == []
    assert suppressed("30 1 * * *", NY, s - DAY, s - 1) == []
    # Across two years, and with the interval starting inside the repeated hour.
    assert suppressed("30 1 * * *", NY, utc("2024-06-01T00:00"), utc("2025-12-01T00:00")) == [
        s,
        utc("2025-11-02T06:30"),
    ]
    got = suppressed("*/20 1 * * *", NY, utc("2024-11-03T06:10"), utc("2024-11-04T00:00"))
    assert got == [utc("2024-11-03T06:20"), utc("2024-11-03T06:40")]
    # An hour range: only its hour 1 is repeated.
    assert suppressed("0 1-3 * * *", NY, *year) == [utc("2024-11-03T06:00")]


def test_suppressed_is_empty_for_real_time_schedules_and_spring_forward() -> None:
    year = utc("2024-01-01T00:00"), utc("2025-01-01T00:00")
    for expression in ("0 * * * *", "*/30 * * * *", "0 */2 * * *", "* * * * * *"):
        assert suppressed(expression, NY, *year) == []
    # A skipped slot fires at the transition: nothing is suppressed in March.
    assert suppressed("30 2 * * *", NY, utc("2024-03-01T00:00"), utc("2024-04-01T00:00")) == []
    # A fall-back day whose repeated hour holds no slot.
    assert suppressed("30 2 * * *", NY, utc("2024-11-01T00:00"), utc("2024-12-01T00:00")) == []


@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo", "Asia/Kolkata"])
def test_suppressed_is_empty_without_dst(zone: str) -> None:
    assert suppressed("30 1 * * *", zone, utc("2000-01-01T00:00"), utc("2030-01-01T00:00")) == []


def test_suppressed_lord_howe_half_hour() -> None:
    # 7 April 2024: 02:00 +11 -> 01:30 +10:30; 01:30-02:00 happens twice.
    after, until = utc("2024-04-06T00:00"), utc("2024-04-07T00:00")
    assert suppressed("45 1 * * *", "Australia/Lord_Howe", after, until) == [
        utc("2024-04-06T15:15")
    ]
    assert suppressed("0,15,30,45 1 * * *", "Australia/Lord_Howe", after, until) == [
        utc("2024-04-06T15:00"),  # 01:30 +10:30
        utc("2024-04-06T15:15"),  # 01:45 +10:30
    ]
    assert suppressed("15 1 * * *", "Australia/Lord_Howe", after, until) == []


@pytest.mark.parametrize(
    "zone", [NY, "Europe/London", "America/Santiago", "America/Havana", "Australia/Lord_Howe"]
)
@pytest.mark.parametrize(
    "expression", ["30 1 * * *", "*/20 0-2 * * *", "45 23 * * *", "0,30 * * * sun", "0 1 1 * *"]
)
def test_suppressed_is_what_a_wall_clock_scan_fires_and_we_do_not(
    zone: str, expression: str
) -> None:
    """Against a minute scan: every real minute whose wall reading matches, minus our fires."""
    tz = ZoneInfo(zone)
    as_utc = CronSchedule.parse(expression, "UTC")  # matches a naive reading read as UTC
    for year in (2024, 2025):
        after, until = fall(zone, year) - DAY, fall(zone, year) + DAY
        matching = []
        for minute in range(after + MINUTE, until + 1, MINUTE):
            reading = dt.datetime.fromtimestamp(minute / SECOND, tz).replace(tzinfo=None)
            at = int(reading.replace(tzinfo=dt.UTC).timestamp()) * SECOND
            if as_utc.next_after(at - 1) == at:
                matching.append(minute)
        ours = set(fires(expression, zone, after, until))
        expected = [m for m in matching if m not in ours]
        assert suppressed(expression, zone, after, until) == expected


def test_suppressed_since_previous_reports_each_instant_once() -> None:
    """Asked fire by fire, the answers partition suppressed_between: nothing lost or doubled."""
    for expression, zone in [
        ("*/20 1 * * *", NY),
        ("30 1 * * *", NY),
        ("45 1 * * *", "Australia/Lord_Howe"),
        ("0 1 * * sun", "Europe/London"),
        ("0 * * * *", NY),
    ]:
        schedule = CronSchedule.parse(expression, zone)
        start, end = utc("2024-01-01T00:00"), utc("2026-01-01T00:00")
        every = schedule.fires_between(start, end, 100_000)
        reported = []
        for fire in every[1:]:
            reported += schedule.suppressed_since_previous(fire, fire)
        assert reported == schedule.suppressed_between(every[0], every[-1])
        # Handling several fires in one step gives the same instants.
        batched = []
        for i in range(1, len(every), 7):
            chunk = every[i : i + 7]
            batched += schedule.suppressed_since_previous(chunk[0], chunk[-1])
        assert batched == reported


def test_no_zone_changes_offset_twice_within_a_day_since_1970() -> None:
    """The fall-back search samples the offset daily (``core.cron``); tzdata must allow it.

    Reads the transition table of the pure-Python zoneinfo implementation (a test-only use
    of a private attribute): the closest pair of offset changes since 1970 is about a week.
    """
    from zoneinfo import _zoneinfo, available_timezones

    for key in sorted(available_timezones()):
        zone = _zoneinfo.ZoneInfo.no_cache(key)  # type: ignore[attr-defined]
        offsets = [(t, info.utcoff) for t, info in zip(zone._trans_utc, zone._ttinfos, strict=True)]
        changes = [t for (t, o), (_, p) in zip(offsets[1:], offsets, strict=False) if o != p]
        changes = [t for t in changes if t >= 0]
        assert all(b - a > DAY // SECOND for a, b in itertools.pairwise(changes)), key
