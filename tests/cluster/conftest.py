"""Fixtures for the cluster tests: two node processes on the test Kafka, and a loopback target."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cluster.nodes import Cluster, two_nodes
from tests.node.targets import Target


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch) -> Iterator[Target]:
    # Twenty jobs firing on the same second connect at once: with socketserver's backlog of 5
    # the kernel drops SYNs and the client's retransmit makes a call a second late.
    with monkeypatch.context() as patch:
        patch.setattr(ThreadingHTTPServer, "request_queue_size", 128)
        t = Target().start()
    yield t
    t.stop()


@pytest.fixture
def cluster(
    kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """Two nodes, ``n1`` and ``n2``, both ready, on topics of this test's own; a test
    parametrized with ``indirect=["cluster"]`` names where they keep history (``every-node``,
    the default, or ``owner``: ``--history-on``)."""
    history_on = getattr(request, "param", "every-node")
    with two_nodes(kafka_bootstrap, tmp_path, ("--history-on", history_on)) as c:
        yield c
