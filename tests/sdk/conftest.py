"""The SDK against real nodes: a ``cronlog serve`` process per test module, and loopback
servers for the targets it calls.

Teams: ``team-a`` and ``team-b``; the operator's token reads every team's events.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from cronlog_client import AsyncClient, Client

from tests.cli.test_serve import Serve

TOKENS = "team-a=token-a,team-b=token-b"
OPERATOR = "operator-token"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    data = tmp_path_factory.mktemp("node")
    served = Serve(data, TOKENS, env={"CRONLOG_OPERATOR_TOKEN": OPERATOR}).start()
    yield served
    assert served.stop() == 0, (data / "serve.log").read_text()[-5000:]


@pytest.fixture
def a(node: Serve) -> Iterator[Client]:
    with Client(node.url, "token-a") as client:
        yield client


@pytest.fixture
def b(node: Serve) -> Iterator[Client]:
    with Client(node.url, "token-b") as client:
        yield client


def async_client(node: Serve, token: str = "token-a") -> AsyncClient:
    return AsyncClient(node.url, token)


class Loopback:
    """An ASGI app served by uvicorn on a loopback port, in a thread of its own."""

    def __init__(self, app: Any) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        started = threading.Event()

        class Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                started.set()

        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])), daemon=True
        )
        self._thread.start()
        assert started.wait(10), "the loopback server did not start"

    def stop(self) -> None:
        self._server.should_exit = True
        # nor wait for calls still held open (uvicorn's graceful end waits for them)
        self._server.force_exit = True
        self._thread.join(10)
        self._sock.close()


def unique(prefix: str) -> str:
    """A job id no other test of the module uses (they share one node)."""
    unique.count += 1  # type: ignore[attr-defined]
    return f"{prefix}-{unique.count}"  # type: ignore[attr-defined]


unique.count = 0  # type: ignore[attr-defined]


def data_dir_of(node: Serve) -> Path:
    return node.data_dir
