"""Registration under the operator's egress policy: a target outside it answers 422 naming
``target`` and saying "egress policy", in every spelling, and changes nothing. Target headers
are bounded and checked the same way; secret references are stored as references."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from core.egress import EgressPolicy
from tests.api.conftest import Api, serve
from tests.api.fakes import FakeScheduler

pytestmark = pytest.mark.anyio

JOB: dict[str, Any] = {"name": "report", "schedule": "0 9 * * *", "target": "https://svc/run"}

REFUSED_URLS = [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://0xa9fea9fe/",
    "http://2852039166/",
    "http://0251.0376.0251.0376/",
    "http://[::ffff:169.254.169.254]/",
    "http://[fd00:ec2::254]/",
    "http://100.100.100.200/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://METADATA.GOOGLE.INTERNAL./computeMetadata/v1/",
    "http://metadata.goog/",
    "http://127.0.0.1:22/",
    "http://127.1:6379/",
    "http://0/",
    "http://0.0.0.0:8080/",
    "http://[::]:8080/",
    "http://[::1]/",
    "http://localhost:5432/",
    "http://10.0.0.1/",
    "http://192.168.1.1/",
    "http://[fe80::1]/",
    "http://user:password@api.example.com/",
    # Unicode spellings: the URL parser that calls reads them in ASCII (UTS #46), as addresses.
    "http://169\u3002254\u3002169\u3002254/latest/meta-data/",
    "http://169\uff0e254\uff0e169\uff0e254/",
    "http://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11:6379/",
    "http://\uff10\uff58\uff41\uff19\uff46\uff45\uff41\uff19\uff46\uff45/",
    "http://0x7f\uff611/",
    "http://\uff11\uff10\uff61\uff10\uff61\uff10\uff61\uff11/",
]


@asynccontextmanager
async def api_under(fake: FakeScheduler, policy: EgressPolicy) -> AsyncIterator[Api]:
    async with serve(fake, egress=policy) as transport:
        clients = [
            httpx.AsyncClient(
                transport=transport,
                base_url="http://cronlog",
                headers={"Authorization": f"Bearer {token}"},
            )
            for token in ("token-of-team-a", "token-of-team-b", "none")
        ]
        try:
            yield Api(fake, *clients)
        finally:
            for client in clients:
                await client.aclose()


@pytest.fixture
async def strict(fake: FakeScheduler) -> AsyncIterator[Api]:
    """The API under the default policy: the public internet only, no topic granted."""
    async with api_under(fake, EgressPolicy()) as api:
        yield api


def assert_egress_refusal(r: httpx.Response) -> None:
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["field"] == "target"
    assert body["message"].startswith("egress policy: "), body


@pytest.mark.parametrize("url", REFUSED_URLS)
async def test_a_target_outside_the_policy_is_refused_in_every_spelling_and_changes_nothing(
    strict: Api, url: str
) -> None:
    await strict.a.put("/v1/jobs/existing", json=JOB)
    before = strict.everything()
    for method, path, body in (
        ("POST", "/v1/jobs", {**JOB, "target": url}),
        ("POST", "/v1/jobs", {**JOB, "target": {"type": "http", "url": url}}),
        ("PUT", "/v1/jobs/existing", {**JOB, "target": url}),
        ("PATCH", "/v1/jobs/existing", {"target": url}),
    ):
        assert_egress_refusal(await strict.a.request(method, path, json=body))
    assert strict.everything() == before


async def test_loopback_is_registered_once_the_operator_allows_it(fake: FakeScheduler) -> None:
    async with api_under(fake, EgressPolicy.build(allow=["127.0.0.0/8"])) as api:
        r = await api.a.post("/v1/jobs", json={**JOB, "target": "http://127.0.0.1:9000/hook"})
        assert r.status_code == 201, r.text
        assert_egress_refusal(
            await api.a.post("/v1/jobs", json={**JOB, "target": "http://169.254.169.254/"})
        )


@pytest.mark.parametrize(
    "topic",
    ["cronlog.events", "cronlog.commands", "cronlog.replies", "__consumer_offsets", "__x"],
)
async def test_the_clusters_own_topics_are_refused_even_when_every_topic_is_granted(
    api: Api, topic: str
) -> None:
    before = api.everything()
    assert_egress_refusal(await api.a.post("/v1/jobs", json={**JOB, "target": f"kafka://{topic}"}))
    assert_egress_refusal(
        await api.a.post("/v1/jobs", json={**JOB, "target": {"type": "kafka", "topic": topic}})
    )
    assert api.everything() == before


async def test_topics_are_refused_unless_granted_to_the_team(fake: FakeScheduler) -> None:
    policy = EgressPolicy.build(topics=["team-a=billing."])
    async with api_under(fake, policy) as api:
        r = await api.a.post("/v1/jobs", json={**JOB, "target": "kafka://billing.invoices"})
        assert r.status_code == 201, r.text
        assert_egress_refusal(
            await api.b.post("/v1/jobs", json={**JOB, "target": "kafka://billing.invoices"})
        )
        assert_egress_refusal(
            await api.a.post("/v1/jobs", json={**JOB, "target": "kafka://payroll.runs"})
        )


# -- headers -----------------------------------------------------------------------------------


def with_headers(headers: dict[str, Any]) -> dict[str, Any]:
    return {**JOB, "target": {"type": "http", "url": "https://svc/run", "headers": headers}}


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"Host": "internal.example"}, "target.headers.Host"),
        ({"Transfer-Encoding": "chunked"}, "target.headers.Transfer-Encoding"),
        ({"Content-Length": "0"}, "target.headers.Content-Length"),
        ({"X-Cronlog-Fencing-Token": "999999"}, "target.headers.X-Cronlog-Fencing-Token"),
        ({"Idempotency-Key": "forged"}, "target.headers.Idempotency-Key"),
        ({"Proxy-Authorization": "Basic x"}, "target.headers.Proxy-Authorization"),
        ({"X-Team": "a\r\nX-Injected: 1"}, "target.headers.X-Team"),
        ({"X-Team\r\nX-Injected": "1"}, "target.headers"),
        ({f"X-H{i}": "v" for i in range(900)}, "target.headers"),
        ({"Authorization": {"from_env": "AWS_SECRET_ACCESS_KEY"}}, "target.headers.Authorization"),
        ({"Authorization": {}}, "target.headers.Authorization"),
        ({"Authorization": {"from_file": "../tokens"}}, "target.headers.Authorization"),
    ],
)
async def test_a_bad_header_is_refused_naming_it_and_changes_nothing(
    api: Api, headers: dict[str, Any], field: str
) -> None:
    await api.a.put("/v1/jobs/existing", json=JOB)
    before = api.everything()
    for method, path in (("POST", "/v1/jobs"), ("PUT", "/v1/jobs/existing")):
        r = await api.a.request(method, path, json=with_headers(headers))
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field
    assert api.everything() == before


async def test_a_secret_reference_is_stored_and_shown_as_the_reference(api: Api) -> None:
    headers = {"Authorization": {"from_file": "billing-token"}, "X-Team": "a"}
    r = await api.a.post("/v1/jobs", json=with_headers(headers))
    assert r.status_code == 201, r.text
    assert r.json()["target"]["headers"] == headers
    job_id = r.json()["job_id"]
    assert (await api.a.get(f"/v1/jobs/{job_id}")).json()["target"]["headers"] == headers


async def test_the_openapi_document_describes_secret_references(api: Api) -> None:
    schemas = (await api.a.get("/openapi.json")).json()["components"]["schemas"]
    assert "from_file" in schemas["SecretRefIn"]["properties"]


def test_every_white_space_or_control_character_in_a_url_is_refused() -> None:
    policy = EgressPolicy.build()
    assert policy.check_url("http://93.184.215.14/hook") is None
    # Every white space and control character of the first planes' blocks, and a few beyond.
    chars = [chr(c) for c in [*range(0x3100), 0xE000, 0xFEFF, 0xFFF9, 0x1D173, 0xE0001]]
    odd = [c for c in chars if c.isspace() or not c.isprintable()]
    assert len(odd) > 100
    for c in odd:
        reason = policy.check_url(f"http://93.184.215.14/a{c}b")
        assert reason == "the URL holds white space or control characters", repr(c)


async def test_a_batch_refuses_every_spelling_as_a_single_create_does(strict: Api) -> None:
    before = strict.everything()
    urls = [u for u in REFUSED_URLS if not u.isascii()]
    r = await strict.a.post(
        "/v1/jobs:batch", json={"jobs": [{**JOB, "target": url} for url in urls]}
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [422] * len(urls)
    assert [x["error"]["field"] for x in results] == [f"jobs[{i}].target" for i in range(len(urls))]
    assert strict.everything() == before


# -- the status URL a guard answers at (core.asking) -------------------------------------------


def guarded(status_url: str) -> dict[str, Any]:
    target = {"type": "http", "url": "https://svc/run", "status_url": status_url}
    return {**JOB, "critical": True, "target": target}


@pytest.mark.parametrize("url", REFUSED_URLS[:12])
async def test_a_status_url_outside_the_policy_is_refused_naming_it(strict: Api, url: str) -> None:
    before = strict.everything()
    r = await strict.a.post("/v1/jobs", json=guarded(url))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "target.status_url"
    assert r.json()["message"].startswith("egress policy: ")
    r = await strict.a.post("/v1/jobs:batch", json={"jobs": [guarded(url)]})
    assert r.json()["results"][0]["error"]["field"] == "jobs[0].target.status_url"
    assert strict.everything() == before


async def test_a_status_url_is_stored_shown_and_never_the_jobs_own_url(strict: Api) -> None:
    r = await strict.a.post("/v1/jobs", json=guarded("https://svc/cronlog/status"))
    assert r.status_code == 201, r.text
    job = (await strict.a.get(f"/v1/jobs/{r.json()['job_id']}")).json()
    assert job["target"]["status_url"] == "https://svc/cronlog/status"
    r = await strict.a.post("/v1/jobs", json=guarded("https://svc/run"))
    assert r.status_code in (400, 422) and r.json()["field"] == "target.status_url", r.text
