"""One partition's behaviour, whole and pure: its state, the timers that state needs, and the
loop every driver runs — decide, fold, arm the timers.

The node's runner, the core tests' harness and the API tests' fake all drive this object, so
there is one place where a decision becomes state and timers::

    p = Partition(3, now)                          # or Partition.restore(snapshot, now)
    p.handle(PutJob(...), now)                     # decide, fold, arm: the decided events
    p.advance(now)                                 # timers whose deadline passed are now due
    while (key := p.next_due()) is not None:
        if key[0] == "ready":                      # a push run may start: the driver decides
            ...                                    # whether there is room (StartRun)
        elif key[0] == "ask":                      # a run's target is to be asked (the
            ...                                    # driver's executors: AnswerOutcome)
        else:
            p.fire(key, now)                       # SlotDue / LeaseDue / AnswerDue / ForgetDue
    p.next_deadline()                              # when to look again

It reads no clock (``now`` is an argument) and does no I/O; appending the events durably is the
driver's business, which is why ``handle`` returns them. A refused command raises its
``core.errors`` error and changes nothing.

A job that ended (``core.state.has_ended``) is forgotten ``retention_ms`` after it ended: a
``("forget", job_id)`` timer decides ``ForgetDue``, which appends ``JobForgotten`` if the job is
still over. The retention is a setting, not state: it only says when that decision is taken,
and replaying the log folds what was decided, whatever the setting is now.

**Lead time.** With ``lead_ms`` set, a job with no live run has its slot timer armed
``lead_ms`` before its next slot, and firing it decides ``SlotDue`` with ``through = now +
lead_ms``: the run is materialised ahead of its slot, pending until its ``available_at`` (the
slot plus jitter), and at the slot only its start is left (a lease and the dispatch). A job
with a run live keeps its timer at the slot (the overlap policy decides then); when its last
live run ends the timer moves back to the lead time before the next slot. Like the retention,
the lead is a setting, not state: it says when a decision is taken, and a restored partition
arms its timers by the lead it is given. 0 (the default) decides every slot at the slot.

**Calls armed ahead.** With ``arm_ms`` set, a push run's ``ready`` timer comes due
``arm_ms`` before its ``available_at``, and the driver's ``StartRun`` reaches that far
(``horizon_ms``): the lease is granted ahead, counting from ``available_at`` (its
``start_at``), and the executor makes the call at that instant on its own timer. Like the lead,
a setting, not state. The arming time is also the reach under ``allow`` of a push job that
is not critical (``core.jobs.reach_ahead_ms``): its next slot is materialised ahead once its
latest run is within the arming time of its start (``SlotDue.reach_ms``), so a job due more
often than that keeps its calls armed that far ahead of now. With ``kafka_at_slot`` set (a
cluster whose runner produces ``kafka://`` runs in the events' own transaction,
``node.produced``) a Kafka target's run is not armed ahead: its lease, its success and its
record are decided together at its start.

``snapshot()`` gives the canonical state as bytes with a format version in front, and
``restore()`` takes them back (rebuilding every timer from the state): a snapshot of a state
equals the snapshot of the state that replaying its events gives.

**Parked slots.** A partition built from a state (a recovery, a restore) arms every timer the
state calls for, but a job's slot further away than two ``park_ms`` spans (10 minutes each by
default) is not put in the wheel yet: its job id waits in the list of the span its slot falls
in, one reference per job instead of a wheel timer (a key, a packed deadline, two map entries:
about 190 bytes and a microsecond and a half each, for a million jobs whose next slot is hours
or years away). A span is ``park_ms`` long for a slot less than a day away and a whole day
(UTC) for a farther one, so that slots strewn over years share lists too. ``advance`` takes a
span's jobs into the wheel ``park_ms`` before the span begins, so each is in the wheel at least
that long before its slot, and ``next_deadline`` wakes the driver for that. A parked job's
deadline is not kept: taken in, its slot timer is derived from the state as it stands then
(``core.timers.slot_timer``), unless the wheel holds one already, which a later event armed and
which is therefore newer. So whatever was folded meanwhile (a pause, an update, the job
forgotten), the timer armed is the one the state calls for. It keeps the arming number it would
have had (``TimingWheel.reserve``), so it fires among equal deadlines where it would have: a
restored partition decides exactly what a partition with every timer armed decides
(``tests/core/test_partition.py``). Only the building parks: a timer armed afterwards goes to
the wheel, however far.
"""

from __future__ import annotations

import heapq
from array import array
from typing import Any

from core import events as ev
from core.clock import Millis
from core.commands import AnswerDue, AnyCommand, ForgetDue, LeaseDue, SlotDue
from core.decide import MAX_HORIZON_MS, decide
from core.errors import CronlogError, InvalidDefinition
from core.ids import SEPARATOR
from core.jobs import KafkaTarget
from core.state import JobStatus, PartitionState, ended_at, evolve
from core.timers import TimerKey, forget_timer, run_timers, slot_timer, timers_after
from core.turns import Turns
from core.wheel import TimingWheel

MAX_ARM_MS = MAX_HORIZON_MS  # a call is armed at most this far ahead of its start
# Slots of one job a hand-over's last batch materialises at most (``Partition.arm_ahead``): the
# reach stops it sooner, a slot a second within a 2 s arming time being three.
MAX_AHEAD_PER_JOB = 64

# 2: a job's definition held encoded (``core.state.hold_spec``). Format 1 (the definition as a
# map in place) is still read, and its jobs converted (``core.state.JobStateV1``).
SNAPSHOT_FORMAT = 2
READABLE_SNAPSHOT_FORMATS = (1, 2)
# How long a job that ended stays known: a repeated request within it (a create, a cancel, a
# trigger) is answered from the job; after it the job is history only (docs/architecture.md).
DEFAULT_RETENTION_MS = 24 * 3_600_000
# The span of the parked slots' lists (module docstring): a slot at least one span and at most
# two away is in the wheel; a farther one waits in its span's list.
DEFAULT_PARK_MS = 600_000
# The node's lead time unless told (``cronlog serve --lead-time``); a Partition built without
# one decides every slot at the slot. Long enough for a herd's materialisation to be done by
# its slot (50,000 runs took more than 10 s on a busy 2-core machine, bench/results/perfherd.md),
# short enough that a pause or a schedule change seldom has a run to withdraw.
DEFAULT_LEAD_MS = 30_000
DEFAULT_ARM_MS = 2_000  # a node arms a push run's call this long before its start
# The longest lead time: well inside a parked span, so a parked slot enters the wheel before
# its lead time begins.
MAX_LEAD_MS = 300_000
_DAY_MS = 86_400_000  # the span of a slot a day or more away


class Partition:
    def __init__(
        self,
        number: int,
        now: Millis,
        state: PartitionState | None = None,
        *,
        tick_ms: int = 10,
        wheel_size: int = 512,
        retention_ms: int = DEFAULT_RETENTION_MS,
        park_ms: int = DEFAULT_PARK_MS,
        lead_ms: int = 0,
        arm_ms: int = 0,
        kafka_at_slot: bool = False,
    ) -> None:
        if not 0 <= lead_ms <= MAX_LEAD_MS:
            raise ValueError(f"lead_ms must be between 0 and {MAX_LEAD_MS}, got {lead_ms}")
        if not 0 <= arm_ms <= MAX_ARM_MS:
            raise ValueError(f"arm_ms must be between 0 and {MAX_ARM_MS}, got {arm_ms}")
        if retention_ms < 0:
            raise ValueError(f"retention_ms must not be negative, got {retention_ms}")
        if park_ms < 0:
            raise ValueError(f"park_ms must not be negative, got {park_ms}")
        self.number = number
        self.retention_ms = retention_ms
        self.lead_ms = lead_ms
        self.arm_ms = arm_ms
        self.kafka_at_slot = kafka_at_slot
        self.state = state if state is not None else PartitionState(number)
        self.wheel: TimingWheel[TimerKey] = TimingWheel(now, tick_ms=tick_ms, wheel_size=wheel_size)
        # Timers that came due, (deadline, key), each team's in the order they came due and the
        # teams in turn (core.turns): one team's 40,000 midnight slots are decided a batch at a
        # time, and another team's slot due meanwhile goes in the next batch, not after them.
        self._due: Turns[tuple[Millis, TimerKey]] = Turns()
        self._park_ms = park_ms  # 0: nothing is parked
        # when a span's jobs enter the wheel -> its jobs, and the arming number each would have had
        self._parked: dict[int, tuple[list[str], array[int]]] = {}
        self._takes: list[int] = []  # heap of the instants in ``_parked``
        self._arm_all(now)

    def _arm_all(self, now: Millis) -> None:
        """Every timer the state calls for (``core.timers.all_timers``), far slots parked.

        The same timers as ``all_timers`` gives, in its order, written out for the jobs: it
        runs once per job of a recovery, a million times over."""
        state, retention, park, lead = self.state, self.retention_ms, self._park_ms, self.lead_ms
        parked = self._parked
        active = JobStatus.ACTIVE
        for job in state.jobs.values():
            slot = job.next_slot
            if slot is not None and job.status is active:
                if lead and not job.live:  # as ``core.timers.slot_timer`` arms it
                    slot -= lead
                elif lead:  # live runs: what the overlap policy allows is slot_timer's to say
                    slot = slot_timer(state, job.job_id, lead, self.arm_ms)[1] or slot
                take = now  # not parked
                if park:
                    take = slot - slot % (park if slot - now < _DAY_MS else _DAY_MS) - park
                if take > now:
                    waiting = parked.get(take)
                    if waiting is None:
                        waiting = parked[take] = ([], array("q"))
                    waiting[0].append(job.job_id)
                    waiting[1].append(self.wheel.reserve())
                else:
                    self._arm(("slot", job.job_id), slot)
                if job.ended_at is None:
                    continue  # active with a next slot: it has not ended (``ended_at``)
            ended = ended_at(state, job)
            if ended is not None:
                self._arm(("forget", job.job_id), ended + retention)
        self._takes = list(parked)
        heapq.heapify(self._takes)
        for key, deadline in run_timers(state):
            self._arm(key, deadline)

    # -- deciding ------------------------------------------------------------------------------

    def handle(self, command: AnyCommand, now: Millis) -> list[ev.AnyEvent]:
        """Decide ``command`` at ``now`` and fold what it decided; the events, to append."""
        events = decide(self.state, command, now)
        for event in events:
            self.fold(event)
        return events

    def fold(self, event: ev.AnyEvent) -> None:
        """Fold one event in and change the timers it calls for (replay uses this too)."""
        evolve(self.state, event)
        changes = timers_after(self.state, event, self.lead_ms, self.arm_ms)
        changes.append(forget_timer(self.state, event.job_id, self.retention_ms))
        for key, deadline in changes:
            if deadline is None:
                self.wheel.cancel(key)
                # A due key stays queued: firing it decides against the state, which refuses.
            else:
                self._arm(key, deadline)

    def arm_ahead(self, now: Millis) -> list[ev.AnyEvent]:
        """A graceful hand-over's last batch: the next slots of each critical push job under
        ``allow`` within the arming time of ``now`` materialised, as every other push job's
        are (``core.jobs.reach_ahead_ms``), so their ``ready`` timers come due and the calls
        are armed here. A node that hands its partitions over and then drains makes those
        calls at their slots, while the next owner takes over; a node killed instead never
        gets here, which is why a critical job keeps one call armed otherwise. The events,
        folded, to append; none without an arming time."""
        if not self.arm_ms:
            return []
        through = now + self.arm_ms
        state = self.state
        due = {run.job_id for run in state.runs.values() if run.scheduled_for <= through}
        events: list[ev.AnyEvent] = []
        for job_id in sorted(due):
            job = state.jobs.get(job_id)
            if job is None or not job.spec.critical or job.spec.pool is not None:
                continue
            if self.kafka_at_slot and isinstance(job.spec.target, KafkaTarget):
                continue  # produced in the events' transaction at its start, never armed
            command = SlotDue(job_id=job_id, through=through, reach_ms=self.arm_ms, critical=True)
            for _ in range(MAX_AHEAD_PER_JOB):  # one slot a decision, within the reach
                try:
                    decided = self.handle(command, now)
                except CronlogError:
                    break
                if not decided:
                    break
                events += decided
        return events

    def fire(self, key: TimerKey, now: Millis) -> list[ev.AnyEvent]:
        """Decide a slot, lease, answer or forget timer that came due. A timer can lose a race
        with a request (the job was paused, the run completed): then nothing is decided."""
        kind, ident = key
        command: AnyCommand
        if kind == "slot":
            command = SlotDue(
                job_id=ident,
                through=now + self.lead_ms if self.lead_ms else None,
                reach_ms=self.arm_ms,
            )
        elif kind == "lease":
            command = LeaseDue(run_id=ident)
        elif kind == "answer":
            command = AnswerDue(run_id=ident)
        elif kind == "forget":
            command = ForgetDue(job_id=ident, retention_ms=self.retention_ms)
        else:
            raise ValueError(f"a {kind!r} timer is the driver's to act on, not a command")
        try:
            return self.handle(command, now)
        except CronlogError:
            return []

    # -- time ----------------------------------------------------------------------------------

    def advance(self, now: Millis) -> None:
        """Move the wheel to ``now``: every timer whose deadline passed becomes due."""
        takes = self._takes
        if takes and takes[0] <= now:
            self._take_parked(now)
        for deadline, key in self.wheel.advance(now):
            self._came_due(deadline, key)

    def _take_parked(self, now: Millis) -> None:
        """Arm the parked slots of every span that begins within ``park_ms`` of ``now``."""
        takes, wheel, state = self._takes, self.wheel, self.state
        while takes and takes[0] <= now:
            jobs, armings = self._parked.pop(heapq.heappop(takes))
            for job_id, arming in zip(jobs, armings, strict=True):
                key: TimerKey = ("slot", job_id)
                if key in wheel:
                    continue  # armed by an event folded since: newer than the parked one
                _, deadline = slot_timer(state, job_id, self.lead_ms, self.arm_ms)
                if deadline is not None and not wheel.add(key, deadline, arming):
                    self._came_due(deadline, key)

    def parked(self) -> dict[str, int]:
        """The jobs whose slot timer is parked, each with the instant it will be armed by."""
        return {job_id: take for take, (jobs, _) in self._parked.items() for job_id in jobs}

    def next_due(self) -> TimerKey | None:
        """The next timer that came due, each team's oldest first and the teams in turn (None
        when none is)."""
        return self._due.popleft()[1] if self._due else None

    def take_due(self) -> tuple[Millis, TimerKey] | None:
        """:meth:`next_due` with the timer's deadline."""
        return self._due.popleft() if self._due else None

    def due_count(self) -> int:
        """Timers that came due and are not decided yet."""
        return len(self._due)

    def overdue_since(self) -> Millis | None:
        """The deadline of the oldest timer that came due and is not decided yet (None when
        every due timer is decided): how far behind its timers the partition is."""
        return min((deadline for deadline, _ in self._due.heads()), default=None)

    def has_due(self) -> bool:
        return bool(self._due)

    def next_deadline(self) -> Millis | None:
        """When to advance next: the earliest armed deadline not yet due, or, when sooner, the
        moment parked slots are to be armed."""
        deadline = self.wheel.next_deadline()
        if self._takes:
            take = self._takes[0]
            if deadline is None or take < deadline:
                return take
        return deadline

    def _arm(self, key: TimerKey, deadline: Millis) -> None:
        # A push run's start is decided its arming time ahead; a kafka:// run produced in the
        # events' transaction at its start (its job looked up only where that can differ).
        if (
            key[0] == "ready"
            and self.arm_ms
            and not (self.kafka_at_slot and self._produced(key[1]))
        ):
            deadline -= self.arm_ms
        if not self.wheel.add(key, deadline):  # already due
            self._came_due(deadline, key)

    def _produced(self, run_id: str) -> bool:
        """Whether the run's target is a Kafka topic (produced in the events' transaction)."""
        run = self.state.runs.get(run_id)
        job = self.state.jobs.get(run.job_id) if run is not None else None
        return job is not None and isinstance(job.spec.target, KafkaTarget)

    def _came_due(self, deadline: Millis, key: TimerKey) -> None:
        # The team is the job id's scope (core.ids); a job from before ids were scoped is a
        # scope of its own.
        self._due.append(key[1].partition(SEPARATOR)[0], (deadline, key))

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The canonical state as bytes, behind a format version (equal states, equal bytes)."""
        return bytes([SNAPSHOT_FORMAT]) + self.state.snapshot()

    @classmethod
    def restore(cls, data: bytes, now: Millis, **settings: Any) -> Partition:
        """The partition a snapshot describes, its timers armed as of ``now``."""
        if not data or data[0] not in READABLE_SNAPSHOT_FORMATS:
            found = data[0] if data else None
            raise InvalidDefinition(
                "snapshot",
                f"format {found} is not one this build reads ({READABLE_SNAPSHOT_FORMATS})",
            )
        state = PartitionState.restore(data[1:], legacy=data[0] == 1)
        return cls(state.partition, now, state, **settings)
