"""A node joining a group whose members hold every partition warms, before it joins, the
partitions it may be given (node.standby, "Warm before joining"), so that what it takes from a
live owner is taken over warm: it reads only the few events written since it warmed, not the
partition's history (no snapshot exists here, so a cold take-over folds from offset 0).

Node ``a`` owns the four partitions and is given a history of one-shots a day ahead (one event
each) and an every-second job on each partition. Node ``b`` then starts with an empty data
directory; once the group has given it its half, its metrics say what it warmed and what each
take-over read, and its stores, after it stopped, must equal a fold of each partition's events
from offset 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodes import PARTITIONS, Cluster, iso, job_ids, now_ms, open_log
from tests.cluster.test_snapshot_takeover import by_partition, event_ends, gauge
from tests.node.targets import Target
from tools.replay.source import Layout
from tools.replay.verify import verify_partition

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

HISTORY = 800  # one-shots a day ahead: about 200 events a partition


@pytest.fixture
def cluster(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Cluster]:
    limits = tmp_path / "limits.toml"
    limits.write_text("[tenants.team-a]\nrequests_per_sec = 10000\nrequest_burst = 10000\n")
    c = Cluster(kafka_bootstrap, tmp_path, serve_args=("--limits", str(limits)))
    try:
        yield c
    finally:
        c.stop()
        print(c.logs())  # shown when the test failed


def test_a_joining_node_takes_over_warm_what_it_is_given_by_a_live_owner(
    cluster: Cluster, target: Target
) -> None:
    (a,) = cluster.start("a")
    ticks = [job_ids("tick", p, 1)[0] for p in range(PARTITIONS)]
    for job_id in ticks:
        created = a.create_job(
            {"job_id": job_id, "name": "tick", "interval_sec": 1, "target": target.url}
        )
        assert created.status_code == 201, created.text
    day_ahead = now_ms() + 86_400_000
    batch = [
        {"job_id": f"h-{i}", "name": "h", "run_at": iso(day_ahead + i * 1000)}
        | {"target": target.url}
        for i in range(HISTORY)
    ]
    response = a.http.post("/v1/jobs:batch", json={"jobs": batch})
    assert response.status_code == 200, response.text
    assert {r["status"] for r in response.json()["results"]} == {201}

    log_ = open_log(cluster)
    try:
        history = event_ends(log_)
        assert min(history.values()) > 100, history  # what a cold take-over would read

        (b,) = cluster.start("b")  # a data directory of its own, empty
        deadline = time.monotonic() + 30
        while gauge(b, "cronlog_partitions_owned") != PARTITIONS // 2:
            assert time.monotonic() < deadline, f"b owns {gauge(b, 'cronlog_partitions_owned')}"
            time.sleep(0.1)  # the cooperative rebalance gives b half, in two rounds
        b.wait_ready()
        owned = sorted(by_partition(b, "cronlog_recovery_replayed_events"))
        replayed = by_partition(b, "cronlog_recovery_replayed_events")
        warmed = gauge(b, "cronlog_partitions_warmed_before_joining_total")
        print(f"history {history}; b warmed {warmed}, owns {owned}, replayed {replayed}")
        # a held all four, over the floor of two a member: each one might have come to b
        assert warmed == PARTITIONS, warmed
        assert "before joining" in b.log_path.read_text()
        assert len(owned) == PARTITIONS // 2, owned
        for p in owned:
            # Only what a wrote between b's warming and the hand-over (the ticks' runs of a few
            # seconds), not the partition's history.
            assert replayed[p] < history[p] / 4, (p, replayed, history)

        # Every partition's every-second job runs, wherever it lives now.
        began = time.time()
        calls = target.wait_until(
            lambda calls: {c.body["job_id"] for c in calls if c.received_at > began} >= set(ticks),
            timeout_s=10,
        )
        assert {c.body["job_id"] for c in calls if c.received_at > began} >= set(ticks)

        b.stop()  # its stores closed, for the check
        for p in owned:
            check = verify_partition(log_, Layout(b.data_dir), p)
            assert check.ok and not check.store_missing, check.describe()
    finally:
        log_.close()
