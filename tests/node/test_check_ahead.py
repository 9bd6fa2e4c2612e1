"""A worker's check of a run leased ahead (``HeartbeatRun.check``, a few seconds before the
start) is answered from the partition's state once its loop decides past the run's cut-off,
without queueing for a batch; one that comes before the cut-off is held by the loop and
answered once it decides past it, so a pause decided up to the cut-off withdraws the run
whenever the worker checked; anything but a live lease is answered by the loop at once (on a
fake clock)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from core import events as ev
from core.clock import FakeClock
from core.commands import HeartbeatRun, PauseJob, PutJob, TriggerRun
from core.decide import CHECK_GUARD_MS
from core.errors import LeaseLost, Unavailable
from core.jobs import JobSpec, PullTarget
from eventlog.memory import MemoryLog
from eventlog.port import partition_for
from node.node import Node
from node.runner import Request
from tests.cli.test_serve_workers import wait_until

PARTITIONS = 2
POOL = "p"
TENANT = "team-a"
START = 1_800_000_000_000
SLOT = START + 10_000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def node(tmp_path: Path, clock: FakeClock) -> Iterator[Node]:
    log = MemoryLog(PARTITIONS, gaps=True)
    n = Node(log, tmp_path / "node", node_id="only", clock=clock)
    n.start()
    assert n.wait_ready(10)
    yield n
    n.stop()
    log.close()


def job_in(partition: int, i: int) -> str:
    """A job id of the team that lands in ``partition``."""
    while True:
        job_id = f"{TENANT}/j{i}"
        if partition_for(job_id, PARTITIONS) == partition:
            return job_id
        i += 1


def lease_ahead(node: Node, job_ids: Sequence[str]) -> dict[str, ev.LeaseGranted]:
    for job_id in job_ids:
        spec = JobSpec(name=job_id, tenant=TENANT, target=PullTarget(pool=POOL), run_at=SLOT)
        asyncio.run(node.execute(PutJob(job_id=job_id, spec=spec)))
    leases = asyncio.run(node.claim(TENANT, POOL, "w", 10, horizon_ms=10_000))
    assert all(lease.start_at == SLOT for lease in leases)
    return {lease.job_id: lease for lease in leases}


def check(lease: ev.LeaseGranted, tenant: str = TENANT) -> HeartbeatRun:
    return HeartbeatRun(
        run_id=lease.run_id, fencing_token=lease.fencing_token, tenant=tenant, check=True
    )


def count_asked(node: Node, partition: int) -> list[HeartbeatRun]:
    """The checks the partition's loop is asked from here on."""
    runner = node._runners[partition]
    asked: list[HeartbeatRun] = []
    submit_many = runner.submit_many

    def counted(requests: Sequence[Request]) -> None:
        asked.extend(r.command for r in requests if isinstance(r.command, HeartbeatRun))
        submit_many(requests)

    runner.submit_many = counted  # type: ignore[method-assign]
    return asked


def test_an_early_check_is_held_until_the_cut_off_and_answered_with_every_decision_until_then(
    node: Node, clock: FakeClock
) -> None:
    a, b = job_in(0, 0), job_in(0, 100)
    leases = lease_ahead(node, [a, b])
    asked = count_asked(node, 0)
    runner = node._runners[0]

    # Ten seconds before the start: too early to hold; refused, nothing decided.
    [early] = asyncio.run(node.execute_many([check(leases[a])], visible=False))
    assert isinstance(early, Unavailable) and "send it later" in str(early)

    # Three seconds before it (the SDK's default): held by the loop until the cut-off.
    clock.set(SLOT - 3_000)
    answers: list[list[object]] = []
    worker = threading.Thread(
        target=lambda: answers.append(
            asyncio.run(node.execute_many([check(leases[a]), check(leases[b])], visible=False))
        )
    )
    worker.start()
    wait_until(lambda: len(runner._held_checks) == 2, 10, "both checks held")

    # b is paused up to its cut-off: withdrawn, and its held check must say so.
    clock.set(SLOT - CHECK_GUARD_MS)
    paused = asyncio.run(node.execute(PauseJob(job_id=b, tenant=TENANT)))
    assert [e.run_id for e in paused if isinstance(e, ev.RunCancelled)] == [leases[b].run_id]
    assert worker.is_alive() and not answers  # a batch at the cut-off answers none of them

    clock.set(SLOT - 1_000)  # past the cut-off: the loop's next batch answers both
    worker.join(10)
    [[held_a, held_b]] = answers
    assert held_a == [] and isinstance(held_b, LeaseLost)
    assert len(asked) == 3 and not runner._held_checks

    # From here on no decision can withdraw a: its checks are answered without the loop,
    # in a batch or alone ...
    assert asyncio.run(node.execute_many([check(leases[a])] * 3, visible=False)) == [[]] * 3
    assert asyncio.run(node.execute(check(leases[a]))) == []
    assert len(asked) == 3
    # ... but b's refusal, another team's check and a stale token still go to the loop.
    [withdrawn, foreign, stale] = asyncio.run(
        node.execute_many(
            [
                check(leases[b]),
                check(leases[a], tenant="team-b"),
                HeartbeatRun(
                    run_id=leases[a].run_id,
                    fencing_token=leases[a].fencing_token + 1,
                    tenant=TENANT,
                    check=True,
                ),
            ],
            visible=False,
        )
    )
    assert isinstance(withdrawn, LeaseLost) and isinstance(stale, LeaseLost)
    assert isinstance(foreign, LeaseLost)
    assert len(asked) == 6


def test_a_beat_that_extends_and_a_run_leased_at_its_start_always_go_to_the_loop(
    node: Node, clock: FakeClock
) -> None:
    a = job_in(1, 0)
    leases = lease_ahead(node, [a])
    clock.set(SLOT - 500)
    asked = count_asked(node, 1)
    asyncio.run(node.execute_many([check(leases[a])], visible=False))  # the loop's batch
    beat = HeartbeatRun(
        run_id=leases[a].run_id, fencing_token=leases[a].fencing_token, tenant=TENANT
    )
    [events] = asyncio.run(node.execute_many([beat], visible=False))
    assert isinstance(events, list) and any(isinstance(e, ev.Heartbeat) for e in events)
    assert len(asked) == 2  # an extension is decided, and appended, by the loop

    # A run leased at once (not ahead) has no start to guard: its check goes to the loop.
    now_job = job_in(1, 200)
    spec = JobSpec(name="now", tenant=TENANT, target=PullTarget(pool=POOL), schedule="0 0 1 1 *")
    asyncio.run(node.execute(PutJob(job_id=now_job, spec=spec)))
    asyncio.run(node.execute(TriggerRun(job_id=now_job, tenant=TENANT)))
    [lease] = asyncio.run(node.claim(TENANT, POOL, "w", 1))
    assert lease.start_at is None
    assert asyncio.run(node.execute_many([check(lease)], visible=False)) == [[]]
    assert len(asked) == 3
