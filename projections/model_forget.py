"""Forgetting: the hot window takes old finished runs, skipped slots and ended jobs out.

``node.hot_window`` drives it, batch by batch, each holding the writer's lock for one batch
only. Finished runs go first (:data:`FORGETTABLE`, :meth:`ModelForget.forget_runs`), with every
index key that names them and their counts; old skipped-slot records next
(:meth:`ModelForget.forget_skips`).

**Jobs leave too.** Once its partition has forgotten a job (``JobForgotten``, a retention
after it ended), it ended before the history window's start, and none of its runs or
skipped-slot records is held any more (they leave with the window; a dead run holds its job),
the hot window removes the job's record and every index key naming it
(:meth:`ModelForget.forget_jobs`), so a model fed one-shots by the million holds only those of
the window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rocksdict import WriteBatch

from core.errors import StoreDamaged
from eventlog.rocks import checked_reads, iterator_error
from projections.model_keys import (
    FORGOTTEN,
    RUN_COUNTS,
    SKIPS,
    JobRecord,
    dependant_key,
    forgotten_at,
    forgotten_job,
    inv,
    job_count_key,
    job_decoder,
    job_key,
    job_runs_prefix,
    prefix_end,
    run_count_key,
    run_decoder,
    run_id_of,
    run_record_key,
    skip_decoder,
    skips_prefix,
    slot_of,
    state_prefix,
    status_key,
    tag_key,
    tenant_job_key,
    tenant_of_count,
    trigger_key,
    triggers_range,
    u64,
)
from projections.model_store import ModelStore, query
from projections.views import RunStateName

# Finished for good: the states a run may leave the hot window in. A dead run stays (it can
# still be replayed, and the dead-letter list is where operators find it); live runs stay.
FORGETTABLE: tuple[RunStateName, ...] = ("succeeded", "cancelled")


@dataclass(frozen=True, slots=True)
class Forgot:
    """What one batch of forgetting removed, and how long it held the writer's lock."""

    runs: int = 0
    skips: int = 0
    jobs: int = 0
    held_s: float = 0.0
    took_s: float = 0.0
    resume: bytes | None = None


class ModelForget(ModelStore):
    """The hot window's side of the read model (``node.hot_window`` drives it)."""

    def forget_runs(
        self, cutoff: int, max_runs: int, resume: dict[bytes, bytes] | None = None
    ) -> Forgot:
        """Remove up to ``max_runs`` finished runs (:data:`FORGETTABLE` states) whose slot is
        before ``cutoff``, oldest slot first, with every index key that names them (``r/``,
        ``jr/``, ``rs/``, ``jk/``) and their ``c/`` counts, in one batch. Live and dead runs
        stay; a job's own record and ``cj/`` do not change. Holds the writer's lock for this
        one batch only (``Forgot.held_s``). ``resume`` (index prefix -> the last key removed),
        kept by the caller across the batches of one cutoff, starts each scan past what earlier
        batches deleted: RocksDB would otherwise step over their tombstones again each time."""
        started = time.perf_counter()
        with self._write_lock:
            held_from = time.perf_counter()
            removed = 0
            wb = WriteBatch(raw_mode=True)
            counts: dict[bytes, int] = {}
            with self._reading():
                for tenant in self._tenants():
                    for state in FORGETTABLE:
                        prefix = state_prefix(tenant, state)
                        before = None if resume is None else resume.get(prefix)
                        for suffix in self._oldest(prefix, cutoff, max_runs - removed, before):
                            run_id = run_id_of(suffix)
                            run = run_decoder.decode(self._indexed(run_record_key(run_id)))
                            wb.delete(run_record_key(run_id))
                            self._forget_kept(runs=(run.run_id,))
                            wb.delete(prefix + suffix)
                            wb.delete(job_runs_prefix(run.job_id) + suffix)
                            if run.idempotency_key is not None:
                                key = trigger_key(run.job_id, run.idempotency_key)
                                if self._db.get(key) == run_id:
                                    wb.delete(key)
                            count = run_count_key(tenant, state)
                            counts[count] = counts.get(count, 0) + 1
                            removed += 1
                            if resume is not None:
                                resume[prefix] = suffix
                        if removed >= max_runs:
                            break
                    if removed >= max_runs:
                        break
                self._lower_counts_and_write(wb, counts)
            done = time.perf_counter()
        return Forgot(runs=removed, held_s=done - held_from, took_s=done - started)

    def forget_skips(self, cutoff: int, after: bytes | None, max_scan: int) -> Forgot:
        """Look at up to ``max_scan`` skipped-slot records after the key ``after`` (None: from
        the first) and remove those whose last slot is before ``cutoff``. ``Forgot.resume``
        is where the next call goes on (None: the scan reached the end)."""
        started = time.perf_counter()
        with self._write_lock:
            held_from = time.perf_counter()
            wb = WriteBatch(raw_mode=True)
            removed = scanned = 0
            resume: bytes | None = None
            with self._reading():
                for suffix, value in self._scan(SKIPS, after):
                    if suffix == after:
                        continue
                    if scanned == max_scan:
                        break
                    scanned += 1
                    resume = suffix
                    if skip_decoder.decode(value).last_scheduled_for < cutoff:
                        wb.delete(SKIPS + suffix)
                        removed += 1
                else:
                    resume = None
                if not wb.is_empty():
                    with self._db_lock:
                        self._db.write(wb, self._write_options)
            done = time.perf_counter()
        return Forgot(skips=removed, held_s=done - held_from, took_s=done - started, resume=resume)

    def forget_jobs(self, cutoff: int, after: bytes | None, max_scan: int) -> Forgot:
        """Look at up to ``max_scan`` jobs their partition forgot that ended before ``cutoff``,
        oldest first from after the ``jf/`` key suffix ``after`` (None: from the first), and remove
        those of which no run and no skipped-slot record is held: the record, every index key
        naming the job, its keys of manual triggers, and its count in ``cj/`` (one batch).
        ``Forgot.resume`` is where the next call goes on (None: no more before ``cutoff``)."""
        started = time.perf_counter()
        with self._write_lock:
            held_from = time.perf_counter()
            wb = WriteBatch(raw_mode=True)
            removed = scanned = 0
            resume: bytes | None = None
            counts: dict[bytes, int] = {}
            with self._reading():
                for suffix, _ in self._scan(FORGOTTEN, after):
                    if suffix == after:
                        continue
                    if scanned == max_scan:
                        break
                    if forgotten_at(suffix) >= cutoff:
                        resume = None
                        break
                    scanned += 1
                    resume = suffix
                    job_id = forgotten_job(suffix)
                    if self._holds_history_of(job_id):
                        continue  # a dead run, or runs still in the window: it stays
                    job = job_decoder.decode(self._indexed(job_key(job_id)))
                    self._delete_job(wb, job)
                    self._forget_kept(jobs=(job.view.job_id,))
                    wb.delete(FORGOTTEN + suffix)
                    if job.base != "cancelled":
                        key = job_count_key(job.view.tenant)
                        counts[key] = counts.get(key, 0) + 1
                    removed += 1
                else:
                    resume = None
                self._lower_counts_and_write(wb, counts)
            done = time.perf_counter()
        return Forgot(jobs=removed, held_s=done - held_from, took_s=done - started, resume=resume)

    @query
    def oldest_forgettable(self, cutoff: int) -> int | None:
        """The oldest slot of a finished run still held that is before ``cutoff`` (None: none
        is): how far behind forgetting is."""
        oldest: int | None = None
        with self._db_lock:
            for tenant in self._tenants():
                for state in FORGETTABLE:
                    for suffix in self._oldest(state_prefix(tenant, state), cutoff, 1):
                        slot = slot_of(suffix)
                        oldest = slot if oldest is None else min(oldest, slot)
        return oldest

    def _lower_counts_and_write(self, wb: WriteBatch, counts: dict[bytes, int]) -> None:
        """Lower each counter by what a forgetting pass removed (never below zero) in ``wb``,
        then write the batch if it holds anything."""
        for key, gone in counts.items():
            held = self._stored_count(key)
            wb.put(key, u64(max(0, held - gone)))
        if not wb.is_empty():
            with self._db_lock:
                self._db.write(wb, self._write_options)

    def _holds_history_of(self, job_id: str) -> bool:
        for prefix in (job_runs_prefix(job_id), skips_prefix(job_id)):
            if next(iter(self._scan(prefix, limit=1)), None) is not None:
                return True
        return False

    @staticmethod
    def _delete_job(wb: WriteBatch, job: JobRecord) -> None:
        view = job.view
        tenant, job_id = view.tenant, view.job_id
        wb.delete(job_key(job_id))
        wb.delete(tenant_job_key(tenant, job_id))
        wb.delete(status_key(tenant, view.status, job_id))
        for tag in view.spec.tags:
            wb.delete(tag_key(tenant, tag, job_id))
        for upstream in view.spec.depends_on:
            wb.delete(dependant_key(tenant, upstream, job_id))
        wb.delete_range(*triggers_range(job_id))

    def _tenants(self) -> list[str]:
        """Every tenant that has had a run (its ``c/`` counters), from the counters alone."""
        tenants: list[str] = []
        for key, _ in self._scan(RUN_COUNTS):
            tenant = tenant_of_count(key)
            if not tenants or tenants[-1] != tenant:
                tenants.append(tenant)
        return tenants

    def _oldest(
        self, prefix: bytes, cutoff: int, limit: int, before: bytes | None = None
    ) -> list[bytes]:
        """Up to ``limit`` key suffixes of an ``<inv(slot)><run_id>`` index whose slot is before
        ``cutoff``, oldest slot first (a backward scan from the prefix's end, or from just
        before the suffix ``before``)."""
        if limit <= 0 or cutoff <= 0:
            return []
        lower = prefix + inv(cutoff - 1)
        upper = prefix_end(prefix)
        options = checked_reads()
        options.set_iterate_upper_bound(upper)
        it: Any = self._db.iter(options)
        start = upper if before is None else prefix + before
        it.seek_for_prev(start)
        found: list[bytes] = []
        # The lower bound is checked here: rocksdict's iterate_lower_bound does not stop a
        # backward scan when nothing lies between the bounds.
        while it.valid() and len(found) < limit:
            key = bytes(it.key())
            if key < lower:
                break
            if key != start:
                found.append(key[len(prefix) :])
            it.prev()
        error = iterator_error(it)
        del it  # a live iterator keeps the model's LOCK
        if error is not None:
            raise StoreDamaged(f"read model {self._path}: {error}")
        return found
