"""Pages of several models merged into one listing: every item once, in order, any page size."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from projections.figures import Minute
from projections.merging import merge_keyed, merge_minutes, merge_pages, sum_counts
from projections.model_keys import decode_cursor, encode_cursor
from projections.views import Page


def _page(keys: list[bytes], cursor: str | None, limit: int, scan: int | None) -> Page[bytes]:
    """What one model answers: its keys after ``cursor``, up to ``limit``; with ``scan``, a
    search page that looks at no more than ``scan`` keys (and says where it stopped)."""
    after = None if cursor is None else decode_cursor(cursor)
    rest = [k for k in keys if after is None or k > after]
    if scan is not None:
        looked = rest[:scan]
        items = [k for k in looked if k[-1] % 2 == 0][:limit]  # the search wants even ones
        if len(rest) > len(looked) or (len(items) == limit and items[-1] != rest[-1]):
            stop = items[-1] if len(items) == limit else looked[-1]
            return Page(items=items, next_cursor=encode_cursor(stop))
        return Page(items=items)
    items = rest[:limit]
    more = len(rest) > limit
    return Page(items=items, next_cursor=encode_cursor(items[-1]) if more else None)


keys = st.lists(st.binary(min_size=1, max_size=4), unique=True, max_size=40)
# a key is one model's (a job, a run, lives in one partition): keys dealt out to the models
dealt = st.tuples(keys, st.integers(min_value=1, max_value=5)).map(
    lambda t: [sorted(k for i, k in enumerate(t[0]) if i % t[1] == m) for m in range(t[1])]
)


@settings(max_examples=300, deadline=None)
@given(
    dealt,
    st.integers(min_value=1, max_value=7),
    st.one_of(st.none(), st.integers(min_value=1, max_value=5)),
)
def test_paging_through_merged_pages_lists_every_item_once_in_order(
    split: list[list[bytes]], limit: int, scan: int | None
) -> None:
    models = split
    wanted = sorted({k for model in models for k in model if scan is None or k[-1] % 2 == 0})
    listed: list[bytes] = []
    cursor: str | None = None
    for _ in range(1000):
        pages = [_page(model, cursor, limit, scan) for model in models]
        merged = merge_pages(pages, lambda k: k, limit)
        assert len(merged.items) <= limit
        listed += merged.items
        if merged.next_cursor is None:
            break
        assert merged.next_cursor != cursor  # every page moves on
        cursor = merged.next_cursor
    assert listed == wanted


def test_a_page_cut_at_the_limit_goes_on_after_its_last_item() -> None:
    a = Page(items=[b"k1", b"k3"], next_cursor=encode_cursor(b"k3"))
    b: Page[bytes] = Page(items=[b"k2"])
    merged = merge_pages([a, b], lambda k: k, 2)
    assert merged.items == [b"k1", b"k2"]
    assert merged.next_cursor is not None and decode_cursor(merged.next_cursor) == b"k2"


@settings(max_examples=200, deadline=None)
@given(dealt, st.integers(min_value=1, max_value=6))
def test_run_keys_merged_list_every_key_once_in_order(split: list[list[bytes]], limit: int) -> None:
    models = split
    wanted = sorted({k for model in models for k in model})
    listed: list[bytes] = []
    cursor: str | None = None
    for _ in range(1000):
        after = None if cursor is None else decode_cursor(cursor)
        answers = [
            [(encode_cursor(k), 0, k.hex()) for k in model if after is None or k > after][:limit]
            for model in models
        ]
        merged = merge_keyed(answers, limit)
        if not merged:
            break
        listed += [decode_cursor(c) for c, _, _ in merged]
        cursor = merged[-1][0]
    assert listed == wanted


def test_sums_add_up_every_model() -> None:
    assert sum_counts([{"dead": 1, "pending": 0}, {"dead": 2, "pending": 3}]) == {
        "dead": 3,
        "pending": 3,
    }
    one, two = Minute(started=2, succeeded=1), Minute(started=3, failed=1)
    merged = merge_minutes([[(60_000, one)], [(0, two), (60_000, two)]])
    assert [at for at, _ in merged] == [0, 60_000]
    assert merged[0][1] == two
    assert (merged[1][1].started, merged[1][1].succeeded, merged[1][1].failed) == (5, 1, 1)
