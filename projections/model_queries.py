"""What the read model answers: jobs, runs, skipped slots, counts and figures, page by page.

Every query is scoped to a tenant: another tenant's ids are simply not found. Each reads the
indexes :mod:`projections.model_fold` writes through the same key helpers
(:mod:`projections.model_keys`), under the lock a batch's write takes
(:mod:`projections.model_store`); a page's cursor is the key it stopped at (see the layout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.errors import InvalidDefinition
from core.ids import team_id
from projections.figures import HOUR_MS, RETENTION_MS, Minute, minute_of
from projections.model_keys import (
    decode_cursor,
    dependants_prefix,
    encode_cursor,
    figures_prefix,
    from_u64,
    job_count_key,
    job_decoder,
    job_key,
    job_runs_prefix,
    minute_decoder,
    run_counts_prefix,
    run_decoder,
    run_id_of,
    run_record_key,
    skip_decoder,
    skips_prefix,
    slot_of,
    state_prefix,
    status_prefix,
    tag_prefix,
    tenant_jobs_prefix,
    trigger_key,
    u64,
)
from projections.model_store import ModelStore, query
from projections.views import (
    JOB_STATUSES,
    RUN_STATES,
    JobStatusName,
    JobView,
    Page,
    RunStateName,
    RunView,
    SkipView,
)

MAX_LIMIT = 1000
MAX_SEARCH_SCAN = 10_000  # jobs one page of a search looks at


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidDefinition("limit", f"must be between 1 and {MAX_LIMIT}")


def _next_cursor(keys: list[bytes], limit: int) -> str | None:
    return encode_cursor(keys[limit - 1]) if len(keys) > limit else None


class ModelQueries(ModelStore):
    """The read model's queries (each a :func:`~projections.model_store.query`)."""

    # -- jobs -------------------------------------------------------------------------------

    @query
    def job(self, tenant: str, job_id: str) -> JobView | None:
        with self._db_lock:
            stored = self._db.get(job_key(job_id))
        if stored is None:
            return None
        view = job_decoder.decode(stored).view
        return view if view.tenant == tenant else None

    @query
    def jobs(
        self,
        tenant: str,
        status: JobStatusName | None = None,
        limit: int = 50,
        cursor: str | None = None,
        search: str | None = None,
        tag: str | None = None,
    ) -> Page[JobView]:
        """A tenant's jobs by job id, all of them or those with ``status``, or ``tag``. With
        ``search``, only those whose name or team's id holds it (any case); such a page (and
        one by tag and status) looks at up to :data:`MAX_SEARCH_SCAN` jobs, so it may hold
        fewer than ``limit`` and still have a ``next_cursor``."""
        _check_limit(limit)
        if status is not None and status not in JOB_STATUSES:
            raise InvalidDefinition("status", f"must be one of {', '.join(JOB_STATUSES)}")
        if tag is not None:
            prefix = tag_prefix(tenant, tag)
        elif status is None:
            prefix = tenant_jobs_prefix(tenant)
        else:
            prefix = status_prefix(tenant, status)
        needle = search.casefold() if search else None
        if needle is not None or (tag is not None and status is not None):

            def wanted(view: JobView) -> bool:
                if tag is not None and status is not None and view.status != status:
                    return False
                return needle is None or (
                    needle in view.name.casefold() or needle in team_id(view.job_id).casefold()
                )

            return self._search_jobs(prefix, limit, cursor, wanted)
        with self._db_lock:
            keys = self._page_keys(prefix, limit, cursor)
            found = [self._indexed(job_key(k)) for k in keys[:limit]]
        items = [job_decoder.decode(v).view for v in found]
        return Page(items=items, next_cursor=_next_cursor(keys, limit))

    def _search_jobs(
        self, prefix: bytes, limit: int, cursor: str | None, wanted: Callable[[JobView], bool]
    ) -> Page[JobView]:
        after = None if cursor is None else decode_cursor(cursor)
        items: list[JobView] = []
        last: bytes | None = None
        scanned = 0
        with self._db_lock:
            for suffix, _ in self._scan(prefix, after):
                if suffix == after:
                    continue
                if len(items) == limit or scanned == MAX_SEARCH_SCAN:
                    # More keys follow: the next page goes on after the last one looked at.
                    return Page(items=items, next_cursor=encode_cursor(last or b""))
                scanned += 1
                last = suffix
                view = job_decoder.decode(self._indexed(job_key(suffix))).view
                if wanted(view):
                    items.append(view)
        return Page(items=items)

    @query
    def dependants(self, tenant: str, upstream_job_id: str) -> list[str]:
        """The live jobs of ``tenant`` whose ``depends_on`` names ``upstream_job_id``."""
        if not self._dependants:  # no job depends on another (most nodes): nothing to read
            return []
        prefix = dependants_prefix(tenant, upstream_job_id)
        with self._db_lock:
            return [key.decode() for key, _ in self._scan(prefix)]

    @query
    def job_count(self, tenant: str) -> int:
        """How many of ``tenant``'s jobs are not cancelled (active, paused or finished)."""
        with self._db_lock:
            return self._stored_count(job_count_key(tenant))

    @query
    def skipped(self, tenant: str, job_id: str, limit: int = 50) -> list[SkipView]:
        """Slots of a job that did not run, most recent record first."""
        _check_limit(limit)
        if self.job(tenant, job_id) is None:
            return []
        with self._db_lock:
            stored = list(self._scan(skips_prefix(job_id), limit=limit))
        return [skip_decoder.decode(v) for _, v in stored]

    # -- runs -------------------------------------------------------------------------------

    @query
    def run(self, tenant: str, run_id: str) -> RunView | None:
        with self._db_lock:
            stored = self._db.get(run_record_key(run_id))
        if stored is None:
            return None
        run = run_decoder.decode(stored)
        return run if run.tenant == tenant else None

    @query
    def latest_run(self, tenant: str, job_id: str) -> RunView | None:
        """The run of the job's newest slot (whatever its state), or None before its first."""
        with self._db_lock:
            newest = next(iter(self._scan(job_runs_prefix(job_id), limit=1)), None)
            stored = None if newest is None else self._indexed(run_record_key(run_id_of(newest[0])))
        if stored is None:
            return None
        run = run_decoder.decode(stored)
        return run if run.tenant == tenant else None

    @query
    def run_by_key(self, tenant: str, job_id: str, idempotency_key: str) -> RunView | None:
        """The run a manual trigger of ``job_id`` with ``idempotency_key`` made (the latest, if
        the key was used again after the partition forgot it); None if none is known."""
        with self._db_lock:
            run_id = self._db.get(trigger_key(job_id, idempotency_key))
            stored = None if run_id is None else self._indexed(run_record_key(bytes(run_id)))
        if stored is None:
            return None
        run = run_decoder.decode(stored)
        return run if run.tenant == tenant else None

    @query
    def runs_of(
        self, tenant: str, job_id: str, limit: int = 20, cursor: str | None = None
    ) -> Page[RunView]:
        """A job's runs, newest slot first (empty for another tenant's job)."""
        _check_limit(limit)
        if self.job(tenant, job_id) is None:
            return Page(items=[])
        return self._run_page(job_runs_prefix(job_id), limit, cursor)

    @query
    def runs(
        self, tenant: str, state: RunStateName, limit: int = 20, cursor: str | None = None
    ) -> Page[RunView]:
        """A tenant's runs in ``state``, newest slot first; ``state="dead"`` is the dead letters."""
        _check_limit(limit)
        if state not in RUN_STATES:
            raise InvalidDefinition("state", f"must be one of {', '.join(RUN_STATES)}")
        return self._run_page(state_prefix(tenant, state), limit, cursor)

    @query
    def run_keys(
        self, tenant: str, state: RunStateName, cursor: str | None, limit: int
    ) -> list[tuple[str, int, str]]:
        """Up to ``limit`` of a tenant's runs in ``state`` after ``cursor``, newest slot first,
        from the index alone: (the cursor after it, its slot, its run id). For filters that
        look at many runs and read few."""
        _check_limit(limit)
        after = None if cursor is None else decode_cursor(cursor)
        out: list[tuple[str, int, str]] = []
        with self._db_lock:
            for suffix, _ in self._scan(state_prefix(tenant, state), after, limit=limit + 1):
                if suffix == after:
                    continue
                out.append((encode_cursor(suffix), slot_of(suffix), run_id_of(suffix).decode()))
                if len(out) == limit:
                    break
        return out

    @query
    def job_runs_after(
        self, job_id: str, after: bytes | None, limit: int
    ) -> list[tuple[bytes, RunView]]:
        """Up to ``limit`` of the job's runs after the key ``after`` (:func:`run_key`), newest
        slot first, with their keys (the caller checked the job is its tenant's)."""
        return self.job_runs_with(job_id, after, limit, [])[0]

    @query
    def job_runs_with(
        self, job_id: str, after: bytes | None, limit: int, run_ids: Sequence[str]
    ) -> tuple[list[tuple[bytes, RunView]], set[str]]:
        """:meth:`job_runs_after`, and which of ``run_ids`` the model holds, in one read."""
        prefix = job_runs_prefix(job_id)
        with self._db_lock:
            keys = [k for k, _ in self._scan(prefix, after, limit=limit + 1) if k != after]
            found = [(k, self._indexed(run_record_key(run_id_of(k)))) for k in keys[:limit]]
            held = {r for r in run_ids if self._db.get(run_record_key(r)) is not None}
        return [(k, run_decoder.decode(v)) for k, v in found], held

    def _run_page(self, prefix: bytes, limit: int, cursor: str | None) -> Page[RunView]:
        with self._db_lock:
            keys = self._page_keys(prefix, limit, cursor)
            found = [self._indexed(run_record_key(run_id_of(k))) for k in keys[:limit]]
        items = [run_decoder.decode(v) for v in found]
        return Page(items=items, next_cursor=_next_cursor(keys, limit))

    # -- counts and figures -----------------------------------------------------------------

    @query
    def counts(self, tenant: str) -> dict[str, int]:
        """A tenant's runs by state (every state, zeros included)."""
        with self._db_lock:
            stored = list(self._scan(run_counts_prefix(tenant)))
        found = {k.decode(): from_u64(v) for k, v in stored}
        return {state: found.get(state, 0) for state in RUN_STATES}

    @query
    def minutes(self, tenant: str, since: int, until: int) -> list[tuple[int, Minute]]:
        """The team's figures of the minutes in ``[since, until)``, oldest first (minutes with
        nothing to count are not stored, so not listed). Figures are kept for
        :data:`~projections.figures.RETENTION_MS`: a window reaches back that far at most."""
        since = max(since, until - RETENTION_MS - HOUR_MS)
        prefix = figures_prefix(tenant)
        start = u64(minute_of(max(0, since)))
        out: list[tuple[int, Minute]] = []
        with self._db_lock:
            for suffix, value in self._scan(prefix, start):
                at = from_u64(suffix)
                if at >= until:
                    break
                out.append((at, minute_decoder.decode(value)))
        return out

    # -- scanning ---------------------------------------------------------------------------

    def _page_keys(self, prefix: bytes, limit: int, cursor: str | None) -> list[bytes]:
        """Up to ``limit + 1`` key suffixes after ``cursor`` (the extra one says "more")."""
        after = None if cursor is None else decode_cursor(cursor)
        found: list[bytes] = []
        for suffix, _ in self._scan(prefix, after, limit=limit + 2):
            if suffix == after:
                continue
            found.append(suffix)
            if len(found) > limit:
                break
        return found
