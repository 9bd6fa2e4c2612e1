"""A node on the embedded log, with real time and a real HTTP target on loopback."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.commands import CancelRun, CompleteRun, Outcome, PauseJob, PutJob, ReplayRun, ResumeJob
from core.decide import ARM_GUARD_MS
from core.errors import NotYetReadable, Unavailable
from core.events import RunCompleted
from core.jobs import Backoff, HttpTarget, JobSpec, PullTarget
from eventlog.embedded import EmbeddedLog
from node import node as node_module
from node.executors import Executors
from node.node import Node
from node.worker import OneShot
from tests.node.targets import LOOPBACK_ALLOWED, Call, Target

pytestmark = pytest.mark.slow


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target().start()
    yield t
    t.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    log = EmbeddedLog.open(tmp_path / "log", 4)
    n = Node(
        log,
        tmp_path / "node",
        node_id="n1",
        executors=Executors("n1", egress=LOOPBACK_ALLOWED),
    )
    n.start()
    assert n.wait_ready(10)
    yield n
    n.stop()
    log.close()


def spec(url: str, **kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        name="job",
        tenant="team-a",
        target=HttpTarget(url=url),
        backoff=Backoff(base_sec=0.2, factor=2, cap_sec=5, jitter=False),
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def state_of(node: Node, run_id: str) -> str | None:
    view = node.history.run("team-a", run_id)
    return view.state if view is not None else None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_one_shot_fires_within_a_second_with_the_run_headers(node: Node, target: Target) -> None:
    slot = now_ms() + 700
    asyncio.run(node.execute(PutJob(job_id="once", spec=spec(target.url, run_at=slot))))
    (call,) = target.wait_for(1, timeout_s=5)
    late_ms = call.received_at * 1000 - slot
    assert 0 <= late_ms < 1000, late_ms
    assert call.headers["Idempotency-Key"] == f"once:{slot}"
    assert call.headers["X-Cronlog-Run-Id"] == f"once.{slot}"
    assert call.headers["X-Cronlog-Attempt"] == "1"
    assert int(call.headers["X-Cronlog-Fencing-Token"]) >= 1
    assert call.body["scheduled_for_ms"] == slot
    assert node.history.wait_until(lambda: state_of(node, f"once.{slot}") == "succeeded", 5)


def test_cron_job_fires_every_second_slot(node: Node, target: Target) -> None:
    asyncio.run(node.execute(PutJob(job_id="tick", spec=spec(target.url, schedule="* * * * * *"))))
    calls = target.wait_for(3, timeout_s=6)
    assert len(calls) >= 3
    slots = [c.body["scheduled_for_ms"] for c in calls[:3]]
    assert slots == sorted(slots) and len(set(slots)) == 3
    for call in calls[:3]:
        assert 0 <= call.received_at * 1000 - call.body["scheduled_for_ms"] < 1000


def test_failing_target_retries_with_growing_delays_then_dead_letters_and_replays(
    node: Node, target: Target
) -> None:
    target.answer = lambda call: (503, {}, 0.0)
    slot = now_ms() + 100
    job = spec(target.url, run_at=slot, max_attempts=3)
    asyncio.run(node.execute(PutJob(job_id="flaky", spec=job)))
    calls = target.wait_for(3, timeout_s=10)
    assert [c.headers["X-Cronlog-Attempt"] for c in calls] == ["1", "2", "3"]
    gaps = [b.received_at - a.received_at for a, b in itertools.pairwise(calls)]
    assert gaps[1] > gaps[0] >= 0.2
    run_id = f"flaky.{slot}"
    assert node.history.wait_until(lambda: state_of(node, run_id) == "dead", 5)
    assert [r.run_id for r in node.history.runs("team-a", "dead").items] == [run_id]
    target.answer = lambda call: (200, {}, 0.0)
    asyncio.run(node.execute(ReplayRun(run_id=run_id, tenant="team-a")))
    calls = target.wait_for(4, timeout_s=5)
    assert calls[3].headers["X-Cronlog-Attempt"] == "4"
    assert int(calls[3].headers["X-Cronlog-Fencing-Token"]) > int(
        calls[2].headers["X-Cronlog-Fencing-Token"]
    )


def test_pause_stops_firing_and_resume_restarts(node: Node, target: Target) -> None:
    asyncio.run(node.execute(PutJob(job_id="p", spec=spec(target.url, schedule="* * * * * *"))))
    target.wait_for(1, timeout_s=5)
    asyncio.run(node.execute(PauseJob(job_id="p", tenant="team-a")))
    paused_at = time.time()
    count = len(target.calls)
    time.sleep(2.2)  # real time must pass to show that nothing fires while paused
    # A call armed ahead goes ahead when the pause comes within ARM_GUARD_MS of its start
    fired_while_paused = [
        c for c in target.calls[count:] if c.received_at > paused_at + ARM_GUARD_MS / 1000 + 0.1
    ]
    assert fired_while_paused == []
    asyncio.run(node.execute(ResumeJob(job_id="p", tenant="team-a")))
    calls = target.wait_for(len(target.calls) + 1, timeout_s=3)
    assert calls[-1].received_at > paused_at + 2


def test_cancel_of_a_running_run_reaches_the_executor(node: Node, target: Target) -> None:
    target.answer = lambda call: (200, {}, 5.0)  # a slow target: the run is still running
    slot = now_ms() + 100
    asyncio.run(
        node.execute(PutJob(job_id="slow", spec=spec(target.url, run_at=slot, lease_sec=1)))
    )
    target.wait_for(1, timeout_s=5)
    asyncio.run(node.execute(CancelRun(run_id=f"slow.{slot}", tenant="team-a")))
    # The executor abandons the call on its next heartbeat (every ~0.33 s), not after 5 s.
    assert node.executors.wait_idle(2)
    assert state_of(node, f"slow.{slot}") == "cancelled"


def test_a_dependent_job_runs_once_every_upstream_succeeded(node: Node, target: Target) -> None:
    from eventlog.port import partition_for

    # Upstream and dependant jobs on different partitions: the trigger crosses partitions.
    assert len({partition_for(j, 4) for j in ("up-a", "up-b", "after")}) > 1
    asyncio.run(
        node.execute(PutJob(job_id="after", spec=spec(target.url, depends_on=("up-a", "up-b"))))
    )
    slot = now_ms() + 300
    for job_id in ("up-a", "up-b"):
        asyncio.run(node.execute(PutJob(job_id=job_id, spec=spec(target.url, run_at=slot))))
    calls = target.wait_for(3, timeout_s=10)
    by_job = {c.body["job_id"]: c for c in calls}
    assert set(by_job) == {"up-a", "up-b", "after"}
    assert by_job["after"].body["scheduled_for_ms"] == slot  # the upstream runs' logical slot
    assert by_job["after"].received_at >= max(
        by_job["up-a"].received_at, by_job["up-b"].received_at
    )
    assert len(target.wait_for(4, timeout_s=1)) == 3  # and only once


def test_calls_that_end_while_a_heartbeat_is_decided_never_stop_a_partition(
    node: Node, target: Target
) -> None:
    # Calls of about a third of their lease end while their heartbeat is being decided: the
    # executor cancels the heartbeat, and the runner's answer then has nobody to take it. That
    # once killed the runner, and with it every job of its partition.
    rng = random.Random(7)
    target.answer = lambda call: (200, {}, rng.uniform(0.330, 0.345))
    jobs = [f"beat-{i}" for i in range(20)]
    for job_id in jobs:
        asyncio.run(
            node.execute(
                PutJob(
                    job_id=job_id,
                    spec=spec(target.url, schedule="* * * * * *", lease_sec=1, timeout_sec=5),
                )
            )
        )
    first = now_ms()

    def last_slots(calls: list[Call]) -> dict[str, int]:
        last: dict[str, int] = {}
        for call in calls:
            job_id = call.body["job_id"]
            last[job_id] = max(last.get(job_id, 0), call.body["scheduled_for_ms"])
        return last

    def kept_firing(calls: list[Call]) -> bool:
        last = last_slots(calls)
        return set(last) == set(jobs) and min(last.values()) >= first + 6_000

    # Every job kept firing: each has calls for slots at least 6 s after the first create
    # (awaited as such: retries after a lease ran out under load make a count of calls lie).
    calls = target.wait_until(kept_firing, timeout_s=30)
    assert node.ready() and node.not_deciding() == []
    assert node.metrics.runner_failures._value.get() == 0
    last_slot = last_slots(calls)
    assert set(last_slot) == set(jobs)
    assert min(last_slot.values()) >= first + 6_000


def test_a_partition_that_cannot_recover_is_not_ready_until_it_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Partition 2's state store cannot be opened (something else sits at its path): the node
    # owns the partition, says it is not deciding it, and keeps trying until it can.
    blocker = tmp_path / "node" / "state" / "p2"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a store")
    log = EmbeddedLog.open(tmp_path / "log", 4)
    n = Node(log, tmp_path / "node", node_id="n1")
    n.start()
    try:
        assert n.wait_owned(lambda owned: owned == [0, 1, 2, 3], 10)
        assert not n.wait_ready(2)
        assert n.not_deciding() == [2]
        assert n.gauges().partitions_not_deciding == 1
        scraped = n.metrics.render()
        assert b"cronlog_partitions_not_deciding 1.0" in scraped
        assert b'cronlog_partition_deciding{partition="2"} 0.0' in scraped
        assert b'cronlog_partition_deciding{partition="1"} 1.0' in scraped
        # /readyz names it, with why
        assert any("partitions not deciding: 2 (failing" in r for r in n.not_ready())
        blocker.unlink()
        assert n.wait_ready(40)  # the next try after its backoff finds the path free
        assert n.not_deciding() == []
        assert n.metrics.runner_failures._value.get() >= 1
    finally:
        n.stop()
        log.close()
    loud = [r for r in caplog.records if "partition 2: runner failed;" in r.getMessage()]
    assert len(loud) == 1 and loud[0].exc_info  # once with its traceback; repeats are short


def test_a_write_the_read_model_has_not_caught_up_with_is_unavailable_not_missing(
    node: Node, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The API answers a write from the read model. One that is behind (a node that has just
    # started and is catching up) once made a create answer 404 for the job it had just
    # registered; the caller must hear "unavailable, try again" instead.
    monkeypatch.setattr(node_module, "READ_YOUR_WRITES_S", 0.2)
    node._history_runner.stop()  # the read model stops following the log
    with pytest.raises(Unavailable):
        asyncio.run(node.execute(PutJob(job_id="behind", spec=spec(target.url, run_at=now_ms()))))
    assert node.history.job("team-a", "behind") is None  # it is behind...
    assert any("behind" in r.state.jobs for r in node._runners.values())  # ...the log is not


def _a_pending_pull_run(node: Node, job_id: str) -> int:
    """A one-shot of pool ``lagging`` due now, once its run is materialised and folded; its
    slot."""
    slot = now_ms()
    pull = spec("http://unused", target=PullTarget(pool="lagging"), run_at=slot)
    asyncio.run(node.execute(PutJob(job_id=job_id, spec=pull)))
    deadline = time.monotonic() + 10
    while state_of(node, f"{job_id}.{slot}") != "pending":  # another thread folds it
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return slot


def test_a_claim_whose_leases_the_read_model_has_not_caught_up_with_still_hands_them_out(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under a herd the read model's fold lagged the claims by more than the read-your-writes
    # wait: the leases were granted and durable, the claim gave up on them, and their runs
    # waited until the leases ran out with nobody working on them.
    slot = _a_pending_pull_run(node, "lag")
    monkeypatch.setattr(node_module, "READ_YOUR_WRITES_S", 0.2)
    node._history_runner.stop()  # the read model stops following the log
    (lease,) = asyncio.run(node.claim("team-a", "lagging", "w-1", 10))
    assert lease.run_id == f"lag.{slot}" and lease.worker_id == "w-1"
    assert state_of(node, lease.run_id) == "pending"  # the read model is behind
    owner = next(r for r in node._runners.values() if lease.run_id in r.state.runs)
    assert owner.state.runs[lease.run_id].worker_id == "w-1"  # the lease is the worker's


def test_a_batch_the_read_model_has_not_caught_up_with_answers_each_with_what_it_decided(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch of outcomes is durable once decided; an item whose answer does not read the
    # read model (POST /v1/runs:complete) takes what it decided from its refusal.
    _a_pending_pull_run(node, "done")
    (lease,) = asyncio.run(node.claim("team-a", "lagging", "w-1", 10))
    monkeypatch.setattr(node_module, "READ_YOUR_WRITES_S", 0.2)
    node._history_runner.stop()  # the read model stops following the log
    outcome = CompleteRun(
        run_id=lease.run_id,
        fencing_token=lease.fencing_token,
        outcome=Outcome.SUCCEEDED,
        tenant="team-a",
    )
    (answer,) = asyncio.run(node.execute_many([outcome]))
    assert isinstance(answer, NotYetReadable)
    assert [type(e) for e in answer.events] == [RunCompleted]
    # finished: it has left the partition's state
    assert all(lease.run_id not in r.state.runs for r in node._runners.values())


def test_an_answer_waits_for_the_read_model_without_a_thread_of_the_pool(
    node: Node, target: Target
) -> None:
    """Read-your-writes waited in ``asyncio.to_thread``: with the pool's threads busy (they are
    few: cores + 4), every write's answer queued behind them."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    release, model_held, model_free = threading.Event(), threading.Event(), threading.Event()
    once = {"schedule": "0 0 1 1 *"}

    def hold_the_read_model() -> None:  # it folds nothing until the writes wait for it
        with node.history._write_lock:
            model_held.set()
            model_free.wait(30)

    holder = threading.Thread(target=hold_the_read_model)
    holder.start()
    assert model_held.wait(10)

    async def go() -> int:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        busy = loop.run_in_executor(None, release.wait, 30)  # the pool's only thread, taken
        try:
            writes = asyncio.gather(
                *(
                    node.execute(PutJob(job_id=f"j{i}", spec=spec(target.url, **once)))
                    for i in range(8)
                )
            )
            deadline = time.monotonic() + 10
            while sum(node.events_end(p) for p in range(4)) < 8:  # all decided, none readable
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            model_free.set()
            answers = await asyncio.wait_for(writes, 10)
        finally:
            model_free.set()
            release.set()
            await busy
        return len(answers)

    assert asyncio.run(go()) == 8
    holder.join(10)
    assert all(node.history.job("team-a", f"j{i}") is not None for i in range(8))


def test_readiness_waits_for_what_it_is_told_to_after_the_partitions_recover(
    tmp_path: Path, target: Target
) -> None:
    # serve's start check of the embedded log (a required one-shot service) runs once the
    # partitions have recovered: they decide and fire meanwhile, and /readyz says ready only
    # once the check is done, naming it until then.
    log = EmbeddedLog.open(tmp_path / "log", 4)
    checked = threading.Event()

    def check(stopping: threading.Event) -> bool:
        n.wait_recovered(10)
        while not checked.wait(0.05):  # the test's go, or the node stopping
            if stopping.is_set():
                return False
        return True

    n = Node(
        log,
        tmp_path / "node",
        node_id="n1",
        executors=Executors("n1", egress=LOOPBACK_ALLOWED),
    )
    n.services.add(OneShot("log-check", check, required=True))
    n.start()
    try:
        assert n.wait_recovered(10)
        assert not n.ready()
        assert n.not_ready() == ["services down: log-check (at work)"]
        assert not n.wait_ready(0.2)
        asyncio.run(n.execute(PutJob(job_id="early", spec=spec(target.url, run_at=now_ms()))))
        assert target.wait_for(1, timeout_s=10)  # deciding and firing before the check ends
        assert not n.ready()
        checked.set()
        assert n.wait_ready(10) and n.ready() and n.not_ready() == []
    finally:
        n.stop()
        log.close()
