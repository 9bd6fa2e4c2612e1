"""A partition's state, and ``evolve``: the one way it changes.

``evolve(state, event)`` folds one event into the state. It is deterministic and reads nothing
but its arguments, so replaying a partition's events from offset 0 rebuilds exactly the state
the live owner holds. For speed it updates ``state`` in place and returns it.

The canonical state is ``jobs``, ``runs`` and ``last_token``; :meth:`PartitionState.snapshot`
encodes exactly that. ``ready`` is a derived index (pull runs by pool, ordered for claiming),
rebuilt from the canonical state on load and never compared; ``later`` holds the pull runs not
due yet, by ``available_at``, until a claim moves them into ``ready``.

A job holds its definition encoded (:func:`hold_spec`) and decodes it when it is read
(``JobState.spec``), so a recovery decodes per job only the few fields the timers and counters
read; the decoded definitions read last are kept, a bounded number (:func:`held_spec`).

Runs leave ``runs`` when they succeed or are cancelled (the read model keeps history). Dead runs
stay, so they can be replayed. A run cancelled while running stays until its lease runs out, so
the worker's next heartbeat learns it was cancelled.

Jobs leave ``jobs`` too, once nothing can fire for them any more (:func:`has_ended`: cancelled,
or a one-shot that ran, or a recurring job past its ``end_at``; no live run; no dead run that
could still be replayed; no cancelled run whose lease is still out). The event that ends a job
sets its ``ended_at``; an event that revives it (a manual trigger, a replay, an update) clears
it. The partition forgets the job ``retention`` after ``ended_at`` with a ``JobForgotten`` event
of its own deciding (``core.partition``), which drops the job and the dead runs of a cancelled
job. Until then a repeated command finds the job and is answered as before.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
import operator
from typing import Any, NamedTuple, TypeVar, assert_never

import msgspec

from core.clock import Millis
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
from core.jobs import Backoff, HttpTarget, JobSpec, KafkaTarget, PullTarget

V = TypeVar("V")

# A waiting run gains one priority level per minute it waits, so priority 0 never starves.
AGEING_STEP_MS = 60_000
TRIGGER_KEYS_KEPT = 256


class JobStatus(enum.StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    CANCELLED = "cancelled"


class RunStatus(enum.StrEnum):
    BLOCKED = "blocked"  # held back by buffer_one until the live run ends
    PENDING = "pending"  # ready at available_at
    RUNNING = "running"  # a lease is out
    # its attempt's outcome is unknown and its target can say: the owner asks it (no lease)
    ASKING = "asking"
    DEAD = "dead"  # in the dead-letter list
    CANCELLED = "cancelled"  # cancelled while running; kept until its lease runs out


# State structs hold scalars, strings and flat containers: they cannot form reference cycles,
# so the garbage collector need not scan them (msgspec's "gc=False"; with 50,000 jobs the
# collector's full passes otherwise cost about 40% of a midnight herd's CPU).
#
# A job's state is what a node holds per job, a million times over, so it is kept small (see
# :func:`compact_job`): ``live`` is a tuple (the empty one is shared), and the two maps that are
# almost always empty share one empty dict until a job needs its own (``_own``); nothing but
# ``evolve`` writes them. The encoding is the same as a list's and a dict's.
#
# The definition is held encoded (``encoded_spec``, see :func:`hold_spec`): decoding a million
# of them was most of a restart, and most jobs' definitions are not read between one slot and
# the next. ``spec`` decodes it when something reads it (the job fires, changes, is shown); the
# decoded definitions of the jobs read last are kept, a bounded number (:func:`held_spec`).
# Fields at their defaults are not encoded (``omit_defaults``: a job's stored value is 5 fields
# of 13 as a rule). What is left out is decided by identity (``None``, an enum member, a small
# int, an empty container), so equal states still encode alike.
class JobState(msgspec.Struct, kw_only=True, gc=False, omit_defaults=True):
    job_id: str
    encoded_spec: bytes = msgspec.field(name="spec")  # hold_spec(the definition)
    status: JobStatus = JobStatus.ACTIVE
    version: int = 1
    registered_at: Millis
    next_slot: Millis | None = None
    anchor: Millis = 0  # an interval job's first slot
    live: tuple[str, ...] = ()  # run ids: pending, blocked or running
    blocked_run: str | None = None
    upstream: dict[str, Millis] = {}  # upstream job -> slot it succeeded for, since last trigger
    last_triggered: Millis | None = None  # the slot of the last dependency-triggered run
    trigger_keys: dict[str, str] = {}  # idempotency key of a manual trigger -> run id
    ended_at: Millis | None = None  # when nothing could fire for it any more (has_ended)

    @property
    def spec(self) -> JobSpec:
        """The job's definition, as :func:`compact_spec` gives it."""
        return held_spec(self.encoded_spec)


class JobStateV1(msgspec.Struct, kw_only=True, gc=False):
    """A job's state as builds before snapshot format 2 encoded it: the definition in place (a
    map of every field). Read from their stores and snapshots, never written
    (:func:`upgrade_job`)."""

    job_id: str
    spec: JobSpec
    status: JobStatus = JobStatus.ACTIVE
    version: int = 1
    registered_at: Millis
    next_slot: Millis | None = None
    anchor: Millis = 0
    live: tuple[str, ...] = ()
    blocked_run: str | None = None
    upstream: dict[str, Millis] = {}
    last_triggered: Millis | None = None
    trigger_keys: dict[str, str] = {}
    ended_at: Millis | None = None


def upgrade_job(old: JobStateV1) -> JobState:
    """The state a :class:`JobStateV1` stands for, its definition held as this build holds it."""
    fields = msgspec.structs.asdict(old)
    fields["encoded_spec"] = hold_spec(fields.pop("spec"))
    return compact_job(JobState(**fields))


class RunState(msgspec.Struct, kw_only=True, gc=False):
    run_id: str
    job_id: str
    tenant: str
    scheduled_for: Millis
    available_at: Millis
    priority: int
    trigger: Trigger
    status: RunStatus
    attempt: int = 1
    budget_start: int = 1  # the attempt that opened the current budget (replay resets it)
    fencing_token: int = 0
    worker_id: str | None = None
    lease_expires_at: Millis | None = None
    started_at: Millis | None = None
    last_error: str = ""
    # materialised ahead of its slot (the lead time): its start applies the misfire policy
    # that a materialisation at the slot would have (``core.decide._misfired_ahead``)
    ahead: bool = False
    # leased ahead of its start (``LeaseGranted.start_at``) and not yet reported started
    start_at: Millis | None = None
    # asking (``RunOutcomeAsked``): the ask under way, when the owner asks, and by when an
    # answer must have come
    ask: int = 0
    ask_at: Millis | None = None
    answer_by: Millis | None = None


class _Snapshot(msgspec.Struct):
    partition: int
    last_token: int
    jobs: list[JobState]
    runs: list[RunState]


class _SnapshotV1(msgspec.Struct):
    partition: int
    last_token: int
    jobs: list[JobStateV1]
    runs: list[RunState]


# The empty map every job without upstream successes or trigger keys shares; never written.
_NONE: dict[str, Any] = {}
_SHARED_MAX = 65_536
# Instants (32 bytes each) are kept once: jobs registered in one batch share their
# ``registered_at``, and jobs on the same schedule their next slot. Bounded: past it an instant
# is simply kept per job.
_instants: dict[int, int] = {}


# -- the definition, held encoded --------------------------------------------------------------
#
# ``hold_spec`` encodes a definition as a msgpack array of two: a map of the fields that differ
# from their defaults (and of the target's and the backoff's, the same way), and the payload
# document when it is an object or an array (nil otherwise: a scalar payload is a field). A
# job on the defaults is about 150 bytes where the whole definition is 500; it decodes straight
# into a ``JobSpec`` (missing fields take their defaults) with its payload left encoded, as
# ``compact_spec`` gives it. A field added to ``JobSpec`` later (with a default, as the event
# contract requires) decodes from what older builds held as that default.
#
# "Default" is exact: same type and equal, and for a float the same sign (``-0.0 == 0.0`` but
# encodes apart), so the definition decoded is the one held, field for field.


class _Layout(NamedTuple):
    tag: tuple[str, str] | None  # (tag field, tag) of a tagged struct
    names: tuple[str, ...]  # as encoded
    defaults: tuple[Any, ...]  # _REQUIRED for a field without one
    positions: range  # of the fields


_REQUIRED = object()
_layouts: dict[type, _Layout] = {}


def _layout(cls: type[msgspec.Struct]) -> _Layout:
    config = cls.__struct_config__
    tag = None if config.tag is None else (str(config.tag_field), str(config.tag))
    names, defaults = [], []
    for f in msgspec.structs.fields(cls):
        names.append(f.encode_name)
        if f.default is not msgspec.NODEFAULT:
            defaults.append(f.default)
        elif f.default_factory is not msgspec.NODEFAULT:
            defaults.append(f.default_factory())
        else:
            defaults.append(_REQUIRED)
    return _Layout(tag, tuple(names), tuple(defaults), range(len(names)))


for _cls in (JobSpec, HttpTarget, KafkaTarget, PullTarget, Backoff):
    _layouts[_cls] = _layout(_cls)
_SPEC = _layouts[JobSpec]


def _trimmed(value: msgspec.Struct, layout: _Layout) -> dict[str, Any]:
    """The fields of ``value`` that are not their defaults, the same way inside its structs.

    Run once per definition a partition folds in: the fields that are their default object
    itself (``None``, an enum member, a small int, ``()``: most of them) are passed over in C
    (``compress``), and only the others compared in Python."""
    out: dict[str, Any] = {} if layout.tag is None else {layout.tag[0]: layout.tag[1]}
    values = msgspec.structs.astuple(value)
    defaults = layout.defaults
    for i in itertools.compress(layout.positions, map(operator.is_not, values, defaults)):
        field, default = values[i], defaults[i]
        kind = type(field)
        if (
            kind is type(default)
            and field == default
            and (kind is not float or math.copysign(1.0, field) == math.copysign(1.0, default))
        ):
            continue
        inner = _layouts.get(kind)
        out[layout.names[i]] = field if inner is None else _trimmed(field, inner)
    return out


def hold_spec(spec: JobSpec) -> bytes:
    """``spec`` encoded as a job's state holds it (see above)."""
    payload = spec.payload
    if isinstance(payload, (dict, list)):
        # Nothing in the partition reads inside a payload (the executor decodes it for each
        # call: ``core.jobs.payload_of``), so it stays encoded even when the definition is read.
        document: msgspec.Raw | None = msgspec.Raw(_snapshot_encoder.encode(payload))
    elif isinstance(payload, msgspec.Raw):
        document = payload
    else:
        document = None
    fields = _trimmed(spec, _SPEC)
    if document is not None:
        fields.pop("payload", None)
    return _snapshot_encoder.encode((fields, document))


_held_decoder = msgspec.msgpack.Decoder(tuple[JobSpec, msgspec.Raw])
_NIL = msgspec.Raw(b"\xc0")


def _decode_held(data: bytes) -> JobSpec:
    spec, document = _held_decoder.decode(data)
    if document == _NIL:
        return spec
    return msgspec.structs.replace(spec, payload=document)


# The definitions decoded last, by what they were decoded from: two generations of at most
# ``SPECS_KEPT`` each, the older let go when the younger fills, so a definition read again
# within about that many others is decoded once (a job's run reads it when it fires, starts,
# and ends). Bounded, so that a million jobs that each fired once do not all stay decoded.
# Reads from several threads at once may decode a definition twice, never give a wrong one.
SPECS_KEPT = 16_384
_young: dict[bytes, JobSpec] = {}
_old: dict[bytes, JobSpec] = {}


def held_spec(data: bytes) -> JobSpec:
    """The definition ``data`` holds (:func:`hold_spec`), decoded."""
    global _young, _old
    spec = _young.get(data)
    if spec is not None:
        return spec
    spec = _old.get(data)
    if spec is None:
        spec = _decode_held(data)
    if len(_young) >= SPECS_KEPT:
        _old, _young = _young, {}
    _young[data] = spec
    return spec


def compact_spec(spec: JobSpec) -> JobSpec:
    """``spec`` as a job's state holds it and gives it back: equal to the ``spec`` of a job
    registered with it, whatever form its values came in (a payload decoded or encoded, an
    int for a float)."""
    return _decode_held(hold_spec(spec))


def _share_instant(value: Millis) -> Millis:
    kept = _instants.get(value)
    if kept is not None:
        return kept
    if len(_instants) < _SHARED_MAX:
        _instants[value] = value
    return value


def compact_job(job: JobState) -> JobState:
    """``job`` (as decoded from a store or a snapshot) holding the least memory; returns it.

    Run once per job of a recovery, a million times over: ``_share_instant`` written out."""
    if not job.upstream:
        job.upstream = _NONE
    if not job.trigger_keys:
        job.trigger_keys = _NONE
    instants = _instants
    at = job.registered_at
    kept = instants.get(at)
    if kept is not None:
        job.registered_at = kept
    elif len(instants) < _SHARED_MAX:
        instants[at] = at
    slot = job.next_slot
    if slot is not None:
        kept = instants.get(slot)
        if kept is not None:
            job.next_slot = slot = kept
        elif len(instants) < _SHARED_MAX:
            instants[slot] = slot
        if job.anchor == slot:
            job.anchor = slot
    return job


def _own(mapping: dict[str, V]) -> dict[str, V]:
    """A map ``evolve`` may write: a job's own, never the shared empty one."""
    return {} if mapping is _NONE else mapping


_snapshot_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(_Snapshot)
_snapshot_v1_decoder = msgspec.msgpack.Decoder(_SnapshotV1)


class PartitionState:
    def __init__(self, partition: int = 0) -> None:
        self.partition = partition
        self.jobs: dict[str, JobState] = {}
        self.runs: dict[str, RunState] = {}
        self.last_token = 0
        # derived: pool -> heap of (ageing key, slot, run id, attempt); entries go stale lazily
        self.ready: dict[str, list[tuple[int, int, str, int]]] = {}
        # derived: pool -> heap of (available_at, *ready entry) of runs not due when they were
        # indexed; a claim moves those due into ``ready`` (``promote_due``)
        self.later: dict[str, list[tuple[int, int, int, str, int]]] = {}
        # derived: job -> its runs in ``runs`` that are not live (dead, or cancelled while
        # running), for the few jobs that have any
        self.kept: dict[str, list[str]] = {}

    def snapshot(self) -> bytes:
        """The canonical state as bytes: equal states give equal bytes."""
        return _snapshot_encoder.encode(
            _Snapshot(
                self.partition, self.last_token, list(self.jobs.values()), list(self.runs.values())
            )
        )

    @classmethod
    def restore(cls, data: bytes, *, legacy: bool = False) -> PartitionState:
        """The state :meth:`snapshot` encoded; ``legacy``: as builds before snapshot format 2
        encoded it (:class:`JobStateV1`)."""
        snap = (_snapshot_v1_decoder if legacy else _snapshot_decoder).decode(data)
        state = cls(snap.partition)
        state.last_token = snap.last_token
        if isinstance(snap, _SnapshotV1):
            state.jobs = {j.job_id: upgrade_job(j) for j in snap.jobs}
        else:
            state.jobs = {j.job_id: compact_job(j) for j in snap.jobs}
        state.runs = {r.run_id: r for r in snap.runs}
        rebuild_index(state)
        return state

    def pool_of(self, run: RunState) -> str | None:
        job = self.jobs.get(run.job_id)
        return job.spec.pool if job is not None else None

    def is_ready_entry_live(self, entry: tuple[int, int, str, int], pool: str) -> bool:
        """Whether a ``ready`` entry of ``pool`` still names a pending run of that pool (a job
        moved to another pool leaves its runs' old entries behind)."""
        run = self.runs.get(entry[2])
        return (
            run is not None
            and run.status is RunStatus.PENDING
            and run.attempt == entry[3]
            and self.pool_of(run) == pool
        )


def ageing_key(run: RunState) -> int:
    """Smaller claims first: waiting ``AGEING_STEP_MS`` longer is worth one priority level."""
    return run.available_at - run.priority * AGEING_STEP_MS


def rebuild_index(state: PartitionState) -> None:
    """Rebuild the derived ``ready`` and ``kept`` indexes from ``jobs`` and ``runs`` (after a
    load)."""
    state.ready = {}
    state.later = {}
    state.kept = {}
    for run in state.runs.values():
        if run.status is RunStatus.PENDING:
            _index(state, run)
        job = state.jobs.get(run.job_id)
        if job is not None and run.run_id not in job.live:
            state.kept.setdefault(run.job_id, []).append(run.run_id)


def has_ended(state: PartitionState, job: JobState) -> bool:
    """Whether nothing can fire for ``job`` any more and nothing of it is live."""
    if job.live:
        return False
    kept = state.kept.get(job.job_id, ())
    if job.status is JobStatus.CANCELLED:
        # Its dead runs cannot be replayed (the job is cancelled); a cancelled run whose lease
        # is out waits for it, so the worker learns of the cancel.
        return all(state.runs[r].status is RunStatus.DEAD for r in kept)
    if job.next_slot is not None or job.spec.depends_on:
        return False
    return not kept  # a dead run can still be replayed


def ended_at(state: PartitionState, job: JobState) -> Millis | None:
    """When the job ended, None while it has not. A job that ended before its state had an
    ``ended_at`` (a store written by an earlier version) gives its registration time, the only
    instant its state holds: such a job is forgotten a retention after the upgrade's first
    start at the latest."""
    if job.ended_at is not None:
        return job.ended_at
    if job.status is JobStatus.ACTIVE and job.next_slot is not None:
        return None  # the common case, decided without looking further
    return job.registered_at if has_ended(state, job) else None


def _settle(state: PartitionState, job_id: str, at: Millis) -> None:
    job = state.jobs.get(job_id)
    if job is None:
        return
    if has_ended(state, job):
        if job.ended_at is None:
            job.ended_at = at
    elif job.ended_at is not None:
        job.ended_at = None


def _unkeep(state: PartitionState, run: RunState) -> None:
    kept = state.kept.get(run.job_id)
    if kept is not None and run.run_id in kept:
        kept.remove(run.run_id)
        if not kept:
            del state.kept[run.job_id]


def _index(state: PartitionState, run: RunState, at: Millis | None = None) -> None:
    """Index a pending run of a pool for claims: in ``ready`` if it may start at ``at`` (the
    instant of the event that made it pending), else in ``later`` by its ``available_at``, so
    that a claim does not step over the runs that are not due yet (a herd materialised ahead
    of its slot, retries backing off). ``at`` None (a rebuild): ``later``, whence the first
    claim moves what is due."""
    pool = state.pool_of(run)
    if pool is not None:
        entry = (ageing_key(run), run.scheduled_for, run.run_id, run.attempt)
        if at is not None and run.available_at <= at:
            heapq.heappush(state.ready.setdefault(pool, []), entry)
        else:
            heapq.heappush(state.later.setdefault(pool, []), (run.available_at, *entry))


def promote_due(state: PartitionState, pool: str, now: Millis) -> None:
    """Move ``pool``'s runs whose ``available_at`` came by ``now`` from ``later`` to ``ready``
    (derived indexes only: the claim order among ready runs is their ``ageing_key`` order, the
    same whichever way they came in)."""
    later = state.later.get(pool)
    if not later or later[0][0] > now:
        return
    ready = state.ready.setdefault(pool, [])
    while later and later[0][0] <= now:
        heapq.heappush(ready, heapq.heappop(later)[1:])
    if not later:
        del state.later[pool]


def _tidy_ready(state: PartitionState, pool: str) -> None:
    """Drop the stale entries at the top of ``pool``'s ready heap, and the heap once empty: a
    forgotten job's runs must not stay in the index of a pool nobody claims from any more
    (claims tidy the rest as they pop)."""
    # ``later``'s entries are ``ready``'s with their ``available_at`` in front
    for heaps, skip in ((state.ready, 0), (state.later, 1)):
        heap: list[Any] | None = heaps.get(pool)
        if heap is None:
            continue
        while heap and not state.is_ready_entry_live(heap[0][skip:], pool):
            heapq.heappop(heap)
        if not heap:
            del heaps[pool]


def _end(state: PartitionState, run: RunState, *, keep: bool) -> None:
    """The run is no longer live for its job; drop it unless it must be kept (dead, cancelling)."""
    job = state.jobs[run.job_id]
    if run.run_id in job.live:
        job.live = tuple(r for r in job.live if r != run.run_id)
    if job.blocked_run == run.run_id:
        job.blocked_run = None
    if not keep:
        _unkeep(state, run)  # a dead run that was cancelled
        del state.runs[run.run_id]
    elif run.run_id not in state.kept.get(run.job_id, ()):
        state.kept.setdefault(run.job_id, []).append(run.run_id)


def evolve(state: PartitionState, event: AnyEvent) -> PartitionState:
    match event:
        case JobRegistered():
            state.jobs[event.job_id] = JobState(
                job_id=event.job_id,
                encoded_spec=hold_spec(event.spec),
                version=event.version,
                registered_at=event.at,
                next_slot=event.next_slot,
                anchor=event.next_slot if event.next_slot is not None else event.at,
                upstream=_NONE,
                trigger_keys=_NONE,
            )
        case JobUpdated():
            job = state.jobs[event.job_id]
            old = job.spec
            if old.interval_sec != event.spec.interval_sec or (old.start_at != event.spec.start_at):
                job.anchor = event.next_slot if event.next_slot is not None else event.at
            moved = old.target != event.spec.target
            job.encoded_spec, job.version = hold_spec(event.spec), event.version
            job.next_slot = event.next_slot
            if moved:  # pending runs wait where the new target says: a pool, or the executors
                for run_id in job.live:
                    run = state.runs[run_id]
                    if run.status is RunStatus.PENDING:
                        _index(state, run, event.at)
        case JobPaused():
            job = state.jobs[event.job_id]
            job.status, job.version = JobStatus.PAUSED, event.version
        case JobResumed():
            job = state.jobs[event.job_id]
            job.status, job.version, job.next_slot = (
                JobStatus.ACTIVE,
                event.version,
                event.next_slot,
            )
        case JobCancelled():
            job = state.jobs[event.job_id]
            job.status, job.version, job.next_slot = JobStatus.CANCELLED, event.version, None
        case RunMaterialised():
            job = state.jobs[event.job_id]
            run = RunState(
                run_id=event.run_id,
                job_id=event.job_id,
                tenant=event.tenant,
                scheduled_for=event.scheduled_for,
                available_at=event.available_at,
                priority=event.priority,
                trigger=event.trigger,
                attempt=event.attempt,
                budget_start=event.attempt,
                status=RunStatus.BLOCKED if event.blocked else RunStatus.PENDING,
                ahead=event.trigger is Trigger.SCHEDULE and event.at < event.scheduled_for,
            )
            state.runs[run.run_id] = run
            job.live = (*job.live, run.run_id)
            if event.blocked:
                job.blocked_run = run.run_id
            else:
                _index(state, run, event.at)
            if event.trigger is Trigger.SCHEDULE:
                job.next_slot = event.next_slot
            elif event.trigger is Trigger.DEPENDENCY:
                job.upstream = _NONE
                job.last_triggered = event.scheduled_for
            if event.idempotency_key is not None:
                job.trigger_keys = _own(job.trigger_keys)
                job.trigger_keys[event.idempotency_key] = run.run_id
                if len(job.trigger_keys) > TRIGGER_KEYS_KEPT:
                    del job.trigger_keys[next(iter(job.trigger_keys))]
        case RunSkipped():
            state.jobs[event.job_id].next_slot = event.next_slot
        case RunReleased():
            run = state.runs[event.run_id]
            run.status, run.available_at = RunStatus.PENDING, event.available_at
            state.jobs[event.job_id].blocked_run = None
            _index(state, run, event.at)
        case LeaseGranted():
            run = state.runs[event.run_id]
            run.status, run.fencing_token = RunStatus.RUNNING, event.fencing_token
            run.worker_id, run.lease_expires_at = event.worker_id, event.lease_expires_at
            run.started_at = event.at if event.start_at is None else event.start_at
            run.start_at = event.start_at
            state.last_token = max(state.last_token, event.fencing_token)
        case RunStarted():
            run = state.runs[event.run_id]
            run.started_at, run.start_at = event.started_at, None
        case Heartbeat():
            state.runs[event.run_id].lease_expires_at = event.lease_expires_at
        case RunCompleted():
            _end(state, state.runs[event.run_id], keep=False)
        case RunFailed():
            run = state.runs[event.run_id]
            run.last_error, run.worker_id, run.lease_expires_at = event.error, None, None
            run.start_at = None
        case LeaseExpired():
            run = state.runs[event.run_id]
            if run.status is RunStatus.CANCELLED:
                _unkeep(state, run)
                del state.runs[run.run_id]
            else:
                run.last_error, run.worker_id, run.lease_expires_at = "lease expired", None, None
                run.start_at = None
        case LeaseReturned():
            run = state.runs[event.run_id]
            run.status, run.worker_id, run.lease_expires_at = RunStatus.PENDING, None, None
            run.started_at, run.start_at = None, None
            _index(state, run, event.at)
        case RunOutcomeAsked():
            run = state.runs[event.run_id]
            run.status, run.ask = RunStatus.ASKING, event.ask
            run.ask_at, run.answer_by = event.ask_at, event.answer_by
        case RunOutcomeAnswered():
            run = state.runs[event.run_id]
            run.ask_at, run.answer_by = None, None  # what follows is its own event
        case RetryScheduled():
            run = state.runs[event.run_id]
            run.status, run.attempt, run.available_at = (
                RunStatus.PENDING,
                event.attempt,
                event.available_at,
            )
            run.ask = 0
            _index(state, run, event.at)
        case RunDeadLettered():
            run = state.runs[event.run_id]
            run.status, run.last_error = RunStatus.DEAD, event.error
            run.worker_id, run.lease_expires_at = None, None
            _end(state, run, keep=True)
        case RunCancelled():
            run = state.runs[event.run_id]
            run.status = RunStatus.CANCELLED
            _end(state, run, keep=event.was_running)
            if event.reason is CancelReason.WITHDRAWN:  # taken back before its slot came
                state.jobs[event.job_id].next_slot = event.next_slot
        case RunReplayed():
            run = state.runs[event.run_id]
            run.status, run.attempt, run.budget_start = (
                RunStatus.PENDING,
                event.attempt,
                event.attempt,
            )
            run.available_at, run.last_error, run.ask = event.available_at, "", 0
            job = state.jobs[event.job_id]
            job.live = (*job.live, run.run_id)
            _unkeep(state, run)
            _index(state, run, event.at)
        case UpstreamRecorded():
            job = state.jobs[event.job_id]
            job.upstream = _own(job.upstream)
            job.upstream[event.upstream_job_id] = max(
                event.scheduled_for, job.upstream.get(event.upstream_job_id, event.scheduled_for)
            )
        case JobForgotten():
            for run_id in state.kept.pop(event.job_id, ()):
                del state.runs[run_id]
            pool = state.jobs.pop(event.job_id).spec.pool
            if pool is not None:
                _tidy_ready(state, pool)
            return state
        case _:
            assert_never(event)  # a new event must be folded here, or replay would drop it
    _settle(state, event.job_id, event.at)
    return state


def replay(events: list[AnyEvent], partition: int = 0) -> PartitionState:
    state = PartitionState(partition)
    for event in events:
        evolve(state, event)
    return state
