"""The read model's fold: each event into the records and indexes of the key layout.

Feeding it: :meth:`ModelFold.process` is the one entry point, ``process(event, partition,
offset)``. Inside ``with model.batch():`` changes are staged and written, with the next offset
of every partition they came from, in one ``WriteBatch`` when the block ends; outside a batch
each call is its own batch. So a crash loses whole batches and their positions together, and
:class:`~projections.read_model_runner.ReadModelRunner` resumes each partition from its
recorded position: every event is folded in exactly once. Writes are not synced
(``sync=False``, WAL on): the log re-supplies a lost tail.

A deleted (cancelled) job leaves the listings by id and by tag at once and stays readable (and
listed by ``status=cancelled``); the hot window removes it later (:mod:`projections.model_forget`).

A run materialised ahead of its slot (the lead time) shows as ``pending`` with its
``scheduled_for`` until it starts; one withdrawn before its slot (``RunCancelled``,
``reason=withdrawn``: the job was paused or its schedule changed) leaves no record.

A slot materialised again (a manual trigger after its run ended, once the partition state has
forgotten it) keeps its one record: it shows the new materialisation's state and trigger, and
keeps the earlier attempts, the first start and its lateness, as a replay does.

How a run's fields change is :mod:`projections.run_fold`'s (the archive's history folds runs
the same way); this module keeps the indexes and counters around it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, assert_never

from rocksdict import WriteBatch

from core.events import (
    AnyEvent,
    CancelReason,
    Heartbeat,
    JobCancelled,
    JobForgotten,
    JobPaused,
    JobRegistered,
    JobResumed,
    JobUpdated,
    LeaseExpired,
    LeaseGranted,
    LeaseReturned,
    RetryScheduled,
    RunCancelled,
    RunCompleted,
    RunDeadLettered,
    RunFailed,
    RunMaterialised,
    RunOutcomeAnswered,
    RunOutcomeAsked,
    RunReleased,
    RunReplayed,
    RunSkipped,
    RunStarted,
    Trigger,
    UpstreamRecorded,
)
from core.ids import is_scoped
from eventlog.port import Record
from projections import run_fold
from projections.decoding import EventDecoder
from projections.figures import HOUR_MS, RETENTION_MS, Minute, minute_of, observe
from projections.model_keys import (
    UNSCOPED,
    JobRecord,
    dependant_key,
    encoder,
    figures_kept_key,
    figures_prefix,
    forgotten_key,
    from_u64,
    job_count_key,
    job_decoder,
    job_key,
    job_run_key,
    minute_decoder,
    position_key,
    run_count_key,
    run_decoder,
    run_record_key,
    skip_key,
    state_key,
    status_key,
    tag_key,
    tenant_job_key,
    trigger_key,
    u64,
)
from projections.model_store import ModelStore
from projections.views import JobStatusName, JobView, RunStateName, RunView, SkipView

log = logging.getLogger("projections.read_model")  # the name the model logged under before

R = TypeVar("R", JobRecord, RunView)

LIVE_STATES = frozenset({"blocked", "pending", "running", "failed", "retrying"})
# How many decoded job records, and as many run records, the fold keeps between batches, the
# most recently written: a run's record is read again when its call ends (seconds after its
# lease at most, in a herd), and an every-second job's record each second. A small job's
# records took 1.4 KB and 1.0 KB decoded: about 40 MB at most.
KEPT_RECORDS = 16_384


@dataclass(frozen=True, slots=True)
class ReadyRun:
    """A run of a pull pool that became pending (ready at ``available_at``), as the model folded
    it: what wakes the claims waiting for that pool (``node.wakeups``)."""

    tenant: str
    pool: str
    available_at: int
    partition: int = -1  # the partition whose events made it ready (-1: not said)


class Observer(Protocol):
    """Told after each batch the model wrote (on the writing thread: it must not block)."""

    def folded(self, positions: dict[int, int], ready: list[ReadyRun]) -> None:
        """``positions``: the next offset of every partition the batch moved; ``ready``: pull
        runs it made pending."""


@dataclass
class _Pending:
    """A batch being staged: decoded records it changed, raw keys, counters, positions."""

    jobs: dict[str, JobRecord | None] = field(default_factory=dict)
    runs: dict[str, RunView | None] = field(default_factory=dict)
    counts: dict[bytes, int] = field(default_factory=dict)
    raw: dict[bytes, bytes | None] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    minutes: dict[bytes, Minute] = field(default_factory=dict)  # a team's figures by minute
    # every minute read in the batch, changed or not: most events count for nothing, and each
    # would read its minute (and the retention marker) from the store again
    minutes_read: dict[bytes, Minute] = field(default_factory=dict)
    deleted_ranges: list[tuple[bytes, bytes]] = field(default_factory=list)
    ready: list[ReadyRun] = field(default_factory=list)
    partition: int = -1  # the partition of the event being folded
    dependants: bool = False  # a job was indexed as an upstream's dependant


def _tag(p: _Pending, tenant: str, job_id: str, tags: Sequence[str], value: bytes | None) -> None:
    """Index (``b""``) or unindex (``None``) ``job_id`` under each of its tags."""
    for tag in tags:
        p.raw[tag_key(tenant, tag, job_id)] = value


def _depend(
    p: _Pending, tenant: str, job_id: str, upstreams: Sequence[str], value: bytes | None
) -> None:
    """Index (``b""``) or unindex (``None``) ``job_id`` as a dependant of each upstream job."""
    for upstream in upstreams:
        p.raw[dependant_key(tenant, upstream, job_id)] = value
        p.dependants = p.dependants or value is not None


def _status(job: JobRecord) -> JobStatusName:
    """``finished``: nothing live and no next slot, for a one-shot or dependency job that ran,
    or a recurring job whose ``end_at`` came."""
    spec = job.view.spec
    if job.base == "active" and job.view.next_slot is None and job.live == 0:
        if spec.recurring and spec.end_at is not None:
            return "finished"
        if not spec.recurring and job.runs > 0:
            return "finished"
    return job.base


class _Kept:
    """The job and run records the last batches wrote, decoded, the most recently written
    last: a herd's run is folded in three batches (materialised, leased, finished), and each
    read and decoded the run and its job from the store again.

    A batch takes a record out (:meth:`ModelFold._job`, :meth:`ModelFold._run`) and changes it
    in place; the record comes back only once the batch is written. So a batch that fails
    leaves nothing here it changed, and what is here is what the store holds, as long as:
    - nothing else writes these records: the forgetting passes drop what they delete
      (:meth:`ModelFold._forget_kept`);
    - the store is the one they came from: a set-aside or a refill changes the generation,
      and the next batch finds these kept for another one and drops them all."""

    __slots__ = ("generation", "jobs", "runs")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.jobs: dict[str, JobRecord] = {}
        self.runs: dict[str, RunView] = {}

    def keep(self, pending: _Pending, limit: int) -> None:
        """After ``pending`` was written: its records, the oldest dropped beyond ``limit``."""
        _keep(self.jobs, pending.jobs, limit)
        _keep(self.runs, pending.runs, limit)


def _keep(kept: dict[str, R], written: dict[str, R | None], limit: int) -> None:
    for key, record in written.items():
        if record is None:
            kept.pop(key, None)  # (a run withdrawn: its record deleted)
        else:
            kept[key] = record
    if len(kept) > limit:
        # The oldest go a quarter of the limit at a time: a dict's first key is found by
        # stepping over the slots of those deleted before it, so dropping one at a time cost
        # about 9 us a record kept (0.5 us this way).
        for key in list(itertools.islice(kept, len(kept) - limit * 3 // 4)):
            del kept[key]


class ModelFold(ModelStore):
    """Folds events into the model in batches, moving each partition's position with them."""

    _pending: _Pending | None
    _observers: list[Observer]
    _kept: _Kept | None = None
    kept_records = KEPT_RECORDS  # 0: keep none

    def has_unscoped_ids(self) -> bool:
        """Whether some job's log id is a bare team id, from before ids were scoped
        (:mod:`core.ids`): only then may a team's id name such a job."""
        return self._unscoped

    # -- batches ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Stage every ``process`` inside the block; write them and the positions at once."""
        with self._write_lock:
            if self._pending is not None:  # nested: the outer batch writes
                yield
                return
            if self._kept is None or self._kept.generation != self._generation:
                self._kept = _Kept(self._generation)  # another store's, or none yet
            self._pending = _Pending()
            try:
                yield
                self._commit(self._pending)
                self._kept.keep(self._pending, self.kept_records)
            finally:
                self._pending = None

    def _forget_kept(self, *, jobs: Sequence[str] = (), runs: Sequence[str] = ()) -> None:
        """Records deleted other than by a batch (under ``_write_lock``) are kept no more."""
        if self._kept is not None:
            for job_id in jobs:
                self._kept.jobs.pop(job_id, None)
            for run_id in runs:
                self._kept.runs.pop(run_id, None)

    def process_records(
        self,
        partition: int,
        records: Sequence[Record],
        decoder: EventDecoder | None = None,
        *,
        generation: int | None = None,
    ) -> int:
        """Fold in records read from ``partition``'s event stream, as one batch; foreign
        records are reported through ``decoder`` and passed over. Records read before the
        model was set aside (``generation`` is older) are dropped: returns 0."""
        decoder = decoder or EventDecoder("read_model")
        with self.batch():
            if generation is not None and generation != self._generation:
                return 0
            pending = self._pending
            assert pending is not None
            with self._reading():  # once for the batch: a context per event costs more
                for record in records:
                    event = decoder.decode(record)
                    if event is not None:
                        self._fold(pending, event, partition, record.offset)
                    elif record.offset >= pending.positions.get(
                        partition, self.position(partition)
                    ):
                        pending.positions[partition] = record.offset + 1
        return len(records)

    def process(self, event: AnyEvent, partition: int, offset: int) -> None:
        """Fold one event in; events before the partition's position are already in."""
        with self.batch():
            pending = self._pending
            assert pending is not None
            with self._reading():
                self._fold(pending, event, partition, offset)

    def _fold(self, pending: _Pending, event: AnyEvent, partition: int, offset: int) -> None:
        if offset < pending.positions.get(partition, self.position(partition)):
            return
        pending.partition = partition
        self._apply(pending, event, partition, offset)
        pending.positions[partition] = offset + 1

    def _commit(self, pending: _Pending) -> None:
        wb = WriteBatch(raw_mode=True)
        for job_id, job in pending.jobs.items():
            if job is not None:
                wb.put(job_key(job_id), encoder.encode(job))
        for run_id, run in pending.runs.items():
            if run is not None:
                wb.put(run_record_key(run_id), encoder.encode(run))
        for key, count in pending.counts.items():
            wb.put(key, u64(count))
        for key, value in pending.raw.items():
            if value is None:
                wb.delete(key)
            else:
                wb.put(key, value)
        for key, minute in pending.minutes.items():
            wb.put(key, encoder.encode(minute))
        for begin, end in pending.deleted_ranges:
            wb.delete_range(begin, end)
        for partition, position in pending.positions.items():
            wb.put(position_key(partition), u64(position))
        if not wb.is_empty():
            with self._db_lock, self._reading():
                # before the write, under the lock queries take: none finds the flag clear
                # and the index written
                self._dependants = self._dependants or pending.dependants
                self._db.write(wb, self._write_options)
        with self._moved:
            self._positions.update(pending.positions)
            self._unscoped = self._unscoped or UNSCOPED in pending.raw
            self._moved.notify_all()
        for observer in self._observers:
            try:
                observer.folded(dict(pending.positions), pending.ready)
            except Exception:  # an observer's failure must not fail the fold that is written
                log.exception("a read model observer failed")

    # -- one event --------------------------------------------------------------------------

    def _apply(self, p: _Pending, event: AnyEvent, partition: int, offset: int) -> None:
        self._tally(p, event)
        match event:
            case JobRegistered():
                if not is_scoped(event.job_id):
                    p.raw[UNSCOPED] = b"1"
                # The id of a job the partition forgot (docs/architecture.md) registered again:
                # the new job takes the record; its runs' history stays listed under the id.
                earlier = self._job(p, event.job_id)
                if earlier is not None:
                    p.raw[status_key(earlier.view.tenant, earlier.view.status, event.job_id)] = None
                    if earlier.base != "cancelled":
                        self._count_key(p, job_count_key(event.tenant), -1)
                    if earlier.ended_at is not None:
                        p.raw[forgotten_key(earlier.ended_at, event.job_id)] = None
                self._put_job(
                    p,
                    JobRecord(
                        view=JobView(
                            job_id=event.job_id,
                            tenant=event.tenant,
                            name=event.spec.name,
                            status="active",
                            version=event.version,
                            spec=event.spec,
                            next_slot=event.next_slot,
                            created_at=event.at,
                            updated_at=event.at,
                            partition=partition,
                        ),
                        base="active",
                    ),
                    fresh=True,
                )
                self._count_key(p, job_count_key(event.tenant), 1)
                _depend(p, event.tenant, event.job_id, event.spec.depends_on, b"")
                _tag(p, event.tenant, event.job_id, event.spec.tags, b"")
            case JobUpdated():
                job = self._job(p, event.job_id)
                if job is not None:
                    view = job.view
                    _depend(p, view.tenant, view.job_id, view.spec.depends_on, None)
                    _depend(p, view.tenant, view.job_id, event.spec.depends_on, b"")
                    _tag(p, view.tenant, view.job_id, view.spec.tags, None)
                    if job.base != "cancelled":  # a deleted job is not listed by tag
                        _tag(p, view.tenant, view.job_id, event.spec.tags, b"")
                    moved_to = event.spec.pool if event.spec.pool != view.spec.pool else None
                    view.spec, view.name, view.version = event.spec, event.spec.name, event.version
                    view.next_slot, view.updated_at = event.next_slot, event.at
                    self._put_job(p, job)
                    if moved_to is not None and job.live and self._observers:
                        # its pending runs now wait in this pool
                        p.ready.append(ReadyRun(view.tenant, moved_to, event.at, p.partition))
            case JobPaused() | JobResumed() | JobCancelled():
                job = self._job(p, event.job_id)
                if job is not None:
                    if isinstance(event, JobCancelled) and job.base != "cancelled":
                        self._count_key(p, job_count_key(job.view.tenant), -1)
                    job.view.version, job.view.updated_at = event.version, event.at
                    if isinstance(event, JobPaused):
                        job.base = "paused"
                    elif isinstance(event, JobResumed):
                        job.base, job.view.next_slot = "active", event.next_slot
                    else:
                        job.base, job.view.next_slot = "cancelled", None
                        job.view.ahead_slot = None
                        view = job.view
                        _depend(p, view.tenant, view.job_id, view.spec.depends_on, None)
                        # Deleted: out of the listings by id and tag; still readable by id.
                        p.raw[tenant_job_key(view.tenant, view.job_id)] = None
                        _tag(p, view.tenant, view.job_id, view.spec.tags, None)
                    self._put_job(p, job)
            case RunMaterialised():
                self._materialise(p, event)
            case RunSkipped():
                skip = SkipView(
                    job_id=event.job_id,
                    tenant=event.tenant,
                    scheduled_for=event.scheduled_for,
                    last_scheduled_for=event.last_scheduled_for,
                    count=event.count,
                    reason=str(event.reason),
                    at=event.at,
                )
                p.raw[skip_key(event.job_id, offset)] = encoder.encode(skip)
                job = self._job(p, event.job_id)
                if job is not None:
                    job.view.next_slot = event.next_slot
                    self._put_job(p, job)
            case RunCancelled(reason=CancelReason.WITHDRAWN):
                self._withdraw(p, event)
            case (
                RunReleased()
                | LeaseGranted()
                | RunStarted()
                | RunCompleted()
                | RunFailed()
                | LeaseExpired()
                | LeaseReturned()
                | RetryScheduled()
                | RunDeadLettered()
                | RunCancelled()
                | RunReplayed()
                | RunOutcomeAsked()
                | RunOutcomeAnswered()
            ):
                run = self._run(p, event.run_id)
                if run is not None:
                    state = run_fold.evolve(run, event)
                    if state is not None:
                        self._move(p, run, state)
            case JobForgotten():
                # The job's history stays; the hot window removes its record once none of
                # its runs is held any more (forget_jobs).
                job = self._job(p, event.job_id)
                if job is not None and job.ended_at is None:
                    job.ended_at = event.ended_at
                    p.jobs[event.job_id] = job
                    p.raw[forgotten_key(event.ended_at, event.job_id)] = b""
            case Heartbeat() | UpstreamRecorded():
                pass
            case _:
                assert_never(event)  # a new event must be shown here, or history misses it

    def _tally(self, p: _Pending, event: AnyEvent) -> None:
        """Count ``event`` into its team's figures of its minute (before the run it names is
        changed: whether a lease is the run's first start is read from the run as it was)."""
        first_scheduled_start = False
        if isinstance(event, LeaseGranted) and event.start_at is None:
            run = self._run(p, event.run_id)
            first_scheduled_start = (
                run is not None and run.started_at is None and run.trigger == Trigger.SCHEDULE
            )
        elif isinstance(event, RunStarted):  # the start of a lease granted ahead, reported
            run = self._run(p, event.run_id)
            first_scheduled_start = (
                run is not None
                and run.trigger == Trigger.SCHEDULE
                and bool(run.attempts)
                and run.attempts[0].fencing_token == event.fencing_token
            )
        at = minute_of(event.at)
        prefix = figures_prefix(event.tenant)
        key = prefix + u64(at)
        minute = p.minutes_read.get(key)
        if minute is None:
            stored = self._db.get(key)
            minute = Minute() if stored is None else minute_decoder.decode(stored)
            if stored is None:
                self._forget_old_figures(p, event.tenant, prefix, at)
            p.minutes_read[key] = minute
        if observe(minute, event, first_scheduled_start=first_scheduled_start):
            p.minutes[key] = minute

    def _forget_old_figures(self, p: _Pending, tenant: str, prefix: bytes, at: int) -> None:
        """Delete the team's figures older than the retention, once an hour at most."""
        cutoff = max(0, at - at % HOUR_MS - RETENTION_MS)
        marker = figures_kept_key(tenant)
        done = p.raw[marker] if marker in p.raw else self._db.get(marker)
        if done is not None and from_u64(bytes(done)) >= cutoff:
            return
        p.deleted_ranges.append((prefix + u64(0), prefix + u64(cutoff)))
        p.raw[marker] = u64(cutoff)

    def _materialise(self, p: _Pending, event: RunMaterialised) -> None:
        old = self._run(p, event.run_id)
        run = run_fold.materialised(event, old)
        if old is None:
            p.raw.pop(run_record_key(run.run_id), None)  # withdrawn earlier in this batch
            p.raw[job_run_key(run.job_id, run.scheduled_for, run.run_id)] = b""
        else:  # the same slot again: one record, its history kept (see the module docstring)
            self._unindex(p, old)
        p.runs[run.run_id] = run
        if event.idempotency_key is not None:
            p.raw[trigger_key(run.job_id, event.idempotency_key)] = run.run_id.encode()
        self._index(p, run)
        job = self._job(p, event.job_id)
        if job is not None:
            if old is None:
                job.runs += 1
            if event.trigger is Trigger.SCHEDULE:
                job.view.next_slot = event.next_slot
                ahead = event.scheduled_for if event.at < event.scheduled_for else None
                job.view.ahead_slot = ahead
            self._put_job(p, job)

    def _withdraw(self, p: _Pending, event: RunCancelled) -> None:
        """A run materialised ahead of its slot and taken back before the slot came (the job
        was paused, or its schedule changed): it never started, and the slot is not over (a
        pause's slot runs if resumed in time, or is recorded as skipped), so its record goes
        rather than stay as a cancelled run the user did not cancel."""
        run = self._run(p, event.run_id)
        if run is not None:
            self._unindex(p, run)
            p.runs[run.run_id] = None
            p.raw[run_record_key(run.run_id)] = None
            p.raw[job_run_key(run.job_id, run.scheduled_for, run.run_id)] = None
        job = self._job(p, event.job_id)
        if job is not None:
            if run is not None:
                job.runs -= 1
            job.view.next_slot, job.view.ahead_slot = event.next_slot, None
            self._put_job(p, job)

    def _move(self, p: _Pending, run: RunView, state: RunStateName) -> None:
        if run.state != state:
            # From one live state to another (a lease granted, a retry due) the job's count
            # of live runs stays: its record is neither read nor written for it.
            live = not (run.state in LIVE_STATES and state in LIVE_STATES)
            self._unindex(p, run, live=live)
            run.state = state
            self._index(p, run, live=live)

    def _index(self, p: _Pending, run: RunView, *, live: bool = True) -> None:
        p.raw[state_key(run)] = b""
        self._count_key(p, run_count_key(run.tenant, run.state), +1)
        if live and run.state in LIVE_STATES:
            self._live(p, run.job_id, +1)
        if run.state in ("pending", "retrying") and self._observers:
            job = self._job(p, run.job_id)
            pool = job.view.spec.pool if job is not None else None
            if pool is not None:
                p.ready.append(ReadyRun(run.tenant, pool, run.available_at, p.partition))

    def _unindex(self, p: _Pending, run: RunView, *, live: bool = True) -> None:
        p.raw[state_key(run)] = None
        self._count_key(p, run_count_key(run.tenant, run.state), -1)
        if live and run.state in LIVE_STATES:
            self._live(p, run.job_id, -1)

    def _live(self, p: _Pending, job_id: str, delta: int) -> None:
        job = self._job(p, job_id)
        if job is not None:
            job.live += delta
            self._put_job(p, job)

    def _count_key(self, p: _Pending, key: bytes, delta: int) -> None:
        if key not in p.counts:
            p.counts[key] = self._stored_count(key)
        p.counts[key] += delta

    def _job(self, p: _Pending, job_id: str) -> JobRecord | None:
        if job_id not in p.jobs:
            kept = self._kept.jobs.pop(job_id, None) if self._kept is not None else None
            if kept is None:
                stored = self._db.get(job_key(job_id))
                kept = None if stored is None else job_decoder.decode(stored)
            p.jobs[job_id] = kept
        return p.jobs[job_id]

    def _run(self, p: _Pending, run_id: str) -> RunView | None:
        if run_id not in p.runs:
            kept = self._kept.runs.pop(run_id, None) if self._kept is not None else None
            if kept is None:
                stored = self._db.get(run_record_key(run_id))
                kept = None if stored is None else run_decoder.decode(stored)
            p.runs[run_id] = kept
        return p.runs[run_id]

    def _put_job(self, p: _Pending, job: JobRecord, *, fresh: bool = False) -> None:
        view = job.view
        indexed = None if fresh else view.status
        view.status = _status(job)
        p.jobs[view.job_id] = job
        if fresh:
            p.raw[tenant_job_key(view.tenant, view.job_id)] = b""
        if indexed != view.status:
            if indexed is not None:
                p.raw[status_key(view.tenant, indexed, view.job_id)] = None
            p.raw[status_key(view.tenant, view.status, view.job_id)] = b""
