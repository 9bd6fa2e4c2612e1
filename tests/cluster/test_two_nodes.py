"""Two cronlog nodes as real processes on the real Kafka broker, driven over HTTP.

Each test starts its own pair on topics of its own (the ``cluster`` fixture); a job goes to
the partition ``partition_for(job_id, 4)``, so the tests pick job ids per partition and cover
both a partition the asked node owns and one the other node owns (the request then travels
through the partition's commands stream and the answer back through the asking node's mailbox).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from core.decide import ARM_GUARD_MS
from core.ids import idempotency_key, log_job_id, team_id
from tests.cluster.hold import HoldingTarget
from tests.cluster.nodes import PARTITIONS, Cluster, NodeProcess, iso, job_ids, now_ms
from tests.node.targets import Target

pytestmark = pytest.mark.slow

QUICK_BACKOFF = {"base_sec": 0.2, "factor": 2, "cap_sec": 5, "jitter": False}


def owners(cluster: Cluster) -> list[list[int]]:
    """Each group member's partitions, from the broker's description of the consumer group."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    group = f"{cluster.prefix}.scheduler"
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return sorted(
        sorted(tp.partition for tp in member.assignment.topic_partitions)
        for member in described.members
    )


def one_per_partition(name: str) -> list[str]:
    return [job_ids(name, p, 1)[0] for p in range(PARTITIONS)]


def run_in_state(node: NodeProcess, run_id: str, state: str) -> dict[str, Any] | None:
    """The run once the node's read model has it in ``state`` (polled by ``wait_until``)."""
    run = node.run(run_id)
    return run if run is not None and run["state"] == state else None


def wait_until(what: str, check: Any, timeout_s: float = 10.0) -> Any:
    """Poll a node's HTTP API until ``check()`` gives something truthy."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return result


def test_both_nodes_become_ready_and_split_the_partitions(cluster: Cluster) -> None:
    assert all(node.ready() for node in cluster.nodes.values())
    split = owners(cluster)
    assert len(split) == 2 and all(split), split
    assert sorted(itertools.chain(*split)) == list(range(PARTITIONS))


@pytest.mark.parametrize("cluster", ["every-node", "owner"], indirect=True)
def test_a_job_on_the_other_nodes_partition_is_forwarded_and_fires_on_time(
    cluster: Cluster, target: Target
) -> None:
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    slots = {}
    for job_id in one_per_partition("fwd"):
        slot = now_ms() + 1500
        response = n1.create_job(
            {"job_id": job_id, "name": "once", "run_at": iso(slot), "target": target.url}
        )
        assert response.status_code == 201, response.text
        assert response.json()["next_run_at"] == iso(slot)
        slots[job_id] = slot
    calls = {c.headers["Idempotency-Key"]: c for c in target.wait_for(PARTITIONS, 10)}
    assert len(calls) == PARTITIONS and len(target.calls) == PARTITIONS
    workers = set()
    for job_id, slot in slots.items():
        call = calls[idempotency_key(log_job_id("team-a", job_id), slot)]
        late_ms = call.received_at * 1000 - slot
        assert 0 <= late_ms < 1000, (job_id, late_ms)
        assert call.headers["X-Cronlog-Run-Id"] == f"{job_id}.{slot}"
        assert call.headers["X-Cronlog-Attempt"] == "1"
        assert int(call.headers["X-Cronlog-Fencing-Token"]) >= 1
        # Read back through the other node: its read model follows every partition.
        run = wait_until(
            f"{job_id} never showed up as succeeded at n2",
            lambda run_id=f"{job_id}.{slot}": run_in_state(n2, run_id, "succeeded"),
        )
        workers.add(run["attempts"][0]["worker_id"])
    # Both cases were covered: partitions n1 decided itself and partitions it forwarded to n2.
    assert workers == {n1.worker_id, n2.worker_id}


@pytest.mark.parametrize("cluster", ["every-node", "owner"], indirect=True)
def test_a_failing_target_is_retried_with_growing_delays_dead_lettered_and_replayed(
    cluster: Cluster, target: Target
) -> None:
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    target.answer = lambda call: (503, {}, 0.0)
    slot = now_ms() + 500
    job_id = one_per_partition("flaky")[1]
    response = n1.create_job(
        {
            "job_id": job_id,
            "name": "flaky",
            "run_at": iso(slot),
            "target": target.url,
            "retries": 2,
            "backoff": QUICK_BACKOFF,
        }
    )
    assert response.status_code == 201, response.text
    calls = target.wait_for(3, timeout_s=15)
    assert [c.headers["X-Cronlog-Attempt"] for c in calls] == ["1", "2", "3"]
    gaps = [b.received_at - a.received_at for a, b in itertools.pairwise(calls)]
    assert gaps[1] > gaps[0] >= 0.2, gaps
    run_id = f"{job_id}.{slot}"
    for node in (n1, n2):  # the dead-letter list reads the same through either node
        wait_until(f"{run_id} not dead at {node.node_id}", lambda node=node: node.dead())
        [dead] = node.dead()
        assert dead["run_id"] == run_id and dead["attempt"] == 3
    # Created through n1, replayed through n2: one of the two requests was forwarded.
    target.answer = lambda call: (200, {}, 0.0)
    replayed = n2.http.post(f"/v1/runs/{run_id}/replay")
    assert replayed.status_code == 200, replayed.text
    calls = target.wait_for(4, timeout_s=10)
    assert calls[3].headers["X-Cronlog-Attempt"] == "4"
    assert int(calls[3].headers["X-Cronlog-Fencing-Token"]) > int(
        calls[2].headers["X-Cronlog-Fencing-Token"]
    )
    wait_until("the replayed run never succeeded", lambda: run_in_state(n1, run_id, "succeeded"))
    assert n1.dead() == [] and n2.dead() == []


def test_pause_stops_firing_and_resume_restarts(cluster: Cluster, target: Target) -> None:
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    job_id = one_per_partition("tick")[2]
    body = {
        "job_id": job_id,
        "name": "tick",
        "schedule": "* * * * *",
        "seconds": "*",
        "target": target.url,
    }
    assert n1.create_job(body).status_code == 201
    target.wait_for(1, timeout_s=5)
    paused = n1.http.patch(f"/v1/jobs/{job_id}", json={"status": "paused"})
    assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
    paused_at = time.time()
    count = len(target.calls)
    time.sleep(2.2)  # real time must pass to show that nothing fires while paused
    # A call armed for a slot less than ARM_GUARD_MS after the pause was decided still goes
    # (docs/architecture.md, "Calls armed ahead"); no slot after that is called.
    guard_ends_ms = paused_at * 1000 + ARM_GUARD_MS
    assert [c for c in target.calls[count:] if c.body["scheduled_for_ms"] >= guard_ends_ms] == []
    # Paused through n1, resumed through n2: one of the two requests was forwarded.
    resumed = n2.http.patch(f"/v1/jobs/{job_id}", json={"status": "active"})
    assert resumed.status_code == 200 and resumed.json()["status"] == "active", resumed.text
    calls = target.wait_for(len(target.calls) + 2, timeout_s=5)
    assert calls[-1].received_at > paused_at + 2


def start_held_call(
    cluster: Cluster, target: HoldingTarget, name: str, partition: int, extra: dict[str, Any]
) -> tuple[str, NodeProcess, NodeProcess]:
    """A one-shot job created through n1 whose call the target now holds: its run id, the
    node whose executor makes the call, and the other node."""
    slot = now_ms() + 300
    job_id = one_per_partition(name)[partition]
    body = {"job_id": job_id, "name": name, "run_at": iso(slot), "target": target.url, **extra}
    assert cluster.nodes["n1"].create_job(body).status_code == 201
    assert target.received.wait(10)
    run_id = f"{job_id}.{slot}"
    run = wait_until(
        "the run never showed as running",
        lambda: run_in_state(cluster.nodes["n1"], run_id, "running"),
    )
    runner = run["attempts"][0]["worker_id"].split("/")[0]
    other = "n2" if runner == "n1" else "n1"
    return run_id, cluster.nodes[runner], cluster.nodes[other]


def test_a_cancel_reaches_the_executor_running_the_call(cluster: Cluster) -> None:
    slow = HoldingTarget(hold_s=20.0)
    try:
        extra = {"lease_sec": 3, "timeout_sec": 30}
        run_id, _, asker = start_held_call(cluster, slow, "slow", 3, extra)
        # Cancel through the node whose executor does not run the call: it goes through the log.
        cancelled_at = time.time()
        response = asker.http.post(f"/v1/runs/{run_id}/cancel")
        assert response.status_code == 200 and response.json()["state"] == "cancelled"
        # The executor learns on its next heartbeat (every lease_sec / 3 = 1 s) and hangs up.
        assert slow.hung_up.wait(5), "the executor kept calling the target"
        assert slow.hung_up_at - cancelled_at < 2.5
    finally:
        slow.stop()


def claim(node: NodeProcess, body: dict[str, Any], count: int, wait_s: float = 10.0) -> list[Any]:
    """Claim through ``node`` until ``count`` runs came back, as a polling worker would."""
    runs: list[Any] = []
    deadline = time.monotonic() + wait_s
    while len(runs) < count:
        response = node.http.post("/v1/workers/claim", json={**body, "limit": count - len(runs)})
        assert response.status_code == 200, response.text
        runs += response.json()["runs"]
        assert time.monotonic() < deadline, f"claimed {len(runs)} of {count}: {runs}"
        time.sleep(0.1)
    return runs


def test_a_pull_worker_that_stops_heartbeating_loses_its_runs_and_its_late_completion_gets_409(
    cluster: Cluster,
) -> None:
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    slot = now_ms()
    for job_id in one_per_partition("crunch"):
        body = {
            "job_id": job_id,
            "name": "crunch",
            "run_at": iso(slot),
            "target": "pull://crunchers",
            "lease_sec": 1,
            "backoff": {"base_sec": 0.3, "jitter": False},
        }
        assert n1.create_job(body).status_code == 201
    # One claim through n1 gathers runs of every partition: its own, then the other node's.
    first = claim(n1, {"pool": "crunchers", "worker_id": "w1"}, PARTITIONS)
    assert sorted(r["job_id"] for r in first) == sorted(one_per_partition("crunch"))
    assert all(r["attempt"] == 1 for r in first)
    # w1 goes quiet; the leases expire and, after the backoff, w2 gets every run through n2.
    second = claim(n2, {"pool": "crunchers", "worker_id": "w2"}, PARTITIONS)
    by_run = {r["run_id"]: r for r in second}
    assert sorted(by_run) == sorted(r["run_id"] for r in first)
    for stale in first:
        fresh = by_run[stale["run_id"]]
        assert fresh["attempt"] == 2 and fresh["fencing_token"] > stale["fencing_token"]
        run_id = fresh["run_id"]
        # w1 wakes up: its heartbeat is refused, so it must abandon the run.
        beat = n2.http.post(
            f"/v1/runs/{run_id}/heartbeat", json={"fencing_token": stale["fencing_token"]}
        )
        assert beat.status_code == 409, beat.text
        done = {"fencing_token": fresh["fencing_token"], "status": "succeeded"}
        ok = n1.http.post(f"/v1/runs/{run_id}/complete", json=done)
        assert ok.status_code == 200, ok.text
        late = {"fencing_token": stale["fencing_token"], "status": "succeeded"}
        refused = n2.http.post(f"/v1/runs/{run_id}/complete", json=late)
        assert refused.status_code == 409, refused.text
        run = wait_until(
            f"{run_id} never showed up as succeeded at n2",
            lambda run_id=run_id: run_in_state(n2, run_id, "succeeded"),
        )
        assert [a["worker_id"] for a in run["attempts"]] == ["w1", "w2"]


def owned_by(node: NodeProcess) -> int:
    for line in node.metrics().splitlines():
        if line.startswith("cronlog_partitions_owned "):
            return int(float(line.split()[1]))
    raise AssertionError("no cronlog_partitions_owned in /metrics")


def test_a_rolling_restart_hands_the_partitions_over_and_lets_a_critical_call_finish(
    cluster: Cluster,
) -> None:
    slow = HoldingTarget(hold_s=8.0)
    try:
        run_id, runner, survivor = start_held_call(cluster, slow, "careful", 1, {"critical": True})
        assert runner.process is not None
        runner.process.terminate()  # SIGTERM, as a rolling restart sends it
        # The stopping node hands its partitions over first, so their runs keep their slots
        # while its call is still held (before, the node held them until the call ended).
        wait_until(
            "the survivor did not own every partition while the call was held",
            lambda: owned_by(survivor) == PARTITIONS,
        )
        assert not slow.answered.is_set(), "the partitions moved only after the call ended"
        # It drains its call meanwhile and ends.
        assert runner.process.wait(30) == 0
        runner.down = True
        assert not slow.hung_up.is_set(), "the call was cut short"
        done = wait_until(
            "the drained call's outcome was not recorded",
            lambda: run_in_state(survivor, run_id, "succeeded"),
        )
        assert len(done["attempts"]) == 1 and done["attempts"][0]["outcome"] == "succeeded"
    finally:
        slow.stop()


def test_a_stopping_node_arms_its_critical_jobs_next_calls_and_makes_them_as_it_drains(
    cluster: Cluster, target: Target
) -> None:
    """A critical job keeps one call armed ahead, since a killed node's armed leases are
    ambiguous; a node that hands its partitions over and then drains makes the calls it armed,
    so it first arms its critical every-second jobs' calls through the arming time (the last
    batch, docs/architecture.md). A call leased by the stopping node more than a second ahead
    of its start is one of those: it went out from that node as it drained, and the new owner
    recorded it, the only attempt of its run."""
    from cronlog_client import Client

    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    for job_id in one_per_partition("pay"):
        body = {"job_id": job_id, "name": "pay", "schedule": "* * * * *", "seconds": "*",
                "target": target.url, "critical": True}  # fmt: skip
        assert n1.create_job(body).status_code == 201
    target.wait_for(2 * PARTITIONS, timeout_s=10)  # the jobs are being called
    assert n1.process is not None
    n1.process.terminate()  # SIGTERM, as a rolling restart sends it
    assert n1.process.wait(30) == 0
    n1.down = True
    with Client(n2.url, "token-a") as client:
        leases = [e.event for e in client.events(start="start") if e.type == "LeaseGranted"]
    ahead = [
        lease
        for lease in leases
        if lease["worker_id"].startswith("n1/") and lease["start_at"] - lease["at"] > 1000
    ]
    assert ahead, "the stopping node armed no critical call more than a second ahead"
    for lease in ahead:
        run = wait_until(
            f"{lease['run_id']} was not recorded as succeeded",
            lambda lease=lease: run_in_state(n2, team_id(lease["run_id"]), "succeeded"),
        )
        [attempt] = run["attempts"]
        assert attempt["worker_id"] == lease["worker_id"]
    called = {(c.headers["X-Cronlog-Run-Id"], c.headers["X-Cronlog-Fencing-Token"])
              for c in target.calls}  # fmt: skip
    assert {(team_id(lease["run_id"]), str(lease["fencing_token"])) for lease in ahead} <= called


@pytest.mark.parametrize("cluster", ["every-node", "owner"], indirect=True)
def test_any_node_streams_every_partition_and_wakes_claims_for_the_others(
    cluster: Cluster,
) -> None:
    """The audit stream reads through the asked node's log handle (every partition, whoever
    owns it); a claim long-polling on one node wakes for a run the other node's partition
    made ready (each node's read model folds every partition; with history kept by the
    owner, the waiting claim watches the other node's partitions: node.ready_watch)."""
    from cronlog_client import Client, JobDefinition

    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    names = one_per_partition("streamed")
    with Client(n1.url, "token-a") as via_n1, Client(n2.url, "token-a") as via_n2:
        for job_id in names:
            via_n1.put_job(
                job_id, JobDefinition(name="s", schedule="0 0 1 1 *", target="pull://x-nodes")
            )
        registered = {
            e.event["job_id"] for e in via_n2.events(start="start") if e.type == "JobRegistered"
        }
        assert registered == {log_job_id("team-a", j) for j in names}
        # Each node owns some partitions; a claim on n1 long-polls while n2's partition gets
        # a run (and the other way round): each is answered at once.
        for asked, job_id in ((n1, names[0]), (n2, names[0]), (n1, names[-1]), (n2, names[-1])):
            with Client(asked.url, "token-a") as worker:
                started = time.monotonic()
                triggered: list[str] = []

                def trigger(job_id: str = job_id, triggered: list[str] = triggered) -> None:
                    time.sleep(0.5)  # the claim is waiting by then (it waits up to 10 s)
                    triggered.append(via_n1.trigger(job_id).run_id)

                thread = threading.Thread(target=trigger)
                thread.start()
                [claimed] = worker.claim("x-nodes", "w", wait_sec=10)
                thread.join()
                assert claimed.run_id == triggered[0]
                assert time.monotonic() - started < 3
                worker.complete(claimed.run_id, claimed.fencing_token)


@pytest.mark.parametrize("cluster", ["every-node", "owner"], indirect=True)
def test_a_batch_spans_both_nodes_partitions_and_replays_safely(cluster: Cluster) -> None:
    """The items of the asked node's partitions go to its runners; the others travel to the
    other node, each answered in its own result; the batch sent again creates nothing."""
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    ids = [job_id for p in range(PARTITIONS) for job_id in job_ids("batch", p, 3)]
    jobs = [{"job_id": i, "name": "b", "schedule": "0 0 29 2 *", "target": "pull://b"} for i in ids]
    jobs.append({"name": "bad", "schedule": "0 0 31 2 *", "target": "pull://b"})
    body = {"jobs": jobs}
    first = n1.http.post("/v1/jobs:batch", json=body)
    assert first.status_code == 200, first.text
    results = first.json()["results"]
    assert [r["status"] for r in results] == [201] * len(ids) + [422]
    assert [r["job_id"] for r in results[: len(ids)]] == ids
    # Readable through the asked node at once (read-your-writes), and through the other soon.
    assert all(n1.http.get(f"/v1/jobs/{i}").status_code == 200 for i in ids)
    wait_until(
        "n2 reads the batch",
        lambda: all(n2.http.get(f"/v1/jobs/{i}").status_code == 200 for i in ids),
    )
    again = n2.http.post("/v1/jobs:batch", json=body)
    assert [r["status"] for r in again.json()["results"]] == [200] * len(ids) + [422]
