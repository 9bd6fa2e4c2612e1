"""What the read model answers with: JSON-friendly msgspec structs, one per thing a user asks about.

These are the API's response bodies (``msgspec.json.encode(view)``), so like events they only
grow: add fields with defaults, never retype or remove one.

Instants are int milliseconds since the epoch (UTC). A page's ``next_cursor`` is opaque: pass it
back unchanged for the next page; None means there is no next page.
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

import msgspec

from core.clock import Millis
from core.jobs import JobSpec

JobStatusName = Literal["active", "paused", "cancelled", "finished"]
RunStateName = Literal[
    "blocked", "pending", "running", "succeeded", "failed", "retrying", "dead", "cancelled"
]
AttemptOutcome = Literal["succeeded", "failed", "lease_expired", "cancelled"]

JOB_STATUSES: tuple[JobStatusName, ...] = ("active", "paused", "cancelled", "finished")
RUN_STATES: tuple[RunStateName, ...] = (
    "blocked",
    "pending",
    "running",
    "succeeded",
    "failed",
    "retrying",
    "dead",
    "cancelled",
)


class JobView(msgspec.Struct, kw_only=True, gc=False):
    """A job as defined now. ``finished``: a one-shot or dependency-triggered job that has had a
    run, with no next slot and no live runs (it may still be triggered again by hand or by its
    upstream jobs); until its first run such a job is ``active``."""

    job_id: str
    tenant: str
    name: str
    status: JobStatusName
    version: int
    spec: JobSpec
    next_slot: Millis | None
    created_at: Millis
    updated_at: Millis
    partition: int
    # the slot of a run materialised ahead of it (the lead time): ``next_slot`` has moved past
    # it already, and until it comes it is the job's next run (``api.translate.next_run``)
    ahead_slot: Millis | None = None


class AttemptView(msgspec.Struct, kw_only=True, gc=False):
    """One lease of a run: ``finished_at`` and ``outcome`` stay None while it is running."""

    attempt: int
    fencing_token: int
    worker_id: str
    started_at: Millis
    finished_at: Millis | None = None
    outcome: AttemptOutcome | None = None
    error: str = ""


class AskView(msgspec.Struct, kw_only=True, gc=False):
    """One ask of a run's target about what became of the attempt of ``fencing_token`` (its
    outcome was unknown: ``core.asking``); ``answer`` stays None until it is answered."""

    ask: int
    fencing_token: int
    ask_at: Millis
    answered_at: Millis | None = None
    answer: str | None = None  # core.events.OutcomeAnswer
    status: int | None = None  # succeeded: the status the target's handler answered
    detail: str = ""


class RunView(msgspec.Struct, kw_only=True, gc=False):
    """One run of a job (its identity is the job and the slot ``scheduled_for``).

    ``state`` is ``failed`` between an attempt's failure and the decision that follows it (a retry
    or the dead-letter list; for a critical run of unknown outcome whose target can say, the
    asks of ``asks`` first), ``retrying`` while a retry waits for its start time. ``started_at``
    is the first lease; ``lateness_ms`` is that first start minus the slot. ``attempts`` is every
    lease the run's identity ever had, also those of an earlier materialisation of the same slot.
    """

    run_id: str
    job_id: str
    tenant: str
    scheduled_for: Millis
    state: RunStateName
    attempt: int
    trigger: str
    available_at: Millis
    started_at: Millis | None = None
    finished_at: Millis | None = None
    lateness_ms: Millis | None = None
    error: str = ""
    attempts: list[AttemptView] = []
    dead_reason: str | None = None
    idempotency_key: str | None = None  # the key of the manual trigger that made the run
    # the asks of its target about attempts of unknown outcome, oldest first (core.asking)
    asks: list[AskView] = []


class SkipView(msgspec.Struct, kw_only=True):
    """Slots that did not run: ``count`` slots from ``scheduled_for`` to ``last_scheduled_for``
    (``count`` is None when there were too many to count cheaply)."""

    job_id: str
    tenant: str
    scheduled_for: Millis
    last_scheduled_for: Millis
    count: int | None
    reason: str
    at: Millis


T = TypeVar("T")


class Page(msgspec.Struct, Generic[T], kw_only=True):
    """One page of a listing; pass ``next_cursor`` back for the next one."""

    items: list[T]
    next_cursor: str | None = None
