"""Bad input answers 400 or 422 naming the field, and changes nothing; no token answers 401.

400: the request does not match /openapi.json (type, range, pattern, required field);
422: it does, and a rule the document cannot state refuses it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.anyio

GOOD: dict[str, Any] = {"name": "report", "schedule": "0 9 * * *", "target": "https://svc/run"}

# (what is wrong, body, status, field)
BAD_JOBS: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("unknown field", {**GOOD, "retires": 3}, 400, "retires"),
    ("unknown nested field", {**GOOD, "backoff": {"base": 1}}, 400, "backoff.base"),
    ("wrong type", {**GOOD, "retries": "three"}, 400, "retries"),
    ("wrong nested type", {**GOOD, "backoff": {"factor": "x"}}, 400, "backoff.factor"),
    ("unknown policy", {**GOOD, "misfire_policy": "sometimes"}, 400, "misfire_policy"),
    ("unknown target type", {**GOOD, "target": {"type": "ftp"}}, 400, "target.type"),
    ("invalid cron", {**GOOD, "schedule": "61 * * * *"}, 422, "schedule"),
    ("cron that never fires", {**GOOD, "schedule": "0 0 30 2 *"}, 422, "schedule"),
    ("unknown timezone", {**GOOD, "timezone": "Mars/Olympus"}, 422, "timezone"),
    ("schedule and run_at", {**GOOD, "run_at": "2026-12-01T00:00:00Z"}, 422, "schedule"),
    ("no time at all", {"name": "x", "target": "pull://p"}, 422, "schedule"),
    (
        "run_at without offset",
        {**GOOD, "schedule": None, "run_at": "2026-12-01T09:00:00"},
        400,
        "run_at",
    ),
    ("run_at not a date", {**GOOD, "schedule": None, "run_at": "tomorrow"}, 400, "run_at"),
    ("negative retries", {**GOOD, "retries": -1}, 400, "retries"),
    ("too many retries", {**GOOD, "retries": 100}, 400, "retries"),
    ("oversized payload", {**GOOD, "payload": "x" * 70_000}, 422, "payload"),
    (
        "not an http url",
        {**GOOD, "target": {"type": "http", "url": "file:///etc/passwd"}},
        422,
        "target",
    ),
    ("ftp target", {**GOOD, "target": "ftp://files.internal/drop"}, 422, "target"),
    (
        "zero calls a second",
        {**GOOD, "target": {"type": "http", "url": "https://svc/run", "max_calls_per_sec": 0}},
        400,
        "target.max_calls_per_sec",
    ),
    ("bad kafka topic", {**GOOD, "target": "kafka://no spaces"}, 422, "target"),
    ("missing name", {"schedule": "0 9 * * *", "target": "pull://p"}, 400, "name"),
    ("missing target", {"name": "x", "schedule": "0 9 * * *"}, 400, "target"),
    ("blank name", {**GOOD, "name": "  "}, 422, "name"),
    ("priority out of range", {**GOOD, "priority": 10}, 400, "priority"),
    ("negative backoff", {**GOOD, "backoff": {"base_sec": -1}}, 400, "backoff.base_sec"),
]


@pytest.mark.parametrize(
    ("what", "body", "status", "field"), BAD_JOBS, ids=[b[0] for b in BAD_JOBS]
)
async def test_a_bad_job_is_refused_naming_the_field(
    api: Api, what: str, body: dict[str, Any], status: int, field: str | None
) -> None:
    await api.a.put("/v1/jobs/existing", json=GOOD)
    before = api.everything()
    for call in (
        api.a.post("/v1/jobs", json=body),
        api.a.put("/v1/jobs/existing", json=body),
    ):
        r = await call
        assert r.status_code == status, r.text
        error = r.json()
        assert error["field"] == field
        assert error["error"] == ("invalid" if status == 422 else "bad_request")
        assert error["message"]
    assert api.everything() == before


async def test_a_bad_job_id_is_refused(api: Api) -> None:
    r = await api.a.post("/v1/jobs", json={**GOOD, "job_id": "has spaces"})
    assert (r.status_code, r.json()["field"]) == (400, "job_id")
    r = await api.a.put("/v1/jobs/has%20spaces", json=GOOD)
    assert (r.status_code, r.json()["field"]) == (422, "job_id")
    r = await api.a.put("/v1/jobs/ok", json={**GOOD, "job_id": "other"})
    assert (r.status_code, r.json()["field"]) == (400, "job_id")  # the path names the job
    assert len(api.fake.events) == 0


async def test_a_bad_patch_changes_nothing(api: Api) -> None:
    await api.a.put("/v1/jobs/j", json=GOOD)
    before = api.everything()
    cases = [
        ({"status": "cancelled"}, 400, "status"),
        ({"schedule": "not cron"}, 422, "schedule"),
        ({"retries": -2, "status": "paused"}, 400, "retries"),  # nothing half-applied
        ({"timezone": "Mars/Olympus", "status": "paused"}, 422, "timezone"),
        ({"interval_sec": 0.5}, 400, "interval_sec"),
        ({"version": "one"}, 400, "version"),
    ]
    for body, status, field in cases:
        r = await api.a.patch("/v1/jobs/j", json=body)
        assert (r.status_code, r.json()["field"]) == (status, field), r.text
    r = await api.a.patch("/v1/jobs/j", json={"version": 1}, headers={"If-Match": "2"})
    assert (r.status_code, r.json()["field"]) == (422, "version")
    assert api.everything() == before


async def test_malformed_json_is_400(api: Api) -> None:
    before = api.everything()
    for body in (b'{"name": ', b"not json", b""):
        r = await api.a.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400
        assert r.json()["error"] == "malformed"
    r = await api.a.post("/v1/jobs", json=[1, 2])
    assert (r.status_code, r.json()["error"]) == (400, "bad_request")
    assert api.everything() == before


async def test_a_body_over_1_mib_is_413(api: Api) -> None:
    big = b'{"name": "' + b"x" * (1 << 20) + b'"}'
    r = await api.a.post("/v1/jobs", content=big, headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["error"]) == (413, "too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams in
        for _ in range(20):
            yield b"x" * 65536

    r = await api.a.post("/v1/jobs", content=chunks())
    assert r.status_code == 413
    assert len(api.fake.events) == 0


async def test_bad_run_and_worker_input(api: Api) -> None:
    await api.a.put("/v1/jobs/j", json={**GOOD, "target": "pull://p"})
    before = api.everything()
    cases = [
        ("/v1/jobs/j/runs", {"scheduled_for": "yesterday"}, 400, "scheduled_for"),
        ("/v1/jobs/j/runs", {"scheduled_for": "2026-02-30T00:00:00Z"}, 422, "scheduled_for"),
        ("/v1/jobs/j/runs", {"slot": "2026-01-01T00:00:00Z"}, 400, "slot"),
        ("/v1/workers/claim", {"pool": "p", "worker_id": "w", "limit": 0}, 400, "limit"),
        ("/v1/workers/claim", {"pool": "p w", "worker_id": "w"}, 400, "pool"),
        ("/v1/workers/claim", {"pool": "p"}, 400, "worker_id"),
        ("/v1/runs/j.1/heartbeat", {"fencing_token": "seven"}, 400, "fencing_token"),
        ("/v1/runs/j.1/complete", {"fencing_token": 1, "status": "meh"}, 400, "status"),
        ("/v1/schedules/preview", {"schedule": "* * *"}, 422, "schedule"),
        ("/v1/schedules/preview", {"schedule": "@daily", "timezone": "Nowhere/X"}, 422, "timezone"),
        ("/v1/schedules/preview", {"schedule": "@daily", "n": 1000}, 400, "n"),
    ]
    for path, body, status, field in cases:
        r = await api.a.post(path, json=body)
        assert (r.status_code, r.json().get("field")) == (status, field), (path, r.text)
    for path, params, field in [
        ("/v1/jobs", {"limit": "0"}, "limit"),
        ("/v1/jobs", {"limit": "many"}, "limit"),
        ("/v1/jobs", {"status": "asleep"}, "status"),
        ("/v1/jobs/j/preview", {"n": "-1"}, "n"),
    ]:
        r = await api.a.get(path, params=params)
        assert (r.status_code, r.json()["field"]) == (400, field), (path, r.text)
    r = await api.a.get("/v1/jobs", params={"cursor": "%%%"})
    assert (r.status_code, r.json()["field"]) == (422, "cursor")
    assert api.everything() == before


async def test_401_without_a_token_or_with_a_bad_one(api: Api) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic dG9rZW4="}):
        r = await api.anon.get("/v1/jobs", headers=headers)
        assert r.status_code == 401
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert r.json()["error"] == "unauthorized"
    r = await api.anon.post("/v1/jobs", json=GOOD)
    assert r.status_code == 401
    assert len(api.fake.events) == 0


# -- inputs that once answered 500 ---------------------------------------------------------------

JSON = {"Content-Type": "application/json"}


async def test_digits_of_other_scripts_are_not_numbers(api: Api) -> None:
    await api.a.put("/v1/jobs/j", json=GOOD)
    before = api.everything()
    for path, name in [("/v1/jobs", "limit"), ("/v1/runs", "limit"), ("/v1/jobs/j/preview", "n")]:
        for text in ("²", "٣", "1" * 5000):  # superscript, Arabic-Indic, past int()'s limit
            r = await api.a.get(path, params={name: text})
            assert (r.status_code, r.json()["field"]) == (400, name), (path, text, r.text)
    for value in (b"\xb2", b'"\xb2"', b"9" * 5000):  # If-Match as latin-1 bytes
        r = await api.a.delete("/v1/jobs/j", headers={"If-Match": value})
        assert (r.status_code, r.json()["field"]) == (400, "If-Match"), r.text
    r = await api.a.post("/v1/jobs", content=b"{}", headers={**JSON, "Content-Length": b"\xb2"})
    assert r.status_code in (400, 413), r.text
    assert api.everything() == before


async def test_json_nested_thousands_deep_is_400_naming_the_payload(api: Api) -> None:
    head = b'{"name": "x", "schedule": "@daily", "target": "pull://p", "payload": '
    # Deeper than any recursion limit the interpreter is left with: hypothesis raises it for
    # its own tests by a few thousand frames and may leave it raised (a body 5,000 deep then
    # decoded, and was refused 422 by the depth rule below instead).
    for depth in (50_000, 100_000):
        body = head + b"[" * depth + b"]" * depth + b"}"
        r = await api.a.post("/v1/jobs", content=body, headers=JSON)
        assert (r.status_code, r.json()["field"]) == (400, "payload"), r.text
    # Shallow enough to decode, too deep to keep: the threads that encode it again later
    # (the runner, the read model) must never meet it.
    body = head + b"[" * 65 + b"]" * 65 + b"}"
    r = await api.a.post("/v1/jobs", content=body, headers=JSON)
    assert (r.status_code, r.json()["field"]) == (422, "payload")
    body = head + b"[" * 64 + b"]" * 64 + b"}"
    assert (await api.a.post("/v1/jobs", content=body, headers=JSON)).status_code == 201


async def test_bytes_that_are_not_utf8_are_400_naming_the_field(api: Api) -> None:
    cases = [
        (b'{"name": "x\xff", "schedule": "@daily", "target": "pull://p"}', "name"),
        (
            b'{"name": "x", "schedule": "@daily", "target": "pull://p",'
            b' "payload": {"a": [1, "\xc3("]}}',
            "payload.a[1]",
        ),
        (b'{"pool": "p", "worker_id": "w\xe9"}', "worker_id"),
    ]
    for body, field in cases:
        path = "/v1/workers/claim" if b"pool" in body else "/v1/jobs"
        r = await api.a.post(path, content=body, headers=JSON)
        assert (r.status_code, r.json()["error"], r.json().get("field")) == (
            400,
            "malformed",
            field,
        ), r.text
    assert len(api.fake.events) == 0


async def test_no_fire_time_past_year_9999_is_ever_shown(api: Api) -> None:
    preview = {"schedule": "0 0 1 1 *", "after": "9999-06-01T00:00:00Z"}
    r = await api.a.post("/v1/schedules/preview", json=preview)
    assert (r.status_code, r.json()["fires"]) == (200, [])
    r = await api.a.post("/v1/schedules/preview", json={**preview, "after": "9998-06-01T00:00:00Z"})
    assert [f["at"] for f in r.json()["fires"]] == ["9999-01-01T00:00:00.000Z"]
    late = {"name": "x", "target": "pull://p", "interval_sec": 86400}
    r = await api.a.put("/v1/jobs/late", json={**late, "start_at": "9999-12-30T00:00:00Z"})
    assert r.status_code == 201
    fires = (await api.a.get("/v1/jobs/late/preview", params={"n": 10})).json()["fires"]
    assert [f["at"] for f in fires] == ["9999-12-30T00:00:00.000Z", "9999-12-31T00:00:00.000Z"]
    for body, field in [
        ({"schedule": "@daily", "after": "9999-12-31T23:59:59-23:59"}, "after"),
        ({"schedule": "@daily", "after": "0001-01-01T00:00:00+23:59"}, "after"),
    ]:
        r = await api.a.post("/v1/schedules/preview", json=body)
        assert (r.status_code, r.json()["field"]) == (422, field), r.text
    r = await api.a.post("/v1/jobs", json={**late, "start_at": "9999-12-31T23:59:59-10:00"})
    assert (r.status_code, r.json()["field"]) == (422, "start_at")


async def test_a_body_that_is_not_json_is_415(api: Api) -> None:
    before = api.everything()
    for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/xml"}, {}):
        r = await api.a.post("/v1/jobs", content=b'{"name": "x"}', headers=headers)
        assert (r.status_code, r.json()["field"]) == (415, "Content-Type"), r.text
    r = await api.a.post("/v1/jobs", data={"name": "x"})
    assert r.status_code == 415
    assert api.everything() == before
    r = await api.a.post(
        "/v1/jobs", json=GOOD, headers={"Content-Type": "Application/JSON; charset=utf-8"}
    )
    assert r.status_code == 201  # parameters and case do not matter
    await api.a.put("/v1/jobs/j", json=GOOD)
    # A bodiless request needs no Content-Type.
    assert (await api.a.post("/v1/jobs/j/runs")).status_code == 201


async def test_405_lists_every_method_of_the_path(api: Api) -> None:
    r = await api.a.request("OPTIONS", "/v1/jobs/j")
    assert r.status_code == 405
    assert set(r.headers["Allow"].split(", ")) == {"GET", "HEAD", "PUT", "PATCH", "DELETE"}
    r = await api.a.request("TRACE", "/v1/jobs/j/runs")
    assert set(r.headers["Allow"].split(", ")) == {"GET", "HEAD", "POST"}


async def test_a_float_with_no_fraction_is_an_integer_as_json_schema_says(api: Api) -> None:
    r = await api.a.post("/v1/jobs", json={**GOOD, "retries": 3.0, "priority": 2.0})
    assert (r.status_code, r.json()["retries"], r.json()["priority"]) == (201, 3, 2), r.text
    r = await api.a.post("/v1/jobs", json={**GOOD, "retries": 3.5})
    assert (r.status_code, r.json()["field"]) == (400, "retries")
    # A payload is kept exactly as sent.
    r = await api.a.post("/v1/jobs", json={**GOOD, "payload": {"x": 1.0, "y": [2.0]}})
    assert r.json()["payload"] == {"x": 1.0, "y": [2.0]}
    assert isinstance(r.json()["payload"]["x"], float)


async def test_a_client_that_hangs_up_mid_body_is_no_error(
    fake: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker stopping mid-request (its heartbeat's body never comes) is not a bug of the
    node's: no traceback, nothing decided."""
    from tests.api.conftest import TOKENS, serve

    token = next(iter(TOKENS))
    sent: list[dict[str, Any]] = []
    async with serve(fake) as transport:
        app = transport.app
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/runs/r.1/heartbeat", "raw_path": b"",
            "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
            "headers": [(b"authorization", f"Bearer {token}".encode()),
                        (b"content-type", b"application/json")],
        }  # fmt: skip

        async def receive() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        before = len(fake.events)
        await app(scope, receive, send)
    assert sent[0]["status"] == 499 and len(fake.events) == before
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
