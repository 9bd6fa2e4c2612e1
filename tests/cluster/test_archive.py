"""Two ``cronlog serve --kafka`` nodes archiving into one shared directory: each archives the
partitions it owns, and the archive holds exactly what the events topic holds, in order."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from archive.archive import Archive
from archive.store import DirectoryStore
from eventlog.kafka import KafkaLog
from tests.cluster.nodes import PARTITIONS, Cluster, iso, job_ids
from tests.node.targets import Target
from tools.replay.records import events

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _archived(cluster: Cluster) -> float:
    total = 0.0
    for node in cluster.nodes.values():
        found = re.search(r"^cronlog_archive_records_total (\S+)$", node.metrics(), re.MULTILINE)
        total += float(found.group(1)) if found else 0.0
    return total


def test_nodes_archive_the_partitions_they_own_into_a_shared_archive(
    kafka_bootstrap: str, tmp_path: Path, target: Target
) -> None:
    shared = tmp_path / "archive"
    args = ("--archive-dir", str(shared), "--archive-delay", "1s", "--retention-check", "200ms")
    cluster = Cluster(kafka_bootstrap, tmp_path, serve_args=args)
    try:
        n1, _ = cluster.start("n1", "n2")
        for p in range(PARTITIONS):
            [job_id] = job_ids("tick", p, 1)
            body = {
                "job_id": job_id,
                "name": "tick",
                "schedule": "* * * * *",
                "seconds": "*",
                "target": target.url,
                "start_at": iso(time.time()),
            }
            assert n1.create_job(body).status_code == 201
        deadline = time.monotonic() + 60
        while _archived(cluster) < 8 * PARTITIONS:  # other processes: poll their metrics
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.2)
    finally:
        cluster.stop()
    archive = Archive(DirectoryStore(shared))
    log = KafkaLog.open(
        kafka_bootstrap,
        PARTITIONS,
        prefix=cluster.prefix,
        replication_factor=-1,
        min_insync_replicas=None,
    )
    try:
        for p in range(PARTITIONS):
            through = archive.archived_through(p)
            assert through > 0, f"partition {p} was never archived"
            assert archive.read(p, 0, 100_000) == list(events(log, p, until=through))
    finally:
        log.close()
