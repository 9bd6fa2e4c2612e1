"""What a definition may ask for, and how many jobs a tenant may hold.

Jobs per tenant
    A job spreads over the partitions by its id, so no partition sees a tenant's whole count;
    the read model does (every node folds every partition's events). A create is admitted when
    the tenant's jobs that are not cancelled (``ReadModel.job_count``) plus the creates this
    node has admitted but not yet seen answered stay under ``max_jobs``. The check and the
    reservation happen with no ``await`` between them, and a reservation is held until the
    scheduler's answer, which comes once the read model holds the new job (the port's
    read-your-writes promise): on one node (the embedded log) the count is exact however many
    requests race. On a cluster, node A learns of a create decided through node B when A's read
    model has folded it in (its lag, ``cronlog_read_model_lag_events``; well under a second when
    healthy): within that window the tenant may end up over ``max_jobs`` by the creates it got
    admitted on other nodes, at most (nodes - 1) x its request rate x the lag. Nothing admitted
    is ever taken back; later creates are refused until the tenant is under the limit again.

Upstream jobs
    ``depends_on`` may list at most ``max_depends_on`` jobs, each one the tenant has and has not
    cancelled, as this node's read model knows them. A job created just now through another
    node may not be known here yet (the same lag): the refusal says so, and a retry succeeds.
    A client that creates the upstream job first through the same node never meets that. Only
    the ids a request adds are checked: repeating a definition whose upstream job was cancelled
    since is not refused (the dependant then waits, as any dependant of a cancelled job does).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Container, Mapping, Sequence
from contextlib import asynccontextmanager

from api.edge import Call
from api.errors import ApiError
from core.errors import InvalidDefinition
from core.ids import team_id
from core.jobs import JobSpec
from projections.views import JobView

# The part of a team's count of jobs kept by other nodes (--history-on owner) may be this old:
# a create does not ask every owner; the limit may be passed by the creates of that second.
COUNT_AGE_S = 1.0


class JobQuota:
    """The creates this node has admitted and not yet seen answered, per tenant."""

    def __init__(self) -> None:
        self._admitted: dict[str, int] = {}

    @asynccontextmanager
    async def admit(
        self,
        call: Call,
        job_id: str,
        *,
        fresh: bool = False,
        known: Mapping[str, JobView | None] | None = None,
    ) -> AsyncIterator[None]:
        """Hold a place for ``job_id`` while the block creates it; 403 when the tenant has none
        left. A job the tenant has already is no create and takes no place. ``fresh``: the id
        was drawn for this create, so no job has it (history is not asked); ``known``: it was
        looked up already."""
        fresh_ids = {job_id} if fresh else frozenset()
        async with self.admit_many(call, [job_id], fresh=fresh_ids, known=known) as admitted:
            if not admitted[0]:
                raise quota_exceeded(call)
            yield

    @asynccontextmanager
    async def admit_many(
        self,
        call: Call,
        job_ids: Sequence[str],
        fresh: Container[str] = frozenset(),
        known: Mapping[str, JobView | None] | None = None,
    ) -> AsyncIterator[list[bool]]:
        """Hold a place for each new job of ``job_ids`` (a batch) while the block creates them,
        in order, while the tenant has places left: the block is given, for each id, whether
        it was admitted. An id the tenant has already, or one named earlier in the list, takes
        no place; an id of ``fresh`` was drawn for this create and is new without asking, and
        one in ``known`` was looked up already (a batch's items, at once)."""
        history = call.scheduler.reader
        # What the history says first: from here to the reservation nothing awaits.
        held = await history.job_count(call.tenant, max_age_s=COUNT_AGE_S)
        looked = known or {}
        asked = [j for j in dict.fromkeys(job_ids) if j not in fresh and j not in looked]
        found = {**looked, **await history.jobs_by_id(call.tenant, asked)}
        exists = {job_id for job_id, view in found.items() if view is not None}
        room = call.limits.max_jobs - held - self._admitted.get(call.tenant, 0)
        new: set[str] = set()
        admitted: list[bool] = []
        for job_id in job_ids:
            if job_id in new or job_id in exists:
                admitted.append(True)
            elif len(new) < room:
                new.add(job_id)
                admitted.append(True)
            else:
                admitted.append(False)
        placed = len(new)
        if placed:
            self._admitted[call.tenant] = self._admitted.get(call.tenant, 0) + placed
        try:
            yield admitted
        finally:
            if placed:
                left = self._admitted[call.tenant] - placed
                if left:
                    self._admitted[call.tenant] = left
                else:
                    del self._admitted[call.tenant]


def quota_exceeded(call: Call) -> ApiError:
    return ApiError(
        403,
        "quota_exceeded",
        f"tenant {call.tenant} has {call.limits.max_jobs} jobs, the most it may have; cancel"
        " some, or ask the operator for more",
    )


async def check_definition(call: Call, job_id: str, spec: JobSpec, before: JobSpec | None) -> None:
    """The tenant's bounds on ``job_id``'s definition (``before``: its current one, if any);
    :class:`InvalidDefinition` names the field."""
    limits = call.limits
    if len(spec.name) > limits.max_name_chars:
        raise InvalidDefinition("name", f"must be at most {limits.max_name_chars} characters")
    if len(spec.depends_on) > limits.max_depends_on:
        raise InvalidDefinition("depends_on", f"must list at most {limits.max_depends_on} jobs")
    known = set(before.depends_on) if before is not None else set()
    for i, upstream in enumerate(spec.depends_on):
        if upstream == job_id:
            raise InvalidDefinition(f"depends_on[{i}]", "a job cannot wait for itself")
        if upstream in known:
            continue
        view = await call.scheduler.reader.job(call.tenant, upstream)
        if view is None:
            raise InvalidDefinition(
                f"depends_on[{i}]",
                f"there is no job {team_id(upstream)} (if it was created through another node a"
                " moment ago, try again)",
            )
        if view.status == "cancelled":
            raise InvalidDefinition(f"depends_on[{i}]", f"job {team_id(upstream)} is cancelled")
