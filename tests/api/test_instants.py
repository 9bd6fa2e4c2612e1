"""RFC 3339 at the edge, int milliseconds inside."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.instants import parse_rfc3339, to_rfc3339
from core.clock import MAX_INSTANT
from core.errors import InvalidDefinition


def test_examples() -> None:
    assert to_rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert parse_rfc3339("2026-11-29T09:00:00.000Z", "f") == parse_rfc3339(
        "2026-11-29T10:00:00+01:00", "f"
    )
    assert parse_rfc3339("2026-11-29T09:00:00.1239Z", "f") % 1000 == 123  # cut, not rounded
    assert parse_rfc3339("2026-11-29t09:00:00z", "f") == parse_rfc3339("2026-11-29T09:00:00Z", "f")


@pytest.mark.parametrize(
    "text",
    ["2026-11-29T09:00:00", "2026-11-29", "2026-13-01T00:00:00Z", "09:00Z", "2026-11-29T25:00:00Z"],
)
def test_refuses_what_is_not_an_instant(text: str) -> None:
    with pytest.raises(InvalidDefinition) as e:
        parse_rfc3339(text, "run_at")
    assert e.value.field == "run_at"


@pytest.mark.parametrize(
    "text",
    [
        "9999-12-31T23:59:59-23:59",  # year 10000 in UTC: could not be written back out
        "0001-01-01T00:00:00+23:59",  # year 0 in UTC
        "1969-12-31T23:59:59.999Z",
        "\uff12\uff10\uff12\uff16-11-29T09:00:00Z",  # fullwidth digits
    ],
)
def test_refuses_instants_outside_1970_to_9999(text: str) -> None:
    with pytest.raises(InvalidDefinition) as e:
        parse_rfc3339(text, "after")
    assert e.value.field == "after"


def test_the_last_instant_is_accepted() -> None:
    assert parse_rfc3339("9999-12-31T23:59:59.999Z", "f") == MAX_INSTANT


@given(st.integers(min_value=0, max_value=MAX_INSTANT))
def test_round_trip(ms: int) -> None:
    assert parse_rfc3339(to_rfc3339(ms), "f") == ms


def test_instants_read_as_the_calendar_reads_them() -> None:
    # The text is computed without a datetime per instant: it must still be the calendar's.
    import datetime as dt
    import random

    from core.clock import MAX_INSTANT

    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    picks = random.Random(8)
    edges = [0, 1, 999, 86_399_999, 86_400_000, 951_782_400_000, MAX_INSTANT]  # 2000-02-29
    for ms in edges + [picks.randrange(MAX_INSTANT + 1) for _ in range(20_000)]:
        at = epoch + dt.timedelta(milliseconds=ms)
        expected = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
        assert to_rfc3339(ms) == expected
