"""``kafka://`` targets on the cluster itself, exactly once (``node.produced``): two nodes on
the real broker, every-second jobs producing to a team's topic, one node killed -9 among them.

A ``read_committed`` consumer of the team's topic must then see one record for each run the
log says succeeded, and none for anything else: no run twice (the killed node's open
transaction is aborted when the survivor's writer fences it), none lost (a run whose
transaction never committed is still due, and the survivor produces it).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.nodes import PARTITIONS, Cluster, iso, job_ids, now_ms, two_nodes

pytestmark = pytest.mark.slow

TEAM_TOPIC_PARTITIONS = 3


@pytest.fixture
def cluster(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Cluster]:
    with two_nodes(kafka_bootstrap, tmp_path, ("--allow-topics", "team-a=team-a.")) as c:
        yield c


def test_every_succeeded_run_is_in_the_team_topic_once_through_a_node_kill(
    cluster: Cluster,
) -> None:
    topic = f"team-a.ticks.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, TEAM_TOPIC_PARTITIONS, 1)])[topic].result(30)
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    assert "kafka:// targets: exactly once" in n1.log_tail(200)

    jobs = [job_ids("tick", p, 1)[0] for p in range(PARTITIONS)]
    for i, job_id in enumerate(jobs):
        response = n2.create_job(
            {
                "job_id": job_id,
                "name": job_id,
                "schedule": "* * * * *",
                "seconds": "*",
                "target": f"kafka://{topic}",
                "critical": i % 2 == 0,
                "start_at": iso(now_ms()),
            }
        )
        assert response.status_code == 201, response.text

    _wait_until("every job produced", lambda: all(_succeeded(n2, j) for j in jobs), 20)
    n1.kill()  # its partitions' open transactions die with it
    before = {j: len(_succeeded(n2, j)) for j in jobs}
    # the survivor takes n1's partitions over and produces their runs from there
    _wait_until(
        "every job produced again after the kill",
        lambda: all(len(_succeeded(n2, j)) >= before[j] + 3 for j in jobs),
        60,
    )
    for job_id in jobs:
        paused = n2.http.patch(f"/v1/jobs/{job_id}", json={"status": "paused"})
        assert paused.status_code == 200, paused.text

    # What the log says succeeded, once nothing more is produced: every record is committed
    # with its run's completion, so the read model's succeeded runs are the records to expect.
    # A run decided as the pause came completes after it, and the read model folds a
    # completion a moment after its record is readable: the runs are read once they stay put,
    # and again until the read model has caught up with the records read.
    def succeeded_now() -> set[str]:
        return {run["run_id"] for job_id in jobs for run in _succeeded(n2, job_id)}

    seen: list[tuple[float, set[str]]] = [(time.monotonic(), succeeded_now())]

    def settled() -> bool:  # the same for a second and more (a run a second was produced)
        now, runs = time.monotonic(), succeeded_now()
        if runs != seen[-1][1]:
            seen.append((now, runs))
        return now - seen[-1][0] >= 1.5

    _wait_until("no more runs succeed once paused", settled, 20)
    records = _committed(cluster.bootstrap, topic)
    counts = Counter(body["run_id"] for body, _ in records)
    _wait_until("the read model has every run produced", lambda: set(counts) <= succeeded_now(), 10)
    succeeded = succeeded_now()
    twice = {run_id: n for run_id, n in counts.items() if n > 1}
    assert twice == {}, f"runs produced more than once: {twice}"
    assert set(counts) == set(succeeded), (
        f"records without a succeeded run: {sorted(set(counts) - set(succeeded))[:5]}; "
        f"succeeded runs without a record: {sorted(set(succeeded) - set(counts))[:5]}"
    )
    for body, headers in records:
        assert headers["Idempotency-Key"].endswith(f"/{body['job_id']}:{body['scheduled_for_ms']}")
    # the runs are in the topic of their own accord: nothing was left to a person
    for job_id in jobs:
        assert all(run["state"] != "dead_lettered" for run in n2.all_runs(job_id))


def _succeeded(node: Any, job_id: str) -> list[dict[str, Any]]:
    return [run for run in node.all_runs(job_id) if run["state"] == "succeeded"]


def _wait_until(what: str, check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)  # the read model is asked over HTTP: nothing to wait on here


def _committed(bootstrap: str, topic: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Every committed record of ``topic``, read to its last stable offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"audit-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        ends = {}
        for p in range(TEAM_TOPIC_PARTITIONS):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in range(TEAM_TOPIC_PARTITIONS)])
        records: list[tuple[dict[str, Any], dict[str, str]]] = []
        done: set[int] = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 30
        while len(done) < TEAM_TOPIC_PARTITIONS:
            assert time.monotonic() < deadline, f"read {len(records)} records; ends {ends}"
            message = consumer.poll(0.5)
            if message is None:
                for p in set(ends) - done:  # aborted records and markers end some partitions
                    [position] = consumer.position([TopicPartition(topic, p)])
                    if position.offset >= ends[p]:
                        done.add(p)
                continue
            assert message.error() is None, message.error()
            headers = {k: v.decode() for k, v in (message.headers() or [])}
            records.append((json.loads(message.value()), headers))
            if message.offset() + 1 >= ends[message.partition()]:
                done.add(message.partition())
        return records
    finally:
        consumer.close()
