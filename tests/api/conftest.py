"""Fixtures: the API over a :class:`~tests.api.fakes.FakeScheduler`, and a client per tenant.

``httpx.ASGITransport`` does not run the ASGI lifespan, so :func:`serve` runs the app's lifespan
itself and hands every request a copy of its state, which is what a server such as uvicorn does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from starlette.types import Receive, Scope, Send

from api.app import create_app
from api.instants import parse_rfc3339
from core.clock import FakeClock
from core.egress import EgressPolicy
from projections.read_model import ReadModel
from tests.api.fakes import FakeScheduler

START = parse_rfc3339("2026-11-29T08:00:00Z", "start")
TOKENS = {"token-of-team-a": "team-a", "token-of-team-b": "team-b"}
# The default policy with every team granted every topic of its Kafka (never the cluster's
# own): these tests are about the API; tests/api/test_egress.py is about the policy.
ANY_TOPIC = EgressPolicy.build(topics=["*=*"])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeScheduler]:
    with ReadModel(tmp_path / "read_model") as history:
        yield FakeScheduler(history, FakeClock(START))


@asynccontextmanager
async def serve(scheduler: FakeScheduler, **options: Any) -> AsyncIterator[httpx.ASGITransport]:
    app = create_app(scheduler, TOKENS, **options)
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        yield httpx.ASGITransport(app=with_state)


@dataclass
class Api:
    fake: FakeScheduler
    a: httpx.AsyncClient  # team-a
    b: httpx.AsyncClient  # team-b
    anon: httpx.AsyncClient  # no token

    def everything(self) -> tuple[Any, ...]:
        """What a refused request must not change: the log, and what the read model shows."""
        h = self.fake.history
        return (
            len(self.fake.events),
            [
                msgspec.json.encode(v)
                for t in ("team-a", "team-b")
                for v in h.jobs(t, limit=1000).items
            ],
            [h.counts(t) for t in ("team-a", "team-b")],
        )


@pytest.fixture
async def api(fake: FakeScheduler) -> AsyncIterator[Api]:
    async with serve(fake, egress=ANY_TOPIC) as transport:
        clients = [
            httpx.AsyncClient(
                transport=transport,
                base_url="http://cronlog",
                headers={"Authorization": f"Bearer {token}"} if token else {},
            )
            for token in ("token-of-team-a", "token-of-team-b", None)
        ]
        try:
            yield Api(fake, *clients)
        finally:
            for client in clients:
                await client.aclose()
