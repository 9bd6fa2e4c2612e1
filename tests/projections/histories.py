"""Realistic partition histories for projection tests, made by driving the real core.

``busy_partition(seed)`` registers a handful of jobs (cron, interval, one-shot, dependency;
every overlap policy; a critical job; push and pull targets) and then, chosen by a seeded RNG,
lets time pass, claims and finishes runs (successes, retried failures, permanent failures,
abandoned leases that expire), replays dead runs, cancels runs, pauses, resumes and cancels
jobs, and triggers runs by hand. The same seed gives the same log.

It never triggers a run by hand for a future slot: ``decide`` would then materialise that slot
a second time when it comes (see the report on ``core/decide.py``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from datetime import UTC, datetime

from core import events as ev
from core.commands import (
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
from core.errors import CronlogError
from core.jobs import Backoff, HttpTarget, JobSpec, PullTarget
from core.state import RunStatus
from eventlog.port import EventLog, PartitionWriter
from tests.core.harness import Sim

T0 = int(datetime(2026, 3, 7, 23, tzinfo=UTC).timestamp() * 1000)
POOL = "p"


def _spec(name: str, tenant: str, **kw: object) -> JobSpec:
    kw.setdefault("target", PullTarget(pool=POOL))
    return JobSpec(
        name=name,
        tenant=tenant,
        backoff=Backoff(base_sec=5, cap_sec=60),
        **kw,  # type: ignore[arg-type]
    )


def job_specs(prefix: str = "") -> dict[str, JobSpec]:
    """The jobs of a busy partition, by id; ``prefix`` keeps ids apart across partitions."""
    return {
        f"{prefix}rollup": _spec("rollup", "t1", schedule="*/20 * * * * *", max_attempts=2),
        f"{prefix}report": _spec(
            "report", "t1", schedule="* * * * *", overlap_policy="buffer_one", lease_sec=90
        ),
        f"{prefix}sync": _spec(
            "sync", "t2", interval_sec=45, overlap_policy="skip", max_attempts=3, priority=8
        ),
        f"{prefix}billing": _spec(
            "billing", "t2", schedule="*/2 * * * *", critical=True, overlap_policy="cancel_other"
        ),
        f"{prefix}hook": _spec(
            "hook",
            "t1",
            schedule="*/30 * * * * *",
            target=HttpTarget(url="http://127.0.0.1:9/"),
            misfire_policy="catch_up",
            catch_up_limit=3,
        ),
        f"{prefix}once": _spec("once", "t1", run_at=T0 + 90_000),
        f"{prefix}after": _spec("after", "t1", depends_on=(f"{prefix}rollup", f"{prefix}report")),
    }


def busy_partition(
    seed: int, steps: int = 200, partition: int = 0, prefix: str = "", cancel_jobs: bool = True
) -> Sim:
    """``cancel_jobs=False`` keeps every job alive, for long histories."""
    rng = random.Random(seed)
    sim = Sim(T0, partition)
    specs = job_specs(prefix)
    for job_id, spec in specs.items():
        sim.do(PutJob(job_id=job_id, spec=spec))
    leases: list[ev.LeaseGranted] = []
    job_ids = list(specs)
    for _ in range(steps):
        roll = rng.random()
        with contextlib.suppress(CronlogError):
            if roll < 0.25:
                sim.advance(rng.randint(1_000, 20_000))
            elif roll < 0.28:
                sim.jump(rng.randint(60_000, 600_000))  # the node was down
            elif roll < 0.55:
                while sim.ready:
                    got = sim.do(StartRun(run_id=sim.ready.popleft(), worker_id="node-1"))
                    leases += [e for e in got if isinstance(e, ev.LeaseGranted)]
                got = sim.do(
                    ClaimRuns(tenant=None, pool=POOL, worker_id=f"w{rng.randint(1, 3)}", limit=3)
                )
                leases += [e for e in got if isinstance(e, ev.LeaseGranted)]
            elif roll < 0.80 and leases:
                for _ in range(min(len(leases), rng.randint(1, 4))):
                    lease = leases.pop(rng.randrange(len(leases)))
                    with contextlib.suppress(CronlogError):
                        _finish(sim, rng, lease)
            elif roll < 0.84 and leases:
                lease = rng.choice(leases)
                sim.do(HeartbeatRun(run_id=lease.run_id, fencing_token=lease.fencing_token))
            elif roll < 0.88:
                dead = sorted(r for r, s in sim.state.runs.items() if s.status is RunStatus.DEAD)
                if dead:
                    run = sim.state.runs[rng.choice(dead)]
                    sim.do(ReplayRun(run_id=run.run_id, tenant=run.tenant))
            elif roll < 0.91 and sim.state.runs:
                run = sim.state.runs[rng.choice(sorted(sim.state.runs))]
                sim.do(CancelRun(run_id=run.run_id, tenant=run.tenant))
            elif roll < 0.95:
                job_id = rng.choice(job_ids)
                tenant = specs[job_id].tenant
                if rng.random() < 0.5:
                    sim.do(TriggerRun(job_id=job_id, tenant=tenant, idempotency_key=f"k{roll:.2f}"))
                else:
                    sim.do(
                        UpstreamSucceeded(
                            job_id=f"{prefix}after",
                            upstream_job_id=rng.choice([f"{prefix}rollup", f"{prefix}report"]),
                            scheduled_for=sim.now - sim.now % 60_000,
                        )
                    )
            elif roll < 0.99:
                job_id = rng.choice(job_ids)
                tenant = specs[job_id].tenant
                command = PauseJob if rng.random() < 0.5 else ResumeJob
                sim.do(command(job_id=job_id, tenant=tenant))
            elif cancel_jobs:
                job_id = rng.choice(job_ids)
                sim.do(CancelJob(job_id=job_id, tenant=specs[job_id].tenant))
    return sim


def _finish(sim: Sim, rng: random.Random, lease: ev.LeaseGranted) -> None:
    roll = rng.random()
    if roll < 0.1:
        return  # the worker vanished: the lease will expire
    outcome = Outcome.SUCCEEDED if roll < 0.6 else Outcome.FAILED
    sim.do(
        CompleteRun(
            run_id=lease.run_id,
            fencing_token=lease.fencing_token,
            outcome=outcome,
            error="" if outcome is Outcome.SUCCEEDED else f"exit {rng.randint(1, 3)}",
            permanent=outcome is Outcome.FAILED and roll > 0.95,
            ambiguous=outcome is Outcome.FAILED and roll > 0.9,
        )
    )


class _Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


class Writers:
    """The single writer of every partition of a log, for tests that fill a log."""

    def __init__(self, log: EventLog) -> None:
        self._member = log.join(_Quiet())
        for _ in range(1000):
            if len(self._member.owned()) == log.num_partitions:
                break
            self._member.poll(0.05)
        assert len(self._member.owned()) == log.num_partitions, "never owned every partition"

    def writer(self, partition: int) -> PartitionWriter:
        return self._member.writer(partition)

    def append(self, partition: int, events: Sequence[bytes], chunk: int = 500) -> list[int]:
        offsets: list[int] = []
        for i in range(0, len(events), chunk):
            offsets += self.writer(partition).append(events[i : i + chunk])
        return offsets

    def close(self) -> None:
        self._member.close()
