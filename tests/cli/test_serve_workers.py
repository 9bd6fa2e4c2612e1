"""``cronlog serve --workers N``: one node of several processes on the embedded log.

As a user runs it: one command, one port; the workers share the partitions, every job runs
once whichever worker took the request, a worker killed with ``kill -9`` is started again and
its partitions are decided meanwhile by the others, and the parent's retention never prunes
what a worker still needs.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cli.workers import floor_path, reported_floor
from tests.cli.test_serve import A, B, Serve, _iso
from tests.node.targets import Target
from tools.chaos.procs import children


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def stopped_index(data: Path, pid: int) -> int:
    """The worker index of the worker process ``pid`` (its command line says it)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--worker-index") + 1])


def wait_until(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # external processes: nothing to await but their state
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def create(node: Serve, name: str, target: Target, at: float) -> str:
    body = {"name": name, "run_at": _iso(at), "target": target.url, "critical": True}
    created = httpx.post(f"{node.url}/v1/jobs", json=body, headers=A, timeout=10)
    assert created.status_code == 201, created.text
    return str(created.json()["job_id"])


@pytest.mark.slow
def test_workers_share_the_partitions_and_a_killed_one_comes_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    target = Target().start()
    node = Serve(data, partitions=4, args=("--workers", "2")).start()
    assert node.proc is not None
    try:
        wait_until(lambda: len(children(node.proc.pid)) == 2, 10, "two worker processes")
        first = children(node.proc.pid)
        # A team's first claims, on both workers at once, all wait: each worker's share of the
        # team's 256 waiting claims is granted by the team's owner, and the first worker to ask
        # was once granted all of them as headroom, the other none (429 until the next period).
        claim = {"pool": "first", "worker_id": "w", "limit": 1, "wait_sec": 0.5}

        def claim_once(_: int) -> int:
            with httpx.Client(timeout=10) as fresh:  # a connection each: either worker's
                return fresh.post(f"{node.url}/v1/workers/claim", json=claim, headers=B).status_code

        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(claim_once, range(16))) == [200] * 16
        # Each request lands on one worker or the other; every job is known to both (each
        # worker keeps its own partitions' history and asks the other about the rest) and
        # runs once.
        at = time.time() + 3
        ids = {create(node, f"before-{i}", target, at) for i in range(12)}
        for _ in range(6):  # new connections: the kernel hands them to either worker
            listed = httpx.get(f"{node.url}/v1/jobs", headers=A, timeout=10).json()["jobs"]
            assert ids <= {j["job_id"] for j in listed}
        calls = target.wait_for(12, timeout_s=15)
        assert sorted(c.body["job_id"] for c in calls) == sorted(ids)
        assert all(c.received_at >= at - 0.001 for c in calls)  # never early
        # Whichever worker a scrape reaches answers for both, each sample labelled.
        token = (data / "metrics_token").read_text().strip()
        for _ in range(4):
            text = httpx.get(
                f"{node.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
            ).text
            assert 'cronlog_worker_up{worker="0"} 1.0' in text
            assert 'cronlog_worker_up{worker="1"} 1.0' in text
            owned = [
                line for line in text.splitlines() if line.startswith("cronlog_partitions_owned")
            ]
            assert len(owned) == 2, owned

        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        # Jobs created and due while the worker is down run too: the other takes its partitions.
        at = time.time() + 2
        later = {create(node, f"after-{i}", target, at) for i in range(12)}
        calls = target.wait_for(24, timeout_s=20)
        assert sorted(c.body["job_id"] for c in calls) == sorted(ids | later)  # once each
        # The parent starts the killed worker again; both are members once more.
        wait_until(
            lambda: len(children(node.proc.pid)) == 2 and victim not in children(node.proc.pid),
            20,
            "the killed worker started again",
        )
        wait_until(
            lambda: httpx.get(f"{node.url}/readyz", timeout=2).status_code == 200, 20, "ready"
        )
        assert len(target.wait_for(25, timeout_s=1.5)) == 24  # nothing ran twice
        # Whichever worker a probe reaches answers for the node: one stopped is named.
        stopped = max(children(node.proc.pid))
        os.kill(stopped, signal.SIGSTOP)
        try:
            wait_until(
                lambda: all(
                    f"worker {stopped_index(data, stopped)} does not answer"
                    in httpx.get(f"{node.url}/readyz", timeout=5).text
                    for _ in range(4)  # new connections: whichever worker takes them
                ),
                10,
                "/readyz naming the stopped worker",
            )
        finally:
            os.kill(stopped, signal.SIGCONT)
        wait_until(
            lambda: httpx.get(f"{node.url}/readyz", timeout=5).status_code == 200, 20, "ready"
        )

        workers = children(node.proc.pid)
    finally:
        code = node.stop()
        target.stop()
    assert code == 0
    assert not any(alive(pid) for pid in workers)  # SIGTERM stopped every worker
    for index in (0, 1):  # each said what retention must keep for it
        report = json.loads(floor_path(data, index).read_text())
        # history kept with its partition: a worker's read models bind its own partitions
        # only (test_with_history_kept_by_owners_... checks what the parent makes of it)
        assert report["history_on"] == "owner"
        assert set(report["read_model"]) <= {"0", "1", "2", "3"}
        assert set(report["owned"]) <= {"0", "1", "2", "3"}


@pytest.mark.slow
def test_a_worker_stops_when_its_parent_is_killed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    node = Serve(data, partitions=2, args=("--workers", "2")).start()
    assert node.proc is not None
    wait_until(lambda: len(children(node.proc.pid)) == 2, 10, "two worker processes")
    workers = children(node.proc.pid)
    node.kill()
    # Killed with it, as one process would be: not left draining calls on their own.
    wait_until(lambda: not any(alive(pid) for pid in workers), 2, "the workers killed")


def write_report(
    data: Path,
    index: int,
    read_model: dict[int, int],
    owned: dict[int, object],
    history_on: str = "every-node",
) -> None:
    path = floor_path(data, index)
    path.parent.mkdir(exist_ok=True)
    report = {
        "read_model": {str(p): o for p, o in read_model.items()},
        "owned": {str(p): o for p, o in owned.items()},
        "history_on": history_on,
    }
    path.write_text(json.dumps(report))


def test_with_history_kept_by_owners_a_worker_binds_only_the_partitions_it_keeps(
    tmp_path: Path,
) -> None:
    floor = reported_floor(tmp_path, workers=2, clock=iter(range(1, 100)).__next__)
    write_report(tmp_path, 0, {0: 500}, {0: 300}, "owner")
    write_report(tmp_path, 1, {1: 900}, {1: 700}, "owner")
    assert floor(0) == 300  # worker 1 keeps no history of partition 0: no bound from it
    assert floor(1) == 700
    assert floor(2) is None  # nobody owns it: keep everything
    write_report(tmp_path, 1, {1: 900}, {1: 700})  # a worker folding every partition
    assert floor(0) is None  # ... has no position on partition 0 yet: keep everything


def test_the_parent_prunes_below_every_worker_s_report_only(tmp_path: Path) -> None:
    now = [0.0]

    def clock() -> float:  # every call a second later: each look reads the reports again
        now[0] += 1.0
        return now[0]

    floor = reported_floor(tmp_path, workers=2, clock=clock)
    assert floor(0) is None  # nobody has reported: nothing is pruned
    write_report(tmp_path, 0, {0: 500, 1: 400}, {0: 300})
    assert floor(0) is None  # worker 1 has not reported
    write_report(tmp_path, 1, {0: 200, 1: 900}, {1: 700})
    assert floor(0) == 200  # worker 1's read model still needs 200 of partition 0
    assert floor(1) == 400  # worker 0's read model needs 400 of partition 1, its owner 700
    write_report(tmp_path, 1, {0: 200, 1: 900}, {})
    assert floor(1) is None  # nobody owns partition 1 now: keep everything
    write_report(tmp_path, 1, {0: 200, 1: 900}, {1: None})
    assert floor(1) is None  # its owner does not know its floor
    write_report(tmp_path, 1, {0: 200}, {1: 700})
    assert floor(1) is None  # worker 1's read model has no position on partition 1 yet


def test_a_retention_pass_reads_each_report_once(tmp_path: Path) -> None:
    write_report(tmp_path, 0, {0: 5, 1: 6}, {0: 5, 1: 6})
    floor = reported_floor(tmp_path, workers=1, clock=lambda: 0.0)
    assert (floor(0), floor(1)) == (5, 6)
    floor_path(tmp_path, 0).unlink()  # gone within the pass: what was read still holds
    assert floor(1) == 6


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_node_asked_to_stop_twice_still_makes_the_calls_it_armed_ahead(
    tmp_path: Path, workers: int
) -> None:
    """SIGTERM, and SIGTERM again while the node drains (a supervisor asking twice; a node of
    worker processes asked its workers twice before): the calls armed for the next two
    seconds go out at their slots from the stopping node, and it exits having closed its
    stores. Before, a node of two workers made none of them and exited with its stores open,
    and so every armed call's lease ran out first (a critical run's set aside)."""
    data = tmp_path / "data"
    data.mkdir()
    target = Target().start()
    args = ("--drain-sec", "10") + (("--workers", str(workers)) if workers > 1 else ())
    node = Serve(data, partitions=4, args=args).start()
    assert node.proc is not None
    try:
        for i in range(4):
            body = {"name": f"tick-{i}", "schedule": "* * * * *", "seconds": "*"}
            created = httpx.post(
                f"{node.url}/v1/jobs", json={**body, "target": target.url}, headers=A, timeout=10
            )
            assert created.status_code == 201, created.text
        target.wait_for(12, timeout_s=10)  # running: every job's calls arriving each second
        # 0.2 s into a second: the calls of the next two seconds are armed by now
        time.sleep((1.2 - time.time() % 1) % 1)
        asked = time.time()
        node.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(30) == 0
    finally:
        target.stop()
        if node.proc.poll() is None:
            node.kill()
    second = int(asked) + 1
    made = {
        int(call.headers["Idempotency-Key"].rsplit(":", 1)[1]) // 1000: call.received_at
        for call in target.calls
        if call.received_at > asked
    }
    assert {second, second + 1} <= set(made), sorted(made)
    assert all(at - slot < 1.0 for slot, at in made.items()), made  # on time, not retried
    assert "still open at exit" not in (data / "serve.log").read_text()
