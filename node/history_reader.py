"""What the API reads history through: each partition's answer from wherever it is kept.

Where a partition's history is kept is the node's business (docs/architecture.md, "History
kept with its partition"): on every node, in one read model folding every partition
(``--history-on every-node``), or with the partition, by its owner alone (``owner``). The API
asks :class:`HistoryReader` and never knows which:

- **A job's own questions** (the job, a run, its runs) go to the job's
  partition (``partition_for(job_id)``): answered here when this node holds that partition's
  history, else asked of its owner through the log (:mod:`node.wire`'s ``Query``), one hop, as
  a forwarded command is.
- **A team's listings** (its jobs, its runs by state, its dead letters) and **sums** (counts,
  figures, the jobs quota) are asked of every partition: the partitions whose history this node
  holds in one model are asked once together, every other partition of its owner, all at once,
  and the answers are merged (:mod:`projections.merging`: in the listing's order, with a cursor
  that is a position in that order, valid on any node and across partitions moving).
- **Never a silent gap.** A partition whose history is being filled (its owner took it over
  moments ago, or its model was set aside) answers ``HistoryRefilling``, and an owner that does
  not answer in time ``Unavailable``: the whole answer is a 503 with ``Retry-After``, never a
  listing without that partition's runs or a "not found" for a job that exists.
- **Read your writes.** A write this node forwarded is answered once durable; a later question
  about that partition carries the offset of the last write (``after``), and the owner answers
  once its history has folded past it.

Answers are computed by :func:`answer`, here for a local partition and on the owner for a
remote one, so the two cannot differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from core.decide import job_id_of_run
from core.errors import HistoryMoved, HistoryRefilling, InvalidDefinition, Unavailable
from eventlog.port import partition_for
from node import wire
from projections.figures import Minute
from projections.history import History, HistoryPage, SourcedRun
from projections.merging import merge_keyed, merge_minutes, merge_pages, sum_counts
from projections.model_keys import run_key
from projections.read_model import ReadModel
from projections.views import JobView, Page, RunView


@dataclass(frozen=True, slots=True)
class Held:
    """The history of one or more partitions this node answers for: their read model, and the
    run history over it (which reads past the hot window from the archive)."""

    model: ReadModel
    runs: History


def refilling(model: ReadModel, partition: int) -> HistoryRefilling | None:
    """The error a question about ``partition`` answers while ``model`` has not folded what
    the log held when it began keeping it (a node's start, a takeover, a set-aside): an answer
    now could say a job that exists is not found, or list none of its runs."""
    behind = model.refilling().get(partition)
    if behind is None:
        return None
    return HistoryRefilling(
        f"history is refilling (the read model is folding the log again: partition"
        f" {partition}: {behind[0]} of {behind[1]} events); try again shortly"
    )


def every_partition(held: Held) -> Callable[[int], Held]:
    """``HistoryReader``'s ``held`` for one model folding every partition: that model, but
    HistoryRefilling for a partition it has not caught up on."""

    def held_for(partition: int) -> Held:
        refused = refilling(held.model, partition)
        if refused is not None:
            raise refused
        return held

    return held_for


# How a partition's owner elsewhere is asked: ``ask(p, name, args, after, also)``, the question
# ``name`` with ``args`` about partition ``p`` (this node's last write to it at ``after``) and
# about each partition of ``also`` (partition: last write) the same owner is believed to keep;
# the owner's reply (``node.wire.Reply``), a refusal of the whole question raised.
Ask = Callable[[int, str, list[Any], int, dict[int, int]], Awaitable[wire.Reply]]


def _job(held: Held, tenant: str, job_id: str) -> JobView | None:
    return held.model.job(tenant, job_id)


def _run(held: Held, tenant: str, run_id: str) -> RunView | None:
    return held.model.run(tenant, run_id)


def _job_and_latest_run(
    held: Held, tenant: str, job_id: str
) -> tuple[JobView | None, RunView | None]:
    view = held.model.job(tenant, job_id)
    return view, None if view is None else held.model.latest_run(tenant, job_id)


def _jobs_by_id(held: Held, tenant: str, job_ids: list[str]) -> list[JobView | None]:
    return [held.model.job(tenant, job_id) for job_id in job_ids]


def _latest_runs(held: Held, tenant: str, job_ids: list[str]) -> list[RunView | None]:
    return [held.model.latest_run(tenant, job_id) for job_id in job_ids]


def _run_by_key(held: Held, tenant: str, job_id: str, key: str) -> RunView | None:
    return held.model.run_by_key(tenant, job_id, key)


def _sourced_run(held: Held, tenant: str, run_id: str) -> SourcedRun | None:
    return held.runs.run(tenant, run_id)


def _runs_of(held: Held, tenant: str, job_id: str, limit: int, cursor: str | None) -> HistoryPage:
    return held.runs.runs_of(tenant, job_id, limit, cursor)


def _jobs(
    held: Held,
    tenant: str,
    status: Any,
    limit: int,
    cursor: str | None,
    search: str | None,
    tag: str | None,
) -> Page[JobView]:
    return held.model.jobs(tenant, status, limit, cursor, search, tag)


def _runs(held: Held, tenant: str, state: Any, limit: int, cursor: str | None) -> Page[RunView]:
    return held.model.runs(tenant, state, limit, cursor)


def _run_keys(
    held: Held, tenant: str, state: Any, cursor: str | None, limit: int
) -> list[tuple[str, int, str]]:
    return held.model.run_keys(tenant, state, cursor, limit)


def _job_count(held: Held, tenant: str) -> int:
    return held.model.job_count(tenant)


def _counts(held: Held, tenant: str) -> dict[str, int]:
    return held.model.counts(tenant)


def _minutes(held: Held, tenant: str, since: int, until: int) -> list[tuple[int, Minute]]:
    return held.model.minutes(tenant, since, until)


def _dependants_many(held: Held, upstreams: list[tuple[str, str]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for tenant, upstream in upstreams:
        dependants = held.model.dependants(tenant, upstream)
        if dependants:
            found[upstream] = dependants
    return found


@dataclass(frozen=True, slots=True)
class _Question:
    compute: Callable[..., Any]
    answer_type: Any
    blocking: bool = False  # may read the archive: off the event loop


QUESTIONS: dict[str, _Question] = {
    "job": _Question(_job, JobView | None),
    "run": _Question(_run, RunView | None),
    "latest_runs": _Question(_latest_runs, list[RunView | None]),
    "jobs_by_id": _Question(_jobs_by_id, list[JobView | None]),
    "job_and_latest_run": _Question(_job_and_latest_run, tuple[JobView | None, RunView | None]),
    "run_by_key": _Question(_run_by_key, RunView | None),
    "sourced_run": _Question(_sourced_run, SourcedRun | None, blocking=True),
    "runs_of": _Question(_runs_of, HistoryPage, blocking=True),
    "jobs": _Question(_jobs, Page[JobView]),
    "runs": _Question(_runs, Page[RunView]),
    "run_keys": _Question(_run_keys, list[tuple[str, int, str]]),
    "job_count": _Question(_job_count, int),
    "counts": _Question(_counts, dict[str, int]),
    "minutes": _Question(_minutes, list[tuple[int, Minute]]),
    "dependants_many": _Question(_dependants_many, dict[str, list[str]]),
}

_encoder = msgspec.json.Encoder()
# A question about a partition whose history is being filled (taken over moments ago) waits
# this long for it before it is answered 503 (HistoryRefilling).
FILL_WAIT_S = 2.0
# A question that met the partition moving is asked again after these waits (a rebalance
# takes the partition from one owner to the next in well under a second on the embedded log).
MOVED_RETRY_S = (0.1, 0.4)
MAX_COUNTED = 10_000  # teams whose count of jobs kept elsewhere is remembered


def answer(held: Held, name: str, args: Sequence[Any]) -> bytes:
    """The JSON answer to question ``name`` with ``args`` from ``held`` (on the owner of a
    partition another node asked about); InvalidDefinition for a question not known."""
    question = QUESTIONS.get(name)
    if question is None:
        raise InvalidDefinition("query", f"{name!r} is not a history question")
    return _encoder.encode(question.compute(held, *args))


class HistoryReader:
    """The API's history (see the module's docstring). ``held(p)`` is the history this node
    keeps for partition ``p`` (raising ``HistoryRefilling`` while it is incomplete) or None when
    another node keeps it; ``ask(p, name, args, after)`` asks that node, for a partition whose
    last write from here was at offset ``after``."""

    def __init__(
        self,
        num_partitions: int,
        held: Callable[[int], Held | None],
        models: Callable[[], list[Held]],
        ask: Ask | None = None,
        written: Callable[[int], int] | None = None,
        wait_filled: Callable[[int, float], bool] | None = None,
        *,
        archived: Callable[[], bool],
        past_window: Callable[[str], bool],
    ) -> None:
        self.num_partitions = num_partitions
        self._held = held
        self._models = models
        self._ask = ask
        self._written = written or (lambda p: -1)
        self._wait_filled = wait_filled
        self._archived = archived
        self.past_window = past_window  # whether a run's slot is before the hot window
        self._counted: dict[str, tuple[float, int]] = {}  # a team's jobs kept elsewhere, when
        # The node that last answered for each partition kept elsewhere: a question of every
        # partition goes once to each such node, for all the partitions it answered for.
        self._owners: dict[int, str] = {}

    # -- what this node's own models say (no question asked elsewhere) ---------------------

    def positions(self) -> dict[int, int]:
        """How far the history kept here has folded each partition it keeps."""
        found: dict[int, int] = {}
        for held in self._models():
            found.update(held.model.positions())
        return found

    def has_unscoped_ids(self) -> bool:
        """Whether a model kept here holds a job id from before ids were scoped."""
        return any(held.model.has_unscoped_ids() for held in self._models())

    def job_here(self, tenant: str, job_id: str) -> JobView | None:
        """The job as the history kept here knows it (None also when it is kept elsewhere):
        for the choice between a bare and a scoped id, which only old models need."""
        try:
            held = self._held(self._of_job(job_id))
        except Unavailable:
            return None
        return None if held is None else held.model.job(tenant, job_id)

    @property
    def archived(self) -> bool:
        """Whether runs past the hot window are read from an archive (else they are gone)."""
        return self._archived()

    async def until(
        self, job_id: str, check: Callable[[], Awaitable[bool]], timeout_s: float
    ) -> bool:
        """Whether ``check()`` holds within ``timeout_s``, asked again each time the job's
        partition's history kept here folds more. Kept elsewhere, it is asked once: the owner
        answers only once it has folded this node's last write to the partition."""
        partition = self._of_job(job_id)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            if await check():
                return True
            held = self._held(partition)
            remaining = deadline - asyncio.get_running_loop().time()
            if held is None or remaining <= 0:
                return False
            at = held.model.position(partition)
            await asyncio.to_thread(held.model.wait_for, partition, at, remaining)

    # -- a job's questions: its partition's --------------------------------------------------

    async def job(self, tenant: str, job_id: str) -> JobView | None:
        found: JobView | None = await self._one(self._of_job(job_id), "job", [tenant, job_id])
        return found

    async def run(self, tenant: str, run_id: str) -> RunView | None:
        found: RunView | None = await self._one(self._of_run(run_id), "run", [tenant, run_id])
        return found

    async def job_and_latest_run(
        self, tenant: str, job_id: str
    ) -> tuple[JobView | None, RunView | None]:
        """The job and its newest run, in one question (what a job's answer shows)."""
        found: tuple[JobView | None, RunView | None] = await self._one(
            self._of_job(job_id), "job_and_latest_run", [tenant, job_id]
        )
        return found

    async def latest_runs(self, tenant: str, job_ids: list[str]) -> list[RunView | None]:
        """Each job's newest run (None before its first), one question a partition (a page
        of jobs)."""
        found = await self._each_job("latest_runs", tenant, job_ids)
        return [found[job_id] for job_id in job_ids]

    async def jobs_by_id(self, tenant: str, job_ids: list[str]) -> dict[str, JobView | None]:
        """Each of the jobs, by id (None: not the team's, or none), one question a partition
        (a batch of creates looks up every job it names at once)."""
        found: dict[str, JobView | None] = await self._each_job("jobs_by_id", tenant, job_ids)
        return found

    async def _each_job(self, name: str, tenant: str, job_ids: list[str]) -> dict[str, Any]:
        """Question ``name`` about each job (its answer a list, one an id), asked once of each
        partition the jobs are in, all at once."""
        by_partition: dict[int, list[str]] = {}
        for job_id in dict.fromkeys(job_ids):
            by_partition.setdefault(self._of_job(job_id), []).append(job_id)
        answers = await asyncio.gather(
            *(self._one(p, name, [tenant, ids]) for p, ids in by_partition.items())
        )
        found: dict[str, Any] = {}
        for ids, each in zip(by_partition.values(), answers, strict=True):
            found.update(zip(ids, each, strict=True))
        return found

    async def run_by_key(self, tenant: str, job_id: str, key: str) -> RunView | None:
        found: RunView | None = await self._one(
            self._of_job(job_id), "run_by_key", [tenant, job_id, key]
        )
        return found

    async def sourced_run(self, tenant: str, run_id: str) -> SourcedRun | None:
        """The run from the read model or, past the hot window, the archive."""
        found: SourcedRun | None = await self._one(
            self._of_run(run_id), "sourced_run", [tenant, run_id]
        )
        return found

    async def runs_of(
        self, tenant: str, job_id: str, limit: int = 20, cursor: str | None = None
    ) -> HistoryPage:
        """A job's runs, newest slot first, on past the hot window into the archive."""
        found: HistoryPage = await self._one(
            self._of_job(job_id), "runs_of", [tenant, job_id, limit, cursor]
        )
        return found

    # -- a team's listings and sums: every partition's -------------------------------------

    async def jobs(
        self,
        tenant: str,
        status: Any = None,
        limit: int = 50,
        cursor: str | None = None,
        search: str | None = None,
        tag: str | None = None,
    ) -> Page[JobView]:
        pages = await self._every("jobs", [tenant, status, limit, cursor, search, tag])
        return merge_pages(pages, lambda view: view.job_id.encode(), limit)

    async def runs(
        self, tenant: str, state: Any, limit: int = 20, cursor: str | None = None
    ) -> Page[RunView]:
        pages = await self._every("runs", [tenant, state, limit, cursor])
        return merge_pages(pages, lambda run: run_key(run.scheduled_for, run.run_id), limit)

    async def run_keys(
        self, tenant: str, state: Any, cursor: str | None, limit: int
    ) -> list[tuple[str, int, str]]:
        return merge_keyed(await self._every("run_keys", [tenant, state, cursor, limit]), limit)

    async def job_count(self, tenant: str, max_age_s: float = 0.0) -> int:
        """The team's jobs that are not cancelled, over every partition. ``max_age_s``: the
        part asked of other nodes may be an answer up to that old (the jobs quota takes one a
        second old rather than ask every owner on every create); what is kept here is exact."""
        if max_age_s <= 0:
            every: list[int] = await self._every("job_count", [tenant])
            return sum(every)
        loop = asyncio.get_running_loop()
        cached = self._counted.get(tenant)
        elsewhere: int
        if cached is not None and loop.time() - cached[0] <= max_age_s:
            elsewhere = cached[1]
        else:
            elsewhere = sum(await self._every("job_count", [tenant], here=False))
            self._counted[tenant] = (loop.time(), elsewhere)
            if len(self._counted) > MAX_COUNTED:
                self._counted.pop(next(iter(self._counted)))
        here: list[int] = await self._every("job_count", [tenant], elsewhere=False)
        return elsewhere + sum(here)

    async def counts(self, tenant: str) -> dict[str, int]:
        return sum_counts(await self._every("counts", [tenant]))

    async def minutes(self, tenant: str, since: int, until: int) -> list[tuple[int, Minute]]:
        return merge_minutes(await self._every("minutes", [tenant, since, until]))

    async def dependants_many(self, upstreams: list[tuple[str, str]]) -> dict[str, list[str]]:
        """The live dependants of each ``(tenant, upstream job)`` that has any, in one
        question to each partition (the relay asks for a batch of successes at once)."""
        found: dict[str, set[str]] = {}
        for answer in await self._every("dependants_many", [upstreams]):
            for upstream, dependants in answer.items():
                found.setdefault(upstream, set()).update(dependants)
        return {upstream: sorted(jobs) for upstream, jobs in found.items()}

    # -- asking ------------------------------------------------------------------------------

    def _of_job(self, job_id: str) -> int:
        return partition_for(job_id, self.num_partitions)

    def _of_run(self, run_id: str) -> int:
        return self._of_job(job_id_of_run(run_id))

    async def _held_now(self, partition: int) -> Held | None:
        """``held(partition)``; a partition whose history is being filled here (taken over
        moments ago) is waited for up to ``FILL_WAIT_S`` first, rather than answered 503."""
        try:
            return self._held(partition)
        except HistoryRefilling:
            if self._wait_filled is None:
                raise
            await asyncio.to_thread(self._wait_filled, partition, FILL_WAIT_S)
            return self._held(partition)

    async def _one(self, partition: int, name: str, args: list[Any]) -> Any:
        held = await self._held_now(partition)
        question = QUESTIONS[name]
        if held is not None:
            if question.blocking:
                return await asyncio.to_thread(question.compute, held, *args)
            return question.compute(held, *args)
        return await self._remote(partition, name, args)

    async def _every(
        self, name: str, args: list[Any], *, here: bool = True, elsewhere: bool = True
    ) -> list[Any]:
        """Question ``name`` of every partition: once of each model held here (one may hold
        several partitions), once of each other partition's owner, all at once (``here``,
        ``elsewhere``: those parts only)."""
        question = QUESTIONS[name]
        models: dict[int, Held] = {}
        remote: list[int] = []
        for p in range(self.num_partitions):
            held = await self._held_now(p)  # HistoryRefilling, still being filled: a 503
            if held is None:
                if elsewhere:
                    remote.append(p)
            elif here:
                models.setdefault(id(held.model), held)
        answers = [question.compute(held, *args) for held in models.values()]
        if remote:
            groups: dict[str, list[int]] = {}
            for p in remote:  # one question a node, for every partition it answered for last
                owner = self._owners.get(p)
                groups.setdefault(owner if owner is not None else f"?{p}", []).append(p)
            for each in await asyncio.gather(
                *(self._remote_many(ps, name, args) for ps in groups.values())
            ):
                answers += each
        return answers

    async def _remote(self, partition: int, name: str, args: list[Any]) -> Any:
        if self._ask is None:
            raise Unavailable(f"the history of partition {partition} is not kept here")
        for wait_s in (*MOVED_RETRY_S, None):
            try:
                reply = await self._ask(partition, name, args, self._written(partition), {})
            except HistoryMoved:
                # the partition moved while the question travelled: its new owner answers
                self._owners.pop(partition, None)
                if wait_s is None:
                    raise
                await asyncio.sleep(wait_s)
                continue
            if reply.by:
                self._owners[partition] = reply.by
            return msgspec.json.decode(reply.answer, type=QUESTIONS[name].answer_type)
        raise AssertionError("unreachable")

    async def _remote_many(self, partitions: list[int], name: str, args: list[Any]) -> list[Any]:
        """Question ``name`` of ``partitions``, which one node answered for last: one question
        to it for all of them. A partition it no longer keeps (it moved) is asked again alone,
        of whoever owns it now; any other refusal (refilling, not answered) is raised."""
        if len(partitions) == 1:
            return [await self._remote(partitions[0], name, args)]
        assert self._ask is not None  # partitions are known to be elsewhere only by its answers
        first, *others = partitions
        also = {p: self._written(p) for p in others}
        try:
            reply = await self._ask(first, name, args, self._written(first), also)
        except HistoryMoved:  # the first moved: the others may have too; each alone
            for p in partitions:
                self._owners.pop(p, None)
            return list(await asyncio.gather(*(self._remote(p, name, args) for p in partitions)))
        answer_type = QUESTIONS[name].answer_type
        found: list[Any] = []
        moved: list[int] = []
        for p in partitions:
            raw = reply.answers.get(p)
            if raw is not None:
                found.append(msgspec.json.decode(raw, type=answer_type))
                if reply.by:
                    self._owners[p] = reply.by
                continue
            refused = reply.refused.get(p)
            err = (
                wire.error_of_refused(refused)
                if refused is not None
                else Unavailable(f"partition {p}: the owner's answer left it out")
            )
            if not isinstance(err, HistoryMoved):
                raise err
            self._owners.pop(p, None)
            moved.append(p)
        if moved:
            found += await asyncio.gather(*(self._remote(p, name, args) for p in moved))
        return found
