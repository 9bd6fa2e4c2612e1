"""The cluster tests' nodes: :mod:`tools.chaos.nodes` with this suite's settings.

Nodes run on the one test broker (replication factor 1) with four partitions and two teams;
the tests speak as ``team-a``. Job ids are picked per partition with :func:`job_ids`.
"""

from __future__ import annotations

from pathlib import Path

from eventlog.port import partition_for
from tools.chaos import nodes
from tools.chaos.nodes import NodeConfig, NodeProcess
from tools.chaos.procs import iso, now_ms

__all__ = ["AUTH", "PARTITIONS", "Cluster", "NodeProcess", "iso", "job_ids", "now_ms"]

PARTITIONS = 4
# One broker in tests; a cluster of three given by KAFKA_BOOTSTRAP_SERVERS works too.
CONFIG = NodeConfig(partitions=PARTITIONS, replication_factor=1, min_insync_replicas=1)
AUTH = CONFIG.auth


def job_ids(prefix: str, partition: int, count: int) -> list[str]:
    """``count`` job ids that hash to ``partition``."""
    ids: list[str] = []
    for i in range(10_000):
        if partition_for(f"{prefix}-{i}", PARTITIONS) == partition:
            ids.append(f"{prefix}-{i}")
            if len(ids) == count:
                return ids
    raise AssertionError(f"no {count} ids for partition {partition}")


class Cluster(nodes.Cluster):
    def __init__(self, bootstrap: str, base_dir: Path) -> None:
        super().__init__(bootstrap, base_dir, CONFIG)
