"""Job definitions at the edges of time and shape: no slot past year 9999, payload depth."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import pytest

from core import events as ev
from core.clock import MAX_INSTANT
from core.cron import CronSchedule, DayRule
from core.errors import InvalidDefinition
from core.jobs import (
    CHECKED_KEPT,
    MAX_PAYLOAD_DEPTH,
    JobSpec,
    PullTarget,
    canonical,
    checked,
    first_slot,
    judged,
    next_slot,
    validate,
)

DAY = 86_400_000
LAST_DAY = MAX_INSTANT + 1 - DAY  # 9999-12-31T00:00:00Z


def spec(**given: Any) -> JobSpec:
    return JobSpec(name="x", tenant="t", target=PullTarget(pool="p"), **given)


def test_an_interval_job_has_no_slot_past_year_9999() -> None:
    daily = spec(interval_sec=86_400, start_at=LAST_DAY - DAY)
    assert next_slot(daily, LAST_DAY - DAY, LAST_DAY - DAY) == LAST_DAY
    assert next_slot(daily, LAST_DAY, LAST_DAY - DAY) is None


def test_a_cron_job_has_no_slot_past_year_9999() -> None:
    yearly = spec(schedule="0 0 1 1 *")
    assert first_slot(yearly, LAST_DAY) is None
    assert next_slot(yearly, LAST_DAY, 0) is None
    schedule = CronSchedule.parse("0 0 * * *", "UTC")
    assert schedule.preview(LAST_DAY - DAY, 5) == [LAST_DAY]
    assert schedule.fires_between(LAST_DAY - 1, MAX_INSTANT + DAY, 5) == [LAST_DAY]


def test_instants_past_year_9999_are_refused() -> None:
    with pytest.raises(InvalidDefinition) as e:
        validate(spec(run_at=MAX_INSTANT + 1))
    assert e.value.field == "run_at"
    with pytest.raises(InvalidDefinition) as e:
        validate(spec(interval_sec=60, start_at=MAX_INSTANT + 1))
    assert e.value.field == "start_at"
    validate(spec(run_at=MAX_INSTANT))


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_a_payload_nests_at_most_max_payload_depth_levels() -> None:
    validate(spec(schedule="@daily", payload=nested(MAX_PAYLOAD_DEPTH)))
    with pytest.raises(InvalidDefinition) as e:
        validate(spec(schedule="@daily", payload=nested(MAX_PAYLOAD_DEPTH + 1)))
    assert e.value.field == "payload"
    # Deeper than the interpreter's recursion limit: refused, not a RecursionError.
    with pytest.raises(InvalidDefinition):
        validate(spec(schedule="@daily", payload=nested(5_000)))


# A JobRegistered as the log held it before a job had a day_rule (the bytes are verbatim).
LOGGED_BEFORE_DAY_RULE = (
    b'{"type":"JobRegistered","at":0,"job_id":"j1","tenant":"t","spec":{"name":"x","tenant":"t",'
    b'"target":{"type":"pull","pool":"p"},"schedule":"30 1 3 12 */2","run_at":null,'
    b'"interval_sec":null,"start_at":null,"timezone":"UTC","payload":null,"max_attempts":4,'
    b'"backoff":{"base_sec":10.0,"factor":2.0,"cap_sec":3600.0,"jitter":true},'
    b'"timeout_sec":60.0,"lease_sec":30.0,"priority":5,"misfire_policy":"fire_once",'
    b'"misfire_grace_sec":60.0,"catch_up_limit":10,"overlap_policy":"allow",'
    b'"allow_jitter_sec":0.0,"critical":false,"depends_on":[],"end_at":null},'
    b'"version":1,"next_slot":0}'
)
NOV_30_2026 = 1_796_083_200_000  # 2026-11-30T00:00:00Z


def december_days(job: JobSpec) -> list[int]:
    days, slot = [], first_slot(job, NOV_30_2026)
    while slot is not None and slot < NOV_30_2026 + 32 * DAY:
        days.append(dt.datetime.fromtimestamp(slot / 1000, dt.UTC).day)
        slot = next_slot(job, slot, 0)
    return days


def test_a_job_logged_before_day_rule_replays_with_the_rule_it_had() -> None:
    event = ev.decode(LOGGED_BEFORE_DAY_RULE)
    assert isinstance(event, ev.JobRegistered)
    assert event.spec.day_rule is DayRule.EITHER
    # croniter's OR: the 3rd and every even weekday (Sun, Tue, Thu, Sat) of December 2026.
    even_weekdays = [d for d in range(1, 32) if dt.date(2026, 12, d).isoweekday() % 7 % 2 == 0]
    assert december_days(event.spec) == sorted({3, *even_weekdays})
    # The same schedule under crontab's rule (what the API registers now): only the 3rd.
    crontab = msgspec.structs.replace(event.spec, day_rule=DayRule.CRONTAB)
    assert december_days(crontab) == [3]
    again = ev.decode(ev.encode(msgspec.structs.replace(event, spec=crontab)))
    assert isinstance(again, ev.JobRegistered) and again.spec.day_rule is DayRule.CRONTAB


def test_a_spec_checked_here_is_judged_once_and_any_other_in_full() -> None:
    built = JobSpec(name="x", tenant="t", target=PullTarget(pool="p"), schedule="* * * * *",
                    tags=["a"])  # type: ignore[arg-type]  # fmt: skip
    sound = checked(built)
    assert sound == canonical(built) and sound.tags == ("a",)
    assert judged(sound) is sound  # checked in this process: taken as it is
    again = judged(sound)  # the mark is taken once; after it, judged in full
    assert again == sound and again is not sound
    # A spec this process did not check (decoded from the log, built elsewhere) is judged.
    with pytest.raises(InvalidDefinition) as refused:
        judged(spec(schedule="* * * * *", max_attempts=0))
    assert refused.value.field == "max_attempts"
    with pytest.raises(InvalidDefinition):
        checked(spec(schedule="* * * * *", priority=-1))


def test_the_checked_specs_are_bounded() -> None:
    sound = [checked(spec(schedule="* * * * *")) for _ in range(CHECKED_KEPT + 1)]
    assert judged(sound[-1]) is sound[-1]
    assert judged(sound[0]) == sound[0]  # dropped past the bound: judged again, same verdict
