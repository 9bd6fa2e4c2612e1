"""Canonical JSON forms of what a replay rebuilds: a partition's state and the read model's
answers, for the log corpus (:mod:`tools.replay.corpus`) to record and compare across builds.

A form is plain JSON (``msgspec.to_builtins``) of this build's types. A form recorded by an
earlier build is read back *through* this build's types (:func:`read_job`, :func:`read_run`,
:func:`read_answers`) before it is compared: a field added since, with a default, reads as
that default on both sides, as the event contract says (``core/events.py``), while a field
removed or retyped fails to read, and a value that differs is named.

A job's definition is shown whole (``JobSpec`` with its payload decoded), not as the state
holds it (``core.state.hold_spec``), so the form does not change when that holding does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from core.jobs import JobSpec, payload_of
from core.state import JobState, PartitionState, RunState

try:
    from core.state import JobStateV1
except ImportError:  # run on a build before snapshot format 2 (tests/corpus/record_older.sh),
    from core.state import JobState as JobStateV1  # type: ignore[assignment]  # spec in place
from projections.read_model import ReadModel
from projections.views import RUN_STATES, JobView, Page, RunView, SkipView

Form = dict[str, Any]
V = TypeVar("V")


def _whole(spec: JobSpec) -> JobSpec:
    """A job's definition with its payload as a document."""
    return msgspec.structs.replace(spec, payload=payload_of(spec))


def spec_form(spec: JobSpec) -> Form:
    """A job's definition, its payload as a document."""
    form: Form = msgspec.to_builtins(_whole(spec))
    return form


def job_form(job: JobState) -> Form:
    """A job's state with its definition whole (the layout of ``JobStateV1``)."""
    fields = {f: getattr(job, f) for f in JobStateV1.__struct_fields__ if f != "spec"}
    form: Form = msgspec.to_builtins(JobStateV1(spec=_whole(job.spec), **fields))
    return form


def run_form(run: RunState) -> Form:
    form: Form = msgspec.to_builtins(run)
    return form


def state_form(state: PartitionState) -> Form:
    """The canonical state (``PartitionState.snapshot``'s content), jobs and runs in the
    state's order."""
    return {
        "partition": state.partition,
        "last_token": state.last_token,
        "jobs": [job_form(j) for j in state.jobs.values()],
        "runs": [run_form(r) for r in state.runs.values()],
    }


def read_job(form: Form, spec: Form | None = None) -> Form:
    """A recorded job's form as this build reads it. ``spec``: the definition to read it with
    when the form leaves it out (a trace's), which is then left out again."""
    given = dict(form)
    if spec is not None and "spec" not in given:
        given["spec"] = spec
        job = msgspec.convert(given, JobStateV1)
        out: Form = msgspec.to_builtins(job)
        out.pop("spec")
        return out
    job = msgspec.convert(given, JobStateV1)
    out = msgspec.to_builtins(job)
    out["spec"] = spec_form(job.spec)
    return out


def read_run(form: Form) -> Form:
    out: Form = msgspec.to_builtins(msgspec.convert(form, RunState))
    return out


def read_state(form: Form) -> Form:
    return {
        "partition": form["partition"],
        "last_token": form["last_token"],
        "jobs": [read_job(j) for j in form["jobs"]],
        "runs": [read_run(r) for r in form["runs"]],
    }


def first_difference(recorded: Any, folded: Any, path: str = "") -> str | None:
    """Where two forms first differ (``jobs[3].next_slot: recorded 1, folded 2``); None if
    they are equal."""
    if isinstance(recorded, dict) and isinstance(folded, dict):
        for key in [*recorded, *(k for k in folded if k not in recorded)]:
            if key not in folded or key not in recorded:
                side = "folded" if key not in folded else "recorded"
                return f"{path}{key}: missing from the {side} form"
            found = first_difference(recorded[key], folded[key], f"{path}{key}.")
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(folded, list):
        for i, (a, b) in enumerate(zip(recorded, folded, strict=False)):
            found = first_difference(a, b, f"{path.rstrip('.')}[{i}].")
            if found is not None:
                return found
        if len(recorded) != len(folded):
            return f"{path.rstrip('.')}: {len(recorded)} entries recorded, {len(folded)} folded"
        return None
    if recorded != folded or type(recorded) is not type(folded):
        return f"{path.rstrip('.')}: recorded {recorded!r}, folded {folded!r}"
    return None


# -- the read model's answers ------------------------------------------------------------------

_PAGE = 200


def _every(listing: Callable[..., Page[V]], *args: str) -> list[V]:
    """Every item a paged listing of the read model (``model.jobs``...) gives for ``args``."""
    out: list[V] = []
    cursor = None
    while True:
        page = listing(*args, limit=_PAGE, cursor=cursor)
        out += page.items
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


def answers(model: ReadModel, tenants: list[str]) -> Form:
    """What the read model answers about each tenant: every job, each job's runs and skipped
    slots, the dead letters, the runs counted by state and the jobs counted."""
    out: Form = {"positions": {str(p): at for p, at in sorted(model.positions().items())}}
    for tenant in tenants:
        jobs = _every(model.jobs, tenant)
        dead = _every(model.runs, tenant, "dead")
        out[tenant] = {
            "jobs": [_view_form(j) for j in jobs],
            "runs": {
                j.job_id: [_view_form(r) for r in _every(model.runs_of, tenant, j.job_id)]
                for j in jobs
            },
            "skipped": {
                j.job_id: [_view_form(s) for s in model.skipped(tenant, j.job_id, _PAGE)]
                for j in jobs
            },
            "dead_letters": [r.run_id for r in dead],
            "counts": model.counts(tenant),
            "job_count": model.job_count(tenant),
        }
    return out


def _view_form(view: JobView | RunView | SkipView) -> Form:
    if isinstance(view, JobView):
        view = msgspec.structs.replace(view, spec=_whole(view.spec))
    form: Form = msgspec.to_builtins(view)
    return form


def read_answers(form: Form) -> Form:
    """Recorded answers as this build's views read them."""
    out: Form = {"positions": form["positions"]}
    for tenant, said in form.items():
        if tenant == "positions":
            continue
        out[tenant] = {
            "jobs": [_view_form(msgspec.convert(j, JobView)) for j in said["jobs"]],
            "runs": {
                job: [_view_form(msgspec.convert(r, RunView)) for r in runs]
                for job, runs in said["runs"].items()
            },
            "skipped": {
                job: [_view_form(msgspec.convert(s, SkipView)) for s in skips]
                for job, skips in said["skipped"].items()
            },
            "dead_letters": list(said["dead_letters"]),
            # a run state added since counts 0 in a model recorded before it
            "counts": {state: said["counts"].get(state, 0) for state in RUN_STATES},
            "job_count": said["job_count"],
        }
    return out
