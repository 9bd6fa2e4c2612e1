"""``log_factory``: the contract suite's way to open a log, once per adapter.

A factory opens logs over one storage per test and closes whatever it opened at teardown.
``restart(log)`` is a node restart: the log is closed and opened again over the same storage
where the adapter has storage to reopen (``reopenable``); the in-memory log has none, so it
hands back the same log and a test goes on with a new membership, which is what a restarted
node in the same process would see.

To add an adapter, write a maker ``(request, tmp_path) -> LogFactory`` and append it to
``ADAPTERS``. The Kafka adapter's entry will look like::

    pytest.param(_kafka, id="kafka", marks=pytest.mark.kafka)

with ``_kafka`` taking the broker from ``request.getfixturevalue("kafka_bootstrap")`` and
giving each factory its own topic names.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from eventlog.embedded import EmbeddedLog
from eventlog.group import InProcessLog
from eventlog.kafka import KafkaLog
from eventlog.log_server import LogServer
from eventlog.memory import MemoryLog
from eventlog.port import EventLog
from eventlog.remote import RemoteLog


@dataclass
class LogFactory:
    name: str
    reopenable: bool
    _open: Callable[[int], EventLog]
    _opened: list[EventLog] = field(default_factory=list)

    def open(self, num_partitions: int = 4) -> EventLog:
        log = self._open(num_partitions)
        self._opened.append(log)
        return log

    def restart(self, log: EventLog) -> EventLog:
        if not self.reopenable:
            return log
        log.close()
        return self.open(log.num_partitions)

    def close_all(self) -> None:
        for log in reversed(self._opened):
            log.close()


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    # Gaps between appends, as Kafka's transaction markers leave: no test may assume offset+1.
    return LogFactory("memory", False, lambda n: MemoryLog(n, gaps=True))


def _embedded(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    return LogFactory("embedded", True, lambda n: EmbeddedLog.open(tmp_path / "log", n))


def _kafka(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    prefix = f"contract-{uuid.uuid4().hex[:12]}"  # the factory's own topics and group
    # Replication and min ISR are the broker's defaults: whatever KAFKA_BOOTSTRAP_SERVERS runs.
    return LogFactory(
        "kafka",
        True,
        lambda n: KafkaLog.open(
            bootstrap, n, prefix=prefix, replication_factor=-1, min_insync_replicas=None
        ),
    )


class ServedLog(RemoteLog):
    """A worker's log through a log server over ``backing``; closing it closes the server and
    ``backing`` too, so a restart reopens all three over the same storage."""

    def __init__(self, backing: InProcessLog, socket_path: Path, member_id: str) -> None:
        self.backing = backing
        self.server = LogServer(backing, socket_path)
        try:
            super().__init__(socket_path, member_id)
        except BaseException:
            self.server.close()
            raise

    def close(self) -> None:
        super().close()
        self.server.close()
        self.backing.close()


def _remote(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    # The embedded log in a parent process, a worker reaching it through the socket.
    sockets = itertools.count()
    return LogFactory(
        "remote",
        True,
        lambda n: ServedLog(
            EmbeddedLog.open(tmp_path / "log", n), tmp_path / f"log-{next(sockets)}.sock", "w1"
        ),
    )


def _remote_memory(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    # The in-memory log with gaps behind the socket: the client assumes no contiguous offsets.
    sockets = itertools.count()
    return LogFactory(
        "remote-memory",
        False,
        lambda n: ServedLog(MemoryLog(n, gaps=True), tmp_path / f"mem-{next(sockets)}.sock", "w1"),
    )


# Append new adapters here (see the module docstring).
ADAPTERS = [
    pytest.param(_memory, id="memory"),
    pytest.param(_embedded, id="embedded"),
    pytest.param(_remote, id="remote"),
    pytest.param(_remote_memory, id="remote-memory"),
    pytest.param(_kafka, id="kafka", marks=pytest.mark.kafka),
]
_NOT_REOPENABLE = {"memory", "remote-memory"}


@pytest.fixture(params=ADAPTERS)
def log_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    factory = request.param(request, tmp_path)
    yield factory
    factory.close_all()


@pytest.fixture(params=[a for a in ADAPTERS if a.id not in _NOT_REOPENABLE])
def reopenable_log_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    """The adapters with storage to reopen: a test of what survives a restart is not run
    against the in-memory log at all (rather than skipped)."""
    factory = request.param(request, tmp_path)
    assert factory.reopenable
    yield factory
    factory.close_all()
