"""Health, readiness, unavailability, unknown routes, and the OpenAPI document."""

from __future__ import annotations

import pytest

from api.app import ROUTES
from api.errors import from_exception
from core.errors import CronlogError
from tests.api.conftest import Api

pytestmark = pytest.mark.anyio


async def test_healthz_and_readyz_need_no_token(api: Api) -> None:
    assert (await api.anon.get("/healthz")).json() == {"status": "ok"}
    assert (await api.anon.get("/readyz")).json() == {"status": "ready"}
    api.fake.is_ready = False
    r = await api.anon.get("/readyz")
    assert (r.status_code, r.json()["error"]) == (503, "unavailable")
    assert (await api.anon.get("/healthz")).status_code == 200


async def test_an_unavailable_partition_is_503_with_retry_after(api: Api) -> None:
    api.fake.available = False
    job = {"name": "x", "schedule": "@daily", "target": "pull://p"}
    r = await api.a.post("/v1/jobs", json=job)
    assert (r.status_code, r.json()["error"]) == (503, "unavailable")
    assert r.headers["Retry-After"] == "1"
    claim = await api.a.post("/v1/workers/claim", json={"pool": "p", "worker_id": "w"})
    assert claim.status_code == 503


async def test_unknown_routes_and_methods_answer_json(api: Api) -> None:
    r = await api.a.get("/v1/nothing-here")
    assert (r.status_code, r.json()["error"]) == (404, "not_found")
    r = await api.a.post("/v1/runs/r1")
    assert (r.status_code, r.json()["error"]) == (405, "method_not_allowed")


async def test_openapi_lists_every_route_with_schemas(api: Api) -> None:
    r = await api.anon.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    listed = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}
    assert listed == {(method, path) for method, path, _ in ROUTES}
    schemas = doc["components"]["schemas"]
    for name in ("NewJob", "JobPatch", "JobOut", "RunOut", "ClaimOut", "CompleteIn", "ErrorBody"):
        assert name in schemas
    assert schemas["NewJob"]["additionalProperties"] is False  # unknown fields are refused
    create = doc["paths"]["/v1/jobs"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/NewJob"
    }
    assert create["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/healthz"]["get"]


def test_a_nodes_own_cronlog_error_means_try_again() -> None:
    class PartitionMoving(CronlogError):
        pass

    error = from_exception(PartitionMoving("partition 3 moved"))
    assert (error.status, error.body.error, error.headers) == (
        503,
        "unavailable",
        {"Retry-After": "1"},
    )
    assert from_exception(RuntimeError("bug")).status == 500
