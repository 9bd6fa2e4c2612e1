"""The scenario the log corpus is recorded from: every kind of event, written by the node's own
parts to a real embedded log, on a fake clock.

:class:`Owner` is what a node is to its partitions, without threads: it owns every partition
of the log (a member of the log's group), holds one :class:`core.partition.Partition` each,
appends every decided event through the partition's writer, and fires the timers that come
due as the fake clock moves, at their own deadlines, the way a punctual node's runner does
(``tests/core/harness.py`` does the same for one partition in memory). The same code decides
and folds as in the node (``Partition.handle`` / ``fire``), so the log is the one a node would
have written for these requests.

:func:`play` is the scenario: six jobs of two teams (cron, interval, one-shot, dependency;
pull, HTTP and Kafka targets; the overlap policies; a critical job) and the requests that
make every event kind happen, the fields added to events since the first build given values
other than their defaults (a lease of a manual run, a lease granted ahead, a run withdrawn, a
run completed by asking its target).
:func:`missing_kinds` says which kinds of ``core.events.AnyEvent`` a log lacks: the recorder
refuses to write a corpus that lacks one, so a new kind of event must be added here.
"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from typing import Any

from core import commands
from core import events as ev
from core.clock import FakeClock, Millis
from core.commands import (
    AnyCommand,
    CancelJob,
    CancelRun,
    ClaimRuns,
    CompleteRun,
    HeartbeatRun,
    Outcome,
    PauseJob,
    PutJob,
    ReplayRun,
    ResumeJob,
    StartRun,
    TriggerRun,
    UpstreamSucceeded,
)
from core.jobs import Backoff, HttpTarget, JobSpec, KafkaTarget, PullTarget
from core.partition import Partition
from eventlog.port import EventLog, partition_for
from node.node import routing_key
from projections.decoding import KINDS

START = int(datetime(2026, 3, 1, tzinfo=UTC).timestamp() * 1000)
LEAD_MS = 30_000
RETENTION_MS = 600_000
POOL = "p"
# Whether the core this runs with grants leases ahead (events schema 5): the scenario also runs
# on an earlier build's checkout, to record what that build wrote (tests/corpus/record_older.sh).
_LEASES_AHEAD = "horizon_ms" in ClaimRuns.__struct_fields__
# Whether a critical run's target is asked what became of an attempt (events schema 6).
_ASKS = "status_url" in HttpTarget.__struct_fields__
# Whether a lease no worker received is given back (events schema 7).
_RETURNS = hasattr(commands, "ReturnLease")
# Whether it materialises runs a lead time ahead (events schema 4): if not, every slot at its slot.
_HAS_LEAD = "lead_ms" in inspect.signature(Partition).parameters
LEAD: dict[str, Any] = {"lead_ms": LEAD_MS} if _HAS_LEAD else {}


def kinds() -> list[str]:
    """Every event kind this build knows (``core.events.AnyEvent``), by tag."""
    return sorted(KINDS)


def missing_kinds(seen: set[str]) -> list[str]:
    return [k for k in kinds() if k not in seen]


class _Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


class Owner:
    """Every partition of ``log``, decided in this thread at the fake clock's time."""

    def __init__(self, log: EventLog, clock: FakeClock) -> None:
        self.log = log
        self.clock = clock
        self.member = log.join(_Quiet())
        for _ in range(1000):
            if len(self.member.owned()) == log.num_partitions:
                break
            self.member.poll(0.01)
        if len(self.member.owned()) != log.num_partitions:
            raise RuntimeError("the recorder never came to own every partition")
        now = clock.now_ms()
        self.partitions = [
            Partition(p, now, tick_ms=10, wheel_size=64, retention_ms=RETENTION_MS, **LEAD)
            for p in range(log.num_partitions)
        ]
        self.ready: list[str] = []  # push runs whose start came (a node's executors start them)
        self.asks: list[str] = []  # runs whose target is to be asked (a node's executors ask)
        self.seen: set[str] = set()

    @property
    def now(self) -> Millis:
        return self.clock.now_ms()

    def partition_of(self, job_id: str) -> int:
        return partition_for(job_id, self.log.num_partitions)

    def do(self, command: AnyCommand, partition: int | None = None) -> list[ev.AnyEvent]:
        """Decide ``command`` on its job's partition, as the node routes it (or on
        ``partition``), append what it decided, and fire the timers that came due."""
        if partition is None:
            partition = self.partition_of(routing_key(command))
        events = self.partitions[partition].handle(command, self.now)
        self._append(partition, events)
        self._drain()
        return events

    def claim(self, tenant: str, limit: int = 1, horizon_ms: Millis = 0) -> list[ev.LeaseGranted]:
        """A pull worker's claim, asked of every partition in turn as a node's claim does."""
        leases: list[ev.LeaseGranted] = []
        reach = {"horizon_ms": horizon_ms} if horizon_ms else {}
        for p in range(self.log.num_partitions):
            if len(leases) >= limit:
                break
            got = self.do(
                ClaimRuns(
                    tenant=tenant,
                    pool=POOL,
                    worker_id="worker-1",
                    limit=limit - len(leases),
                    **reach,
                ),
                partition=p,
            )
            leases += [e for e in got if isinstance(e, ev.LeaseGranted)]
        return leases

    def start_ready(self) -> list[ev.LeaseGranted]:
        """The node's executors lease every push run whose start came."""
        leases: list[ev.LeaseGranted] = []
        while self.ready:
            got = self.do(StartRun(run_id=self.ready.pop(0), worker_id="node-1/executor"))
            leases += [e for e in got if isinstance(e, ev.LeaseGranted)]
        return leases

    def advance(self, ms: Millis) -> None:
        """Let ``ms`` pass, each timer firing at its own deadline."""
        target = self.now + ms
        while True:
            deadlines = [d for p in self.partitions if (d := p.next_deadline()) is not None]
            if not deadlines or min(deadlines) > target:
                break
            self.clock.set(max(min(deadlines), self.now))
            self._tick()
        self.clock.set(target)
        self._tick()

    def jump(self, ms: Millis) -> None:
        """Let ``ms`` pass with the node down: every timer fires late, at the new time."""
        self.clock.advance(ms)
        self._tick()

    def _tick(self) -> None:
        for partition in self.partitions:
            partition.advance(self.now)
        self._drain()

    def _append(self, partition: int, events: list[ev.AnyEvent]) -> None:
        if events:
            self.member.writer(partition).append([ev.encode(e) for e in events])
            self.seen.update(type(e).__name__ for e in events)

    def _drain(self) -> None:
        for number, partition in enumerate(self.partitions):
            while (key := partition.next_due()) is not None:
                kind, ident = key
                if kind == "ask":
                    self.asks.append(ident)
                elif kind != "ready":
                    self._append(number, partition.fire(key, self.now))
                elif ident not in self.ready:
                    self.ready.append(ident)

    def close(self) -> None:
        self.member.close()


def _pull(name: str, tenant: str, **kw: object) -> JobSpec:
    kw.setdefault("target", PullTarget(pool=POOL))
    return JobSpec(
        name=name,
        tenant=tenant,
        backoff=Backoff(base_sec=5, factor=2, cap_sec=60, jitter=False),
        **kw,  # type: ignore[arg-type]
    )


JOBS: dict[str, JobSpec] = {
    "t1/report": _pull(
        "report", "t1", schedule="* * * * *", overlap_policy="buffer_one", max_attempts=2,
        tags=("daily", "env:prod"), payload={"report": "daily", "n": [1, 2.5, None]},
    ),
    "t1/hook": _pull(
        "hook", "t1", interval_sec=120.0, critical=True, max_attempts=3,
        target=HttpTarget(url="https://example.com/hook", headers={"X-Team": "t1"}),
    ),
    "t2/sync": _pull("sync", "t2", interval_sec=60.0, overlap_policy="skip", priority=8),
    "t2/after": _pull("after", "t2", depends_on=("t2/sync",)),
    "t2/latest": _pull("latest", "t2", schedule="*/2 * * * *", overlap_policy="cancel_other"),
    "t2/once": _pull("once", "t2", run_at=START + 300_000, target=KafkaTarget(topic="out")),
    "t1/temp": _pull("temp", "t1", schedule="*/5 * * * *", misfire_policy="skip"),
}  # fmt: skip


def _finish(owner: Owner, lease: ev.LeaseGranted, outcome: Outcome, **kw: object) -> None:
    owner.do(
        CompleteRun(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            outcome=outcome,
            error="" if outcome is Outcome.SUCCEEDED else "exit 1",
            **kw,  # type: ignore[arg-type]
        )
    )


def _ask(owner: Owner) -> None:
    """A critical call that timed out, its target asked: "in progress", then "succeeded"."""
    # imported here: an earlier build's core, which this scenario also runs on, has neither
    from core.commands import AnswerOutcome
    from core.events import OutcomeAnswer

    target = HttpTarget(url="https://example.com/pay", status_url="https://example.com/status")
    spec = _pull("pay", "t1", run_at=owner.now, critical=True, target=target)
    owner.do(PutJob(job_id="t1/pay", spec=spec))
    for lease in owner.start_ready():
        _finish(owner, lease, Outcome.FAILED, ambiguous=True)  # asked about, not set aside
        for ask, answer in ((1, OutcomeAnswer.IN_PROGRESS), (2, OutcomeAnswer.SUCCEEDED)):
            owner.advance(2_000)
            owner.asks.clear()
            owner.do(
                AnswerOutcome(
                    run_id=lease.run_id,
                    fencing_token=lease.fencing_token,
                    ask=ask,
                    answer=answer,
                    status=200 if answer is OutcomeAnswer.SUCCEEDED else None,
                )
            )


def play(owner: Owner) -> None:
    """The scenario (see the module docstring). Deterministic: the same build writes the same
    log."""
    for job_id, spec in JOBS.items():
        owner.do(PutJob(job_id=job_id, spec=spec))
    # A lease granted ahead of its run's start, the start reported late by a heartbeat (a build
    # before leases granted ahead, run by tests/corpus/record_older.sh, claims at the start).
    owner.advance(LEAD_MS)
    ahead = owner.claim("t1", horizon_ms=LEAD_MS) if _LEASES_AHEAD else []
    owner.advance(LEAD_MS + 2_000)
    for lease in ahead if _LEASES_AHEAD else owner.claim("t1"):
        late = {"started_late_ms": 2_000} if _LEASES_AHEAD else {}
        owner.do(
            HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token, **late)  # type: ignore[arg-type]
        )
        _finish(owner, lease, Outcome.SUCCEEDED)
    # Runs of both teams: one succeeds, one fails into a retry, one is left to its lease.
    owner.advance(LEAD_MS)
    first = owner.claim("t2", limit=2)
    report = owner.claim("t1")
    for lease in first[:1]:
        _finish(owner, lease, Outcome.SUCCEEDED)
        owner.do(
            UpstreamSucceeded(
                job_id="t2/after", upstream_job_id=lease.job_id, scheduled_for=lease.scheduled_for
            )
        )
    owner.advance(40_000)  # the report's next slot comes while it runs: held back (buffer_one)
    for lease in report:
        owner.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token))
        _finish(owner, lease, Outcome.FAILED)  # the held-back run is released
    owner.advance(60_000)
    for lease in owner.claim("t2", limit=4):  # left running: the leases run out
        if lease.job_id == "t2/sync":
            owner.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token))
    owner.advance(120_000)  # sync's next slot is skipped (overlap), latest's is cancelled
    # Push runs: the hook's calls, the one-shot's record, the critical call that timed out.
    owner.advance(60_000)
    for lease in owner.start_ready():
        if lease.job_id == "t1/hook":
            _finish(owner, lease, Outcome.FAILED, ambiguous=True)  # set aside: outcome unknown
        else:
            _finish(owner, lease, Outcome.SUCCEEDED)
    # Pull runs until one is dead (attempts exhausted), replayed and done.
    for _ in range(6):
        for lease in owner.claim("t1", limit=3) + owner.claim("t2", limit=3):
            failing = lease.job_id in ("t1/report", "t2/after")  # exhausted; permanent
            outcome = Outcome.FAILED if failing else Outcome.SUCCEEDED
            _finish(owner, lease, outcome, permanent=lease.job_id == "t2/after")
        owner.advance(15_000)
    dead = [r for p in owner.partitions for r in p.state.runs.values() if r.status == "dead"]
    for run in dead:
        owner.do(ReplayRun(run_id=run.run_id, tenant=run.tenant))
    # A manual run with an idempotency key, leased (its lease says what made it) and cancelled.
    owner.do(TriggerRun(job_id="t1/report", tenant="t1", idempotency_key="by-hand-1"))
    manual = owner.claim("t1", limit=4)
    if _RETURNS and manual:  # one lease's answer reached no worker: given back, leased anew
        lost = manual[0]
        owner.do(commands.ReturnLease(run_id=lost.run_id, fencing_token=lost.fencing_token))
        manual = manual[1:] + owner.claim("t1")
    for lease in manual:
        _finish(owner, lease, Outcome.SUCCEEDED)
    owner.do(TriggerRun(job_id="t2/sync", tenant="t2", idempotency_key="by-hand-2"))
    pending = [r for p in owner.partitions for r in p.state.runs.values() if r.job_id == "t2/sync"]
    for run in pending[-1:]:
        owner.do(CancelRun(run_id=run.run_id, tenant=run.tenant))
    # The temporary job: changed, paused (its run materialised ahead is withdrawn), resumed,
    # cancelled and, a retention later, forgotten.
    owner.advance(4 * 60_000 + 45_000)  # the temp job's run is materialised ahead of 00:15
    owner.do(PutJob(job_id="t1/temp", spec=_pull("temp", "t1", schedule="*/5 * * * *", priority=2)))
    owner.do(PauseJob(job_id="t1/temp", tenant="t1"))
    owner.advance(5 * 60_000)
    owner.do(ResumeJob(job_id="t1/temp", tenant="t1"))
    owner.do(CancelJob(job_id="t1/temp", tenant="t1"))
    # The node is down for ten minutes: slots are missed (misfire) and the retention passes.
    owner.jump(10 * 60_000)
    for lease in owner.claim("t1", limit=8) + owner.claim("t2", limit=8) + owner.start_ready():
        _finish(owner, lease, Outcome.SUCCEEDED)
    if _ASKS:
        _ask(owner)
    owner.advance(RETENTION_MS)
