"""How the client sends: what it sends again after a failure on the way, and how long it keeps
an idle connection (against the node's keep-alive). No node: httpx's mock transport."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from cronlog_client import AsyncClient, Beat, Client, Unreachable
from cronlog_client import client as client_module

ANSWERS = {
    "/v1/workers/claim": {"runs": []},
    "/v1/runs/r.1/heartbeat": {"run_id": "r.1", "lease_expires_at": "2026-11-01T00:00:30Z"},
    "/v1/runs:heartbeat": {
        "results": [
            {"index": 0, "status": 200, "run_id": "r.1", "lease_expires_at": "2026-11-01T00:00:30Z"}
        ],
        "extended": 1,
        "failed": 0,
    },
}


def flaky(
    error: type[httpx.TransportError], failures: int
) -> tuple[httpx.MockTransport, list[str]]:
    """A transport that fails its first ``failures`` requests with ``error``, then answers."""
    sent: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if len(sent) <= failures:
            raise error("on the way", request=request)
        return httpx.Response(200, json=ANSWERS[request.url.path])

    return httpx.MockTransport(handle), sent


def no_sleep(_: float) -> None:
    pass


@pytest.mark.parametrize("error", [httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout])
def test_a_request_that_never_left_is_sent_again_whatever_it_is(
    error: type[httpx.TransportError],
) -> None:
    transport, sent = flaky(error, 2)
    # A claim is not harmless to repeat once it may have arrived (it leases runs); one that
    # never left is.
    with Client("http://node", "t", transport=transport, sleep=no_sleep) as api:
        assert api.claim("p", "w") == []
    assert sent == ["/v1/workers/claim"] * 3


@pytest.mark.parametrize("error", [httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError])
def test_a_request_that_may_have_arrived_is_sent_again_only_if_harmless(
    error: type[httpx.TransportError],
) -> None:
    transport, sent = flaky(error, 1)
    with Client("http://node", "t", transport=transport, sleep=no_sleep) as api:
        with pytest.raises(Unreachable):
            api.claim("p", "w")
        assert sent == ["/v1/workers/claim"]
        # A heartbeat carries its fencing token: harmless to send again.
        assert api.heartbeat("r.1", 7).run_id == "r.1"
    assert sent == ["/v1/workers/claim", "/v1/runs/r.1/heartbeat"]


def test_a_batch_of_heartbeats_that_may_have_arrived_is_sent_again() -> None:
    # Each carries its fencing token: a repeat extends the same lease again, nothing more.
    transport, sent = flaky(httpx.ReadError, 1)
    with Client("http://node", "t", transport=transport, sleep=no_sleep) as api:
        done = api.heartbeat_many([Beat(run_id="r.1", fencing_token=7)])
    assert done.extended == 1 and sent == ["/v1/runs:heartbeat"] * 2


def test_the_async_client_sends_again_what_never_left() -> None:
    transport, sent = flaky(httpx.ConnectError, 1)

    async def claim() -> int:
        async with AsyncClient("http://node", "t", transport=transport) as api:
            return len(await api.claim("p", "w"))

    assert asyncio.run(claim()) == 0 and sent == ["/v1/workers/claim"] * 2


def test_an_idle_connection_is_let_go_before_the_node_closes_it() -> None:
    from cli.serve import KEEP_ALIVE_S

    for api in (Client("http://node", "t"), AsyncClient("http://node", "t")):
        pool = api._http._transport._pool  # type: ignore[union-attr]
        assert pool._keepalive_expiry == client_module.KEEPALIVE_S
    assert client_module.KEEPALIVE_S + 30 <= KEEP_ALIVE_S
