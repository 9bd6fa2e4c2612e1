"""Job definitions at the edges of time and shape: no slot past year 9999, payload depth."""

from __future__ import annotations

from typing import Any

import pytest

from core.clock import MAX_INSTANT
from core.cron import CronSchedule
from core.errors import InvalidDefinition
from core.jobs import MAX_PAYLOAD_DEPTH, JobSpec, PullTarget, first_slot, next_slot, validate

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
