"""``GET /metrics``: served only to the operator's token, never to a tenant's or to no one."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from api.app import create_app
from core import events as ev
from node.metrics import NodeMetrics
from tests.api.conftest import TOKENS, serve
from tests.api.fakes import FakeScheduler

pytestmark = pytest.mark.anyio
OPERATOR = "token-of-the-operator"


async def get(
    fake: FakeScheduler, metrics: NodeMetrics | None, auth: str | None, path: str = "/metrics"
) -> httpx.Response:
    options = {} if metrics is None else {"metrics": metrics, "metrics_token": OPERATOR}
    headers = {} if auth is None else {"Authorization": f"Bearer {auth}"}
    async with (
        serve(fake, **options) as transport,
        httpx.AsyncClient(transport=transport, base_url="http://cronlog") as client,
    ):
        return await client.get(path, headers=headers)


async def test_only_the_operator_token_reads_the_metrics(fake: FakeScheduler) -> None:
    metrics = NodeMetrics()
    lease = ev.LeaseGranted(
        at=5, job_id="j", tenant="team-a", run_id="j.1", scheduled_for=1,
        worker_id="w", lease_expires_at=9, lateness_ms=4,
    )  # fmt: skip
    metrics.appended(0, [0], [lease])
    for refused in (None, "nonsense", *TOKENS):  # no token, a wrong one, each tenant's
        response = await get(fake, metrics, refused)
        assert response.status_code == 401, refused
        assert "cronlog_leases" not in response.text
    response = await get(fake, metrics, OPERATOR)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert "cronlog_leases_granted_total 1.0" in response.text.splitlines()
    assert "team-a" not in response.text  # no tenant is named


async def test_without_metrics_there_is_no_endpoint(fake: FakeScheduler) -> None:
    assert (await get(fake, None, OPERATOR)).status_code == 404
    with pytest.raises(ValueError, match="metrics_token"):
        create_app(fake, TOKENS, metrics=NodeMetrics())


async def test_the_openapi_document_describes_the_endpoint_and_its_token(
    fake: FakeScheduler,
) -> None:
    document = msgspec.json.decode((await get(fake, NodeMetrics(), None, "/openapi.json")).content)
    operation = document["paths"]["/metrics"]["get"]
    assert operation["security"] == [{"bearer": []}]
    assert "text/plain" in operation["responses"]["200"]["content"]
