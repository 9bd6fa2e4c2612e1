"""One /metrics for a node of several workers: every worker's samples, labelled."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from node.worker_metrics import (
    READY_TIMEOUT_S,
    MergedMetrics,
    MetricsSocket,
    Readiness,
    merge,
    siblings_not_ready,
)


class Own:
    content_type = "text/plain"

    def __init__(self, runs: float) -> None:
        self.registry = CollectorRegistry()
        Counter("cronlog_runs", "Runs.", ["tenant"], registry=self.registry).labels("a").inc(runs)
        Gauge("cronlog_ready", "Ready.", registry=self.registry).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_each_worker_s_samples_carry_its_label_and_a_silent_one_is_down() -> None:
    texts = {0: Own(3).render().decode(), 1: Own(5).render().decode(), 2: None}
    registry = CollectorRegistry()

    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            return merge(texts)

    registry.register(Collector())
    found = samples(generate_latest(registry).decode())
    assert found[("cronlog_runs_total", (("tenant", "a"), ("worker", "0")))] == 3
    assert found[("cronlog_runs_total", (("tenant", "a"), ("worker", "1")))] == 5
    assert found[("cronlog_ready", (("worker", "1"),))] == 1
    assert found[("cronlog_worker_up", (("worker", "0"),))] == 1
    assert found[("cronlog_worker_up", (("worker", "2"),))] == 0
    assert not any(
        dict(labels).get("worker") == "2" for name, labels in found if name != "cronlog_worker_up"
    )


def test_a_worker_answers_for_its_siblings_over_their_sockets(tmp_path: Path) -> None:
    sibling = MetricsSocket(Own(7), tmp_path / "m1.sock")
    sibling.start()
    try:
        merged = MergedMetrics(Own(2), 0, {1: tmp_path / "m1.sock", 2: tmp_path / "m2.sock"})
        found = samples(merged.render().decode())
    finally:
        sibling.stop()
    assert found[("cronlog_runs_total", (("tenant", "a"), ("worker", "0")))] == 2
    assert found[("cronlog_runs_total", (("tenant", "a"), ("worker", "1")))] == 7
    assert found[("cronlog_worker_up", (("worker", "2"),))] == 0  # nothing listens there
    assert not (tmp_path / "m1.sock").exists()  # removed at stop


def test_siblings_that_hang_cost_one_timeout_together(tmp_path: Path) -> None:
    # Two siblings whose sockets take the connection and never answer (stuck processes), and
    # one that answers: /readyz waits for the stuck ones at once, not one after the other.
    stuck = []
    for i in (1, 2):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / f"ready-{i}.sock"))
        listener.listen(1)
        stuck.append(listener)
    owns_none = Readiness(lambda: ["it owns no partitions yet"])
    answering = MetricsSocket(owns_none, tmp_path / "r3.sock")
    answering.start()
    try:
        ask = siblings_not_ready(
            {1: tmp_path / "ready-1.sock", 2: tmp_path / "ready-2.sock", 3: tmp_path / "r3.sock"}
        )
        began = time.monotonic()
        reasons = ask()
        took = time.monotonic() - began
    finally:
        answering.stop()
        for listener in stuck:
            listener.close()
    assert reasons == [
        "worker 1 does not answer",
        "worker 2 does not answer",
        "worker 3: it owns no partitions yet",
    ]
    assert took < READY_TIMEOUT_S * 1.8
