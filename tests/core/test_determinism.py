"""Replaying the log through ``evolve`` rebuilds exactly the state the live path holds.

Hypothesis drives a partition through random commands and clock moves (punctual and late),
including stale tokens, unknown ids and refused commands, with and without a lead time (runs
materialised ahead of their slot), slot decisions asked directly with any horizon
(``SlotDue.through``), and the answers of targets asked about runs of unknown outcome
(``AnswerOutcome``, also stale ones). After every step the state folded
from the encoded log, read back from zero, must equal the live state byte for byte, and a
refused command must have changed nothing.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import events as ev
from core.commands import (
    AnswerOutcome,
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
    SlotDue,
    StartRun,
    TriggerRun,
    UpstreamSucceeded,
)
from core.errors import CronlogError
from core.events import OutcomeAnswer
from core.jobs import Backoff, HttpTarget, JobSpec, PullTarget
from core.state import PartitionState, evolve
from tests.core.harness import Sim

T0 = int(datetime(2026, 3, 7, 23, tzinfo=UTC).timestamp() * 1000)
# Short, so that jobs that end are forgotten within a program (the clock moves up to 2 h a step).
RETENTION_MS = 600_000
JOBS = ["a", "b", "c", "d"]

specs = st.builds(
    JobSpec,
    name=st.just("j"),
    tenant=st.sampled_from(["t1", "t2"]),
    target=st.sampled_from(
        [
            HttpTarget(url="http://127.0.0.1:9/"),
            # a critical run of unknown outcome asks it (core.asking)
            HttpTarget(url="http://127.0.0.1:9/", status_url="http://127.0.0.1:9/status"),
            PullTarget(pool="p"),
        ]
    ),
    schedule=st.sampled_from(
        ["*/20 * * * * *", "*/20 * * * * *", "* * * * *", "*/5 * * * *", "30 1 * * *"]
    ),
    timezone=st.sampled_from(["UTC", "America/New_York"]),
    max_attempts=st.integers(1, 3),
    backoff=st.just(Backoff(base_sec=5, cap_sec=60)),
    lease_sec=st.sampled_from([5.0, 60.0, 600.0]),
    priority=st.integers(0, 9),
    misfire_policy=st.sampled_from(["skip", "fire_once", "catch_up"]),
    misfire_grace_sec=st.sampled_from([0.0, 60.0]),
    catch_up_limit=st.integers(1, 4),
    overlap_policy=st.sampled_from(["allow", "skip", "buffer_one", "cancel_other"]),
    allow_jitter_sec=st.sampled_from([0.0, 30.0]),
    critical=st.booleans(),
)
one_shots = st.builds(
    JobSpec,
    name=st.just("once"),
    tenant=st.just("t1"),
    target=st.just(PullTarget(pool="p")),
    run_at=st.integers(T0 - 60_000, T0 + 600_000),
)
dependants = st.builds(
    JobSpec,
    name=st.just("dep"),
    tenant=st.just("t1"),
    target=st.just(PullTarget(pool="p")),
    depends_on=st.just(("a", "b")),
)

job_ids = st.sampled_from(JOBS)
leads = st.sampled_from([0, 0, 5_000, 30_000])  # the partition's lead time
tenants = st.sampled_from(["t1", "t2", None])
steps = st.one_of(
    st.tuples(st.just("put"), job_ids, st.one_of(specs, one_shots, dependants)),
    st.tuples(st.just("advance"), st.integers(1, 400_000)),
    st.tuples(st.just("advance"), st.integers(1, 20_000)),
    st.tuples(st.just("advance"), st.integers(RETENTION_MS, 2 * RETENTION_MS)),
    st.tuples(st.just("cancel"), job_ids, st.just(None)),
    st.tuples(st.just("jump"), st.integers(1, 7_200_000)),
    st.tuples(st.just("start"), st.integers(0, 5)),
    st.tuples(st.just("start"), st.integers(0, 5)),
    st.tuples(st.just("claim"), tenants, st.integers(1, 3)),
    st.tuples(st.just("work"), st.sampled_from(list(Outcome)), st.booleans()),
    st.tuples(st.just("work"), st.sampled_from(list(Outcome)), st.booleans()),
    st.tuples(
        st.just("finish"),
        st.integers(0, 20),
        st.sampled_from(list(Outcome)),
        st.booleans(),
        st.booleans(),
        st.sampled_from([0, 0, 0, -1, 1]),
    ),
    st.tuples(
        st.just("finish"),
        st.integers(0, 20),
        st.just(Outcome.SUCCEEDED),
        st.just(False),
        st.just(False),
        st.just(0),
    ),
    st.tuples(st.just("heartbeat"), st.integers(0, 20), st.sampled_from([0, 0, -1, 1])),
    st.tuples(st.sampled_from(["pause", "resume", "pause", "resume", "cancel"]), job_ids, tenants),
    st.tuples(st.just("trigger"), job_ids, st.sampled_from([None, "k1", "k2"])),
    st.tuples(st.sampled_from(["cancel_run", "replay"]), st.integers(0, 20)),
    st.tuples(st.just("upstream"), st.sampled_from(["a", "b"]), st.integers(0, 3)),
    st.tuples(st.just("slot"), job_ids, st.one_of(st.none(), st.integers(-5_000, 120_000))),
    st.tuples(st.just("answer"), st.sampled_from(list(OutcomeAnswer)), st.sampled_from([0, 0, -1])),
    st.tuples(st.just("answer"), st.sampled_from(list(OutcomeAnswer)), st.just(0)),
)


def _kept(state: PartitionState) -> dict[str, list[str]]:
    return {job_id: sorted(runs) for job_id, runs in state.kept.items()}


def _run_ids(sim: Sim) -> list[str]:
    return sorted(sim.state.runs)


def _leases(events: list[ev.AnyEvent]) -> list[ev.LeaseGranted]:
    """The leases a start or a claim granted (a misfire of a run materialised ahead is
    withdrawn and skipped instead)."""
    return [e for e in events if isinstance(e, ev.LeaseGranted)]


def _apply(sim: Sim, step: tuple, leases: list[ev.LeaseGranted]) -> None:  # type: ignore[type-arg]
    kind = step[0]
    if kind == "put":
        sim.do(PutJob(job_id=step[1], spec=step[2]))
    elif kind == "advance":
        sim.advance(step[1])
    elif kind == "jump":
        sim.jump(step[1])
    elif kind == "start":
        for _ in range(step[1]):
            if sim.ready:
                leases += _leases(sim.do(StartRun(run_id=sim.ready.popleft(), worker_id="node")))
    elif kind == "claim":
        leases += _leases(sim.do(ClaimRuns(tenant=step[1], pool="p", worker_id="w", limit=step[2])))
    elif kind == "work":  # a busy worker: lease what is ready, then finish all of it
        while sim.ready:
            leases += _leases(sim.do(StartRun(run_id=sim.ready.popleft(), worker_id="node")))
        got = _leases(sim.do(ClaimRuns(tenant=None, pool="p", worker_id="w", limit=10)))
        leases += got
        for lease in got + leases[-3:]:
            with contextlib.suppress(CronlogError):
                sim.do(
                    CompleteRun(
                        run_id=lease.run_id,
                        fencing_token=lease.fencing_token,
                        outcome=step[1],
                        ambiguous=step[2],
                        error="e",
                    )
                )
    elif kind == "finish" and leases:
        lease = leases[-1 - step[1] % len(leases)]
        sim.do(
            CompleteRun(
                run_id=lease.run_id,
                fencing_token=lease.fencing_token + step[5],
                outcome=step[2],
                permanent=step[3],
                ambiguous=step[4],
                error="e",
            )
        )
    elif kind == "heartbeat" and leases:
        lease = leases[step[1] % len(leases)]
        sim.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token + step[2]))
    elif kind in ("pause", "resume", "cancel"):
        tenant = step[2] or "t1"
        command = {"pause": PauseJob, "resume": ResumeJob, "cancel": CancelJob}[kind]
        sim.do(command(job_id=step[1], tenant=tenant))
    elif kind == "trigger":
        sim.do(TriggerRun(job_id=step[1], tenant="t1", idempotency_key=step[2]))
    elif kind in ("cancel_run", "replay") and sim.state.runs:
        runs = _run_ids(sim)
        run = sim.state.runs[runs[step[1] % len(runs)]]
        command = CancelRun if kind == "cancel_run" else ReplayRun
        sim.do(command(run_id=run.run_id, tenant=run.tenant))
    elif kind == "slot":  # a slot decision asked directly, with any horizon
        through = None if step[2] is None else sim.now + step[2]
        sim.do(SlotDue(job_id=step[1], through=through))
    elif kind == "answer" and sim.asks:  # the executors' answer to an ask (or a stale one)
        run = sim.state.runs.get(sim.asks.popleft())
        if run is not None:
            sim.do(
                AnswerOutcome(
                    run_id=run.run_id,
                    fencing_token=run.fencing_token,
                    ask=run.ask + step[2],
                    answer=step[1],
                    status=200,
                )
            )
    elif kind == "upstream":
        sim.do(
            UpstreamSucceeded(
                job_id="d", upstream_job_id=step[1], scheduled_for=T0 + step[2] * 60_000
            )
        )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.tuples(specs, specs, one_shots, dependants),
    st.lists(steps, min_size=10, max_size=50),
    leads,
)
def test_replay_rebuilds_the_live_state(
    initial: tuple[JobSpec, ...],
    program: list[tuple],  # type: ignore[type-arg]
    lead_ms: int,
) -> None:
    sim = Sim(T0, retention_ms=RETENTION_MS, lead_ms=lead_ms)
    leases: list[ev.LeaseGranted] = []
    for job_id, spec in zip(JOBS, initial, strict=True):
        sim.do(PutJob(job_id=job_id, spec=spec))
    for step in program:
        before = sim.state.snapshot()
        logged = len(sim.log)
        try:
            _apply(sim, step, leases)
        except CronlogError:
            # A refused command decided nothing (timers it had already run may have).
            if len(sim.log) == logged:
                assert sim.state.snapshot() == before
        replayed = PartitionState(sim.state.partition)
        for raw in sim.log:
            evolve(replayed, ev.decode(raw))
        assert replayed.snapshot() == sim.state.snapshot()
        restored = PartitionState.restore(sim.state.snapshot())
        assert restored.snapshot() == sim.state.snapshot()
        assert _kept(restored) == _kept(sim.state)  # the derived index, kept up event by event
    tokens = [e.fencing_token for e in sim.events() if isinstance(e, ev.LeaseGranted)]
    assert tokens == sorted(set(tokens))
