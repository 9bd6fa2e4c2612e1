"""Two nodes of one embedded log's group, as a node's two worker processes are, in this
process: each a :class:`RemoteLog` client of one :class:`LogServer`, owning half the
partitions once both have joined."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eventlog.embedded import EmbeddedLog
from eventlog.log_server import LogServer
from eventlog.remote import RemoteLog
from node.node import Node


@contextmanager
def two_workers(tmp_path: Path, partitions: int, **node_args: Any) -> Iterator[tuple[Node, Node]]:
    log = EmbeddedLog.open(tmp_path / "log", partitions)
    server = LogServer(log, tmp_path / "log.sock")
    names = ("w0", "w1")
    clients = [RemoteLog(server.path, name) for name in names]
    started = [
        Node(client, tmp_path / name, node_id=name, **node_args)
        for client, name in zip(clients, names, strict=True)
    ]
    for node in started:
        node.start()
    a, b = started
    half = partitions // 2
    assert a.wait_owned(lambda owned: len(owned) == half, 20)
    assert b.wait_owned(lambda owned: len(owned) == half, 20)
    try:
        yield a, b
    finally:
        for node in started:
            node.stop(drain_s=0)
        for client in clients:
            client.close()
        server.close()
        log.close()
