"""``GET /v1/events``: a team's own events, the operator's every team's; from the start, the end,
an instant or a cursor. (httpx's ASGI transport hands a body over only once it has ended, so
following live is tested against a real server: ``tests/sdk``.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.api.conftest import ANY_TOPIC, TOKENS, serve
from tests.api.fakes import FakeScheduler

pytestmark = pytest.mark.anyio

OPERATOR = "operator-token"
A, B = (f"Bearer {token}" for token in TOKENS)
JOB = {"name": "crunch", "schedule": "0 9 * * *", "target": "pull://crunchers"}


@pytest.fixture
async def http(fake: FakeScheduler) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serve(fake, egress=ANY_TOPIC, operator_token=OPERATOR) as transport,
        httpx.AsyncClient(transport=transport, base_url="http://cronlog") as client,
    ):
        yield client


def parse(text: str) -> list[dict[str, Any]]:
    """The stream's blocks: each a dict of its fields (``data`` decoded)."""
    blocks = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            if name == "data":
                fields["data"] = json.loads(value)
            elif name in ("id", "retry"):
                fields[name] = value
        if "data" in fields:
            blocks.append(fields)
    return blocks


async def read(http: httpx.AsyncClient, token: str, **params: Any) -> list[dict[str, Any]]:
    r = await http.get("/v1/events", params=params, headers={"Authorization": token})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return parse(r.text)


async def test_a_team_reads_its_own_events_and_the_operator_everyones(
    http: httpx.AsyncClient,
) -> None:
    await http.put("/v1/jobs/crunch", json=JOB, headers={"Authorization": A})
    await http.put("/v1/jobs/crunch", json=JOB, headers={"Authorization": B})
    await http.post("/v1/jobs/crunch/runs", headers={"Authorization": A})
    mine = await read(http, A)
    assert [b["data"]["event"]["type"] for b in mine] == ["JobRegistered", "RunMaterialised"]
    assert {b["data"]["event"]["tenant"] for b in mine} == {"team-a"}
    assert mine[0]["data"]["event"]["job_id"] == "team-a/crunch"  # as docs/events.md has it
    everyone = await read(http, f"Bearer {OPERATOR}")
    assert sorted(b["data"]["event"]["tenant"] for b in everyone) == ["team-a", "team-a", "team-b"]
    only_b = await read(http, f"Bearer {OPERATOR}", tenant="team-b")
    assert [b["data"]["event"]["tenant"] for b in only_b] == ["team-b"]
    refused = await http.get(
        "/v1/events", params={"tenant": "team-b"}, headers={"Authorization": A}
    )
    assert refused.status_code == 403
    assert (await http.get("/v1/events")).status_code == 401


async def test_a_cursor_resumes_right_after_its_event(http: httpx.AsyncClient) -> None:
    for i in range(5):
        await http.put(f"/v1/jobs/j{i}", json=JOB, headers={"Authorization": A})
    first = await read(http, A, max_events=2)
    assert len(first) == 2
    rest = await read(http, A, cursor=first[-1]["id"])
    again = await http.get(
        "/v1/events", headers={"Authorization": A, "Last-Event-ID": first[-1]["id"]}
    )
    assert parse(again.text) == rest
    seen = [(b["data"]["partition"], b["data"]["offset"]) for b in first + rest]
    assert len(seen) == len(set(seen)) == 5  # nothing lost, nothing repeated


async def test_a_job_filter_and_an_instant_to_start_from(
    http: httpx.AsyncClient, fake: FakeScheduler
) -> None:
    await http.put("/v1/jobs/early", json=JOB, headers={"Authorization": A})
    fake.advance(60_000)
    await http.put("/v1/jobs/late", json=JOB, headers={"Authorization": A})
    late = await read(http, A, **{"from": "2026-11-29T08:00:30Z"})
    assert [b["data"]["event"]["job_id"] for b in late] == ["team-a/late"]
    early = await read(http, A, job="early")
    assert [b["data"]["event"]["job_id"] for b in early] == ["team-a/early"]
    assert await read(http, A, **{"from": "end"}) == []


async def test_bad_cursors_and_parameters_are_refused(http: httpx.AsyncClient) -> None:
    for params, status, field in (
        ({"cursor": "1-2"}, 422, "cursor"),  # the fake log has four partitions
        ({"cursor": "x"}, 400, "cursor"),
        ({"from": "yesterday"}, 400, "from"),
        ({"follow": "yes"}, 400, "follow"),
        ({"job": "a/b"}, 400, "job"),
    ):
        r = await http.get("/v1/events", params=params, headers={"Authorization": A})
        assert (r.status_code, r.json().get("field")) == (status, field), (params, r.text)
    r = await http.get(
        "/v1/events", params={"job": "crunch"}, headers={"Authorization": f"Bearer {OPERATOR}"}
    )
    assert (r.status_code, r.json()["field"]) == (422, "job")
    # A Last-Event-ID that is no cursor is refused, even beside a cursor that would win over it.
    r = await http.get(
        "/v1/events",
        params={"cursor": "0-0-0-0"},
        headers={"Authorization": A, "Last-Event-ID": "+0.0"},
    )
    assert (r.status_code, r.json()["field"]) == (400, "Last-Event-ID")
