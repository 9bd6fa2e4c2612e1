"""Session-wide fixtures: a real Kafka for tests marked ``kafka``.

``kafka_bootstrap`` is one node, or ``KAFKA_BOOTSTRAP_SERVERS`` when that is set.
``kafka_cluster3`` is three nodes (a :class:`tools.kafka.broker.KafkaCluster`, so tests can kill
one), started only when a test asks. A broker that cannot start skips its tests, except under
``CI=true`` or ``CRONLOG_REQUIRE_KAFKA=1`` (``scripts/test`` sets it), where they fail with the
reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tools.kafka import broker

# The property tests search anew on every run by default. ``scripts/test`` (and so CI) uses the
# "ci" profile: the same examples every run, so the gate is reproducible; plain pytest explores.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "explore"))

KAFKA_FIXTURES = frozenset({"kafka_bootstrap", "kafka_cluster3"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that uses a Kafka fixture is a Kafka test, marked or not: `-m "not kafka"` skips it.
    for item in items:
        if KAFKA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)


def pytest_report_header() -> str:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        return f"kafka: KAFKA_BOOTSTRAP_SERVERS={external}"
    return f"kafka: {broker.kafka_version()} from jars in {broker.jars_dir()}, started on demand"


def _start(nodes: int, tmp_path_factory: pytest.TempPathFactory) -> broker.KafkaCluster:
    try:
        return broker.start(nodes, tmp_path_factory.mktemp(f"kafka{nodes}"))
    except (broker.BrokerError, OSError) as e:
        reason = f"cannot start a {nodes}-node Kafka: {e}"
    if os.environ.get("CI") == "true" or os.environ.get("CRONLOG_REQUIRE_KAFKA"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    cluster = _start(1, tmp_path_factory)
    yield cluster.bootstrap_servers
    cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[broker.KafkaCluster]:
    cluster = _start(3, tmp_path_factory)
    yield cluster
    cluster.stop()
