"""One answer from several read models: pages merged in the listing's order, sums of counts.

History kept with its partition (docs/architecture.md, "History kept with its partition")
answers a team's listing from every partition's model: each gives a page of its own, in the
listing's order, and the pages are merged here. Every listing's order is its index's key order
(:mod:`projections.model_keys`): jobs by job id, runs by inverted slot and run id. A page's
cursor is the key it stopped at, the same bytes in every model, so a cursor names a position in
the listing's global order: any model continues from it, across pages, across models and
across partitions moving between nodes.

**Merging pages.** A model's page covers its listing up to a bound: the key of its last item
when it has more (``next_cursor``), else the end. A search page (which looks at a bounded
number of keys) may also stop before ``limit`` items with a cursor: its bound is that cursor.
The merged page holds every item at or before the lowest bound, in key order, cut at
``limit``; its cursor is the last item's key when it was cut, else the lowest bound when some
model had more, else none. So no item is skipped (every model has listed everything up to the
bound) and none repeats (the next page starts after the cursor in every model).

Worked example, limit 2: model A gives ``[k1, k3]`` with more (bound ``k3``), model B gives
``[k2]`` and no more. Merged in key order ``k1, k2, k3``; all are at or before ``k3``; cut at
2: ``[k1, k2]``, cursor ``k2``. The next page asks both after ``k2``: A gives ``[k3, ...]``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from projections.figures import Minute, merged
from projections.model_keys import decode_cursor, encode_cursor
from projections.views import Page

T = TypeVar("T")


def merge_pages(pages: Sequence[Page[T]], key: Callable[[T], bytes], limit: int) -> Page[T]:
    """The page of the listing the models' ``pages`` (each after the same cursor, in the
    listing's order by ``key``) make together; see the module's docstring."""
    bound: bytes | None = None  # the lowest bound of a page that has more; None: the end
    for page in pages:
        if page.next_cursor is not None:
            at = decode_cursor(page.next_cursor)
            bound = at if bound is None else min(bound, at)
    keyed = heapq.merge(*([(key(item), item) for item in page.items] for page in pages))
    items: list[T] = []
    last: bytes | None = None
    for item_key, item in keyed:
        if bound is not None and item_key > bound:
            break
        if len(items) == limit:
            return Page(items=items, next_cursor=encode_cursor(last or b""))
        items.append(item)
        last = item_key
    return Page(items=items, next_cursor=None if bound is None else encode_cursor(bound))


def merge_keyed(
    lists: Sequence[Sequence[tuple[str, int, str]]], limit: int
) -> list[tuple[str, int, str]]:
    """``ModelQueries.run_keys`` of several models (each after the same cursor, at most
    ``limit``), merged: the first ``limit`` in the listing's order. A model that gave fewer than
    ``limit`` has no more; one that gave ``limit`` may, but the merge is cut at ``limit``, and
    nothing of it after its last is taken before what another may still hold before it."""
    bound: bytes | None = None
    for listed in lists:
        if len(listed) >= limit:
            at = decode_cursor(listed[-1][0])
            bound = at if bound is None else min(bound, at)
    keyed = heapq.merge(
        *([(decode_cursor(entry[0]), entry) for entry in listed] for listed in lists)
    )
    out: list[tuple[str, int, str]] = []
    for item_key, entry in keyed:
        if (bound is not None and item_key > bound) or len(out) == limit:
            break
        out.append(entry)
    return out


def sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Runs by state of several models, added up (every state each gives, zeros included)."""
    total: dict[str, int] = {}
    for one in counts:
        for state, n in one.items():
            total[state] = total.get(state, 0) + n
    return total


def merge_minutes(lists: Iterable[Sequence[tuple[int, Minute]]]) -> list[tuple[int, Minute]]:
    """A team's figures by minute from several models, one :class:`Minute` a minute (merged
    where more than one model counted in it), oldest first."""
    by_minute: dict[int, list[Minute]] = {}
    for listed in lists:
        for at, minute in listed:
            by_minute.setdefault(at, []).append(minute)
    return [
        (at, found[0] if len(found) == 1 else merged(found))
        for at, found in sorted(by_minute.items())
    ]
