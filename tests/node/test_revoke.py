"""Giving partitions up never waits long for their runners: the group waits for a member's
rebalance callback, so a runner held inside an append (a broker that stopped answering) must
not hold the other partitions, nor the callback, for long."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.commands import PutJob
from core.errors import CronlogError, Fenced
from core.jobs import JobSpec, PullTarget
from eventlog.embedded import EmbeddedLog
from eventlog.port import partition_for
from node.node import Node

PARTITIONS = 3


class HeldWriter:
    """Stands in for a writer whose broker stopped answering: an append waits for ``gate``,
    then fails as a closed writer does."""

    def __init__(self, inner: object, entered: threading.Semaphore, gate: threading.Event) -> None:
        self._inner = inner
        self._entered = entered
        self._gate = gate

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def append(
        self, events: Sequence[bytes], *, commands_through: int | None = None, outbound: Any = ()
    ) -> list[int]:
        self._entered.release()
        assert self._gate.wait(30), "the test never let the append go"
        raise Fenced("writer closed while the append was in flight")


def job_on(partition: int) -> str:
    return next(
        job_id
        for job_id in (f"job-{i}" for i in range(1000))
        if partition_for(job_id, PARTITIONS) == partition
    )


def test_revoking_partitions_whose_runners_are_inside_appends_returns_within_one_wait(
    tmp_path: Path,
) -> None:
    gate = threading.Event()
    entered = threading.Semaphore(0)
    with EmbeddedLog.open(tmp_path / "log", PARTITIONS) as log:
        node = Node(log, tmp_path / "node", stop_wait_s=0.2)
        node.start()
        answers: list[object] = []
        try:
            assert node.wait_ready(30)
            for runner in node._runners.values():
                runner._writer = HeldWriter(runner._writer, entered, gate)  # type: ignore[assignment]

            async def create_one_per_partition() -> None:
                spec = JobSpec(
                    name="held", tenant="team-a", target=PullTarget(pool="p"), run_at=2**40
                )
                answers.extend(
                    await asyncio.gather(
                        *(
                            node.execute(PutJob(job_id=job_on(p), spec=spec))
                            for p in range(PARTITIONS)
                        ),
                        return_exceptions=True,
                    )
                )

            creating = threading.Thread(target=asyncio.run, args=(create_one_per_partition(),))
            creating.start()
            for _ in range(PARTITIONS):
                assert entered.acquire(timeout=10)  # every runner is inside its append

            revoking = threading.Thread(target=node.revoked, args=(list(range(PARTITIONS)),))
            revoking.start()
            # One wait of 0.2 s in all; the runners' own join would be 10 s each.
            revoking.join(5)
            assert not revoking.is_alive(), "revoking waited for the runners' appends"
            assert not gate.is_set()
        finally:
            gate.set()
            creating.join(30)
            node.stop()
    assert len(answers) == PARTITIONS
    assert all(isinstance(answer, CronlogError) for answer in answers)  # told, not lost
