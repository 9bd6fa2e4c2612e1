"""``backfill``: run a job's past slots in a time range, through the node that owns the job.

The slots come from the job's own schedule (``slots_between``): a cron or interval job's slots
in ``[from, to]``. A slot already materialised is left alone, and so is a slot in the future
(the schedule will run it; ``decide`` refuses a manual run of one). Every other slot becomes a
``TriggerRun`` — only the partition's owner may decide, so the tool does not append anything
itself: it asks a running node, ``POST /v1/jobs/{id}/runs`` with ``{"scheduled_for": ...}``
and ``Idempotency-Key: backfill:<job_id>:<slot>``. Running the same backfill twice, or again
after it stopped half-way, triggers each slot once.

Where the job and its existing runs are read from:

- ``--url`` (needed for ``--apply``): the node's API, i.e. its read model. An embedded data
  directory is locked while its node runs, so this is the only way to look at a live one.
- otherwise the log (``--data-dir`` with the node stopped, or ``--kafka``): the job's events
  are folded for its definition, and a slot counts as present when a ``RunMaterialised`` for it
  is in the log. The read model is made of the same events, so that is the same answer without
  waiting for the read model to catch up (and a Kafka tool has no read model of its own).

Bounded: a range with more than ``--max`` slots is refused before anything is sent.
"""

from __future__ import annotations

import datetime as dt
import enum
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import httpx
import msgspec

from core.clock import Millis
from core.cron import with_seconds
from core.decide import run_id_of
from core.events import RunMaterialised
from core.ids import is_scoped, log_job_id
from core.jobs import JobSpec, slots_between
from core.state import JobStatus, PartitionState, evolve
from eventlog.port import EventLog, partition_for
from tools.replay.progress import Meter
from tools.replay.records import decoded, tool_decoder
from tools.replay.source import ReplayError

DEFAULT_MAX = 1000
RUNS_PAGE = 100
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class SlotAction(enum.StrEnum):
    TRIGGER = "trigger"  # past, no run yet: backfill it
    PRESENT = "present"  # its run exists already
    FUTURE = "future"  # the schedule will run it


@dataclass(frozen=True, slots=True)
class Job:
    """What planning needs of a job: its definition and where its slots start counting."""

    job_id: str
    tenant: str
    spec: JobSpec
    anchor: Millis  # an interval job's first slot; unused for cron
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class PlannedSlot:
    slot: Millis
    action: SlotAction


def idempotency_key(job_id: str, slot: Millis) -> str:
    return f"backfill:{job_id}:{slot}"


# -- instants -----------------------------------------------------------------------------------


def parse_instant(text: str) -> Millis:
    """Epoch milliseconds, or an RFC 3339 instant with ``Z`` or an offset."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    try:
        at = dt.datetime.fromisoformat(stripped.replace("z", "Z"))
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise ReplayError(
            f"{text!r} is not epoch milliseconds or an RFC 3339 instant with Z or an offset "
            "(e.g. 2026-03-01T00:00:00Z)"
        )
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def rfc3339(ms: Millis) -> str:
    """``ms`` as the API writes instants: UTC with milliseconds."""
    at = _EPOCH + dt.timedelta(milliseconds=ms)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


# -- planning -----------------------------------------------------------------------------------


def plan(
    job: Job, present: set[Millis], start: Millis, end: Millis, now: Millis, max_slots: int
) -> list[PlannedSlot]:
    """The job's slots in ``[start, end]`` and what to do with each."""
    if end < start:
        raise ReplayError(f"--to {rfc3339(end)} is before --from {rfc3339(start)}")
    if job.cancelled:
        raise ReplayError(f"job {job.job_id} is cancelled; a cancelled job takes no runs")
    if not job.spec.recurring:
        raise ReplayError(
            f"job {job.job_id} has no schedule (a one-shot or dependency-triggered job): "
            "it has no slots to backfill"
        )
    slots = slots_between(job.spec, start - 1, end, job.anchor, max_slots + 1)
    if len(slots) > max_slots:
        raise ReplayError(
            f"job {job.job_id} has more than {max_slots} slots in [{rfc3339(start)}, "
            f"{rfc3339(end)}]; narrow the range or raise --max"
        )
    return [
        PlannedSlot(
            slot,
            SlotAction.PRESENT
            if slot in present
            else SlotAction.FUTURE
            if slot > now
            else SlotAction.TRIGGER,
        )
        for slot in slots
    ]


# -- reading the job: from the log ----------------------------------------------------------------


def job_from_log(log: EventLog, job_id: str, tenant: str | None) -> tuple[Job, set[Millis]]:
    """The job ``job_id`` names: its log id (``team-a/nightly``), or with ``tenant`` the team's
    id, scoped or from before ids were scoped (:mod:`core.ids`)."""
    if tenant is None or is_scoped(job_id):
        return _job_in_log(log, job_id, tenant)
    try:
        return _job_in_log(log, log_job_id(tenant, job_id), tenant)
    except ReplayError:
        return _job_in_log(log, job_id, tenant)


def _job_in_log(log: EventLog, job_id: str, tenant: str | None) -> tuple[Job, set[Millis]]:
    """Fold the job's own events (an event changes only its job and that job's runs)."""
    partition = partition_for(job_id, log.num_partitions)
    state = PartitionState(partition)
    present: set[Millis] = set()
    for _, event in decoded(log, partition, tool_decoder([])):
        if event is None or event.job_id != job_id:
            continue
        if isinstance(event, RunMaterialised):
            present.add(event.scheduled_for)
        evolve(state, event)
    found = state.jobs.get(job_id)
    if found is None or (tenant is not None and found.spec.tenant != tenant):
        raise ReplayError(f"job {job_id} not found in partition {partition}" + _of(tenant))
    job = Job(
        job_id,
        found.spec.tenant,
        found.spec,
        found.anchor,
        cancelled=found.status is JobStatus.CANCELLED,
    )
    return job, present


def _of(tenant: str | None) -> str:
    return "" if tenant is None else f" for tenant {tenant}"


# -- reading the job and triggering runs: through a node's API ------------------------------------


class _JobOut(msgspec.Struct):
    """The fields of ``GET /v1/jobs/{id}`` that planning needs."""

    job_id: str
    tenant: str
    name: str
    status: str
    target: Any
    created_at: str
    next_run_at: str | None = None
    schedule: str | None = None
    seconds: str | None = None
    run_at: str | None = None
    interval_sec: float | None = None
    start_at: str | None = None
    end_at: str | None = None
    timezone: str = "UTC"


class _RunOut(msgspec.Struct):
    scheduled_for: str


class _RunPage(msgspec.Struct):
    runs: list[_RunOut]
    next_cursor: str | None = None


def _check(response: httpx.Response, what: str) -> None:
    if response.is_success:
        return
    raise ReplayError(f"{what}: HTTP {response.status_code} {response.text.strip()[:500]}")


def job_from_api(
    http: httpx.Client, job_id: str, tenant: str | None, start: Millis
) -> tuple[Job, set[Millis]]:
    """The job as the node's read model has it, and its runs' slots from ``start`` on."""
    response = http.get(f"/v1/jobs/{job_id}")
    if response.status_code == 404:
        raise ReplayError(f"job {job_id} not found (for this token's tenant)")
    _check(response, f"GET /v1/jobs/{job_id}")
    out = msgspec.json.decode(response.content, type=_JobOut)
    if tenant is not None and out.tenant != tenant:
        raise ReplayError(f"job {job_id} not found for tenant {tenant}")
    spec = msgspec.convert(
        {
            "name": out.name,
            "tenant": out.tenant,
            "target": out.target,
            "schedule": None if out.schedule is None else with_seconds(out.schedule, out.seconds),
            "run_at": None if out.run_at is None else parse_instant(out.run_at),
            "interval_sec": out.interval_sec,
            "start_at": None if out.start_at is None else parse_instant(out.start_at),
            "end_at": None if out.end_at is None else parse_instant(out.end_at),
            "timezone": out.timezone,
        },
        JobSpec,
    )
    # An interval job's slots lie on one grid; its next slot is on it, else its start or birth.
    anchor = next(
        parse_instant(t) for t in (out.next_run_at, out.start_at, out.created_at) if t is not None
    )
    job = Job(job_id, out.tenant, spec, anchor, cancelled=out.status == "cancelled")
    return job, _runs_from_api(http, job_id, start)


def _runs_from_api(http: httpx.Client, job_id: str, start: Millis) -> set[Millis]:
    """Slots of the job's runs at or after ``start``: pages come newest slot first."""
    present: set[Millis] = set()
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": RUNS_PAGE}
        if cursor is not None:
            params["cursor"] = cursor
        response = http.get(f"/v1/jobs/{job_id}/runs", params=params)
        _check(response, f"GET /v1/jobs/{job_id}/runs")
        page = msgspec.json.decode(response.content, type=_RunPage)
        slots = [parse_instant(run.scheduled_for) for run in page.runs]
        present.update(slots)
        if page.next_cursor is None or not slots or min(slots) < start:
            return present
        cursor = page.next_cursor


def apply(
    http: httpx.Client,
    job_id: str,
    planned: list[PlannedSlot],
    out: TextIO | None = None,
    meter: Meter | None = None,
) -> tuple[int, int]:
    """Trigger every slot planned for it; returns (runs made, runs the node had already).

    Stops at the first refusal: the keys make a second attempt safe, so the operator fixes the
    cause and runs the same command again.
    """
    out = out or sys.stdout
    made = existing = 0
    for item in planned:
        if item.action is not SlotAction.TRIGGER:
            continue
        response = http.post(
            f"/v1/jobs/{job_id}/runs",
            json={"scheduled_for": rfc3339(item.slot)},
            headers={"Idempotency-Key": idempotency_key(job_id, item.slot)},
        )
        _check(response, f"trigger of {run_id_of(job_id, item.slot)}")
        if meter is not None:
            meter.advance()
        if response.status_code == 201:
            made += 1
            out.write(f"triggered {run_id_of(job_id, item.slot)} ({rfc3339(item.slot)})\n")
        else:
            existing += 1
            out.write(f"present   {run_id_of(job_id, item.slot)} ({rfc3339(item.slot)})\n")
    return made, existing


def show(job: Job, planned: list[PlannedSlot], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    for item in planned:
        out.write(
            f"{item.action.value:<8} {rfc3339(item.slot)}  {run_id_of(job.job_id, item.slot)}\n"
        )
    counts = {action: sum(1 for p in planned if p.action is action) for action in SlotAction}
    out.write(
        f"job {job.job_id} (tenant {job.tenant}): {len(planned)} slots, "
        f"{counts[SlotAction.TRIGGER]} to trigger, {counts[SlotAction.PRESENT]} present, "
        f"{counts[SlotAction.FUTURE]} in the future\n"
    )
