"""Run history past the hot window: the read model first, then the archive, saying which answered.

The read model keeps the runs of the hot window (``--history-window``, ``node.hot_window``); a
finished run older than that has left it. :class:`History` answers for such runs from the
events themselves, read through :class:`archive.reading.ArchivedLog` (archive + hot log, one
reader), and folded by :mod:`projections.run_fold`, the code the read model folds with: a run
read back from the archive is the run the read model held. Every answer says where it came
from (``source``: ``"hot"`` or ``"archive"``).

**Where a run's events are.** A run id carries its slot (``<tenant>/<job>.<slot_ms>``) and a
job's partition is a hash of its id, so the events to read are one partition's from about the
slot on. A run is materialised at its slot (a timer; up to the lead time before it), or later
when its node was down or it
was backfilled; so the reader starts at the first offset whose event is at most
:data:`BEFORE_MS` before the slot (found from the archive manifest's time ranges, then by
bisecting the hot log) and reads on until the run asked for has ended for good, or, for a
range of slots, until it is :data:`FIND_SPAN_MS` past the range and every run it found has
ended for good or is still in the read model (which then answers for it). A run first
materialised more than ``FIND_SPAN_MS`` after its slot (a backfill of old slots) is not found
there once it has left the window: a limit of this answer, said in docs/architecture.md. One
answer reads at most :data:`MAX_SCAN` records; past that it is ``Unavailable`` naming the job,
never a silent partial answer.

**A job's runs, across the boundary.** A page is keyed as the read model's is (the cursor is
the inverted slot and the run id), so one cursor goes on in either place: the page merges the
read model's runs after the cursor with the archive's runs of slots before the window (and
before the cursor), the read model's copy winning where a run is in both (not forgotten yet),
newest slot first, no run twice, none skipped. The archive part looks back a day from the
window (or the cursor), doubling the span until it has a page or reaches the job's creation.

With no archive (``--no-archive``), what left the window is gone: a run past it is not found
and the answer says so, and a page says from which instant on it has nothing older
(``gone_before``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from archive.archive import Archive
from archive.files import at_of
from core.clock import Clock
from core.decide import job_id_of_run
from core.errors import InvalidDefinition, Unavailable
from core.events import RunEvent
from eventlog.port import Record, partition_for
from projections.decoding import EventDecoder
from projections.read_model import (
    FORGETTABLE,
    MAX_LIMIT,
    ReadModel,
    decode_cursor,
    run_key,
)
from projections.read_model import encode_cursor as _encode
from projections.run_fold import fold
from projections.views import RunView

Source = Literal["hot", "archive"]

BEFORE_MS = 3_600_000  # a manual run may name a slot a little ahead of its trigger
FIND_SPAN_MS = 3_600_000  # how long after its slot a run may first be materialised and be found
FIRST_SPAN_MS = 86_400_000  # the span of slots a page first looks back over in the archive
MAX_SCAN = 20_000_000  # records one answer reads at most
READ_BATCH = 2000


@dataclass(frozen=True, slots=True)
class SourcedRun:
    view: RunView
    source: Source


@dataclass(slots=True)
class HistoryPage:
    items: list[SourcedRun]
    next_cursor: str | None = None
    gone_before: int | None = None  # no archive: runs of slots before this are not kept

    @property
    def source(self) -> Source:
        return "archive" if any(i.source == "archive" for i in self.items) else "hot"


@dataclass(slots=True)
class _Scan:
    records: int = 0
    runs: dict[str, RunView] = field(default_factory=dict)


class EventReader(Protocol):
    """What :class:`ArchivedRuns` reads: the events part of the log port."""

    @property
    def num_partitions(self) -> int: ...

    def read_events(self, partition: int, from_offset: int, max_records: int) -> list[Record]: ...

    def start_offset(self, stream: str, partition: int) -> int: ...

    def end_offset(self, stream: str, partition: int) -> int: ...


class ArchivedRuns:
    """A job's runs folded from its partition's events, read through ``log_`` (an
    ``ArchivedLog``); ``archive`` (its manifest's time ranges) finds where to start."""

    def __init__(self, log_: EventReader, archive: Archive | None, decoder: EventDecoder) -> None:
        self.log = log_
        self.archive = archive
        self.decoder = decoder

    def run(self, run_id: str, slot: int) -> RunView | None:
        job_id = job_id_of_run(run_id)
        scan = self._fold(job_id, slot, slot + 1, wanted=run_id)
        return scan.runs.get(run_id)

    def older(
        self, job_id: str, before: int, count: int, floor: int, held: Callable[[str], bool]
    ) -> list[RunView]:
        """The job's runs of slots in ``[floor, before)``, newest first, looking back until
        ``count`` of them are not ``held`` (in the read model) or ``floor`` is reached."""
        found: dict[str, RunView] = {}
        hi, span = before, FIRST_SPAN_MS
        for _ in range(64):  # the span doubles: 64 rounds reach any instant
            if hi <= floor:
                break
            lo = max(floor, hi - span)
            found.update(self._fold(job_id, lo, hi, held=held).runs)
            if sum(1 for run_id in found if not held(run_id)) >= count:
                break
            hi, span = lo, span * 2
        return sorted(found.values(), key=lambda r: r.scheduled_for, reverse=True)

    def _fold(
        self,
        job_id: str,
        lo: int,
        hi: int,
        wanted: str | None = None,
        held: Callable[[str], bool] | None = None,
    ) -> _Scan:
        """The job's runs of slots in ``[lo, hi)``, every event of theirs folded in: read until
        ``FIND_SPAN_MS`` past ``hi`` and every run found is done (:func:`_done`), or with
        ``wanted``, until that run is done (or, not found by then, ``FIND_SPAN_MS`` past)."""
        partition = partition_for(job_id, self.log.num_partitions)
        offset = self.offset_at(partition, lo - BEFORE_MS)
        until = hi + FIND_SPAN_MS
        scan = _Scan()
        known: dict[str, bool] = {}  # held, asked once a run

        def held_now(run_id: str) -> bool:
            if run_id not in known:
                known[run_id] = held is not None and held(run_id)
            return known[run_id]

        while scan.records < MAX_SCAN:
            records = self.log.read_events(partition, offset, READ_BATCH)
            if not records:
                return scan
            scan.records += len(records)
            for record in records:
                offset = record.offset + 1
                event = self.decoder.decode(record)
                if event is None:
                    continue
                if event.at >= until and (
                    wanted not in scan.runs
                    if wanted is not None
                    else all(_done(r) or held_now(r.run_id) for r in scan.runs.values())
                ):
                    return scan
                if event.job_id != job_id or not isinstance(event, RunEvent):
                    continue
                if lo <= event.scheduled_for < hi:
                    fold(scan.runs, event)
                    if wanted is not None and wanted in scan.runs and _done(scan.runs[wanted]):
                        return scan
        raise Unavailable(
            f"the history of job {job_id} around {lo} needs more than {MAX_SCAN} events read"
            " from the archive; ask for a narrower range"
        )

    def offset_at(self, partition: int, at_ms: int) -> int:
        """An offset at or before the partition's first event at ``at_ms`` or later: the start
        of the first archived file that reaches ``at_ms``, else found by bisecting the log."""
        low = self.log.start_offset("events", partition)
        if self.archive is not None:
            files = self.archive.files(partition, refresh=True)
            for entry in files:
                if entry.gap or entry.last_at_ms is None:
                    continue
                if entry.last_at_ms >= at_ms:
                    return entry.from_offset
            if files:
                low = max(low, files[-1].end_offset)
        high = self.log.end_offset("events", partition)
        for _ in range(128):  # halves the range each turn
            if low >= high:
                break
            mid = (low + high) // 2
            found = self.log.read_events(partition, mid, 1)
            if not found:
                high = mid
                continue
            at = at_of(found[0].value)
            if at is None or at < at_ms:
                low = found[0].offset + 1
            else:
                high = mid
        return low


def _done(run: RunView) -> bool:
    """Ended for good: nothing moves a succeeded or cancelled run again (a dead one may be
    replayed or cancelled later). Only such runs leave the read model (``FORGETTABLE``); a
    run that is not done is answered from the read model, which still holds it."""
    return run.state in FORGETTABLE


class History:
    """The read model's runs, and past its window the archive's (``archived`` None: gone)."""

    def __init__(
        self,
        model: ReadModel,
        clock: Clock,
        window_ms: int | None,
        archived: ArchivedRuns | None,
    ) -> None:
        self.model = model
        self.clock = clock
        self.window_ms = window_ms
        self.archived = archived

    def cutoff(self) -> int | None:
        """Runs of slots before this may have left the read model (None: none leave it)."""
        return cutoff_of(self.clock, self.window_ms)

    def past_window(self, run_id: str) -> bool:
        """Whether the run's slot is before the window, so it may have left the read model."""
        return past_window(run_id, self.clock, self.window_ms)

    def run(self, tenant: str, run_id: str) -> SourcedRun | None:
        """The caller's run, from the read model or, past the window, the archive."""
        hot = self.model.run(tenant, run_id)
        if hot is not None:
            return SourcedRun(hot, "hot")
        slot = _slot(run_id)
        if self.archived is None or slot is None or not self.past_window(run_id):
            return None
        view = self.archived.run(run_id, slot)
        if view is None or view.tenant != tenant:  # another team's run is simply not found
            return None
        again = self.model.run(tenant, run_id)  # its slot materialised again meanwhile
        if again is not None:
            return SourcedRun(again, "hot")
        return SourcedRun(view, "archive")

    def runs_of(
        self, tenant: str, job_id: str, limit: int = 20, cursor: str | None = None
    ) -> HistoryPage:
        """A job's runs, newest slot first, continuing past the window into the archive."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidDefinition("limit", f"must be between 1 and {MAX_LIMIT}")
        job = self.model.job(tenant, job_id)
        if job is None:
            return HistoryPage(items=[])
        after = None if cursor is None else decode_cursor(cursor)
        cutoff = self.cutoff()
        hot = self.model.job_runs_after(job_id, after, limit + 1)
        reaches_past = cutoff is not None and (
            len(hot) <= limit or hot[limit][1].scheduled_for < cutoff
        )
        if not reaches_past or self.archived is None or cutoff is None:
            page = _page([(key, SourcedRun(view, "hot")) for key, view in hot], limit)
            if self.archived is None and page.next_cursor is None:
                page.gone_before = cutoff
            return page
        before = cutoff if after is None else min(cutoff, _slot_of_key(after))
        older = self.archived.older(
            job_id,
            before,
            limit + 1,
            floor=job.created_at - BEFORE_MS,
            held=lambda run_id: self.model.run(tenant, run_id) is not None,
        )
        older = [run for run in older if run.tenant == tenant]
        # The read model again, with the archive's candidates, in one read: a run forgotten
        # since the first look is listed from the archive, one still held from the model.
        hot, held = self.model.job_runs_with(job_id, after, limit + 1, [r.run_id for r in older])
        merged = [(key, SourcedRun(view, "hot")) for key, view in hot]
        merged += [
            (run_key(run.scheduled_for, run.run_id), SourcedRun(run, "archive"))
            for run in older
            if run.run_id not in held
        ]
        merged.sort(key=lambda item: item[0])
        return _page(merged, limit)


def _page(items: list[tuple[bytes, SourcedRun]], limit: int) -> HistoryPage:
    more = len(items) > limit
    return HistoryPage(
        items=[run for _, run in items[:limit]],
        next_cursor=_encode(items[limit - 1][0]) if more else None,
    )


def cutoff_of(clock: Clock, window_ms: int | None) -> int | None:
    """Runs of slots before this may have left the read model (None: none leave it)."""
    return None if window_ms is None else clock.now_ms() - window_ms


def past_window(run_id: str, clock: Clock, window_ms: int | None) -> bool:
    """Whether the run's slot is before the hot window, so it may have left the read model."""
    cutoff = cutoff_of(clock, window_ms)
    slot = _slot(run_id)
    return cutoff is not None and slot is not None and slot < cutoff


def _slot(run_id: str) -> int | None:
    _, _, slot = run_id.rpartition(".")
    return int(slot) if slot.isdigit() else None


def _slot_of_key(key: bytes) -> int:
    if len(key) < 8:
        raise InvalidDefinition("cursor", "is not a cursor this listing gave out")
    return 2**64 - 1 - int.from_bytes(key[:8], "big")
