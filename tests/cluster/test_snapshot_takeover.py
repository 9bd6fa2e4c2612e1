"""A whole node killed with SIGKILL, and a new node with an empty data directory takes its
partitions over by restoring each one's snapshot from the snapshots topic and replaying only
the tail after it, not the partition's history from offset 0.

Node ``a`` owns every partition and snapshots each one every half second. It is given every-
second interval jobs, a few one-shots a day ahead and a history of two thousand more one-shots
(one event each), so that a fold from zero would read hundreds of events per partition where
the tail after the snapshot is a few seconds of runs. Once the snapshots topic holds a snapshot
of each partition past that history, ``a`` is killed and ``b`` starts with no state store in
the same group. What ``b`` restored and replayed is read from its metrics
(``cronlog_recovery_snapshot_offset``, ``cronlog_recovery_replayed_events``); its state, after
it has run the jobs for a while and stopped, must equal a fold of each partition's events from
offset 0 (``tools.replay.verify``, the ``cronlog replay verify`` check).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventlog.kafka import KafkaLog
from eventlog.kafka_snapshots import KafkaSnapshots
from tests.cluster.nodes import PARTITIONS, Cluster, NodeProcess, iso, job_ids, now_ms, open_log
from tests.node.targets import Target
from tools.replay.source import Layout
from tools.replay.verify import verify_partition

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TICKS_PER_PARTITION = 2  # every-second interval jobs
ONE_SHOTS_PER_PARTITION = 2  # a day ahead, checked one by one after the takeover
HISTORY_BATCHES = 2  # of 1,000 one-shots each: one JobRegistered apiece, ~500 a partition


@pytest.fixture
def cluster(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Cluster]:
    limits = tmp_path / "limits.toml"  # the history comes in batches of 1,000 jobs
    limits.write_text("[tenants.team-a]\nrequests_per_sec = 10000\nrequest_burst = 10000\n")
    c = Cluster(
        kafka_bootstrap,
        tmp_path,
        # --cold-join: b would otherwise restore the snapshots as standbys before it joins
        # (the killed a still holds every partition in the group's eyes), and its runners would
        # start from those; the runners' own restore is what this test is about
        # (tests/cluster/test_join_warm.py has the warm join).
        serve_args=("--snapshot-every-sec", "0.5", "--limits", str(limits), "--cold-join"),
    )
    try:
        yield c
    finally:
        c.stop()
        print(c.logs())  # shown when the test failed


def by_partition(node: NodeProcess, name: str) -> dict[int, float]:
    """A per-partition gauge of ``node``'s metrics, as Prometheus would read it."""
    values: dict[int, float] = {}
    for family in text_string_to_metric_families(node.metrics()):
        for sample in family.samples:
            if sample.name == name:
                values[int(sample.labels["partition"])] = sample.value
    return values


def gauge(node: NodeProcess, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(node.metrics()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def event_ends(log_: KafkaLog) -> dict[int, int]:
    return {p: log_.end_offset("events", p) for p in range(PARTITIONS)}


def snapshots_past(cluster: Cluster, wanted: dict[int, int], timeout_s: float) -> dict[int, int]:
    """Wait until the snapshots topic holds a snapshot of each partition at ``wanted[p]`` or
    later; the offsets of the newest ones."""
    snapshots = KafkaSnapshots.open(
        cluster.bootstrap,
        PARTITIONS,
        prefix=cluster.prefix,
        replication_factor=1,
        min_insync_replicas=1,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            newest = {p: snapshots.latest(p) for p in range(PARTITIONS)}
            offsets = {p: -1 if s is None else s.offset for p, s in newest.items()}
            if all(offsets[p] >= wanted[p] for p in range(PARTITIONS)):
                return offsets
            assert time.monotonic() < deadline, f"snapshots at {offsets}, wanted {wanted}"
            time.sleep(0.1)  # the owner writes them on its own thread; the topic is polled
    finally:
        snapshots.close()


def test_a_new_node_without_a_store_restores_the_snapshots_and_replays_only_the_tail(
    cluster: Cluster, target: Target, tmp_path: Path
) -> None:
    (a,) = cluster.start("a")
    ticks = [j for p in range(PARTITIONS) for j in job_ids("tick", p, TICKS_PER_PARTITION)]
    for job_id in ticks:
        created = a.create_job(
            {"job_id": job_id, "name": "tick", "interval_sec": 1, "target": target.url}
        )
        assert created.status_code == 201, created.text  # acknowledged: it must keep firing
    day_ahead = now_ms() + 86_400_000
    one_shots: dict[str, int] = {}  # job id -> its slot
    for p in range(PARTITIONS):
        for i, job_id in enumerate(job_ids("once", p, ONE_SHOTS_PER_PARTITION)):
            one_shots[job_id] = day_ahead + 1000 * (p * ONE_SHOTS_PER_PARTITION + i)
    for job_id, slot in one_shots.items():
        created = a.create_job(
            {"job_id": job_id, "name": "once", "run_at": iso(slot), "target": target.url}
        )
        assert created.status_code == 201, created.text
    for b in range(HISTORY_BATCHES):
        batch = [
            {"job_id": f"history-{b}-{i}", "name": "h", "run_at": iso(day_ahead + i * 1000)}
            | {"target": target.url}
            for i in range(1000)
        ]
        response = a.http.post("/v1/jobs:batch", json={"jobs": batch})
        assert response.status_code == 200, response.text
        statuses = {r["status"] for r in response.json()["results"]}
        assert statuses == {201}, statuses
    jobs = len(ticks) + len(one_shots) + HISTORY_BATCHES * 1000

    log_ = open_log(cluster)
    try:
        history = event_ends(log_)
        assert min(history.values()) > 300, history  # what a fold from zero would read
        snapshotted = snapshots_past(cluster, history, timeout_s=10)
        written = by_partition(a, "cronlog_snapshot_offset")  # a's own account of them
        assert all(written[p] >= history[p] for p in range(PARTITIONS)), (written, history)
        target.wait_for(len(target.calls) + len(ticks), timeout_s=5)  # the ticks run on a

        a.kill()
        killed_at = time.time()
        at_kill = event_ends(log_)
        # The newest snapshots: a wrote them; b, recovering, may write newer ones later.
        snapshotted = snapshots_past(cluster, snapshotted, timeout_s=5)

        (b,) = cluster.start("b")  # a data directory of its own, empty
        deadline = time.monotonic() + 10
        while gauge(b, "cronlog_partitions_owned") != PARTITIONS:
            assert time.monotonic() < deadline, f"b owns {gauge(b, 'cronlog_partitions_owned')}"
            time.sleep(0.1)  # the group hands a's partitions over once a's session has expired
        b.wait_ready()
        restored = by_partition(b, "cronlog_recovery_snapshot_offset")
        replayed = by_partition(b, "cronlog_recovery_replayed_events")
        print(
            f"takeover: history {history}, snapshots {snapshotted}, events at the kill"
            f" {at_kill}; b restored {restored} and replayed {replayed}"
        )
        for p in range(PARTITIONS):
            # The newest snapshot seen after the kill (or one a's last commit made visible
            # just after we looked), not an older one.
            assert snapshotted[p] <= restored[p] <= at_kill[p], (p, restored, snapshotted)
            # Only the events after the snapshot were read (offsets also count the
            # transactions' markers, so a tail of n events spans more than n offsets) ...
            assert replayed[p] <= at_kill[p] - restored[p], (p, replayed, at_kill, restored)
            # ... and that tail is a small part of what a fold from zero would have read.
            assert replayed[p] < history[p] / 4, (p, replayed, history)
        assert gauge(b, "cronlog_snapshot_restores_total") == PARTITIONS

        # Every acknowledged interval job fires on b.
        calls = target.wait_until(
            lambda calls: (
                {c.body["job_id"] for c in calls if c.received_at > killed_at} >= set(ticks)
            ),
            timeout_s=10,
        )
        fired = {c.body["job_id"] for c in calls if c.received_at > killed_at}
        assert fired >= set(ticks), f"not fired since the kill: {set(ticks) - fired}"
        # The one-shots are still waiting for their slots, and none of them has run.
        for job_id, slot in one_shots.items():
            job = b.http.get(f"/v1/jobs/{job_id}")
            assert job.status_code == 200, job.text
            body = job.json()
            assert body["status"] == "active", body
            assert parse_ms(body["next_run_at"]) == slot, (job_id, body["next_run_at"], slot)
            assert not b.runs(job_id), job_id
        assert gauge(b, "cronlog_jobs", status="active") == jobs
        assert not {c.body["job_id"] for c in target.calls} - set(ticks)

        b.stop()  # its stores closed, for the check
        for p in range(PARTITIONS):
            check = verify_partition(log_, Layout(b.data_dir), p)
            assert check.ok and not check.store_missing, check.describe()
    finally:
        log_.close()


def parse_ms(instant: str) -> int:
    return round(datetime.fromisoformat(instant).astimezone(UTC).timestamp() * 1000)
