"""Executor processes: calls made in processes of their own, outcomes recorded by the node; a
process that dies is replaced, and the calls it had in flight end as ambiguous."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from core import events as ev
from core.commands import AnyCommand, CancelRun, CompleteRun, PutJob
from core.events import Trigger
from core.jobs import Backoff, HttpTarget, JobSpec
from core.state import JobState, RunState, RunStatus, hold_spec
from eventlog.embedded import EmbeddedLog
from node.executors import Executors
from node.node import Node
from tests.node.targets import LOOPBACK_ALLOWED, Target

pytestmark = pytest.mark.slow


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    log = EmbeddedLog.open(tmp_path / "log", 2)
    n = Node(
        log,
        tmp_path / "node",
        node_id="n1",
        executors=Executors("n1", egress=LOOPBACK_ALLOWED, processes=1),
    )
    n.start()
    assert n.wait_ready(10)
    yield n
    n.stop()
    log.close()


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target().start()
    yield t
    t.stop()


def once(url: str, at_ms: int, **kw: object) -> JobSpec:
    return JobSpec(
        name="once",
        tenant="team-a",
        target=HttpTarget(url=url),
        run_at=at_ms,
        backoff=Backoff(base_sec=0.2, jitter=False),
        **kw,  # type: ignore[arg-type]
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def state_of(node: Node, run_id: str) -> str | None:
    view = node.history.run("team-a", run_id)
    return None if view is None else view.state


def pids(node: Node) -> list[int]:
    processes = node.executors._processes
    assert processes is not None
    return processes.pids


def test_a_run_is_called_from_an_executor_process(node: Node, target: Target) -> None:
    [pid] = pids(node)
    assert pid != os.getpid() and os.path.exists(f"/proc/{pid}")
    slot = now_ms() + 300
    asyncio.run(node.execute(PutJob(job_id="a", spec=once(target.url, slot))))
    (call,) = target.wait_for(1, timeout_s=10)
    assert call.headers["Idempotency-Key"] == f"a:{slot}"
    assert node.history.wait_until(lambda: state_of(node, f"a.{slot}") == "succeeded", 10)


def test_a_process_that_dies_is_replaced_and_its_calls_end_ambiguous(
    node: Node, target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    target.answer = lambda call: (200, {}, 30.0 if call.body["job_id"] == "held" else 0.0)
    slot = now_ms() + 200
    asyncio.run(node.execute(PutJob(job_id="held", spec=once(target.url, slot, critical=True))))
    target.wait_for(1, timeout_s=10)  # the call is in the process, held by the target
    [pid] = pids(node)
    os.kill(pid, signal.SIGKILL)
    # The critical run's attempt may have taken effect: it is dead-lettered, not retried.
    run_id = f"held.{slot}"
    assert node.history.wait_until(lambda: state_of(node, run_id) == "dead", 15)
    view = node.history.run("team-a", run_id)
    assert view is not None and view.dead_reason == "outcome_unknown"
    # Another process takes its place, and the next run is called from it.
    deadline = time.monotonic() + 15
    while not pids(node) or pids(node)[0] == pid:
        assert time.monotonic() < deadline, "no executor process replaced the one that died"
        time.sleep(0.05)
    later = now_ms() + 200
    asyncio.run(node.execute(PutJob(job_id="after", spec=once(target.url, later))))
    assert node.history.wait_until(lambda: state_of(node, f"after.{later}") == "succeeded", 15)
    failures = node.metrics.thread_failures.labels("executor-process")._value.get()
    assert failures == 1
    ended = [r for r in caplog.records if "executor process 0" in r.getMessage()]
    assert ended and ended[0].levelno == logging.ERROR


def test_a_cancelled_run_abandons_its_call_in_the_process(node: Node, target: Target) -> None:
    target.answer = lambda call: (200, {}, 30.0)
    slot = now_ms() + 200
    asyncio.run(node.execute(PutJob(job_id="long", spec=once(target.url, slot, lease_sec=1))))
    target.wait_for(1, timeout_s=10)
    run_id = f"long.{slot}"
    asyncio.run(node.execute(CancelRun(run_id=run_id, tenant="team-a")))
    assert node.history.wait_until(lambda: state_of(node, run_id) == "cancelled", 10)
    # The next heartbeat is refused and the process is told to drop the call.
    processes = node.executors._processes
    assert processes is not None
    deadline = time.monotonic() + 10
    while any(p.pending for p in processes._processes) or node.executors.in_flight:
        assert time.monotonic() < deadline, "the cancelled call was never abandoned"
        time.sleep(0.05)


def test_a_lease_that_ran_out_before_its_call_is_reported_not_called(target: Target) -> None:
    # The node stood still (a pause, a stop) between granting the lease and calling: no call,
    # and a plain failure rather than an unknown outcome, since the target saw nothing.
    spec = once(target.url, 1_000, critical=True)
    lease = ev.LeaseGranted(
        at=1_000, job_id="j", tenant="team-a", run_id="j.1000", scheduled_for=1_000,
        attempt=1, fencing_token=3, worker_id="n1/executor", lease_expires_at=now_ms() - 1,
        lateness_ms=0,
    )  # fmt: skip
    asked: list[AnyCommand] = []

    async def route(command: AnyCommand) -> list[ev.AnyEvent]:
        asked.append(command)
        return []

    executors = Executors("n1", egress=LOOPBACK_ALLOWED)
    executors.route = route
    executors.start()
    try:
        job = JobState(
            job_id="j", encoded_spec=hold_spec(spec), version=1, registered_at=0, anchor=0
        )
        runner = SimpleNamespace(state=SimpleNamespace(jobs={"j": job}))
        run = RunState(
            run_id="j.1000", job_id="j", tenant="team-a", scheduled_for=1_000,
            available_at=1_000, priority=0, trigger=Trigger.SCHEDULE, status=RunStatus.RUNNING,
        )  # fmt: skip
        assert executors.reserve(runner, run)  # type: ignore[arg-type]
        executors.dispatch(runner, lease)  # type: ignore[arg-type]
        assert executors.wait_idle(10)
        deadline = time.monotonic() + 10
        while not asked:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        executors.stop()
    [complete] = asked
    assert isinstance(complete, CompleteRun)
    assert complete.fencing_token == 3 and not complete.ambiguous
    assert complete.error.startswith("not called")
    assert target.calls == []


def test_a_call_handed_to_a_process_after_its_lease_ran_out_is_not_made(target: Target) -> None:
    # The node checked the lease when it handed the call over; a process that takes the call
    # up later (a backlog, a pause) checks again: another node may own the run by then.
    from node.call_process import CallerProcesses
    from node.calls import NOT_CALLED, CallerConfig

    lease = ev.LeaseGranted(
        at=1_000, job_id="j", tenant="team-a", run_id="j.1000", scheduled_for=1_000,
        attempt=1, fencing_token=3, worker_id="n1/executor", lease_expires_at=now_ms() - 1,
        lateness_ms=0,
    )  # fmt: skip

    async def scenario() -> None:
        processes = CallerProcesses(CallerConfig(egress=LOOPBACK_ALLOWED), 1)
        await processes.start()
        try:
            result = await asyncio.wait_for(
                processes.submit(lease, once(target.url, 1_000, critical=True)), 10
            )
        finally:
            await processes.stop()
        assert (result.outcome.value, result.error, result.ambiguous) == (
            "failed",
            NOT_CALLED,
            False,
        )

    asyncio.run(scenario())
    assert target.calls == []


def test_the_processes_start_returns_once_each_process_is_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's start (an interpreter, its imports, the HTTP client) takes seconds on a
    loaded machine. The executors' start, and so the node's joining its group after it, waits
    for each process's word that it is set up: no call waits behind a process's imports."""
    from node import call_process
    from node.calls import CallerConfig

    marked = tmp_path / "started"
    slow = (
        "import pathlib, sys, time; time.sleep(0.5); "
        f"pathlib.Path({str(marked)!r}).touch(); "
        "from node.call_process import main; main(sys.argv)"
    )
    monkeypatch.setattr(call_process, "_command", lambda: [sys.executable, "-c", slow])

    async def scenario() -> bool:
        processes = call_process.CallerProcesses(CallerConfig(egress=LOOPBACK_ALLOWED), 2)
        await processes.start()
        try:
            return marked.exists()  # marked before the process set up and said so
        finally:
            await processes.stop()

    assert asyncio.run(scenario())


_HTTP_CLIENT_IMPORTED = """
import sys
from cli.main import build_parser
from cli import serve
from node.executors import Executors
from node.node import Node

args = build_parser().parse_args(["serve", "--allow-targets", "127.0.0.0/8"])
serve.load_egress(args)
Executors("n1", processes={processes})
print(sorted(name for name in sys.modules if name.split(".")[0] == "aiohttp")[:3])
"""


@pytest.mark.parametrize(("processes", "imported"), [(1, False), (0, True)])
def test_a_node_whose_calls_are_made_in_processes_does_not_import_the_http_client(
    processes: int, imported: bool
) -> None:
    """aiohttp is a tenth of a second of a node's start (a restart's, before it recovers): the
    executor processes import it, the node's own process only when it makes calls itself."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = _HTTP_CLIENT_IMPORTED.format(processes=processes)
    found = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert (found != "[]") is imported, found
