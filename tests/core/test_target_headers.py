"""Target headers: bounded, never able to forge or reframe a request, counted in the payload."""

from __future__ import annotations

import pytest

from core.errors import InvalidDefinition
from core.jobs import (
    MAX_HEADER_NAME,
    MAX_HEADER_VALUE,
    MAX_HEADERS,
    MAX_PAYLOAD_BYTES,
    HttpTarget,
    JobSpec,
    SecretRef,
    validate,
)


def job(headers: dict[str, str | SecretRef], payload: object = None) -> JobSpec:
    return JobSpec(
        name="report",
        tenant="team-a",
        target=HttpTarget(url="https://api.example.com/run", headers=headers),
        schedule="0 9 * * *",
        payload=payload,
    )


def refusal(headers: dict[str, str | SecretRef], payload: object = None) -> InvalidDefinition:
    with pytest.raises(InvalidDefinition) as refused:
        validate(job(headers, payload))
    return refused.value


@pytest.mark.parametrize(
    "name",
    [
        "Host",
        "host",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Keep-Alive",
        "Upgrade",
        "TE",
        "Trailer",
        "Expect",
        "Content-Type",
        "Proxy-Authorization",
        "proxy-connection",
        "Idempotency-Key",
        "X-Cronlog-Run-Id",
        "x-cronlog-fencing-token",
        "X-Cronlog-Anything",
    ],
)
def test_framing_hop_by_hop_and_cronlogs_own_headers_are_never_taken_from_a_job(
    name: str,
) -> None:
    err = refusal({name: "x"})
    assert err.field == f"target.headers.{name}"
    assert "cronlog sets this header" in err.message


@pytest.mark.parametrize(
    "value",
    [
        "a\r\nX-Injected: 1",
        "a\nb",
        "a\rb",
        "a\x00b",
        "a\x7fb",
        "\x1b[31mred",
        " leading",
        "trailing ",
        "caf\u00e9",
        "x" * (MAX_HEADER_VALUE + 1),
    ],
)
def test_a_header_value_with_line_breaks_or_control_characters_is_refused(value: str) -> None:
    err = refusal({"X-Team": value})
    assert err.field == "target.headers.X-Team"


@pytest.mark.parametrize(
    "name", ["X Team", "X-Team:", "X-Team\r\nHost", "", "X\u00e9", "x" * (MAX_HEADER_NAME + 1)]
)
def test_a_header_name_that_is_not_a_token_is_refused(name: str) -> None:
    assert refusal({name: "x"}).field == "target.headers"


def test_a_header_named_twice_in_different_case_is_refused() -> None:
    assert refusal({"X-Team": "a", "x-team": "b"}).field == "target.headers.x-team"


def test_header_count_is_bounded() -> None:
    fine = {f"X-H{i}": "v" for i in range(MAX_HEADERS)}
    validate(job(fine))
    assert refusal({**fine, "X-One-More": "v"}).field == "target.headers"


def test_headers_count_toward_the_payload_limit() -> None:
    # 900 headers of 1 KB once passed and cost the node 4 MB a job; now the sum is bounded.
    headers = {f"X-H{i}": "v" * 4000 for i in range(4)}  # 16 KB of headers
    validate(job(headers))
    payload = "p" * (MAX_PAYLOAD_BYTES - 10_000)  # fits alone, not with the headers
    validate(job({}, payload))
    err = refusal(headers, payload)
    assert err.field == "target.headers"
    assert "together" in err.message


def test_the_total_size_of_headers_is_bounded() -> None:
    headers = {f"X-H{i}": "v" * MAX_HEADER_VALUE for i in range(5)}
    assert refusal(headers).field == "target.headers"


def test_ordinary_headers_and_secret_references_pass() -> None:
    validate(
        job(
            {
                "Authorization": SecretRef(from_file="billing-token"),
                "X-Team": "a",
                "X-Tab": "a\tb",
                "Accept": "application/json",
                "X-Empty": "",
            }
        )
    )


@pytest.mark.parametrize("name", ["", ".", "..", "../tokens", "a/b", "name\n", "x" * 129])
def test_a_secret_reference_names_a_secret_never_a_path(name: str) -> None:
    err = refusal({"Authorization": SecretRef(from_file=name)})
    assert err.field == "target.headers.Authorization"
