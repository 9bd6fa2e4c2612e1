"""The checker: what a chaos run's history must satisfy, and the figures it reports.

:func:`check` is pure: it takes a :class:`History` (the events topic as an independent
``read_committed`` client read it, the target's and the workers' records, which creates were
acknowledged, the faults log, the nodes' answers) and returns a :class:`Report`. Gathering the
history is :mod:`tools.chaos.gather`'s job. The events are read as the public contract
(``docs/events.md``) describes them, as plain JSON: nothing of cronlog's own code decodes or
folds them here, so a bug in cronlog's fold cannot hide itself.

What must hold (a violation of any is a failed run):

1. ``acknowledged_job_lost``: every create answered 201/200 has a ``JobRegistered``.
2. ``slot_never_run``: every slot of every registered job in the window (a cron job's slots
   from its first to the window's end; a one-shot's instant) was materialised or skipped.
3. ``slot_two_outcomes`` / ``run_materialised_twice``: no slot was materialised twice, or both
   materialised and skipped (a run withdrawn before its slot, ``RunCancelled`` with reason
   ``withdrawn``, counts as never materialised).
4. ``run_without_outcome``: after the drain every materialised run of the window has exactly
   one terminal event: ``RunCompleted``, ``RunDeadLettered`` with a reason, or ``RunCancelled``
   (``run_two_outcomes`` if more than one); a skip has its reason.
5. ``lease_overlap``: no lease of a run is granted while an earlier one is live (granted and
   not yet ended by a completion, a failure or an expiry), and tokens strictly increase per run
   and per partition (``token_not_increasing``).
6. ``stale_completion_accepted`` / ``stale_heartbeat_accepted``: a completion or heartbeat is
   recorded only with the live lease's token, before that lease's expiry is in the log (a
   lease is live until its ``LeaseExpired`` is decided, not merely until its instant: while no
   other lease exists, its holder's word is still the truth); ``lease_expired_early``: an
   expiry only after its instant (by the deciding clock). ``completion_not_recorded``: a
   worker's completion answered 200 is in the log with its token.
7. ``delivery_without_lease`` / ``token_delivered_twice`` / ``success_without_delivery``: each
   delivery (a call at the target, a work item at a worker) carries the token of a lease in
   the log, once; a push or pull run that succeeded was delivered with the succeeding token.
   ``withdrawn_run_delivered``: no run the log withdrew (leased or armed ahead, then taken back
   by a pause or a schedule change) was delivered.
8. ``critical_delivered_twice``: a critical slot is delivered again only after an attempt that
   definitely failed (the target answered 5xx, recorded as a non-ambiguous failure).
9. ``fired_early``: no delivery arrives before its slot by more than the clock lead of the node
   that decided its lease (0 for a node with a true clock; see ``docs/reliability.md``).
10. ``slot_skipped_misfire``: no slot was skipped as a misfire: the fault model never leaves a
    partition without a running owner for the jobs' misfire grace (60 s), so such a skip means
    a partition was dark.
11. ``never_on_time_again``: after each fault, every-second jobs fire on time again before the
    window ends.
12. ``projection_differs``: each node's API shows every run of the window in the state its
    events give (state, dead reason, attempts with their outcomes).
13. ``partition_not_running``: at the end every node is ready, and the nodes own every
    partition between them (``/readyz``, ``cronlog_partitions_owned``, and any gauge of
    partitions owned but not running).
14. ``ready_while_dark``: through the run (``tools.chaos.watch`` samples every node's
    ``/readyz`` and ``/metrics`` every half second), no node says ready while its metrics show
    it owning a partition (in that sample and the one before) that has owed leases and granted
    none for more than ``DARK_BOUND_MS`` (:class:`Darkness`); not judged while a clock fault
    moves a clock.
15. ``outcome_unknown_without_fault``: a critical run is set aside (dead-lettered
    ``outcome_unknown``) only near a fault: its last lease, from its grant to its end, overlaps
    a fault of the plan from ``FAULT_BEFORE_MS`` before its strike to ``FAULT_AFTER_MS`` after
    it ended (wider by the largest clock move), or its attempt was told to outlast the job's
    timeout (the target's doing, unless the target can be asked: a guarded one's is not
    excused). Anything else is the nodes' own doing: their queueing, a stall, a node that
    exited by itself.
16. Asking a guarded target (``core.asking``), held to the guard's own records (the target's
    calls with the guard's decision, its answers to asks, in the order decided):
    ``resolvable_outcome_unknown`` (a guarded run set aside although the guard answered an
    ask about its last attempt succeeded, failed or never seen), ``completed_by_asking_without_
    success`` (completed by asking, its key never handled with a 2xx), ``answer_not_given``
    (an answer in the log the guard never gave), ``fence_broken`` (a call the guard handled
    with a token it had answered never seen about, after that answer). A call the guard
    refused as stale (409) did no work: it counts for no ``critical_delivered_twice``.
17. ``node_exited_by_itself``: no node process ends unless the plan ends it (a kill, a
    restart). A crash, an abort inside a native library or an exit of the node's own is a
    violation; the harness starts such a node again, as a process supervisor would, and the
    run goes on, so what the node's death did is judged by the other checks too.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from croniter import croniter

from tools.chaos.behaviour import answer

TERMINAL = ("RunCompleted", "RunDeadLettered", "RunCancelled")
ON_TIME_MS = 1000  # "starts each run within a second of its slot"
RECOVERED_AFTER = 3  # consecutive on-time seconds that count as firing on time again
EXAMPLES = 20  # violations listed per check; the rest are counted
EARLY_TOLERANCE_MS = 5
DARK_AT_END_MS = 10_000  # a partition with a slot never run this close to the end is dark
# A node may say ready at most this long into a partition's darkness (ready_while_dark): the
# node's own bound is 2 s (node.runner.STUCK_S), the rest is the harness's sampling.
DARK_BOUND_MS = 3000
SAID_GRACE_MS = 2000  # a lease this soon after a sample: its batch was being decided then
OWED_LOOKBACK_MS = 60_000  # slots older than this are slot_never_run's, not darkness
SKEW_SETTLE_MS = 2500  # libfaketime reads a new offset within two seconds
# How near a fault a critical run's last lease must be for its ``outcome_unknown`` to be the
# fault's doing (``outcome_unknown_without_fault``). After the fault's end: a fault's effects
# outlive its heal. The nodes' Kafka group notices a member that stopped answering within its
# session timeout (6 s, eventlog.kafka.SESSION_TIMEOUT_MS; a killed one sooner), and a
# rebalance of every partition (a killed controller that hosted the group's coordinator) left
# the nodes owning no partition for up to 14 s before issue 23's fixes (docs/reliability.md); a
# lease granted before the partitions moved is ended by their next owner, later. 6 + 14: 20 s.
FAULT_AFTER_MS = 20_000
# Before its strike: a lease that ended before the fault struck cannot have been lost to it;
# the harness notes the strike just after it sends the signal, by the wall clock the nodes
# read too (a clock moved by a fault widens both sides by the largest move).
FAULT_BEFORE_MS = 1_000
# What ended the attempt before a repeated delivery.
DUPLICATE_CAUSES = {
    "lease_expired": "after_lease_expired",
    "failed_ambiguous": "after_timeout",
    "stale_token": "stale_token",
}


@dataclass
class NodeHealth:
    ready: bool
    metrics: dict[str, float]  # metric line (name{labels}) -> value
    error: str = ""


@dataclass
class History:
    tenant: str
    partitions: int
    events: dict[int, list[tuple[int, dict[str, Any] | None]]]  # partition -> (offset, event)
    calls: list[dict[str, Any]] = field(default_factory=list)  # the target's records
    work: list[dict[str, Any]] = field(default_factory=list)  # the workers' records
    creates: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)  # faults.jsonl
    window_end_ms: int = 0  # slots up to here must have run
    api_runs: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # node -> runs
    health: dict[str, NodeHealth] = field(default_factory=dict)
    unreadable_records: int = 0
    probes: list[dict[str, Any]] = field(default_factory=list)  # one-shots due across a step
    # What the nodes said through the run (tools.chaos.watch): /readyz and /metrics, sampled.
    health_samples: list[dict[str, Any]] = field(default_factory=list)
    # The team's topic the kafka:// jobs produce to, read_committed: {"e": record, "t": ms}
    topic_records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Report:
    figures: dict[str, Any] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter[str] = field(default_factory=Counter)
    recovery: list[dict[str, Any]] = field(default_factory=list)

    def violate(self, check: str, detail: str) -> None:
        self.counts[check] += 1
        if len(self.violations[check]) < EXAMPLES:
            self.violations[check].append(detail)

    @property
    def ok(self) -> bool:
        return not self.counts

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "figures": self.figures,
            "violations": {
                k: {"count": self.counts[k], "examples": v}
                for k, v in sorted(self.violations.items())
            },
            "recovery": self.recovery,
        }


# -- the fold ------------------------------------------------------------------------------------


@dataclass
class Lease:
    token: int
    attempt: int
    worker: str
    granted_at: int
    expires_at: int
    ended_by: str | None = None  # succeeded, failed, failed_ambiguous, lease_expired
    ended_at: int | None = None
    # What its target, asked about it, said it became of it (core.asking); the lease's end
    # above is the log's, as the read model shows it.
    answered: str | None = None


@dataclass
class Run:
    run_id: str
    job_id: str
    slot: int
    partition: int
    materialised: int = 0
    leases: list[Lease] = field(default_factory=list)
    live: Lease | None = None
    outcomes: list[tuple[str, str]] = field(default_factory=list)  # (event type, reason)
    cancelled: bool = False
    asks: int = 0  # RunOutcomeAsked
    answers: list[tuple[int, str]] = field(default_factory=list)  # (token, answer) recorded
    by_asking: int | None = None  # the token of a completion by its target's answer
    returned: set[int] = field(default_factory=set)  # tokens of leases given back unused

    def lease(self, token: int) -> Lease | None:
        for lease in self.leases:
            if lease.token == token:
                return lease
        return None


@dataclass
class Job:
    job_id: str
    partition: int
    spec: dict[str, Any]
    first_slot: int | None
    next_slot: int | None
    paused_at: int | None = None

    @property
    def critical(self) -> bool:
        return bool(self.spec.get("critical"))

    @property
    def pull(self) -> bool:
        return (self.spec.get("target") or {}).get("type") == "pull"

    @property
    def topic(self) -> bool:
        """Whether it produces to a Kafka topic (exactly once, in the events' transaction)."""
        return (self.spec.get("target") or {}).get("type") == "kafka"

    @property
    def guarded(self) -> bool:
        """Whether its target can be asked what became of an attempt (a ``status_url``)."""
        return bool((self.spec.get("target") or {}).get("status_url"))

    @property
    def group(self) -> str:
        """A critical job's group: ``guarded`` (its target can say), ``unguarded`` (a push
        target that cannot), ``pull``, ``topic`` (produced with its completion)."""
        if self.pull or self.topic:
            return "pull" if self.pull else "topic"
        return "guarded" if self.guarded else "unguarded"


@dataclass
class Fold:
    tenant: str = ""
    jobs: dict[str, Job] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    skips: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    withdrawn: set[str] = field(default_factory=set)  # runs taken back before their slot
    foreign: int = 0
    other_tenants: int = 0
    returned: int = 0  # leases given back unused (LeaseReturned)

    def resolve(self, ident: str) -> str:
        """The log's id of a job or run a team names ``ident`` (``docs/events.md``: the log
        scopes ids by tenant, ``<tenant>/<id>``; logs from before scoping hold bare ids)."""
        if ident in self.runs or ident in self.jobs:
            return ident
        scoped = f"{self.tenant}/{ident}"
        return scoped if scoped in self.runs or scoped in self.jobs else ident


def fold(history: History, report: Report) -> Fold:
    """Every partition's events in offset order, checked as they are folded (5 and 6)."""
    f = Fold(tenant=history.tenant)
    for partition in sorted(history.events):
        last_token = 0
        for offset, e in history.events[partition]:
            if e is None or not isinstance(e.get("type"), str):
                f.foreign += 1
                continue
            if e.get("tenant") != history.tenant:
                f.other_tenants += 1
                continue
            where = f"p{partition}@{offset}"
            kind = e["type"]
            job_id = e.get("job_id", "")
            if kind == "JobRegistered":
                f.jobs[job_id] = Job(
                    job_id, partition, e["spec"], e.get("next_slot"), e.get("next_slot")
                )
                continue
            job = f.jobs.get(job_id)
            if job is None:
                report.violate("event_of_unknown_job", f"{where}: {kind} of {job_id}")
                continue
            if kind == "JobUpdated":
                job.spec = e["spec"]
                job.next_slot = e.get("next_slot")
            elif kind == "JobPaused":
                job.paused_at = e["at"]
            elif kind == "JobResumed":
                job.paused_at = None
                job.next_slot = e.get("next_slot")
            elif kind == "RunSkipped":
                if not e.get("reason"):
                    report.violate("skip_without_reason", f"{where}: {e}")
                f.skips[job_id].append(e)
                job.next_slot = e.get("next_slot")
            elif "run_id" in e:
                last_token = _run_event(f, job, partition, where, e, last_token, report)
    return f


def _run_event(
    f: Fold,
    job: Job,
    partition: int,
    where: str,
    e: dict[str, Any],
    last_token: int,
    report: Report,
) -> int:
    kind = e["type"]
    run_id = e["run_id"]
    run = f.runs.get(run_id)
    if kind == "RunMaterialised":
        if run is None:
            run = f.runs[run_id] = Run(run_id, job.job_id, e["scheduled_for"], partition)
        run.materialised += 1
        if run.materialised > 1:
            report.violate("run_materialised_twice", f"{where}: {run_id}")
        if e.get("trigger", "schedule") == "schedule":
            job.next_slot = e.get("next_slot")
        return last_token
    if run is None:
        report.violate("event_of_unknown_run", f"{where}: {kind} of {run_id}")
        return last_token
    token: int = e.get("fencing_token", 0)
    live = run.live
    at = e["at"]
    if kind == "LeaseGranted":
        if live is not None:
            report.violate(
                "lease_overlap",
                f"{where}: {run_id} token {token} granted while token {live.token} is live",
            )
        if run.outcomes:
            report.violate("lease_after_outcome", f"{where}: {run_id} token {token}")
        if token <= last_token or any(token <= lease.token for lease in run.leases):
            report.violate("token_not_increasing", f"{where}: {run_id} token {token}")
        granted = Lease(
            token, e.get("attempt", 1), e.get("worker_id", ""), at, e["lease_expires_at"]
        )
        run.leases.append(granted)
        run.live = granted
        return max(last_token, token)
    if kind == "RunCompleted" and e.get("by_asking"):
        # The attempt's outcome was unknown (its lease is over) and its target, asked, said
        # it succeeded (core.asking): the attempt ends as a success, by that answer.
        asked = run.lease(token)
        if asked is None:
            report.violate("answer_of_no_lease", f"{where}: {run_id} token {token}")
        else:
            asked.ended_by, asked.ended_at = "succeeded", at
        run.outcomes.append((kind, ""))
        run.by_asking = token
        return last_token
    if kind == "RunOutcomeAsked":
        run.asks += 1
        return last_token
    if kind == "RunOutcomeAnswered":
        # Failed or never seen: the attempt did not take effect (never seen: and never will),
        # a definite failure, so a retry is no duplicate. The lease's end stays the log's.
        run.answers.append((token, str(e.get("answer"))))
        asked = run.lease(token)
        if asked is not None:
            asked.answered = str(e.get("answer"))
        return last_token
    if kind in ("Heartbeat", "RunCompleted", "RunFailed"):
        stale = live is None or live.token != token
        if stale:
            check = (
                "stale_heartbeat_accepted" if kind == "Heartbeat" else ("stale_completion_accepted")
            )
            held = "none" if live is None else f"{live.token} until {live.expires_at}"
            report.violate(check, f"{where}: {run_id} {kind} token {token} at {at}; live: {held}")
        if kind == "Heartbeat":
            if live is not None and not stale:
                live.expires_at = e["lease_expires_at"]
            return last_token
        ended = run.lease(token)
        if ended is not None:
            if kind == "RunCompleted":
                ended.ended_by = "succeeded"
            else:
                ended.ended_by = "failed_ambiguous" if e.get("ambiguous") else "failed"
            ended.ended_at = at
        if live is not None and live.token == token:
            run.live = None
        if kind == "RunCompleted":
            run.outcomes.append((kind, ""))
        return last_token
    if kind == "LeaseReturned":
        # No worker received it (the claim's answer reached nobody): as if never granted. A
        # delivery under its token would be a lease handed out and given back both.
        f.returned += 1
        if live is None or live.token != token:
            report.violate("return_of_no_live_lease", f"{where}: {run_id} token {token}")
        else:
            run.leases.remove(live)
            run.live = None
            run.returned.add(token)
        return last_token
    if kind == "LeaseExpired":
        if live is None or live.token != token:
            report.violate("expiry_of_no_live_lease", f"{where}: {run_id} token {token}")
        elif at < live.expires_at:
            report.violate("lease_expired_early", f"{where}: {run_id} at {at} < {live.expires_at}")
        expired = run.lease(token)
        if expired is not None:
            expired.ended_by, expired.ended_at = "lease_expired", at
        run.live = None
        return last_token
    if kind == "RunDeadLettered":
        if not e.get("reason"):
            report.violate("dead_letter_without_reason", f"{where}: {run_id}")
        run.outcomes.append((kind, e.get("reason") or ""))
    elif kind == "RunCancelled" and e.get("reason") == "withdrawn":
        # Materialised ahead of its slot and taken back before it came (a pause, a schedule
        # change): as if never materialised; the slot is still to run or to be skipped.
        del f.runs[run_id]
        f.withdrawn.add(run_id)
        job.next_slot = e.get("next_slot")
    elif kind == "RunCancelled":
        run.cancelled = True
        run.outcomes.append((kind, e.get("reason") or ""))
    elif kind == "RunReplayed":
        run.outcomes = [o for o in run.outcomes if o[0] != "RunDeadLettered"]
    return last_token


# -- slots ---------------------------------------------------------------------------------------


def slots(job: Job, until_ms: int) -> list[int]:
    """The job's slots from its first to ``until_ms``, computed here from its spec alone."""
    spec = job.spec
    if job.first_slot is None:
        return []
    if spec.get("run_at") is not None:
        return [spec["run_at"]] if spec["run_at"] <= until_ms else []
    if spec.get("interval_sec") is not None:
        step = round(spec["interval_sec"] * 1000)
        return list(range(job.first_slot, until_ms + 1, step))
    schedule = spec.get("schedule")
    if not schedule or spec.get("timezone", "UTC") != "UTC":
        return []
    out: list[int] = []
    it = croniter(schedule, datetime.fromtimestamp((job.first_slot - 1) / 1000, UTC))
    for _ in range(1_000_000):
        slot = round(it.get_next(float) * 1000)
        if slot > until_ms:
            break
        out.append(slot)
    return out


def _skipped_slots(job: Job, skips: list[dict[str, Any]], report: Report) -> Counter[int]:
    covered: Counter[int] = Counter()
    for s in skips:
        first, last = s["scheduled_for"], s["last_scheduled_for"]
        in_range = [
            x
            for x in slots(Job(job.job_id, job.partition, job.spec, first, None), last)
            if first <= x <= last
        ]
        if s.get("count") is not None and s["count"] != len(in_range):
            report.violate(
                "skip_count_wrong",
                f"{job.job_id}: {s['count']} skipped from {first} to {last}, {len(in_range)} slots",
            )
        for x in in_range:
            covered[x] += 1
    return covered


# -- the checks ----------------------------------------------------------------------------------


def check(history: History) -> Report:
    report = Report()
    f = fold(history, report)
    figures = report.figures
    figures["events_read"] = sum(len(v) for v in history.events.values())
    figures["foreign_records"] = f.foreign
    figures["leases_returned"] = f.returned
    figures["unreadable_records"] = history.unreadable_records
    figures["jobs"] = len(f.jobs)
    figures["critical_jobs"] = sum(j.critical for j in f.jobs.values())

    _check_creates(history, f, report)
    in_window = _check_slots(history, f, report)
    _check_outcomes(f, in_window, report)
    deliveries = _check_deliveries(history, f, in_window, report)
    _unknown_outcomes(history, f, in_window, deliveries, report)
    _check_asking(history, f, in_window, report)
    _check_timing(history, f, in_window, deliveries, report)
    _check_projections(history, f, in_window, report)
    _check_health(history, report)
    exits = [
        {k: r.get(k) for k in ("node", "code", "at", "error")}
        for r in history.faults
        if r.get("record") == "exit"
    ]
    figures["nodes_exited_by_themselves"] = exits
    for exit_ in exits:
        report.violate(
            "node_exited_by_itself",
            f"{exit_['node']} ended with {exit_['code']} at {exit_['at']}, no fault of the plan"
            f" ending it: {exit_['error'] or 'nothing in its log'}",
        )
    figures["violations"] = sum(report.counts.values())
    return report


def _check_creates(history: History, f: Fold, report: Report) -> None:
    acked = {f.resolve(c["job"]) for c in history.creates if c.get("status") in (200, 201)}
    tried = {f.resolve(c["job"]) for c in history.creates}
    report.figures["creates_acknowledged"] = len(acked)
    report.figures["creates_not_acknowledged"] = len(tried - acked)
    report.figures["unacknowledged_creates_registered"] = len((tried - acked) & set(f.jobs))
    for job_id in sorted(acked - set(f.jobs)):
        report.violate("acknowledged_job_lost", job_id)
    # "Not found" is a definite answer: a client told so believes the job does not exist.
    for c in history.creates:
        if c.get("status") == 404 and f.resolve(c["job"]) in f.jobs:
            report.violate("create_answered_not_found", f"{c['job']} at {c.get('at')}")


def _check_slots(history: History, f: Fold, report: Report) -> set[str]:
    """Check every slot in the window; return the run ids of the window's slots."""
    in_window: set[str] = set()
    checked = never = 0
    never_jobs: set[str] = set()
    dark_at_end: set[int] = set()
    skipped: Counter[str] = Counter()
    by_slot: dict[str, dict[int, Run]] = defaultdict(dict)
    for run in f.runs.values():
        by_slot[run.job_id][run.slot] = run
    for job in f.jobs.values():
        # The window: to its end, and further to every slot the job moved past before it was
        # paused (those must have an outcome too).
        until = history.window_end_ms
        if job.next_slot is not None and job.spec.get("run_at") is None:
            until = max(until, job.next_slot - 1)
        expected = slots(job, until)
        covered = _skipped_slots(job, f.skips.get(job.job_id, []), report)
        for s in f.skips.get(job.job_id, []):
            skipped[s.get("reason") or "none"] += s.get("count") or 0
            if s.get("reason") == "misfire":
                report.violate(
                    "slot_skipped_misfire",
                    f"{job.job_id}: {s.get('count')} slots {s['scheduled_for']}.."
                    f"{s['last_scheduled_for']} (p{job.partition})",
                )
        runs = by_slot.get(job.job_id, {})
        for slot in expected:
            checked += 1
            made = runs.get(slot)
            outcomes = (1 if made is not None else 0) + covered[slot]
            if made is not None:
                in_window.add(made.run_id)
            if outcomes == 0:
                never += 1
                never_jobs.add(job.job_id)
                if slot > history.window_end_ms - DARK_AT_END_MS:
                    dark_at_end.add(job.partition)
                report.violate("slot_never_run", f"{job.job_id} slot {slot} (p{job.partition})")
            elif outcomes > 1:
                report.violate("slot_two_outcomes", f"{job.job_id} slot {slot}")
    report.figures["slots_checked"] = checked
    report.figures["slots_never_run"] = never
    report.figures["jobs_with_slots_never_run"] = len(never_jobs)
    report.figures["slots_skipped"] = dict(skipped)
    report.figures["partitions_with_slots_never_run"] = sorted(
        {f.jobs[j].partition for j in never_jobs}
    )
    report.figures["dark_partitions_at_the_end"] = sorted(dark_at_end)
    return in_window


def _check_outcomes(f: Fold, in_window: set[str], report: Report) -> None:
    without = 0
    outcomes: Counter[str] = Counter()
    unknown_critical = 0
    for run_id in sorted(in_window):
        run = f.runs[run_id]
        if not run.outcomes:
            without += 1
            state = "running" if run.live else "pending"
            report.violate("run_without_outcome", f"{run_id} ({state}, {len(run.leases)} leases)")
            continue
        if len(run.outcomes) > 1:
            report.violate("run_two_outcomes", f"{run_id}: {run.outcomes}")
        kind, reason = run.outcomes[-1]
        name = {
            "RunCompleted": "succeeded",
            "RunDeadLettered": "dead",
            "RunCancelled": "cancelled",
        }[kind]
        outcomes[f"{name}:{reason}" if reason else name] += 1
        if reason == "outcome_unknown" and f.jobs[run.job_id].critical:
            unknown_critical += 1
    report.figures["runs_checked"] = len(in_window)
    report.figures["runs_without_outcome"] = without
    report.figures["run_outcomes"] = dict(outcomes)
    report.figures["critical_dead_outcome_unknown"] = unknown_critical
    report.figures["run_materialised_twice"] = report.counts["run_materialised_twice"]
    report.figures["stale_completion_accepted"] = report.counts["stale_completion_accepted"]
    report.figures["lease_overlaps"] = report.counts["lease_overlap"]


@dataclass
class Delivery:
    run_id: str
    token: int
    at: int
    by: str  # "target" or the worker id
    status: int | None = None  # what the target answered (push)
    answered_at: int | None = None  # when it did
    guard: str | None = None  # what the guard decided of it (a guarded target's call)
    topic: bool = False  # a record in the team's topic (a kafka:// job's), not a call


def _deliveries(history: History) -> dict[str, list[Delivery]]:
    answers = {(r["key"], r["token"]): r for r in history.calls if r.get("kind") == "answer"}
    out: dict[str, list[Delivery]] = defaultdict(list)
    for r in history.calls:
        if r.get("kind") == "call":
            answer = answers.get((r["key"], r["token"]))
            run_id = _run_of_key(r["key"])
            out[run_id].append(
                Delivery(
                    run_id,
                    r["token"],
                    r["at"],
                    "target",
                    answer["status"] if answer else None,
                    answer["at"] if answer else None,
                    r.get("guard"),
                )
            )
    for r in history.work:
        if r.get("kind") == "work":
            run_id = _run_of_key(r["key"])
            out[run_id].append(Delivery(run_id, r["token"], r["at"], r["worker"]))
    for r in history.topic_records:
        body = r.get("e") or {}
        # the record names the run as its team does; the log's id has the team in front
        run_id = f"{body.get('tenant')}/{body.get('run_id')}"
        at = r.get("t") or 0
        token = int(body.get("fencing_token", -1))
        out[run_id].append(Delivery(run_id, token, at, "target", 200, at, topic=True))
    for runs in out.values():
        runs.sort(key=lambda d: d.at)
    return out


def _run_of_key(key: str) -> str:
    """The run an ``Idempotency-Key`` names: ``<job's log id>:<slot>``."""
    job_id, _, slot = key.rpartition(":")
    return f"{job_id}.{slot}"


def _check_deliveries(
    history: History, f: Fold, in_window: set[str], report: Report
) -> dict[str, list[Delivery]]:
    deliveries = _deliveries(history)
    dup: Counter[str] = Counter()
    critical_twice = 0
    retried = 0
    refused = 0
    for run_id, got in deliveries.items():
        run = f.runs.get(run_id)
        if run is None and run_id in f.withdrawn:
            # The log took it back (a pause, a schedule change), its slot still to run: a call
            # made all the same could be made twice.
            report.violate("withdrawn_run_delivered", f"{run_id} ({got[0].by})")
            continue
        if run is None:
            report.violate("delivery_without_lease", f"{run_id}: no such run in the log")
            continue
        tokens = Counter(d.token for d in got)
        for token, n in tokens.items():
            if n > 1:
                report.violate("token_delivered_twice", f"{run_id} token {token} x{n}")
        critical = f.jobs[run.job_id].critical
        for i, d in enumerate(got):
            lease = run.lease(d.token)
            if lease is None:
                check = (
                    "returned_lease_delivered"
                    if d.token in run.returned
                    else "delivery_without_lease"
                )
                report.violate(check, f"{run_id} token {d.token} ({d.by})")
                continue
            if d.by != "target" and lease.worker != d.by:
                report.violate(
                    "delivered_to_wrong_worker",
                    f"{run_id} token {d.token}: {d.by} != {lease.worker}",
                )
            if d.guard == "stale":
                # The guard refused it (409), a newer attempt seen or its token fenced: the
                # work was not done, so it delivers nothing twice (fence_broken is the rest).
                refused += 1
                continue
            prior = [x for x in got[:i] if x.guard != "stale"]
            if not prior:
                continue
            if d.token < max(x.token for x in prior):
                # A zombie: an attempt whose lease was already lost (its node stopped, say)
                # arrived after a newer attempt had been delivered.
                cause: str | None = "stale_token"
            else:
                before = run.lease(prior[-1].token)
                cause = before.ended_by if before is not None else None
                if before is not None and before.answered in ("failed", "never_seen"):
                    cause = "failed"  # its target, asked, said it did not take effect
            if cause == "failed":
                retried += 1  # the target or worker said it failed: a retry, not a duplicate
                continue
            dup[DUPLICATE_CAUSES.get(cause or "", "other")] += 1
            if critical:
                critical_twice += 1
                report.violate(
                    "critical_delivered_twice",
                    f"{run_id}: token {d.token} after token {got[i - 1].token} ({cause})",
                )
    # A success is a delivery: the succeeding lease's token reached the target or a worker.
    for run in f.runs.values():
        for lease in run.leases:
            if lease.ended_by == "succeeded" and not any(
                d.token == lease.token for d in deliveries.get(run.run_id, [])
            ):
                report.violate("success_without_delivery", f"{run.run_id} token {lease.token}")
    # A completion a worker was told was accepted is in the log, with its token.
    for r in history.work:
        if r.get("kind") == "complete" and r.get("status") == 200:
            run = f.runs.get(f.resolve(r["run"]))
            lease = run.lease(r["token"]) if run is not None else None
            if lease is None or lease.ended_by not in ("succeeded", "failed", "failed_ambiguous"):
                report.violate(
                    "completion_not_recorded", f"{r['run']} token {r['token']} ({r.get('at')})"
                )
    _check_topic(history, f, deliveries, report)
    report.figures["deliveries"] = sum(len(v) for v in deliveries.values())
    report.figures["duplicate_deliveries"] = dict(dup)
    report.figures["retries_after_a_definite_failure"] = retried
    report.figures["critical_delivered_twice"] = critical_twice
    report.figures["calls_refused_by_the_guard_stale"] = refused
    return deliveries


def _check_topic(
    history: History, f: Fold, deliveries: dict[str, list[Delivery]], report: Report
) -> None:
    """The kafka:// jobs' records, read_committed from the team's topic: exactly one for each
    run the log says succeeded (``success_without_delivery`` is a record lost), under its
    succeeding lease's token, and none for anything else, whatever the faults did."""
    records = 0
    for run_id, got in deliveries.items():
        produced = [d for d in got if d.topic]
        if not produced:
            continue
        records += len(produced)
        if len(produced) > 1:
            tokens = [d.token for d in produced]
            report.violate("topic_record_twice", f"{run_id}: {len(produced)} records {tokens}")
        run = f.runs.get(run_id)
        job = f.jobs.get(run.job_id) if run is not None else None
        for d in produced:
            lease = run.lease(d.token) if run is not None else None
            if job is not None and not job.topic:
                report.violate("topic_record_of_another_job", f"{run_id} token {d.token}")
            elif lease is not None and lease.ended_by != "succeeded":
                report.violate(
                    "topic_record_without_success",
                    f"{run_id} token {d.token}: its lease ended {lease.ended_by}",
                )
    succeeded = sum(
        1
        for run in f.runs.values()
        if f.jobs[run.job_id].topic and any(lease.ended_by == "succeeded" for lease in run.leases)
    )
    report.figures["topic_records"] = records
    report.figures["topic_runs_succeeded"] = succeeded
    report.figures["topic_records_read"] = len(history.topic_records)


def _unknown_outcomes(
    history: History,
    f: Fold,
    in_window: set[str],
    deliveries: dict[str, list[Delivery]],
    report: Report,
) -> None:
    """Why each critical run dead-lettered ``outcome_unknown`` was unknown, as the target and
    the workers saw its last attempt: the figure to make as small as the design allows.

    ``outcome_unknown_without_fault``: such a run whose last lease (granted to its end: its
    expiry, or the later instant its end was decided) is near no fault (:func:`_fault_spans`)
    was set aside by the nodes' own doing (their queueing, a stall of their own), which the
    fault model never excuses. A run whose last attempt the target (or the worker) was told to
    hold past the job's timeout is the target's doing, its outcome unknown by design: counted
    (``critical_outcome_unknown_target_slow``), never a violation. A node that exited by
    itself is no fault of the plan's: a run set aside by that is a violation too."""
    why: Counter[str] = Counter()
    spans = _fault_spans(history)
    skew_ms = _largest_skew_ms(history)
    target_slow = 0
    for run_id in sorted(in_window):
        run = f.runs[run_id]
        job = f.jobs[run.job_id]
        if not job.critical or not run.outcomes or not run.leases:
            continue
        if run.outcomes[-1] != ("RunDeadLettered", "outcome_unknown"):
            continue
        last = run.leases[-1]
        got = [d for d in deliveries.get(run_id, []) if d.token == last.token]
        if not got:
            cause = "never_delivered"  # the lease was lost before the call went out
        elif got[0].by != "target":
            cause = "worker_lost_the_lease"
        elif got[0].answered_at is None:
            cause = "no_answer"
        elif got[0].answered_at < last.expires_at:
            cause = f"answered_{got[0].status}_before_the_lease_ran_out"
        else:
            cause = f"answered_{got[0].status}_after_the_lease_ran_out"
        why[cause] += 1
        if not job.guarded and _told_past_timeout(job, run, last):
            # A guarded target can say what became of a slow attempt: not excused.
            target_slow += 1
            continue
        lo, hi = last.granted_at, max(last.expires_at, last.ended_at or last.expires_at)
        if not any(
            lo <= end + FAULT_AFTER_MS + skew_ms and hi >= start - FAULT_BEFORE_MS - skew_ms
            for start, end in spans
        ):
            report.violate(
                "outcome_unknown_without_fault",
                f"{run_id}: token {last.token} {lo}..{hi} ({cause}), no fault within"
                f" {FAULT_BEFORE_MS / 1000:.0f} s before or {FAULT_AFTER_MS / 1000:.0f} s after",
            )
    report.figures["critical_outcome_unknown_why"] = dict(why)
    report.figures["critical_outcome_unknown_target_slow"] = target_slow
    report.figures["critical_outcome_unknown_without_fault"] = report.counts[
        "outcome_unknown_without_fault"
    ]


DEFINITE_ANSWERS = ("succeeded", "failed", "never_seen")
GUARD_ANSWERS = (*DEFINITE_ANSWERS, "in_progress", "unknown")  # what only a guard says


def _check_asking(history: History, f: Fold, in_window: set[str], report: Report) -> None:
    """Asking what became of a critical run (``core.asking``), held to what the guard in front
    of the target recorded (:mod:`tools.chaos.target`: each call with the guard's decision,
    each ask with its answer, in the order the guard decided them):

    - ``resolvable_outcome_unknown``: a guarded run dead-lettered ``outcome_unknown`` although
      the guard answered an ask about its last attempt definitively (succeeded, failed, never
      seen): asking failed to resolve what it could have;
    - ``completed_by_asking_without_success``: a run completed by asking whose key the target
      never handled with a 2xx answer (the guard, or the node reading it, lied);
    - ``answer_not_given``: an answer the log records as the target's (anything but
      ``no_answer``) that the guard never gave about that key and token;
    - ``fence_broken``: a call the guard handled (``proceed``) with a token at or below one it
      had answered ``never_seen`` about, decided after that answer: the late original request
      the fence exists to refuse.

    Figures per group of critical runs in the window (guarded, unguarded, pull): runs asked,
    asks, answers by kind, completed by asking, retried after a failed or never-seen answer,
    dead-lettered ``outcome_unknown``; and what the guard decided of the calls and asks."""
    handled: set[str] = set()  # keys the target handled with a 2xx answer
    answers = {(r["key"], r["token"]): r for r in history.calls if r.get("kind") == "answer"}
    given: set[tuple[str, int, str]] = set()
    fenced: dict[str, int] = {}  # key -> the highest token answered never_seen so far
    decisions: Counter[str] = Counter()
    asked_at_target: Counter[str] = Counter()
    late_refused = 0
    for r in history.calls:  # in the order written: the guard's order of decisions
        kind, key = r.get("kind"), r.get("key", "")
        if kind == "status":
            outcome = r.get("outcome")
            asked_at_target[
                str(outcome or "bad_request") if r.get("authorized") else "unauthorized"
            ] += 1
            if outcome is not None:
                given.add((key, r["token"], outcome))
            if outcome == "never_seen":
                fenced[key] = max(fenced.get(key, r["token"]), r["token"])
            continue
        if kind != "call":
            continue
        guard = r.get("guard")
        if guard is not None:
            decisions[guard] += 1
        answer = answers.get((key, r["token"]))
        if guard in (None, "proceed") and answer and 200 <= int(answer["status"]) < 300:
            handled.add(key)
        if key in fenced and r["token"] <= fenced[key]:
            if guard == "proceed":
                report.violate(
                    "fence_broken",
                    f"{_run_of_key(key)}: token {r['token']} handled at {r['at']} after the"
                    f" guard answered never_seen about token {fenced[key]}",
                )
            elif guard == "stale":
                late_refused += 1

    groups: dict[str, dict[str, Any]] = {}
    for run_id in sorted(in_window):
        run = f.runs[run_id]
        job = f.jobs[run.job_id]
        if not job.critical:
            continue
        g = groups.setdefault(
            job.group,
            {
                "runs": 0,
                "runs_asked": 0,
                "asks": 0,
                "answers": Counter(),
                "completed_by_asking": 0,
                "retried_after": Counter(),
                "outcome_unknown": 0,
            },
        )
        g["runs"] += 1
        g["runs_asked"] += run.asks > 0
        g["asks"] += run.asks
        key = f"{run.job_id}:{run.slot}"
        for token, said in run.answers:
            g["answers"][said] += 1
            if said in ("failed", "never_seen") and any(x.token > token for x in run.leases):
                g["retried_after"][said] += 1
            if said in GUARD_ANSWERS and (key, token, said) not in given:
                report.violate(
                    "answer_not_given",
                    f"{run_id}: the log says token {token} was answered {said}; the guard"
                    " never said so",
                )
        if run.by_asking is not None:
            g["completed_by_asking"] += 1
            if key not in handled:
                report.violate(
                    "completed_by_asking_without_success",
                    f"{run_id}: completed by asking (token {run.by_asking}); the target never"
                    " handled its key with a success",
                )
        if run.outcomes and run.outcomes[-1] == ("RunDeadLettered", "outcome_unknown"):
            g["outcome_unknown"] += 1
            last = run.leases[-1].token if run.leases else None
            said_then = sorted(
                {o for (k, t, o) in given if k == key and t == last and o in DEFINITE_ANSWERS}
            )
            if job.guarded and said_then:
                report.violate(
                    "resolvable_outcome_unknown",
                    f"{run_id}: dead-lettered outcome_unknown; the guard answered"
                    f" {', '.join(said_then)} about its last attempt (token {last})",
                )
    for g in groups.values():
        g["answers"] = dict(g["answers"])
        g["retried_after"] = dict(g["retried_after"])
    report.figures["critical_asking"] = {k: groups[k] for k in sorted(groups)}
    report.figures["guard"] = {
        "calls": dict(decisions),
        "asks": dict(asked_at_target),
        "late_originals_refused_after_never_seen": late_refused,
    }
    for check_name in (
        "resolvable_outcome_unknown",
        "completed_by_asking_without_success",
        "answer_not_given",
        "fence_broken",
    ):
        report.figures[check_name] = report.counts[check_name]


def _fault_spans(history: History) -> list[tuple[int, int]]:
    """Each fault the plan struck, from its strike to its end (ready, else healed; the window's
    end when it was never healed). A clock fault ends
    ``SKEW_SETTLE_MS`` after its heal, when the node has read its true clock again."""
    spans = []
    for r in history.faults:
        if r.get("record") != "fault" or "injected_at" not in r:
            continue
        ends = [int(r[k]) for k in ("healed_at", "ready_at") if r.get(k) is not None]
        end = max(ends) if ends else history.window_end_ms
        if str(r.get("kind", "")).startswith("clock_"):
            end += SKEW_SETTLE_MS
        spans.append((int(r["injected_at"]), end))
    return spans


def _largest_skew_ms(history: History) -> int:
    """The most any node's clock was moved, either way (ms): a lease's instants are its
    deciding node's, so near a fault is judged this much wider."""
    offsets = [abs(float(r["offset_s"])) for r in history.faults if r.get("record") == "clock"]
    return round(max(offsets, default=0.0) * 1000)


def _told_past_timeout(job: Job, run: Run, lease: Lease) -> bool:
    """Whether the workload told the target (or the worker) to hold ``lease``'s attempt at
    least the job's timeout (:mod:`tools.chaos.behaviour`, drawn from the run's
    ``Idempotency-Key`` and the attempt, as the target draws it)."""
    timeout_sec = job.spec.get("timeout_sec")
    if timeout_sec is None:
        return False
    told = answer(job.spec.get("payload"), f"{run.job_id}:{run.slot}", lease.attempt)
    return told.hold_ms >= round(float(timeout_sec) * 1000)


def _clock_leads(history: History) -> dict[str, float]:
    """The most each node's wall clock was ever ahead (s), from the faults log."""
    lead: dict[str, float] = defaultdict(float)
    for r in history.faults:
        if r.get("record") == "clock":
            lead[r["node"]] = max(lead[r["node"]], float(r["offset_s"]))
    return lead


def _check_timing(
    history: History,
    f: Fold,
    in_window: set[str],
    deliveries: dict[str, list[Delivery]],
    report: Report,
) -> None:
    leads = _clock_leads(history)
    any_lead = max(leads.values(), default=0.0)
    early = 0
    lateness: dict[str, list[int]] = {"push": [], "pull": [], "topic": []}
    first_at: dict[str, dict[int, int]] = defaultdict(dict)  # job -> slot -> first delivery
    for run_id, got in deliveries.items():
        run = f.runs.get(run_id)
        if run is None:
            continue
        for d in got:
            lease = run.lease(d.token)
            if lease is None:
                continue
            if d.by == "target":
                node = lease.worker.partition("/")[0]
                allowed = leads.get(node, 0.0)
            else:  # a pull lease is decided by the partition's owner, whichever it was
                allowed = any_lead
            if d.at < run.slot - allowed * 1000 - EARLY_TOLERANCE_MS:
                early += 1
                report.violate(
                    "fired_early",
                    f"{run_id} token {d.token} arrived {run.slot - d.at} ms before its slot "
                    f"(allowed {allowed:.1f} s)",
                )
        if run_id in in_window:
            job = f.jobs[run.job_id]
            kind = "pull" if job.pull else "topic" if job.topic else "push"
            lateness[kind].append(got[0].at - run.slot)
            first_at[run.job_id][run.slot] = got[0].at
    report.figures["fired_early"] = early
    report.figures["max_clock_lead_s"] = dict(leads)
    report.figures["first_delivery_lateness_ms"] = {
        kind: _distribution(values) for kind, values in lateness.items() if values
    }
    _recovery(history, f, first_at, report)
    _probes(history, f, first_at, report)
    _check_readiness(history, f, report)


def _probes(history: History, f: Fold, first_at: dict[str, dict[int, int]], report: Report) -> None:
    """The one-shots due where a skewed clock stepped back: each must fire (2 holds that),
    and how late they did, the promise being "up to the step late" (docs/reliability.md)."""
    if not history.probes:
        return
    late: list[int] = []
    for p in history.probes:
        job_id = f.resolve(p["job"])
        fired = first_at.get(job_id, {}).get(p["run_at"])
        if fired is not None:
            late.append(fired - p["run_at"])
    report.figures["clock_step_probes"] = {
        "created": len(history.probes),
        "fired": len(late),
        "lateness_ms": _distribution(late) if late else None,
    }


def _distribution(values: list[int]) -> dict[str, int]:
    values = sorted(values)
    return {
        "n": len(values),
        "p50": values[len(values) // 2],
        "p99": values[min(len(values) - 1, int(len(values) * 0.99))],
        "max": values[-1],
        "over_1s": sum(1 for x in values if x > ON_TIME_MS),
    }


def _recovery(
    history: History, f: Fold, first_at: dict[str, dict[int, int]], report: Report
) -> None:
    """For each fault, the first second from its strike after which every every-second push
    job fired on time for ``RECOVERED_AFTER`` seconds in a row."""
    every_second = [
        j
        for j in f.jobs.values()
        if j.spec.get("schedule") == "* * * * * *" and not j.pull and j.first_slot is not None
    ]
    if not every_second:
        return
    end = history.window_end_ms

    def on_time(second: int) -> bool:
        for job in every_second:
            if job.first_slot is None or job.first_slot > second:
                continue
            at = first_at.get(job.job_id, {}).get(second)
            if at is None or at - second > ON_TIME_MS:
                return False
        return True

    cache: dict[int, bool] = {}
    strikes = sorted(
        r["injected_at"]
        for r in history.faults
        if r.get("record") == "fault" and "injected_at" in r
    )
    for fault in history.faults:
        if fault.get("record") != "fault" or "injected_at" not in fault:
            continue
        struck = fault["injected_at"]
        next_strike = next((t for t in strikes if t > struck), None)
        second = struck - struck % 1000
        streak_start: int | None = None
        streak = 0
        recovered: int | None = None
        worst = 0
        while second <= end:
            good = cache.setdefault(second, on_time(second))
            if good:
                streak_start = second if streak == 0 else streak_start
                streak += 1
                if streak == RECOVERED_AFTER:
                    recovered = streak_start
                    break
            else:
                streak = 0
                late = [first_at.get(j.job_id, {}).get(second) for j in every_second]
                worst = max([worst] + [a - second for a in late if a is not None])
            second += 1000
        healed = fault.get("ready_at") or fault.get("healed_at") or struck
        late_slots, late_worst = _late_between(every_second, first_at, struck, healed)
        entry = {
            "kind": fault["kind"],
            "what": {
                k: v
                for k, v in fault.items()
                if k not in ("record", "kind", "logged_at", "injected_at", "healed_at", "ready_at")
            },
            "injected_at": struck,
            "healed_s": _seconds(fault.get("healed_at"), struck),
            "ready_s": _seconds(fault.get("ready_at"), struck),
            "on_time_again_s": _seconds(recovered, struck),
            "worst_lateness_ms": worst,
            # Every every-second slot from the strike until the fault healed (a rolling
            # restart's whole length, a killed node's until it is ready again): how many
            # started more than a second late, and the latest.
            "late_until_healed": late_slots,
            "worst_until_healed_ms": late_worst,
            # Else the figure includes the faults that came next.
            "before_the_next_fault": recovered is not None
            and (next_strike is None or recovered < next_strike),
        }
        if recovered is not None:
            entry["on_time_again_s"] = max(0.0, entry["on_time_again_s"] or 0.0)
        report.recovery.append(entry)
        if recovered is None:
            report.violate("never_on_time_again", f"{fault['kind']} at {struck}")
        if fault.get("error"):
            report.violate("fault_not_healed", f"{fault['kind']}: {fault['error']}")
    times = [r["on_time_again_s"] for r in report.recovery if r["on_time_again_s"] is not None]
    if times:
        report.figures["on_time_again_s"] = {
            "median": round(statistics.median(times), 1),
            "max": round(max(times), 1),
        }


def _late_between(
    jobs: list[Job], first_at: dict[str, dict[int, int]], start: int, end: int
) -> tuple[int, int]:
    """The every-second slots in [start, end] (ms) that started more than ``ON_TIME_MS`` late
    (or not at all, by the end of the run), and the worst lateness among those that started."""
    late = 0
    worst = 0
    for job in jobs:
        if job.first_slot is None:
            continue
        first = max(job.first_slot, start - start % 1000 + (1000 if start % 1000 else 0))
        for second in range(first, end + 1, 1000):
            at = first_at.get(job.job_id, {}).get(second)
            if at is None or at - second > ON_TIME_MS:
                late += 1
            if at is not None:
                worst = max(worst, at - second)
    return late, worst


# -- readiness through the run ------------------------------------------------------------------


def _every_second_push(f: Fold) -> dict[int, list[Job]]:
    """The every-second push jobs by partition: a deciding partition calls each every second."""
    by_partition: dict[int, list[Job]] = defaultdict(list)
    for j in f.jobs.values():
        if j.spec.get("schedule") == "* * * * * *" and not j.pull and j.first_slot is not None:
            by_partition[j.partition].append(j)
    return by_partition


def _named_not_deciding(reasons: str) -> set[int]:
    """The partitions a ``/readyz`` answer names as not deciding (``partitions not deciding:
    3 (why), 5 (why)``; before issue 23: ``partitions not deciding (recovering or failing):
    3, 5``)."""
    _, found, rest = reasons.partition("partitions not deciding")
    if not found:
        return set()
    rest = rest.split(";")[0].split('"')[0]
    return {int(n) for n in re.findall(r"\d+", re.sub(r"\([^)]*\)", "", rest))}


def _unjudged(history: History) -> list[tuple[int, int]]:
    """When some node's clock was moved (a clock fault, and the ``SKEW_SETTLE_MS`` libfaketime
    takes to read a change): the leases it decided then carry its instants, not the true
    ones, so no node's readiness is judged then."""
    spans: list[tuple[int, int]] = []
    moved_since: dict[str, int] = {}
    for r in sorted(
        (r for r in history.faults if r.get("record") == "clock"), key=lambda r: int(r["at"])
    ):
        node, at = r["node"], int(r["at"])
        if float(r["offset_s"]) != 0:
            moved_since.setdefault(node, at)
        elif node in moved_since:
            spans.append((moved_since.pop(node), at + SKEW_SETTLE_MS))
    spans += [(since, history.window_end_ms + SKEW_SETTLE_MS) for since in moved_since.values()]
    return spans


class Darkness:
    """When a partition was dark, from the events as the log holds them: it *owed* leases (a
    slot of one of its every-second push jobs whose on-time bound had passed ``DARK_BOUND_MS``
    before, and not leased by then) and *granted none* (no lease of any of its runs from then
    to ``SAID_GRACE_MS`` after). A lease's instant is its decision's (``at``, the deciding
    node's clock: ``_check_readiness`` does not judge while a clock is moved). A partition
    catching up grants leases of its older slots: not dark. Whether the calls then went out is
    not readiness' business (``cronlog_runs_waiting_to_start`` and late starts say it). A
    partition without every-second push jobs is never judged."""

    def __init__(self, f: Fold) -> None:
        self.jobs_of = _every_second_push(f)
        self._first: dict[str, dict[int, int]] = defaultdict(dict)  # job -> slot -> leased at
        granted: dict[int, list[int]] = defaultdict(list)
        for run in f.runs.values():
            if not run.leases:
                continue
            self._first[run.job_id][run.slot] = min(lease.granted_at for lease in run.leases)
            granted[run.partition] += [lease.granted_at for lease in run.leases]
        self._granted = {p: sorted(at) for p, at in granted.items()}

    def dark(self, p: int, t: int) -> bool:
        return self._owed(p, t - DARK_BOUND_MS) and self._silent(p, t)

    def _owed(self, p: int, at: int) -> bool:
        newest = (at - ON_TIME_MS) // 1000 * 1000
        for job in self.jobs_of.get(p, ()):
            assert job.first_slot is not None
            oldest = max(job.first_slot, newest - OWED_LOOKBACK_MS)
            leased = self._first.get(job.job_id, {})
            for slot in range(newest, oldest - 1, -1000):
                if job.paused_at is not None and slot >= job.paused_at:
                    continue
                when = leased.get(slot)
                if when is None or when > at:
                    return True
        return False

    def _silent(self, p: int, t: int) -> bool:
        granted = self._granted.get(p, [])
        k = bisect.bisect_right(granted, t - DARK_BOUND_MS)
        return k == len(granted) or granted[k] > t + SAID_GRACE_MS


def _check_readiness(history: History, f: Fold, report: Report) -> None:
    """``ready_while_dark``: no node says ready (``/readyz`` 200) while its metrics show it
    owning a partition dark (:class:`Darkness`) at that moment, which means dark for more than
    ``DARK_BOUND_MS`` already. Ownership is the partition labels of the node's own metrics,
    those of that sample (the last ones it answered when its ``/metrics`` did not) that were in
    its sample before too: ``/metrics`` is asked after ``/readyz``, so a partition first seen in
    a sample may have come after the readiness answer.

    Figures: per fault, each partition's longest darkness after it, how long into it a node
    first named the partition not deciding, for how long one did, how often its owner said
    ready meanwhile; and how promptly ``/metrics`` answered."""
    samples = sorted(history.health_samples, key=lambda r: int(r["at"]))
    if not samples:
        return
    darkness = Darkness(f)
    end = history.window_end_ms
    unjudged = _unjudged(history)
    owned_last: dict[str, list[int]] = {}
    owned_then: list[list[int]] = []  # by sample: what its node owned, as last seen
    named: dict[int, list[int]] = defaultdict(list)  # partition -> when a node named it
    ready_dark = 0
    metrics_ms: list[int] = []
    metrics_missing = 0
    for r in samples:
        node, t = r["node"], int(r["at"])
        before = owned_last.get(node, [])
        if r.get("owned") is not None:
            owned_last[node] = r["owned"]
        # The watch asks /readyz first, then /metrics: a partition gained between the two
        # answers is in the metrics' list but was not the node's when it said ready (seed 32:
        # ready with partition 1 caught up, partition 4 assigned 0.6 s later, its metrics
        # answered after that). So a sample judges the partitions its node owned in this
        # sample's metrics and in its last before: owned across the readiness answer. A
        # partition just gained is judged from the next sample on.
        owned_then.append([p for p in owned_last.get(node, []) if p in before])
        if r.get("metrics_ms") is not None:
            metrics_ms.append(int(r["metrics_ms"]))
        elif r.get("readyz"):  # it answered its probe, not its scrape
            metrics_missing += 1
        if r.get("readyz") not in (None, 0, 200):
            for p in _named_not_deciding(r.get("reasons", "")):
                named[p].append(t)
        if r.get("readyz") != 200 or t > end:
            continue
        if any(lo <= t <= hi for lo, hi in unjudged):
            continue
        for p in owned_then[-1]:
            if darkness.dark(p, t):
                ready_dark += 1
                report.violate(
                    "ready_while_dark",
                    f"{node} said ready at {t} owning partition {p}, which had owed leases and"
                    f" granted none for over {DARK_BOUND_MS / 1000:.0f} s",
                )
    report.figures["ready_while_dark_samples"] = ready_dark
    report.figures["health_samples"] = len(samples)
    if metrics_ms:
        report.figures["metrics_answer_ms"] = _distribution(metrics_ms)
    report.figures["metrics_unanswered_while_probe_answered"] = metrics_missing
    _dark_per_fault(history, darkness, named, samples, owned_then, report)


def _dark_per_fault(
    history: History,
    darkness: Darkness,
    named: dict[int, list[int]],
    samples: list[dict[str, Any]],
    owned_then: list[list[int]],
    report: Report,
) -> None:
    """For each fault (``report.recovery``'s entries): each partition's longest darkness from
    the fault to the next one (or 60 s), looked at every half second; how long into it a node
    first named the partition not deciding, for how long one did, how often its owner said
    ready meanwhile; and the slowest ``/metrics`` answer."""
    end = history.window_end_ms
    strikes = sorted(r["injected_at"] for r in report.recovery)
    for entry in report.recovery:
        struck = entry["injected_at"]
        later = [t for t in strikes if t > struck]
        until = min([end, struck + 60_000, *later[:1]])
        dark_runs = []
        for p in sorted(darkness.jobs_of):
            longest: tuple[int, int] | None = None
            began: int | None = None
            for t in range(struck, until + 1, 500):
                if darkness.dark(p, t):
                    began = t if began is None else began
                    if longest is None or t - began > longest[1] - longest[0]:
                        longest = (began, t)
                else:
                    began = None
            if longest is None:
                continue
            # Dark at t means granting nothing while owing since t - DARK_BOUND_MS.
            lo, hi = longest[0] - DARK_BOUND_MS, longest[1]
            said = sorted(t for t in named.get(p, ()) if lo <= t <= hi)
            ready_owner = sum(
                1
                for r, owned in zip(samples, owned_then, strict=True)
                if lo + DARK_BOUND_MS <= int(r["at"]) <= hi
                and r.get("readyz") == 200
                and p in owned
            )
            dark_runs.append(
                {
                    "partition": p,
                    "dark_s": (hi - lo) / 1000,
                    "first_named_after_s": None if not said else round((said[0] - lo) / 1000, 1),
                    "named_for_s": len({t // 500 for t in said}) / 2,
                    "owner_said_ready_samples": ready_owner,
                }
            )
        window = [r for r in samples if struck <= int(r["at"]) <= until]
        answered = [int(r["metrics_ms"]) for r in window if r.get("metrics_ms") is not None]
        entry["dark_partitions"] = dark_runs
        entry["metrics_slowest_ms"] = max(answered, default=None)
        entry["metrics_unanswered"] = sum(
            1 for r in window if r.get("readyz") and r.get("metrics_ms") is None
        )


def _seconds(at: int | None, since: int) -> float | None:
    return None if at is None else round((at - since) / 1000, 1)


# -- projections and health ----------------------------------------------------------------------

_OUTCOME_OF = {
    "succeeded": "succeeded",
    "failed": "failed",
    "failed_ambiguous": "failed",
    "lease_expired": "lease_expired",
}


def _expected_view(run: Run) -> dict[str, Any]:
    kind, reason = run.outcomes[-1] if run.outcomes else ("", "")
    state = {
        "RunCompleted": "succeeded",
        "RunDeadLettered": "dead",
        "RunCancelled": "cancelled",
    }.get(kind, "live")
    return {
        "state": state,
        "dead_reason": reason if kind == "RunDeadLettered" else None,
        "attempts": [
            (lease.attempt, lease.worker, _OUTCOME_OF.get(lease.ended_by or ""))
            for lease in run.leases
        ],
    }


def _check_projections(history: History, f: Fold, in_window: set[str], report: Report) -> None:
    compared = 0
    for node, team_runs in sorted(history.api_runs.items()):
        runs = {f.resolve(run_id): view for run_id, view in team_runs.items()}
        for run_id in sorted(in_window):
            run = f.runs[run_id]
            want = _expected_view(run)
            if want["state"] == "live":
                continue  # reported as run_without_outcome
            got = runs.get(run_id)
            compared += 1
            if got is None:
                report.violate("projection_differs", f"{node}: {run_id} missing")
                continue
            seen = {
                "state": got["state"],
                "dead_reason": got.get("dead_reason"),
                "attempts": [
                    (a["attempt"], a["worker_id"], a["outcome"]) for a in got.get("attempts", [])
                ],
            }
            if run.cancelled and seen["state"] == "cancelled":
                seen["attempts"] = want["attempts"]  # a cancelled lease's end is not ours to say
            if seen != want:
                report.violate("projection_differs", f"{node}: {run_id} {seen} != {want}")
        for run_id in runs:
            if run_id not in f.runs:
                report.violate("projection_differs", f"{node}: {run_id} is not in the log")
    report.figures["projection_runs_compared"] = compared


def _check_health(history: History, report: Report) -> None:
    owned = 0.0
    for node, h in sorted(history.health.items()):
        if h.error:
            report.violate("partition_not_running", f"{node}: {h.error}")
            continue
        if not h.ready:
            report.violate("partition_not_running", f"{node}: /readyz is not 200")
        owned += h.metrics.get("cronlog_partitions_owned", 0.0)
        if h.metrics.get("cronlog_node_ready", 1.0) != 1.0:
            report.violate("partition_not_running", f"{node}: cronlog_node_ready is 0")
        if h.metrics.get("cronlog_worker_up", 1.0) != 1.0:
            report.violate("partition_not_running", f"{node}: a worker process did not answer")
        for name, value in h.metrics.items():
            if ("not_running" in name or "not_deciding" in name) and value > 0:
                report.violate("partition_not_running", f"{node}: {name} = {value}")
    report.figures["partitions_owned"] = owned
    report.figures["nodes_not_ready"] = sum(not h.ready for h in history.health.values())
    report.figures["partitions_not_deciding"] = sum(
        h.metrics.get("cronlog_partitions_not_deciding", 0.0) for h in history.health.values()
    )
    if history.health and owned != history.partitions:
        report.violate(
            "partition_not_running",
            f"the nodes own {owned:.0f} partitions between them, not {history.partitions}",
        )


# -- the summary ---------------------------------------------------------------------------------


def summary(report: Report) -> str:
    f = report.figures
    dup = f.get("duplicate_deliveries", {})
    lines = [
        "chaos check: " + ("PASSED" if report.ok else f"FAILED ({f.get('violations')} violations)"),
        f"slots checked {f.get('slots_checked')}, never run {f.get('slots_never_run')} "
        f"({f.get('jobs_with_slots_never_run')} jobs, partitions "
        f"{f.get('partitions_with_slots_never_run')}); skipped {f.get('slots_skipped')}",
        f"runs checked {f.get('runs_checked')}, without an outcome {f.get('runs_without_outcome')};"
        f" outcomes {f.get('run_outcomes')}",
        f"deliveries {f.get('deliveries')}; duplicates after a lease expired "
        f"{dup.get('after_lease_expired', 0)}, after a timeout {dup.get('after_timeout', 0)}, "
        f"stale (a zombie's, after a newer attempt's) {dup.get('stale_token', 0)}, "
        f"other {dup.get('other', 0)}; retries after a definite failure "
        f"{f.get('retries_after_a_definite_failure')}",
        f"critical delivered twice {f.get('critical_delivered_twice')}, stale completion "
        f"accepted {f.get('stale_completion_accepted')}, run materialised twice "
        f"{f.get('run_materialised_twice')}, lease overlaps {f.get('lease_overlaps')}, fired "
        f"early {f.get('fired_early')}; leases given back unused {f.get('leases_returned')}",
        f"critical dead-lettered outcome_unknown {f.get('critical_dead_outcome_unknown')} "
        f"{f.get('critical_outcome_unknown_why')}; no fault near "
        f"{f.get('critical_outcome_unknown_without_fault')}, the target told to outlast the "
        f"timeout {f.get('critical_outcome_unknown_target_slow')}",
        *_asking_lines(f),
        f"at the end: partitions owned {f.get('partitions_owned')}, not deciding "
        f"{f.get('partitions_not_deciding')}, nodes not ready {f.get('nodes_not_ready')}, dark "
        f"partitions (slots never run in the last 10 s) {f.get('dark_partitions_at_the_end')}",
        f"first-delivery lateness {f.get('first_delivery_lateness_ms')}",
        f"through the run: {f.get('health_samples')} samples of /readyz and /metrics, ready while"
        f" dark {f.get('ready_while_dark_samples')}; /metrics answered in"
        f" {f.get('metrics_answer_ms')} ms, unanswered (probe answered)"
        f" {f.get('metrics_unanswered_while_probe_answered')}",
        f"clock-step probes {f.get('clock_step_probes')}; nodes that exited by themselves "
        f"(started again) {len(f.get('nodes_exited_by_themselves', []))}",
        "recovery (fault -> every-second jobs on time again):",
    ]
    if "load_1m" in f:
        lines.insert(-1, f"machine's 1-minute load average through the run {f['load_1m']}")
    for r in report.recovery:
        lines.append(
            f"  {r['kind']:<18} {r['what']}  ready {r['ready_s']} s, on time again "
            f"{r['on_time_again_s']} s"
            + ("" if r["before_the_next_fault"] else " (after the next fault too)")
            + f", worst lateness {r['worst_lateness_ms']} ms; until healed"
            f" {r.get('late_until_healed')} slots over 1 s late (worst"
            f" {r.get('worst_until_healed_ms')} ms)"
        )
        for d in r.get("dark_partitions", []):
            lines.append(
                f"    partition {d['partition']} dark {d['dark_s']} s; named not deciding after"
                f" {d['first_named_after_s']} s, for {d['named_for_s']} s; its owner said ready"
                f" in {d['owner_said_ready_samples']} samples"
            )
        if "metrics_slowest_ms" in r:
            lines.append(
                f"    /metrics slowest {r['metrics_slowest_ms']} ms, unanswered (probe answered)"
                f" {r['metrics_unanswered']}"
            )
    for check_name in sorted(report.counts):
        lines.append(f"VIOLATION {check_name}: {report.counts[check_name]}")
        lines += [f"    {x}" for x in report.violations[check_name][:5]]
    return "\n".join(lines)


def _asking_lines(f: dict[str, Any]) -> list[str]:
    lines = []
    for name, g in f.get("critical_asking", {}).items():
        lines.append(
            f"critical {name}: runs {g['runs']}, asked {g['runs_asked']} ({g['asks']} asks),"
            f" answers {g['answers']}, completed by asking {g['completed_by_asking']}, retried"
            f" after {g['retried_after']}, outcome_unknown {g['outcome_unknown']}"
        )
    guard = f.get("guard")
    if guard is not None:
        lines.append(
            f"guard: calls {guard['calls']}, asks {guard['asks']}, late originals refused after"
            f" never_seen {guard['late_originals_refused_after_never_seen']}; resolvable left"
            f" outcome_unknown {f.get('resolvable_outcome_unknown')}, completed by asking"
            f" without a success {f.get('completed_by_asking_without_success')}, answers never"
            f" given {f.get('answer_not_given')}, fence broken {f.get('fence_broken')}"
        )
    return lines
