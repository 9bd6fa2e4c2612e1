"""The chaos checker on histories written by hand: a clean one passes, and each kind of broken
one is caught by the check that names it (a checker that cannot fail proves nothing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tools.chaos.checker import (
    FAULT_AFTER_MS,
    FAULT_BEFORE_MS,
    History,
    Job,
    NodeHealth,
    _late_between,
    check,
    summary,
)

T0 = 1_800_000_000_000  # a whole second
TENANT = "chaos"
LEASE_MS = 3000


@dataclass
class Builder:
    """A history as the events topic, the target and the workers would show it."""

    events: dict[int, list[tuple[int, dict[str, Any] | None]]] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)
    work: list[dict[str, Any]] = field(default_factory=list)
    creates: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[int, int] = field(default_factory=dict)
    partition_of: dict[str, int] = field(default_factory=dict)
    topic_records: list[dict[str, Any]] = field(default_factory=list)
    scoped: bool = True  # the log's ids are <tenant>/<id>, as cronlog writes them now

    def log_id(self, job_id: str) -> str:
        return f"{TENANT}/{job_id}" if self.scoped else job_id

    def emit(self, partition: int, event: dict[str, Any] | None) -> None:
        records = self.events.setdefault(partition, [])
        records.append((len(records) * 2, event))  # gaps, as transaction markers leave

    def job(
        self,
        job_id: str,
        partition: int = 0,
        *,
        first: int = T0,
        critical: bool = False,
        pull: bool = False,
        run_at: int | None = None,
        status_url: str | None = None,
        topic: bool = False,
        **more: Any,
    ) -> None:
        self.partition_of[job_id] = partition
        target: dict[str, Any] = (
            {"type": "pull", "pool": "p"} if pull else {"type": "http", "url": "x"}
        )
        if topic:
            target = {"type": "kafka", "topic": "team-chaos.ticks"}
        if status_url is not None:
            target["status_url"] = status_url
        spec: dict[str, Any] = {
            "name": job_id,
            "tenant": TENANT,
            "target": target,
            "critical": critical,
            "timezone": "UTC",
            **more,
        }
        if run_at is None:
            spec["schedule"] = "* * * * * *"
        else:
            spec["run_at"] = run_at
        self.creates.append({"job": job_id, "status": 201, "at": first - 5000})
        self.emit(
            partition,
            self._ev(
                "JobRegistered",
                job_id,
                first - 500,
                spec=spec,
                next_slot=run_at if run_at is not None else first,
            ),
        )

    def _ev(self, kind: str, job_id: str, at: int, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "at": at, "job_id": self.log_id(job_id), "tenant": TENANT, **fields}

    def _run_ev(
        self,
        kind: str,
        job_id: str,
        slot: int,
        at: int,
        token: int = 0,
        attempt: int = 1,
        **fields: Any,
    ) -> dict[str, Any]:
        return self._ev(
            kind,
            job_id,
            at,
            run_id=f"{self.log_id(job_id)}.{slot}",
            scheduled_for=slot,
            attempt=attempt,
            fencing_token=token,
            **fields,
        )

    def materialise(self, job_id: str, slot: int) -> None:
        self.emit(
            self.partition_of[job_id],
            self._run_ev(
                "RunMaterialised",
                job_id,
                slot,
                slot,
                available_at=slot,
                priority=5,
                next_slot=slot + 1000,
            ),
        )

    def lease(
        self, job_id: str, slot: int, at: int, *, attempt: int = 1, worker: str = "n1/executor"
    ) -> int:
        p = self.partition_of[job_id]
        token = self.tokens[p] = self.tokens.get(p, 0) + 1
        self.emit(
            p,
            self._run_ev(
                "LeaseGranted",
                job_id,
                slot,
                at,
                token,
                attempt,
                worker_id=worker,
                lease_expires_at=at + LEASE_MS,
                lateness_ms=at - slot,
            ),
        )
        return token

    def deliver(
        self,
        job_id: str,
        slot: int,
        token: int,
        at: int,
        *,
        attempt: int = 1,
        status: int = 200,
        worker: str | None = None,
        guard: str | None = None,
        held_ms: int = 20,
    ) -> None:
        """A call at the target (``guard``: what the guard in front of it decided; a
        ``proceed`` is handled for ``held_ms``) or a work item at a worker."""
        key = f"{self.log_id(job_id)}:{slot}"  # the target is sent the team's ids and this key
        if worker is None:
            call = {
                "kind": "call",
                "job": job_id,
                "run": f"{job_id}.{slot}",
                "slot": slot,
                "attempt": attempt,
                "token": token,
                "key": key,
                "at": at,
            }
            self.calls.append(call if guard is None else {**call, "guard": guard})
            self.calls.append(
                {
                    "kind": "answer",
                    "key": key,
                    "token": token,
                    "status": status,
                    "at": at + held_ms,
                    "ok": True,
                }
            )
        else:
            self.work.append(
                {
                    "kind": "work",
                    "worker": worker,
                    "run": f"{job_id}.{slot}",
                    "job": job_id,
                    "slot": slot,
                    "attempt": attempt,
                    "token": token,
                    "key": key,
                    "at": at,
                }
            )

    def produce(self, job_id: str, slot: int, token: int, at: int, attempt: int = 1) -> None:
        """A record in the team's topic, as a kafka:// run's transaction commits it."""
        body = {
            "job_id": job_id,
            "tenant": TENANT,
            "run_id": f"{job_id}.{slot}",
            "scheduled_for_ms": slot,
            "attempt": attempt,
            "fencing_token": token,
        }
        self.topic_records.append({"e": body, "t": at})

    def produced_run(self, job_id: str, slot: int, late_ms: int = 5) -> int:
        """A kafka:// run: leased, completed and produced together."""
        self.materialise(job_id, slot)
        token = self.lease(job_id, slot, slot + late_ms)
        self.complete(job_id, slot, token, slot + late_ms)
        self.produce(job_id, slot, token, slot + late_ms)
        return token

    def complete(self, job_id: str, slot: int, token: int, at: int, attempt: int = 1) -> None:
        self.emit(
            self.partition_of[job_id],
            self._run_ev("RunCompleted", job_id, slot, at, token, attempt, started_at=at - 30),
        )

    def expire(self, job_id: str, slot: int, token: int, at: int, *, critical: bool) -> None:
        p = self.partition_of[job_id]
        self.emit(p, self._run_ev("LeaseExpired", job_id, slot, at, token, lease_expires_at=at))
        if critical:
            self.emit(
                p,
                self._run_ev(
                    "RunDeadLettered",
                    job_id,
                    slot,
                    at,
                    token,
                    reason="outcome_unknown",
                    error="lease expired",
                ),
            )
        else:
            self.emit(
                p,
                self._run_ev(
                    "RetryScheduled",
                    job_id,
                    slot,
                    at,
                    token,
                    2,
                    available_at=at + 200,
                    delay_ms=200,
                ),
            )

    def ask(
        self,
        job_id: str,
        slot: int,
        token: int,
        at: int,
        said: str,
        *,
        ask: int = 1,
        heard: str | None = None,
    ) -> None:
        """An ask about ``token``'s attempt: the guard answers ``said`` (recorded by the target)
        and the log records ``heard`` (by default what was said)."""
        p = self.partition_of[job_id]
        self.emit(
            p,
            self._run_ev(
                "RunOutcomeAsked",
                job_id,
                slot,
                at,
                token,
                ask=ask,
                ask_at=at,
                answer_by=at + 30_000,
            ),
        )
        self.calls.append(
            {
                "kind": "status",
                "key": f"{self.log_id(job_id)}:{slot}",
                "token": token,
                "outcome": said,
                "status": 200 if said == "succeeded" else None,
                "at": at + 5,
                "authorized": True,
            }
        )
        answer = heard or said
        status = 200 if answer == "succeeded" else None
        self.emit(
            p,
            self._run_ev(
                "RunOutcomeAnswered",
                job_id,
                slot,
                at + 10,
                token,
                ask=ask,
                answer=answer,
                status=status,
            ),
        )

    def fine_run(
        self, job_id: str, slot: int, late_ms: int = 10, worker: str = "n1/executor"
    ) -> None:
        self.materialise(job_id, slot)
        token = self.lease(job_id, slot, slot + late_ms, worker=worker)
        self.deliver(job_id, slot, token, slot + late_ms + 2)
        self.complete(job_id, slot, token, slot + late_ms + 40)

    def history(self, window_end: int, **extra: Any) -> History:
        return History(
            tenant=TENANT,
            partitions=2,
            events=self.events,
            calls=self.calls,
            work=self.work,
            creates=self.creates,
            faults=self.faults,
            window_end_ms=window_end,
            topic_records=self.topic_records,
            **extra,
        )


def clean(seconds: int = 10) -> Builder:
    b = Builder()
    b.job("a", 0)
    b.job("b", 1, critical=True)
    for i in range(seconds):
        b.fine_run("a", T0 + i * 1000)
        b.fine_run("b", T0 + i * 1000)
    return b


def end(seconds: int = 10) -> int:
    return T0 + (seconds - 1) * 1000


def test_a_clean_history_passes_with_its_figures() -> None:
    report = check(clean().history(end()))
    assert report.ok, report.as_json()["violations"]
    f = report.figures
    assert f["slots_checked"] == 20 and f["runs_checked"] == 20
    assert f["slots_never_run"] == 0 and f["runs_without_outcome"] == 0
    assert f["run_outcomes"] == {"succeeded": 20}
    assert f["deliveries"] == 20 and f["duplicate_deliveries"] == {}


def test_a_slot_that_never_ran_and_a_run_without_an_outcome_are_caught() -> None:
    b = clean()
    b.materialise("a", T0 + 10_000)  # materialised, never ended
    report = check(b.history(end(12)))  # the window reaches two seconds further
    assert report.counts["run_without_outcome"] == 1
    assert report.counts["slot_never_run"] == 3  # a's 11th second, b's 11th and 12th
    assert report.figures["jobs_with_slots_never_run"] == 2
    assert report.figures["partitions_with_slots_never_run"] == [0, 1]


def test_an_acknowledged_job_missing_from_the_log_is_caught() -> None:
    b = clean()
    b.creates.append({"job": "lost", "status": 201, "at": T0})
    b.creates.append({"job": "refused", "status": 503, "at": T0})
    report = check(b.history(end()))
    assert report.counts == {"acknowledged_job_lost": 1}
    assert report.violations["acknowledged_job_lost"] == ["lost"]


def test_a_slot_materialised_twice_is_caught() -> None:
    b = clean()
    b.materialise("a", T0 + 3000)
    assert check(b.history(end())).counts["run_materialised_twice"] == 1


def test_a_lease_granted_while_another_is_live_is_caught() -> None:
    b = clean()
    slot = T0 + 10_000
    b.materialise("a", slot)
    first = b.lease("a", slot, slot + 5)
    second = b.lease("a", slot, slot + 100, attempt=2)
    b.deliver("a", slot, second, slot + 110, attempt=2)
    b.complete("a", slot, second, slot + 150, attempt=2)
    report = check(b.history(end()))
    assert report.counts["lease_overlap"] == 1, report.counts
    assert first < second


def test_a_completion_with_a_stale_token_is_caught() -> None:
    b = clean()
    slot = T0 + 10_000
    b.materialise("a", slot)
    old = b.lease("a", slot, slot + 5)
    b.expire("a", slot, old, slot + 5 + LEASE_MS, critical=False)
    new = b.lease("a", slot, slot + 5 + LEASE_MS + 200, attempt=2)
    b.deliver("a", slot, old, slot + 10)
    b.deliver("a", slot, new, slot + LEASE_MS + 220, attempt=2)
    b.complete("a", slot, old, slot + LEASE_MS + 300)  # the old token's completion, accepted
    report = check(b.history(end()))
    assert report.counts["stale_completion_accepted"] == 1, report.counts


def test_a_redelivery_after_a_lost_lease_is_a_duplicate_and_for_a_critical_job_a_violation() -> (
    None
):
    b = clean()
    for job_id in ("a", "b"):  # a is not critical, b is
        slot = T0 + 10_000
        b.materialise(job_id, slot)
        old = b.lease(job_id, slot, slot + 5)
        b.deliver(job_id, slot, old, slot + 10)
        p = b.partition_of[job_id]
        b.emit(
            p,
            b._run_ev(
                "LeaseExpired",
                job_id,
                slot,
                slot + 5 + LEASE_MS,
                old,
                lease_expires_at=slot + 5 + LEASE_MS,
            ),
        )
        b.emit(
            p,
            b._run_ev(
                "RetryScheduled",
                job_id,
                slot,
                slot + 5 + LEASE_MS,
                old,
                2,
                available_at=slot + LEASE_MS + 300,
                delay_ms=200,
            ),
        )
        new = b.lease(job_id, slot, slot + LEASE_MS + 300, attempt=2)
        b.deliver(job_id, slot, new, slot + LEASE_MS + 310, attempt=2)
        b.complete(job_id, slot, new, slot + LEASE_MS + 400, attempt=2)
    report = check(b.history(end(11)))
    assert report.figures["duplicate_deliveries"] == {"after_lease_expired": 2}
    assert report.counts == {"critical_delivered_twice": 1}, report.counts
    assert report.violations["critical_delivered_twice"][0].startswith("chaos/b.")


def test_a_retry_after_a_definite_failure_is_not_a_duplicate() -> None:
    b = clean()
    slot = T0 + 10_000
    b.materialise("b", slot)  # critical: a definite failure may be retried
    first = b.lease("b", slot, slot + 5)
    b.deliver("b", slot, first, slot + 10, status=503)
    p = b.partition_of["b"]
    b.emit(p, b._run_ev("RunFailed", "b", slot, slot + 40, first, error="HTTP 503"))
    b.emit(
        p,
        b._run_ev(
            "RetryScheduled", "b", slot, slot + 40, first, 2, available_at=slot + 240, delay_ms=200
        ),
    )
    second = b.lease("b", slot, slot + 240, attempt=2)
    b.deliver("b", slot, second, slot + 250, attempt=2)
    b.complete("b", slot, second, slot + 300, attempt=2)
    b.fine_run("a", slot)
    report = check(b.history(end(11)))
    assert report.ok, report.counts
    assert report.figures["retries_after_a_definite_failure"] == 1


def test_a_critical_run_completed_by_asking_its_target_is_clean() -> None:
    # Its call timed out after reaching the target; the guard, asked (core.asking), said it
    # had succeeded: the attempt ends a success with no live lease, and nothing is delivered
    # twice.
    b = clean()
    b.job("g", 1, critical=True, run_at=T0 + 5000, status_url="s")
    slot = T0 + 5000
    b.materialise("g", slot)
    lease = b.lease("g", slot, slot + 5)
    b.deliver("g", slot, lease, slot + 10, guard="proceed", held_ms=1050)
    p = b.partition_of["g"]
    b.emit(
        p, b._run_ev("RunFailed", "g", slot, slot + 1000, lease, error="timed out", ambiguous=True)
    )
    b.ask("g", slot, lease, slot + 1000, "in_progress")
    b.ask("g", slot, lease, slot + 2100, "succeeded", ask=2)
    b.emit(
        p,
        b._run_ev(
            "RunCompleted", "g", slot, slot + 2110, lease, started_at=slot + 5, by_asking=True
        ),
    )
    report = check(b.history(end()))
    assert report.ok, report.counts
    assert report.figures["critical_asking"]["guarded"] == {
        "runs": 1,
        "runs_asked": 1,
        "asks": 2,
        "answers": {"in_progress": 1, "succeeded": 1},
        "completed_by_asking": 1,
        "retried_after": {},
        "outcome_unknown": 0,
    }
    assert report.figures["critical_asking"]["unguarded"]["runs"] == 10


def test_a_delivery_without_a_lease_in_the_log_and_a_success_never_delivered_are_caught() -> None:
    b = clean()
    b.calls = [c for c in b.calls if c["key"] != f"chaos/a:{T0}"]  # a's first success: no call
    b.deliver("a", T0 + 1000, 999, T0 + 1020)  # a token no lease had
    report = check(b.history(end()))
    assert report.counts["success_without_delivery"] == 1
    assert report.counts["delivery_without_lease"] == 1


def test_firing_early_is_allowed_only_by_the_deciding_nodes_clock_lead() -> None:
    b = Builder()
    b.job("a", 0)
    b.faults.append({"record": "clock", "node": "n3", "offset_s": 3.0, "at": T0})
    b.fine_run("a", T0, late_ms=-2500, worker="n3/executor")  # n3 runs 3 s ahead: allowed
    b.fine_run("a", T0 + 1000, late_ms=-500, worker="n1/executor")  # n1's clock is true
    report = check(b.history(T0 + 1000))
    assert report.counts == {"fired_early": 1}, report.counts
    assert report.violations["fired_early"][0].startswith(f"chaos/a.{T0 + 1000}")


def test_a_misfire_skip_is_a_dark_partition_and_a_skip_covers_its_slots() -> None:
    b = clean()
    b.emit(
        0,
        b._ev(
            "RunSkipped",
            "a",
            T0 + 30_000,
            scheduled_for=T0 + 10_000,
            last_scheduled_for=T0 + 11_000,
            count=2,
            reason="misfire",
            next_slot=T0 + 12_000,
        ),
    )
    b.fine_run("b", T0 + 10_000)
    b.fine_run("b", T0 + 11_000)
    report = check(b.history(end(12)))
    assert report.counts == {"slot_skipped_misfire": 1}, report.counts
    assert report.figures["slots_never_run"] == 0
    assert report.figures["slots_skipped"] == {"misfire": 2}


def test_recovery_is_the_first_of_three_on_time_seconds_after_the_fault() -> None:
    b = Builder()
    b.job("a", 0)
    for i in range(20):
        late = 4000 if 5 <= i < 9 else 20  # slots 5..8 fire 4 s late, then on time again
        b.fine_run("a", T0 + i * 1000, late_ms=late)
    b.faults.append(
        {
            "record": "fault",
            "kind": "node_kill",
            "node": "n1",
            "injected_at": T0 + 5300,
            "healed_at": T0 + 7000,
            "ready_at": T0 + 8000,
        }
    )
    report = check(b.history(T0 + 19_000))
    assert report.ok, report.counts
    [recovery] = report.recovery
    assert recovery["on_time_again_s"] == 3.7  # the slot at T0 + 9 s, 3.7 s after the kill
    assert recovery["worst_lateness_ms"] == 4002  # delivered 2 ms after its lease


def test_a_fault_after_which_nothing_fires_on_time_is_caught() -> None:
    b = clean()
    b.faults.append({"record": "fault", "kind": "restart_all", "injected_at": T0 + 8000})
    b.calls = [c for c in b.calls if c["at"] < T0 + 8000]
    report = check(b.history(end()))
    assert report.counts["never_on_time_again"] == 1


# -- outcome_unknown with no fault near -------------------------------------------------------

SET_ASIDE = T0 + 20_000  # the slot of the critical run dead-lettered outcome_unknown
LEASED = SET_ASIDE + 5  # its lease, granted 5 ms late, ran out LEASE_MS later, undecided since
RAN_OUT = LEASED + LEASE_MS


def set_aside(**spec: Any) -> Builder:
    """40 s of two every-second jobs, b critical, whose slot ``SET_ASIDE`` was called, answered,
    and its lease ran out all the same: dead-lettered ``outcome_unknown``."""
    b = Builder()
    b.job("a", 0)
    b.job("b", 1, critical=True, **spec)
    for i in range(40):
        b.fine_run("a", T0 + i * 1000)
        if T0 + i * 1000 != SET_ASIDE:
            b.fine_run("b", T0 + i * 1000)
    b.materialise("b", SET_ASIDE)
    token = b.lease("b", SET_ASIDE, LEASED)
    b.deliver("b", SET_ASIDE, token, LEASED + 5)
    b.expire("b", SET_ASIDE, token, RAN_OUT, critical=True)
    return b


def kill(injected: int, ready: int) -> dict[str, Any]:
    return {
        "record": "fault",
        "kind": "node_kill",
        "node": "n1",
        "injected_at": injected,
        "healed_at": min(injected + 500, ready),
        "ready_at": ready,
    }


def test_an_unknown_outcome_with_no_fault_near_is_a_violation() -> None:
    report = check(set_aside().history(T0 + 39_000))
    assert report.counts == {"outcome_unknown_without_fault": 1}, report.counts
    [said] = report.violations["outcome_unknown_without_fault"]
    assert said.startswith(f"chaos/b.{SET_ASIDE}: token ")
    assert f"{LEASED}..{RAN_OUT} (answered_200_before_the_lease_ran_out)" in said
    assert report.figures["critical_outcome_unknown_without_fault"] == 1
    assert "no fault near 1" in summary(report)


@pytest.mark.parametrize(
    ("fault", "near"),
    [
        (kill(LEASED + 1000, LEASED + 6000), True),  # struck while the lease was out
        (kill(T0 - 5000, LEASED - FAULT_AFTER_MS), True),  # ready just near enough before
        (kill(T0 - 5000, LEASED - FAULT_AFTER_MS - 1), False),
        (kill(RAN_OUT + FAULT_BEFORE_MS, T0 + 30_000), True),  # struck just after it ran out
        (kill(RAN_OUT + FAULT_BEFORE_MS + 1, T0 + 30_000), False),
        ({**kill(LEASED + 1000, 0), "ready_at": None, "healed_at": None}, True),  # never healed
    ],
    ids=["during", "ready-20s-before", "ready-earlier", "struck-1s-after", "struck-later", "open"],
)
def test_a_fault_near_the_last_lease_explains_its_unknown_outcome(
    fault: dict[str, Any], near: bool
) -> None:
    b = set_aside()
    b.faults.append(fault)
    report = check(b.history(T0 + 39_000))
    assert (report.counts["outcome_unknown_without_fault"] == 0) is near, report.counts


def test_a_moved_clock_widens_near_by_its_move() -> None:
    # The leases a skewed node decides carry its instants: 2 s off, a fault ready 21.5 s before
    # the lease's instant may have been 19.5 s before it.
    b = set_aside()
    b.faults += [
        {"record": "clock", "node": "n2", "offset_s": 2.0, "at": T0 + 500},
        {"record": "clock", "node": "n2", "offset_s": 0.0, "at": T0 + 600},
        kill(T0 - 5000, LEASED - FAULT_AFTER_MS - 1500),
    ]
    report = check(b.history(T0 + 39_000))
    assert report.counts["outcome_unknown_without_fault"] == 0, report.counts


def test_an_attempt_the_target_was_told_to_hold_past_the_timeout_is_the_targets_doing() -> None:
    slow = {"chaos": {"hold_ms": [20, 200], "slow_permille": 1000, "slow_ms": 4600}}
    b = set_aside(payload=slow, timeout_sec=4.0)
    report = check(b.history(T0 + 39_000))
    assert report.ok, report.counts
    assert report.figures["critical_outcome_unknown_target_slow"] == 1
    quick = {"chaos": {"hold_ms": [20, 200]}}  # told to answer at once: the node's doing
    report = check(set_aside(payload=quick, timeout_sec=4.0).history(T0 + 39_000))
    assert report.counts == {"outcome_unknown_without_fault": 1}, report.counts


def test_projections_are_compared_with_the_fold() -> None:
    b = clean(2)
    views = {
        f"a.{T0}": {
            "state": "succeeded",
            "dead_reason": None,
            "attempts": [{"attempt": 1, "worker_id": "n1/executor", "outcome": "succeeded"}],
        },
        f"a.{T0 + 1000}": {
            "state": "dead",
            "dead_reason": "outcome_unknown",
            "attempts": [{"attempt": 1, "worker_id": "n1/executor", "outcome": "lease_expired"}],
        },
    }
    report = check(b.history(end(2), api_runs={"n1": views}))
    assert report.counts == {"projection_differs": 3}  # a's second run and both of b's
    assert any(f"a.{T0 + 1000}" in v for v in report.violations["projection_differs"])


def test_a_node_not_ready_or_partitions_unowned_at_the_end_are_caught() -> None:
    healthy = {"cronlog_partitions_owned": 1.0, "cronlog_node_ready": 1.0}
    report = check(
        clean().history(
            end(),
            health={
                "n1": NodeHealth(True, healthy),
                "n2": NodeHealth(
                    False, {"cronlog_partitions_owned": 0.0, "cronlog_node_ready": 0.0}
                ),
            },
        )
    )
    assert report.counts["partition_not_running"] == 3  # n2 unready twice; 1 of 2 owned
    assert report.figures["partitions_owned"] == 1.0


def test_foreign_records_are_counted_not_fatal() -> None:
    b = clean()
    b.emit(0, None)
    b.emit(1, {"not": "an event"})
    report = check(b.history(end()))
    assert report.ok
    assert report.figures["foreign_records"] == 2


def test_a_zombies_call_after_a_newer_attempt_is_a_stale_duplicate() -> None:
    b = clean()
    slot = T0 + 10_000
    b.materialise("a", slot)
    old = b.lease("a", slot, slot + 5, worker="n3/executor")  # n3 stops before calling
    b.expire("a", slot, old, slot + 5 + LEASE_MS, critical=False)
    new = b.lease("a", slot, slot + LEASE_MS + 300, attempt=2)
    b.deliver("a", slot, new, slot + LEASE_MS + 310, attempt=2)
    b.complete("a", slot, new, slot + LEASE_MS + 400, attempt=2)
    b.deliver("a", slot, old, slot + LEASE_MS + 2000)  # n3 resumes and calls with its token
    b.fine_run("b", slot)
    report = check(b.history(end(11)))
    assert report.ok, report.counts
    assert report.figures["duplicate_deliveries"] == {"stale_token": 1}


def test_a_create_answered_not_found_for_a_job_it_registered_is_caught() -> None:
    b = clean()
    b.creates.append({"job": "a", "status": 404, "at": T0 - 4000})
    report = check(b.history(end()))
    assert report.counts == {"create_answered_not_found": 1}


def test_a_log_from_before_ids_were_scoped_reads_the_same() -> None:
    b = Builder(scoped=False)
    b.job("a", 0)
    for i in range(5):
        b.fine_run("a", T0 + i * 1000)
    report = check(b.history(end(5), api_runs={"n1": {}}))
    assert report.figures["slots_checked"] == 5
    assert report.counts == {"projection_differs": 5}  # the node showed none of them


def test_a_completion_past_the_lease_instant_but_before_its_expiry_is_not_stale() -> None:
    # The log stalled past the lease's instant; no expiry was decided and no other lease
    # exists, so the holder's outcome is the truth (core.decide: a lease is live until its
    # LeaseExpired is in the log).
    b = clean()
    slot = T0 + 10_000
    b.materialise("a", slot)
    token = b.lease("a", slot, slot + 5)
    b.deliver("a", slot, token, slot + 10)
    b.complete("a", slot, token, slot + 5 + LEASE_MS + 3000)
    report = check(b.history(end()))
    assert report.counts["stale_completion_accepted"] == 0, report.counts


def test_a_run_withdrawn_before_its_slot_counts_as_never_materialised() -> None:
    b = clean()
    slot = T0 + 10_000
    b.materialise("a", slot)  # ahead of its slot (the lead time), then the job was paused
    b.emit(
        0,
        b._run_ev("RunCancelled", "a", slot, slot - 3000, reason="withdrawn", next_slot=slot),
    )
    b.fine_run("a", slot)  # resumed in time: the slot runs after all
    b.fine_run("b", slot)
    report = check(b.history(end(11)))
    assert report.ok, report.as_json()["violations"]
    assert report.figures["run_outcomes"] == {"succeeded": 22}


def test_a_node_of_several_workers_is_read_as_one() -> None:
    from tools.chaos.gather import parse_metrics

    text = "\n".join(
        [
            'cronlog_node_ready{worker="0"} 1.0',
            'cronlog_node_ready{worker="1"} 0.0',
            'cronlog_partitions_owned{worker="0"} 3.0',
            'cronlog_partitions_owned{worker="1"} 2.0',
            'cronlog_runs_total{tenant="a,b",worker="0"} 4.0',
            'cronlog_runs_total{tenant="a,b",worker="1"} 5.0',
            'cronlog_worker_up{worker="0"} 1.0',
            'cronlog_worker_up{worker="1"} 1.0',
            "cronlog_plain 7.0",
        ]
    )
    assert parse_metrics(text) == {
        "cronlog_node_ready": 0.0,  # ready only when every worker is
        "cronlog_partitions_owned": 5.0,
        'cronlog_runs_total{tenant="a,b"}': 9.0,
        "cronlog_worker_up": 1.0,
        "cronlog_plain": 7.0,
    }


def test_a_withdrawn_run_that_was_called_all_the_same_is_caught() -> None:
    b = clean()
    slot = T0 + 10_000
    b.materialise("a", slot)
    token = b.lease("a", slot, slot - 2000)  # armed ahead
    b.emit(
        0,
        b._run_ev("RunCancelled", "a", slot, slot - 1000, reason="withdrawn", next_slot=slot),
    )
    b.deliver("a", slot, token, slot + 5)  # the executor never heard: the call was made
    report = check(b.history(end(11)))
    assert report.violations["withdrawn_run_delivered"], report.as_json()["violations"]


def dark_for_a_while() -> Builder:
    """Partition 0 leases nothing from slot 5 on until T0 + 13.5 s, then leases every slot it
    owes at once (a broker's death held its appends); partition 1 is on time throughout."""
    b = Builder()
    b.job("a", 0)
    b.job("b", 1)
    for i in range(25):
        slot = T0 + i * 1000
        b.fine_run("a", slot, late_ms=T0 + 13_500 - slot if 5 <= i < 13 else 20)
        b.fine_run("b", slot)
    b.faults.append(
        {"record": "fault", "kind": "broker_leader", "broker": 2, "injected_at": T0 + 5100}
    )
    return b


def sample(node: str, at: int, owned: list[int], reasons: str | None = None) -> dict[str, Any]:
    said: dict[str, Any] = {"readyz": 200} if reasons is None else {"readyz": 503}
    if reasons is not None:
        said["reasons"] = '{"error":"unavailable","message":"not ready: ' + reasons + '"}'
    return {"node": node, "at": at, **said, "metrics_ms": 30, "not_deciding": 0, "owned": owned}


def test_a_node_that_says_ready_while_its_partition_is_dark_is_caught() -> None:
    b = dark_for_a_while()
    samples = [
        sample("n1", T0 + 4000, [0]),  # before the darkness: ready is the truth
        sample("n2", T0 + 10_000, [1]),  # its partition calls on time
        sample("n1", T0 + 10_000, [0]),  # owing since T0 + 6 s, no lease since 4 s: a lie
        {"node": "n1", "at": T0 + 11_000, "readyz": 200, "metrics_ms": None},  # owner as last seen
    ]
    report = check(b.history(T0 + 24_000, health_samples=samples))
    assert report.counts["ready_while_dark"] == 2, report.as_json()["violations"]
    assert all("partition 0" in v for v in report.violations["ready_while_dark"])
    assert report.figures["metrics_unanswered_while_probe_answered"] == 1
    [fault] = report.recovery
    [dark] = fault["dark_partitions"]
    # Owed from T0 + 6 s (slot 5's on-time bound), silent from T0 + 4 s to slot 13's lease at
    # T0 + 13 s: dark, as looked at every half second from the fault, from T0 + 9.1 s (owed
    # for 3 s) to T0 + 10.6 s (the last look before that call within its grace), which is
    # dark from T0 + 6.1 s.
    assert dark["partition"] == 0 and dark["dark_s"] == 4.5
    assert dark["first_named_after_s"] is None and dark["owner_said_ready_samples"] == 1


def test_a_partition_gained_between_the_readiness_answer_and_the_metrics_is_judged_after() -> None:
    # /readyz is asked before /metrics: n1 said ready owning nothing dark, and was handed
    # partition 0 (dark since T0 + 6 s) before its metrics answered. Its next sample names it.
    b = dark_for_a_while()
    samples = [
        sample("n1", T0 + 9500, [1]),
        sample("n1", T0 + 10_000, [0, 1]),
        sample("n1", T0 + 10_500, [0, 1], "partitions not deciding: 0 (recovering)"),
    ]
    report = check(b.history(T0 + 24_000, health_samples=samples))
    assert report.ok, report.as_json()["violations"]
    # and ready again a sample later, still owning it dark: a lie
    samples.append(sample("n1", T0 + 11_000, [0, 1]))
    report = check(b.history(T0 + 24_000, health_samples=samples))
    assert report.counts["ready_while_dark"] == 1, report.as_json()["violations"]


def test_a_node_that_names_its_dark_partition_passes() -> None:
    b = dark_for_a_while()
    samples = [
        sample("n1", T0 + 8000, [0], "partitions not deciding: 0 (an append in flight for 2.1 s)"),
        sample("n1", T0 + 10_000, [0], "partitions not deciding (recovering or failing): 0, 1"),
        sample("n1", T0 + 12_000, [0], "partitions not deciding: 0 (4.2 s behind its timers)"),
        # catching up: the leases after the darkness are being decided within a second
        sample("n1", T0 + 13_000, [0]),
    ]
    report = check(b.history(T0 + 24_000, health_samples=samples))
    assert report.ok, report.as_json()["violations"]
    [dark] = report.recovery[0]["dark_partitions"]
    assert dark["first_named_after_s"] == 1.9 and dark["named_for_s"] == 1.0


def test_no_node_is_judged_while_a_clock_is_moved() -> None:
    # The leases the skewed node decides carry its instants, not the true ones.
    b = dark_for_a_while()
    b.faults += [
        {"record": "clock", "node": "n3", "offset_s": -4.0, "at": T0 + 5000},
        {"record": "clock", "node": "n3", "offset_s": 0.0, "at": T0 + 12_000},
    ]
    report = check(b.history(T0 + 24_000, health_samples=[sample("n3", T0 + 10_000, [0])]))
    assert report.ok, report.as_json()["violations"]


def test_slots_late_until_a_fault_healed_are_counted_over_the_faults_whole_length() -> None:
    job = Job("sec-0", 0, {"schedule": "* * * * * *"}, first_slot=10_000, next_slot=None)
    # Slots 11..14 s: on time, 1.5 s late, never started, 0.2 s late; the fault runs 10.5-14 s.
    first_at = {"sec-0": {11_000: 11_100, 12_000: 13_500, 14_000: 14_200, 15_000: 18_000}}
    late, worst = _late_between([job], first_at, 10_500, 14_000)
    assert (late, worst) == (2, 1_500)  # 12 s (1.5 s late) and 13 s (never); 15 s is after


# -- asking a guarded target (core.asking, tools.chaos.target) --------------------------------

ASKED = T0 + 5000  # the slot of the guarded one-shot asked about


def never_seen_then_retried(zombie: str | None = None) -> tuple[Builder, int, int]:
    """A guarded critical one-shot whose first lease ran out before its call went out (its
    node stood still); the guard, asked, answered never_seen and fenced the token; the retry
    was handled. ``zombie``: the first attempt's call then arrives all the same, and the guard
    decides it so (``stale``: refused; ``proceed``: handled, the fence broken)."""
    b = Builder()
    b.job("g", 0, critical=True, run_at=ASKED, status_url="s")
    b.materialise("g", ASKED)
    first = b.lease("g", ASKED, ASKED + 5)
    b.emit(
        0,
        b._run_ev("LeaseExpired", "g", ASKED, ASKED + 5 + LEASE_MS, first, lease_expires_at=0),
    )
    b.ask("g", ASKED, first, ASKED + 5 + LEASE_MS, "never_seen")
    b.emit(
        0,
        b._run_ev(
            "RetryScheduled",
            "g",
            ASKED,
            ASKED + LEASE_MS + 20,
            first,
            2,
            available_at=ASKED + LEASE_MS + 300,
            delay_ms=200,
        ),
    )
    second = b.lease("g", ASKED, ASKED + LEASE_MS + 300, attempt=2)
    b.deliver("g", ASKED, second, ASKED + LEASE_MS + 310, attempt=2, guard="proceed")
    b.complete("g", ASKED, second, ASKED + LEASE_MS + 400, attempt=2)
    if zombie is not None:
        status = 409 if zombie == "stale" else 200
        b.deliver("g", ASKED, first, ASKED + LEASE_MS + 900, guard=zombie, status=status)
    return b, first, second


def test_a_retry_after_never_seen_and_the_late_original_refused_by_the_fence_are_clean() -> None:
    b, _, _ = never_seen_then_retried(zombie="stale")
    views = {
        f"g.{ASKED}": {
            "state": "succeeded",
            "dead_reason": None,
            "attempts": [  # the read model keeps the first attempt's end as the log has it
                {"attempt": 1, "worker_id": "n1/executor", "outcome": "lease_expired"},
                {"attempt": 2, "worker_id": "n1/executor", "outcome": "succeeded"},
            ],
        }
    }
    report = check(b.history(ASKED, api_runs={"n1": views}))
    assert report.ok, report.as_json()["violations"]
    assert report.figures["critical_delivered_twice"] == 0
    assert report.figures["calls_refused_by_the_guard_stale"] == 1
    assert report.figures["guard"] == {
        "calls": {"proceed": 1, "stale": 1},
        "asks": {"never_seen": 1},
        "late_originals_refused_after_never_seen": 1,
    }
    guarded = report.figures["critical_asking"]["guarded"]
    assert guarded["answers"] == {"never_seen": 1}
    assert guarded["retried_after"] == {"never_seen": 1}
    assert guarded["outcome_unknown"] == 0 and guarded["completed_by_asking"] == 0


def test_a_retry_after_the_guard_answered_failed_is_no_duplicate() -> None:
    # The call was handled and failed (503), but its lease ran out before cronlog heard it;
    # asked, the guard says failed: the retry is no duplicate, and the attempt's end stays the
    # log's (lease_expired), as the read model shows it.
    b = Builder()
    b.job("g", 0, critical=True, run_at=ASKED, status_url="s")
    b.materialise("g", ASKED)
    first = b.lease("g", ASKED, ASKED + 5)
    b.deliver("g", ASKED, first, ASKED + 10, guard="proceed", status=503, held_ms=LEASE_MS)
    b.emit(0, b._run_ev("LeaseExpired", "g", ASKED, ASKED + 5 + LEASE_MS, first))
    b.ask("g", ASKED, first, ASKED + 5 + LEASE_MS, "failed")
    b.emit(
        0,
        b._run_ev("RetryScheduled", "g", ASKED, ASKED + LEASE_MS + 20, first, 2, available_at=0),
    )
    second = b.lease("g", ASKED, ASKED + LEASE_MS + 300, attempt=2)
    b.deliver("g", ASKED, second, ASKED + LEASE_MS + 310, attempt=2, guard="proceed")
    b.complete("g", ASKED, second, ASKED + LEASE_MS + 400, attempt=2)
    views = {
        f"g.{ASKED}": {
            "state": "succeeded",
            "dead_reason": None,
            "attempts": [
                {"attempt": 1, "worker_id": "n1/executor", "outcome": "lease_expired"},
                {"attempt": 2, "worker_id": "n1/executor", "outcome": "succeeded"},
            ],
        }
    }
    report = check(b.history(ASKED, api_runs={"n1": views}))
    assert report.ok, report.as_json()["violations"]
    assert report.figures["retries_after_a_definite_failure"] == 1
    assert report.figures["critical_asking"]["guarded"]["retried_after"] == {"failed": 1}


def test_a_late_original_the_guard_handled_after_never_seen_is_a_broken_fence() -> None:
    b, first, _ = never_seen_then_retried(zombie="proceed")
    report = check(b.history(ASKED))
    assert report.counts["fence_broken"] == 1, report.counts
    [said] = report.violations["fence_broken"]
    assert said.startswith(f"chaos/g.{ASKED}: token {first} handled")
    # cronlog sent nothing twice; the zombie's call is the old lease's, after a newer one
    assert report.counts["critical_delivered_twice"] == 1


def test_a_call_handled_before_the_never_seen_answer_breaks_no_fence() -> None:
    # A handled call of an older token, then an ask about a newer one the guard never saw:
    # the fence covers what comes after its answer only.
    b = Builder()
    b.job("g", 0, critical=True, run_at=ASKED, status_url="s")
    b.materialise("g", ASKED)
    first = b.lease("g", ASKED, ASKED + 5)
    b.deliver("g", ASKED, first, ASKED + 10, guard="proceed", status=503)
    b.emit(0, b._run_ev("RunFailed", "g", ASKED, ASKED + 40, first, error="HTTP 503"))
    b.emit(
        0,
        b._run_ev("RetryScheduled", "g", ASKED, ASKED + 40, first, 2, available_at=ASKED + 240),
    )
    second = b.lease("g", ASKED, ASKED + 240, attempt=2)
    b.emit(0, b._run_ev("LeaseExpired", "g", ASKED, ASKED + 240 + LEASE_MS, second))
    b.ask("g", ASKED, second, ASKED + 240 + LEASE_MS, "never_seen")
    b.emit(
        0,
        b._run_ev(
            "RunDeadLettered",
            "g",
            ASKED,
            ASKED + 240 + LEASE_MS + 20,
            second,
            reason="attempts_exhausted",
        ),
    )
    report = check(b.history(ASKED))
    assert report.counts["fence_broken"] == 0, report.counts


def test_a_guarded_run_set_aside_after_a_definite_answer_is_caught() -> None:
    # The guard answered never_seen; the log heard no answer and, out of asks, set it aside.
    b = Builder()
    b.job("g", 0, critical=True, run_at=ASKED, status_url="s")
    b.faults.append(kill(ASKED, ASKED + 3000))  # a fault near: outcome_unknown is not judged
    b.materialise("g", ASKED)
    token = b.lease("g", ASKED, ASKED + 5)
    b.deliver("g", ASKED, token, ASKED + 10, guard="proceed", held_ms=LEASE_MS + 100)
    b.emit(0, b._run_ev("LeaseExpired", "g", ASKED, ASKED + 5 + LEASE_MS, token))
    b.ask("g", ASKED, token, ASKED + LEASE_MS + 10, "in_progress")
    b.ask("g", ASKED, token, ASKED + LEASE_MS + 1100, "succeeded", ask=2, heard="no_answer")
    b.emit(
        0,
        b._run_ev(
            "RunDeadLettered",
            "g",
            ASKED,
            ASKED + LEASE_MS + 1200,
            token,
            reason="outcome_unknown",
        ),
    )
    report = check(b.history(ASKED))
    assert report.counts == {"resolvable_outcome_unknown": 1}, report.counts
    [said] = report.violations["resolvable_outcome_unknown"]
    assert said.endswith(f"the guard answered succeeded about its last attempt (token {token})")
    assert report.figures["critical_asking"]["guarded"]["outcome_unknown"] == 1
    assert report.figures["critical_asking"]["guarded"]["answers"] == {
        "in_progress": 1,
        "no_answer": 1,
    }


def test_a_guarded_run_set_aside_when_the_guard_could_not_say_is_no_violation() -> None:
    b = Builder()
    b.job("g", 0, critical=True, run_at=ASKED, status_url="s")
    b.faults.append(kill(ASKED, ASKED + 3000))
    b.materialise("g", ASKED)
    token = b.lease("g", ASKED, ASKED + 5)
    b.deliver("g", ASKED, token, ASKED + 10, guard="proceed", held_ms=LEASE_MS + 100)
    b.emit(0, b._run_ev("LeaseExpired", "g", ASKED, ASKED + 5 + LEASE_MS, token))
    b.ask("g", ASKED, token, ASKED + LEASE_MS + 10, "unknown")
    b.emit(
        0,
        b._run_ev(
            "RunDeadLettered", "g", ASKED, ASKED + LEASE_MS + 20, token, reason="outcome_unknown"
        ),
    )
    report = check(b.history(ASKED))
    assert report.ok, report.counts


def test_a_run_completed_by_asking_that_the_target_never_handled_with_a_success_is_caught() -> None:
    b = Builder()
    b.job("g", 0, critical=True, run_at=ASKED, status_url="s")
    b.materialise("g", ASKED)
    token = b.lease("g", ASKED, ASKED + 5)
    b.deliver("g", ASKED, token, ASKED + 10, guard="proceed", status=503, held_ms=1100)
    b.emit(
        0,
        b._run_ev("RunFailed", "g", ASKED, ASKED + 1000, token, error="timed out", ambiguous=True),
    )
    b.ask("g", ASKED, token, ASKED + 1000, "succeeded")  # the guard says so; its handling failed
    b.emit(0, b._run_ev("RunCompleted", "g", ASKED, ASKED + 1010, token, by_asking=True))
    report = check(b.history(ASKED))
    assert report.counts == {"completed_by_asking_without_success": 1}, report.counts


def test_an_answer_the_log_records_that_the_guard_never_gave_is_caught() -> None:
    b = Builder()
    b.job("g", 0, critical=True, run_at=ASKED, status_url="s")
    b.materialise("g", ASKED)
    token = b.lease("g", ASKED, ASKED + 5)
    b.deliver("g", ASKED, token, ASKED + 10, guard="proceed", held_ms=1100)
    b.emit(
        0,
        b._run_ev("RunFailed", "g", ASKED, ASKED + 1000, token, error="timed out", ambiguous=True),
    )
    b.ask("g", ASKED, token, ASKED + 1000, "in_progress", heard="succeeded")
    b.emit(0, b._run_ev("RunCompleted", "g", ASKED, ASKED + 1010, token, by_asking=True))
    report = check(b.history(ASKED))
    assert report.counts == {"answer_not_given": 1}, report.counts


def test_a_guarded_attempt_held_past_the_timeout_is_not_the_targets_doing() -> None:
    # The target can say what became of a slow attempt: set aside all the same, with no fault
    # near, it is the nodes' doing.
    slow = {"chaos": {"hold_ms": [20, 200], "slow_permille": 1000, "slow_ms": 4600}}
    b = set_aside(
        payload=slow, timeout_sec=4.0, target={"type": "http", "url": "x", "status_url": "s"}
    )
    report = check(b.history(T0 + 39_000))
    assert report.counts == {"outcome_unknown_without_fault": 1}, report.counts
    assert report.figures["critical_outcome_unknown_target_slow"] == 0


def _with_topic_job(seconds: int = 10) -> Builder:
    b = clean(seconds)
    b.job("t", 0, topic=True, critical=True)
    for i in range(seconds):
        b.produced_run("t", T0 + i * 1000)
    return b


def test_a_topic_job_with_one_record_per_succeeded_run_is_clean() -> None:
    report = check(_with_topic_job().history(end()))
    assert report.ok, report.as_json()["violations"]
    assert report.figures["topic_records"] == 10 == report.figures["topic_runs_succeeded"]
    assert report.figures["first_delivery_lateness_ms"]["topic"]["max"] == 5


def test_a_topic_record_twice_lost_or_of_a_run_that_did_not_succeed_is_caught() -> None:
    b = _with_topic_job()
    b.produce("t", T0, 10, T0 + 6)  # the first run again (a zombie's record, say)
    lost = T0 + 3000
    b.topic_records = [r for r in b.topic_records if r["e"]["scheduled_for_ms"] != lost]
    b.materialise("t", T0 + 10_000)
    token = b.lease("t", T0 + 10_000, T0 + 10_005)
    b.expire("t", T0 + 10_000, token, T0 + 13_005, critical=False)
    b.produce("t", T0 + 10_000, token, T0 + 10_005)  # produced, yet its lease expired
    report = check(b.history(end()))
    assert report.counts["topic_record_twice"] == 1
    assert report.counts["success_without_delivery"] == 1  # the record lost
    assert report.counts["topic_record_without_success"] == 1


def test_a_node_that_exited_by_itself_is_caught() -> None:
    b = clean()
    error = "python: rdkafka_queue.h:1086: rd_kafka_enq_once_del_source_return: Assertion"
    b.faults.append({"record": "exit", "node": "n1", "code": -6, "at": T0 + 3000, "error": error})
    report = check(b.history(end()))
    assert report.counts["node_exited_by_itself"] == 1
    [detail] = report.violations["node_exited_by_itself"]
    assert "n1 ended with -6" in detail and "rd_kafka_enq_once" in detail
    assert report.figures["nodes_exited_by_themselves"][0]["code"] == -6


def returned_then_leased_again(deliver_returned: bool) -> Builder:
    """A critical run's first lease given back unused (``LeaseReturned``), then leased anew
    and completed; with ``deliver_returned``, the token given back reached the target too."""
    b = clean()
    slot = T0 + 10_000
    b.fine_run("a", slot)
    b.materialise("b", slot)
    lost = b.lease("b", slot, slot + 5)
    b.emit(b.partition_of["b"], b._run_ev("LeaseReturned", "b", slot, slot + 2_000, lost))
    if deliver_returned:
        b.deliver("b", slot, lost, slot + 2_100)
    again = b.lease("b", slot, slot + 2_200)
    b.deliver("b", slot, again, slot + 2_210)
    b.complete("b", slot, again, slot + 2_300)
    return b


def test_a_lease_given_back_then_leased_anew_is_clean() -> None:
    report = check(returned_then_leased_again(deliver_returned=False).history(end(11)))
    assert report.ok, report.as_json()["violations"]
    assert report.figures["leases_returned"] == 1
    assert report.figures["duplicate_deliveries"] == {}


def test_a_lease_given_back_that_reached_a_worker_or_target_all_the_same_is_caught() -> None:
    report = check(returned_then_leased_again(deliver_returned=True).history(end(11)))
    assert report.counts.get("returned_lease_delivered") == 1, report.counts
