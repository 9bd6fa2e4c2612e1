"""A job's id as its team names it, and as the log does.

Teams choose their jobs' ids (``nightly-report``), and two teams may both own one of the same
name. So in the log a job's id is scoped by its tenant::

    team's job id        nightly-report
    log's job id         team-a/nightly-report          log_job_id("team-a", "nightly-report")
    team's run id        nightly-report.1767225600000
    log's run id         team-a/nightly-report.1767225600000

Everything below the API keys by the log's id: the partition a job lives on is a hash of it,
and the partition state, the state stores and the read model's indexes hold it, so each of
them includes the tenant without having to know about tenants. The API turns a team's ids
into the log's on the way in and back on the way out (:func:`team_id`); a target is sent the
team's ids, and an ``Idempotency-Key`` made of the log's, so two teams calling one downstream
never share a key.

**Logs written before ids were scoped** hold jobs whose log id is the team's id itself (no
``/``: neither a job id nor a tenant may contain one). Their events are read as they are: each
carries its tenant, so a replay gives the same state as before. The API finds such a job by its
bare id when the calling team owns it and has no scoped job of that id (``api.edge``); new jobs
are always scoped.
"""

from __future__ import annotations

SEPARATOR = "/"


def log_job_id(tenant: str, job_id: str) -> str:
    """The log's id of ``tenant``'s job ``job_id``."""
    return f"{tenant}{SEPARATOR}{job_id}"


def team_id(log_id: str) -> str:
    """A job's or run's id as its team names it: the log's id without its tenant scope (an id
    from before scoping is returned as it is)."""
    scope, sep, rest = log_id.partition(SEPARATOR)
    return rest if sep else scope


def is_scoped(log_id: str) -> bool:
    return SEPARATOR in log_id


def idempotency_key(job_id: str, scheduled_for: int) -> str:
    """The ``Idempotency-Key`` of every attempt of a run: the job's log id and the slot, so it
    is the same on every attempt and never the same for two teams."""
    return f"{job_id}:{scheduled_for}"
