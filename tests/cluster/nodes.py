"""The cluster tests' nodes: :mod:`tools.chaos.nodes` with this suite's settings.

Nodes run on the one test broker (replication factor 1) with four partitions and two teams;
the tests speak as ``team-a``. Job ids are picked per partition with :func:`job_ids`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from core.ids import log_job_id
from eventlog.kafka import KafkaLog
from eventlog.port import partition_for
from tools.chaos import nodes
from tools.chaos.nodes import NodeConfig, NodeProcess
from tools.chaos.procs import free_port, iso, now_ms

__all__ = [
    "AUTH",
    "PARTITIONS",
    "Cluster",
    "NodeProcess",
    "free_port",
    "iso",
    "job_ids",
    "now_ms",
    "open_log",
    "two_nodes",
]

PARTITIONS = 4
# One broker in tests; a cluster of three given by KAFKA_BOOTSTRAP_SERVERS works too.
CONFIG = NodeConfig(partitions=PARTITIONS, replication_factor=1, min_insync_replicas=1)
AUTH = CONFIG.auth


def job_ids(prefix: str, partition: int, count: int, tenant: str = "team-a") -> list[str]:
    """``count`` ids of ``tenant``'s jobs that live on ``partition`` (routing is by the log's
    id, which includes the tenant: core.ids)."""
    ids: list[str] = []
    for i in range(10_000):
        if partition_for(log_job_id(tenant, f"{prefix}-{i}"), PARTITIONS) == partition:
            ids.append(f"{prefix}-{i}")
            if len(ids) == count:
                return ids
    raise AssertionError(f"no {count} ids for partition {partition}")


class Cluster(nodes.Cluster):
    def __init__(self, bootstrap: str, base_dir: Path, serve_args: tuple[str, ...] = ()) -> None:
        # serve_args: more `cronlog serve` options for every node
        super().__init__(bootstrap, base_dir, dataclasses.replace(CONFIG, serve_args=serve_args))


def open_log(cluster: Cluster) -> KafkaLog:
    """A log client of ``cluster``'s topics, as a node opens it (the caller closes it)."""
    return KafkaLog.open(
        cluster.bootstrap,
        PARTITIONS,
        prefix=cluster.prefix,
        replication_factor=CONFIG.replication_factor,
        min_insync_replicas=CONFIG.min_insync_replicas,
    )


@contextlib.contextmanager
def two_nodes(
    bootstrap: str, base_dir: Path, serve_args: tuple[str, ...] = ()
) -> Iterator[Cluster]:
    """``n1`` and ``n2``, both ready, on topics of their own; stopped after, their logs printed
    (pytest shows them when the test failed)."""
    c = Cluster(bootstrap, base_dir, serve_args)
    try:
        c.start("n1", "n2")
        yield c
    finally:
        c.stop()
        print(c.logs())
