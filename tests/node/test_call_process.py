"""Executor processes: calls made in processes of their own, outcomes recorded by the node; a
process that dies is replaced, and the calls it had in flight end as ambiguous."""

from __future__ import annotations

import asyncio
import json
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


def holding(node: Node) -> tuple[int, int]:
    """The index and pid of the process that has calls in flight."""
    processes = node.executors._processes
    assert processes is not None
    [busy] = [p for p in processes._processes if p.pending]
    return busy.index, busy.popen.pid


def test_a_run_is_called_from_an_executor_process(node: Node, target: Target) -> None:
    shared, kept = pids(node)  # one process, and the one kept for teams with few calls
    for pid in (shared, kept):
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
    index, pid = holding(node)
    os.kill(pid, signal.SIGKILL)
    # The critical run's attempt may have taken effect: it is dead-lettered, not retried.
    run_id = f"held.{slot}"
    assert node.history.wait_until(lambda: state_of(node, run_id) == "dead", 15)
    view = node.history.run("team-a", run_id)
    assert view is not None and view.dead_reason == "outcome_unknown"
    # Another process takes its place, and the next run is called from it.
    deadline = time.monotonic() + 15
    while len(pids(node)) < 2 or pid in pids(node):
        assert time.monotonic() < deadline, "no executor process replaced the one that died"
        time.sleep(0.05)
    later = now_ms() + 200
    asyncio.run(node.execute(PutJob(job_id="after", spec=once(target.url, later))))
    assert node.history.wait_until(lambda: state_of(node, f"after.{later}") == "succeeded", 15)
    failures = node.metrics.thread_failures.labels("executor-process")._value.get()
    assert failures == 1
    ended = [r for r in caplog.records if f"executor process {index}" in r.getMessage()]
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


def test_an_executor_process_lets_a_herd_s_allocations_run_between_collections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A herd's calls allocate in bursts; at the collector's defaults an executor process making
    50,000 armed calls spent half its CPU collecting (bench/results/perfherd.md). Once set up,
    the process keeps what its start loaded out of the collector's walks and collects at the
    node's thresholds."""
    from node import call_process
    from node.calls import COLLECTOR_THRESHOLDS, CallerConfig

    noted = tmp_path / "collector"
    noting = (
        "import gc, json, pathlib, sys\n"
        "from node import call_process as cp\n"
        "frame = cp._frame\n"
        "def noting(payload):\n"
        f"    pathlib.Path({str(noted)!r}).write_text("
        "json.dumps([gc.get_threshold(), gc.get_freeze_count()]))\n"
        "    return frame(payload)\n"
        "cp._frame = noting\n"
        "cp.main(sys.argv)\n"
    )  # the collector as the process has it when it says it is ready
    monkeypatch.setattr(call_process, "_command", lambda: [sys.executable, "-c", noting])

    async def scenario() -> None:
        processes = call_process.CallerProcesses(
            CallerConfig(egress=LOOPBACK_ALLOWED), 1, kept=False
        )
        await processes.start()
        await processes.stop()

    asyncio.run(scenario())
    thresholds, frozen = json.loads(noted.read_text())
    assert tuple(thresholds) == COLLECTOR_THRESHOLDS
    assert frozen > 10_000  # the imports and the HTTP client, set up before the first call


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


def armed(team: str, i: int, start_in_ms: int = 60_000) -> ev.LeaseGranted:
    """A lease of ``team``'s whose call is armed to start ``start_in_ms`` from now."""
    now = now_ms()
    return ev.LeaseGranted(
        at=now, job_id=f"{team}-{i}", tenant=team, run_id=f"{team}-{i}.1", scheduled_for=now,
        attempt=1, fencing_token=1, worker_id="n1/executor", lease_expires_at=now + 120_000,
        lateness_ms=0, start_at=now + start_in_ms,
    )  # fmt: skip


def test_a_team_with_few_calls_is_called_from_the_kept_process_and_a_herd_never_is(
    target: Target,
) -> None:
    """A herd fills the processes any call may go to; a team with few calls goes to the one
    kept for such teams, while that one has no more than ``KEPT_LEAD`` calls more than the
    least busy of the others. The kept one holding a few more (calls armed for the next
    seconds) does not send the next call elsewhere: there a herd armed for the same slot may
    fill the process before the call is made."""
    from node.call_process import KEPT_LEAD, CallerProcesses
    from node.calls import CallerConfig

    spec = once(target.url, 1_000)

    async def scenario() -> None:
        processes = CallerProcesses(CallerConfig(egress=LOOPBACK_ALLOWED), 1)
        await processes.start()
        shared, kept = processes._processes
        try:
            deadline = time.monotonic() + 30
            while not kept.ready:  # the start does not wait for the kept one
                assert time.monotonic() < deadline, "the kept process never said it was ready"
                await asyncio.sleep(0.01)
            herd = [processes.submit(armed("herd", i), spec) for i in range(3)]
            few = [processes.submit(armed("few", i), spec, few=True) for i in range(5)]
            # 3 of the herd on the shared process, the few's 5 on the kept one (the rule of
            # earlier builds, "no more than the shared one holds", sent the fifth to the herd's)
            assert (len(shared.pending), len(kept.pending)) == (3, 5)
            while len(shared.pending) == 3:
                few.append(processes.submit(armed("few", len(few)), spec, few=True))
            # the kept one took them up to KEPT_LEAD more than the shared one, then one more
            # went where fewer are waiting
            assert len(kept.pending) == 3 + KEPT_LEAD + 1
            few.append(processes.submit(armed("few", len(few)), spec, few=True))
            assert len(kept.pending) == 3 + KEPT_LEAD + 2  # within the lead again: kept
            now = processes.submit(armed("few", 999, start_in_ms=0), spec, few=True)
            assert (await asyncio.wait_for(now, 10)).outcome.value == "succeeded"
            for future in herd + few:
                future.cancel()
            await asyncio.sleep(0)  # the futures' callbacks, scheduled by the cancels
            assert not shared.pending and not kept.pending
        finally:
            await processes.stop()

    asyncio.run(scenario())
    # only the call that started at once was made; the armed ones were withdrawn
    assert [call.headers["Idempotency-Key"].split(":")[0] for call in target.calls] == ["few-999"]


def test_a_call_handed_over_behind_a_herd_goes_down_the_socket_before_the_herd_s_rest() -> None:
    """The socket to a process is a queue too: a herd of one team's calls written into it at
    once held another team's call handed over behind it until the process had read them all
    (15 s, measured). Calls wait in the node, the teams in turn, and go down the socket as it
    drains: the other team's call comes after at most ``SEND_BYTES`` of the herd's. A call
    cancelled while it waits in the node is never sent, nor is a cancel for it."""
    import socket
    import subprocess
    from typing import cast

    from node import call_process as cp
    from node.calls import CallerConfig

    spec = once("http://127.0.0.1:9/", 1_000)

    async def scenario() -> tuple[list[cp.Call | cp.Cancel], int]:
        processes = cp.CallerProcesses(CallerConfig(egress=LOOPBACK_ALLOWED), 1, kept=False)
        ours, theirs = socket.socketpair()
        reader, writer = await cp.open_socket(ours)
        process = cp._Process(0, cast(subprocess.Popen[bytes], None), reader, writer)
        processes._processes = [process]
        process.sending = asyncio.create_task(processes._send(process))
        herd = [processes.submit(armed("herd", i), spec) for i in range(3_000)]
        other = processes.submit(armed("other", 0), spec)
        withdrawn = herd.pop()
        withdrawn.cancel()
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        frames: list[cp.Call | cp.Cancel] = []
        sizes: list[int] = []
        buffer = b""
        while len(frames) < len(herd) + 1:
            buffer += await loop.sock_recv(theirs, 1 << 16)
            while len(buffer) >= 4 and len(buffer) >= 4 + (n := int.from_bytes(buffer[:4])):
                frames.append(cp._to_process.decode(buffer[4 : 4 + n]))
                sizes.append(4 + n)
                buffer = buffer[4 + n :]
        process.sending.cancel()
        writer.close()
        theirs.close()
        for future in [*herd, other]:
            future.cancel()
        assert not buffer and not process.outbox
        return frames, max(sizes)

    frames, frame_bytes = asyncio.run(scenario())
    tenants = [f.lease.tenant if isinstance(f, cp.Call) else "cancel" for f in frames]
    # every call but the one withdrawn, in order, and no cancel for it
    assert tenants.count("herd") == 2_999 and "cancel" not in tenants
    assert [f.lease.job_id for f in frames if isinstance(f, cp.Call)][-1] == "herd-2998"
    ahead = tenants.index("other")
    # what the transport, the socket's kernel buffer and one chunk hold, at most
    assert ahead <= 4 * cp.SEND_BYTES // frame_bytes, (ahead, frame_bytes)


def test_calls_a_dead_process_never_read_fail_as_not_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that dies ends its calls in flight as ambiguous (they may have reached their
    targets), but the calls still waiting in the node never reached it: they fail as not
    called, so even a critical run is tried again."""
    from node import call_process as cp
    from node.calls import NOT_CALLED, CallerConfig, Result

    # says it is ready, then reads nothing until it is killed
    silent = (
        "import os, sys, time; from node.call_process import Ready, _encoder, _frame; "
        "os.write(int(sys.argv[1]), _frame(_encoder.encode(Ready()))); time.sleep(120)"
    )
    monkeypatch.setattr(cp, "_command", lambda: [sys.executable, "-c", silent])
    spec = once("http://127.0.0.1:9/", 1_000)

    async def scenario() -> list[Result]:
        processes = cp.CallerProcesses(CallerConfig(egress=LOOPBACK_ALLOWED), 1, kept=False)
        await processes.start()
        [process] = processes._processes
        try:
            calls = [processes.submit(armed("herd", i), spec) for i in range(3_000)]
            deadline = time.monotonic() + 10
            while len(process.unsent) > 3_000 - 10:  # until some went down the socket
                assert time.monotonic() < deadline, "no call was ever sent"
                await asyncio.sleep(0.01)
            os.kill(process.popen.pid, signal.SIGKILL)
            return await asyncio.wait_for(asyncio.gather(*calls), 30)
        finally:
            await processes.stop()

    results = asyncio.run(scenario())
    not_called = [r for r in results if r.error == NOT_CALLED and not r.ambiguous]
    ambiguous = [r for r in results if r.ambiguous]
    assert len(not_called) + len(ambiguous) == 3_000
    assert ambiguous and len(not_called) >= 2_000, (len(ambiguous), len(not_called))


def test_a_sender_that_fails_ends_its_process_and_its_calls_fail_as_not_called(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """Never a sender owned and dead with calls waiting on it for ever: it says why, its
    process is ended and replaced, and the calls it never sent fail as not called."""
    from node.call_process import CallerProcesses
    from node.calls import NOT_CALLED, CallerConfig

    spec = once(target.url, 1_000)

    async def scenario() -> tuple[list[str], list[int], bool]:
        processes = CallerProcesses(CallerConfig(egress=LOOPBACK_ALLOWED), 1, kept=False)
        await processes.start()
        [process] = processes._processes
        before = processes.pids

        def broken(data: bytes | bytearray | memoryview) -> None:
            raise RuntimeError("a bug in the sender")

        process.writer.write = broken  # type: ignore[method-assign]
        try:
            calls = [processes.submit(armed("team-a", i), spec) for i in range(3)]
            results = await asyncio.wait_for(asyncio.gather(*calls), 30)
            deadline = time.monotonic() + 30
            while processes.pids == before or not processes._processes[0].ready:
                assert time.monotonic() < deadline, "the process was never replaced"
                await asyncio.sleep(0.01)
            after = await asyncio.wait_for(
                processes.submit(armed("team-a", 9, start_in_ms=0), spec), 10
            )
        finally:
            await processes.stop()
        assert all(not r.ambiguous for r in results)
        return [r.error for r in results], before, after.outcome.value == "succeeded"

    errors, _, succeeded = asyncio.run(scenario())
    assert errors == [NOT_CALLED] * 3 and succeeded
    assert any(
        "sending calls to executor process 0 failed" in r.getMessage() for r in caplog.records
    )


def test_a_reader_that_fails_ends_its_process_which_is_replaced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Never a reader owned and dead, the answers of its process's calls never read: a frame
    it cannot read is said, the process is ended, its calls end as a dead process's do, and
    another takes its place."""
    from node import call_process as cp
    from node.calls import CallerConfig, Result

    # says it is ready, then sends what is no answer, then waits to be killed
    garbled = (
        "import os, sys, time; from node.call_process import Ready, _encoder, _frame; "
        "fd = int(sys.argv[1]); os.write(fd, _frame(_encoder.encode(Ready()))); "
        "time.sleep(0.5); os.write(fd, _frame(b'no answer')); time.sleep(120)"
    )
    monkeypatch.setattr(cp, "_command", lambda: [sys.executable, "-c", garbled])
    spec = once("http://127.0.0.1:9/", 1_000)

    async def scenario() -> tuple[Result, list[int], list[int]]:
        processes = cp.CallerProcesses(CallerConfig(egress=LOOPBACK_ALLOWED), 1, kept=False)
        await processes.start()
        before = processes.pids
        try:
            result = await asyncio.wait_for(processes.submit(armed("team-a", 0), spec), 30)
            deadline = time.monotonic() + 30
            while processes.pids == before:
                assert time.monotonic() < deadline, "the process was never replaced"
                await asyncio.sleep(0.01)
            return result, before, processes.pids
        finally:
            await processes.stop()

    result, before, after = asyncio.run(scenario())
    assert result.outcome.value == "failed" and before != after
    assert any("reading from executor process 0 failed" in r.getMessage() for r in caplog.records)


def test_answers_read_from_a_full_buffer_leave_room_for_other_work_between_them() -> None:
    """A buffer full of a herd's outcomes is read ``DONE_PER_TURN`` frames a turn of the loop:
    other work (another team's call handed over) runs between them, not after all of them."""
    import subprocess
    from typing import cast

    from core.commands import Outcome
    from node import call_process as cp
    from node.calls import CallerConfig, Result

    async def scenario() -> tuple[int, int]:
        processes = cp.CallerProcesses(CallerConfig(egress=LOOPBACK_ALLOWED), 1, kept=False)
        loop = asyncio.get_running_loop()
        answers = [loop.create_future() for _ in range(4 * cp.DONE_PER_TURN)]
        reader = asyncio.StreamReader()
        for i in range(len(answers)):
            reader.feed_data(cp._frame(cp._encoder.encode(cp.Done(i, Result(Outcome.SUCCEEDED)))))
        reader.feed_eof()
        process = cp._Process(
            0,
            cast(subprocess.Popen[bytes], None),
            reader,
            cast(asyncio.StreamWriter, None),
            pending=dict(enumerate(answers)),
        )
        seen: list[int] = []

        async def other_work() -> None:
            seen.append(sum(a.done() for a in answers))

        waiting = asyncio.create_task(other_work())  # runs at the reader's first yield
        await processes._take_answers(process)
        await waiting
        return seen[0], sum(a.done() for a in answers)

    from node.call_process import DONE_PER_TURN

    resolved_before_the_other_work, resolved = asyncio.run(scenario())
    assert resolved == 4 * DONE_PER_TURN
    assert resolved_before_the_other_work < DONE_PER_TURN, resolved_before_the_other_work
