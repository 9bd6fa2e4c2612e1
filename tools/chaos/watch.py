"""What the nodes said about themselves through the run: ``/readyz`` and ``/metrics``, sampled.

Reading readiness only at the end cannot see a node that said "ready" while its partitions
decided nothing. A :class:`HealthWatch` asks every node, every ``INTERVAL_S``, what an operator's
probe and scraper would ask, each with a short timeout (``TIMEOUT_S``, as a probe would give
it), and records each answer to ``health.jsonl``:

``{"node", "at", "readyz", "readyz_ms", "reasons", "metrics_ms", "not_deciding", "owned"}``

- ``at``: when the sample began (the harness's true wall clock, ms);
- ``readyz``: the status answered (0: no answer within the timeout), ``reasons`` its message;
- ``metrics_ms``: how long ``/metrics`` took (null: no answer within the timeout);
- ``not_deciding``: ``cronlog_partitions_not_deciding`` (null without metrics);
- ``owned``: the partitions the node's metrics say it owns (``cronlog_partition_deciding``'s
  labels, else the per-partition recovery gauges' labels), null without metrics.

The checker (:func:`tools.chaos.checker.check`) holds these against when each partition's
every-second jobs were in fact called on time (``ready_while_dark``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tools.chaos.gather import parse_metrics
from tools.chaos.procs import now_ms
from tools.chaos.records import Recorder

log = logging.getLogger("chaos")

INTERVAL_S = 0.5
TIMEOUT_S = 2.0
_PARTITION = re.compile(r'partition="(\d+)"')
_OWNED_BY = ("cronlog_partition_deciding", "cronlog_recovery_replayed_events")


class HealthWatch:
    """Samples every node's ``/readyz`` and ``/metrics`` on a thread of its own until stopped."""

    def __init__(self, nodes: dict[str, str], metrics_token: str, record: Recorder) -> None:
        self._nodes = nodes  # node id -> base URL
        self._token = metrics_token
        self._record = record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-watch", daemon=True)
        self._pool = ThreadPoolExecutor(len(nodes), thread_name_prefix="health-watch")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(TIMEOUT_S * 3)
        self._pool.shutdown(wait=True)

    def _run(self) -> None:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                # One node that does not answer must not delay the others' samples.
                futures = [
                    self._pool.submit(self._sample, client, node, url)
                    for node, url in self._nodes.items()
                ]
                for node, future in zip(self._nodes, futures, strict=True):
                    try:
                        self._record.write(future.result())
                    except Exception:
                        # Said, and the watch goes on: a watch that ended here would leave
                        # ready_while_dark nothing to judge for the rest of the run.
                        log.exception("health watch: the sample of %s was lost", node)
                self._stop.wait(max(0.0, INTERVAL_S - (time.monotonic() - began)))

    def _sample(self, client: httpx.Client, node: str, url: str) -> dict[str, Any]:
        sample: dict[str, Any] = {"node": node, "at": now_ms()}
        started = time.monotonic()
        try:
            response = client.get(f"{url}/readyz")
            sample["readyz"] = response.status_code
            if response.status_code != 200:
                sample["reasons"] = response.text[:500]
        except httpx.HTTPError:
            sample["readyz"] = 0
        sample["readyz_ms"] = round((time.monotonic() - started) * 1000)
        started = time.monotonic()
        try:
            response = client.get(
                f"{url}/metrics", headers={"Authorization": f"Bearer {self._token}"}
            )
            response.raise_for_status()
        except httpx.HTTPError:
            sample["metrics_ms"] = None
            return sample
        sample["metrics_ms"] = round((time.monotonic() - started) * 1000)
        metrics = parse_metrics(response.text)
        not_deciding = metrics.get("cronlog_partitions_not_deciding")
        sample["not_deciding"] = None if not_deciding is None else int(not_deciding)
        sample["owned"] = owned(metrics)
        return sample


def owned(metrics: dict[str, float]) -> list[int]:
    """The partitions a node's metrics show it owning."""
    for name in _OWNED_BY:
        found = sorted(
            int(m.group(1))
            for key in metrics
            if key.startswith(name + "{") and (m := _PARTITION.search(key))
        )
        if found:
            return found
    return []
