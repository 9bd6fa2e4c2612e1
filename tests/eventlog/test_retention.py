"""``eventlog.retention.prune_before``: which sealed segments retention may remove."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eventlog.retention import Segment, prune_before

DAY = 86_400_000
NOW = 100 * DAY


def _segments(sizes_and_ages: list[tuple[int, int]]) -> list[Segment]:
    out, first = [], 0
    for records, age_days in sizes_and_ages:
        out.append(
            Segment(
                first, first + records, records * 100, NOW - age_days * DAY, NOW - age_days * DAY
            )
        )
        first += records
    return out


def test_expired_segments_go_oldest_first_and_the_first_young_one_stops_it() -> None:
    segments = _segments([(10, 40), (10, 35), (10, 5), (10, 31), (10, 0)])
    cut = prune_before(
        segments, now_ms=NOW, keep_from=10**9, retention_ms=30 * DAY, retention_bytes=None
    )
    assert cut == 20  # the third is young; the fourth, though expired, stays behind it


def test_the_floor_stops_pruning_inside_what_recovery_needs() -> None:
    segments = _segments([(10, 40), (10, 40), (10, 40), (10, 0)])
    kw = {"now_ms": NOW, "retention_ms": 30 * DAY, "retention_bytes": None}
    assert prune_before(segments, keep_from=25, **kw) == 20  # [20, 30) holds offset 25
    assert prune_before(segments, keep_from=20, **kw) == 20
    assert prune_before(segments, keep_from=19, **kw) == 10
    assert prune_before(segments, keep_from=0, **kw) is None


def test_size_bound_removes_until_the_partition_fits() -> None:
    segments = _segments([(10, 1), (10, 1), (10, 1), (10, 0)])  # 1000 bytes each
    kw = {"now_ms": NOW, "keep_from": 10**9, "retention_ms": None}
    assert prune_before(segments, retention_bytes=2500, **kw) == 20
    assert prune_before(segments, retention_bytes=4000, **kw) is None


def test_the_active_segment_always_stays() -> None:
    segments = _segments([(10, 99)])
    assert (
        prune_before(segments, now_ms=NOW, keep_from=10**9, retention_ms=1, retention_bytes=1)
        is None
    )


@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(0, 60)), min_size=1, max_size=12),
    st.integers(0, 700),
    st.one_of(st.none(), st.integers(1, 60)),
    st.one_of(st.none(), st.integers(1, 60_000)),
)
def test_a_cut_is_a_sealed_boundary_never_past_the_floor(
    shape: list[tuple[int, int]], keep_from: int, days: int | None, size: int | None
) -> None:
    segments = _segments(shape)
    cut = prune_before(
        segments,
        now_ms=NOW,
        keep_from=keep_from,
        retention_ms=None if days is None else days * DAY,
        retention_bytes=size,
    )
    if cut is None:
        return
    assert cut <= keep_from
    assert cut in [s.first for s in segments[1:]]  # a boundary, and the active one is kept
    for gone in (s for s in segments if s.end <= cut):
        expired = days is not None and NOW - gone.last_ms >= days * DAY
        assert expired or size is not None
