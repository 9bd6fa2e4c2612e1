"""The benchmarks' instrument must not rot: the short herd with a few hundred jobs, end to end
(``cronlog serve`` and the recorder as processes, the floor, a pull herd, an APScheduler peer),
and the parts whose mistakes would flatter a figure.

This is no benchmark: it asserts that every run was measured and that the figures are sane,
never how fast anything was."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.common import (
    BatchEndpoint,
    Recorder,
    claim_wait_field,
    find_batch_endpoint,
    first_calls,
    lag_summary,
    slot_of,
)
from bench.herd_serve import run_scenario
from bench.profiling import summarize

JOBS = 300
# The node is given this long after registration before the slot: a benchmark lets it settle
# for 35 s (bench.herd_serve.SETTLE_S) so the figure is the herd's alone; a few hundred jobs
# need none of it, and the smoke asserts no figure.
SETTLE_S = 3.0


def test_a_run_that_never_started_counts_as_infinitely_late() -> None:
    on_time = lag_summary([10.0] * 98, expected=100)
    assert on_time["missing"] == 2
    assert on_time["p50_ms"] == 10.0
    assert on_time["p99_ms"] is None  # 2 % never started: the p99 run is one of them
    assert on_time["all_started_after_s"] is None
    assert lag_summary([10.0] * 99 + [250.0], expected=100)["p99_ms"] == 10.0
    assert lag_summary([10.0] * 99 + [250.0], expected=100)["all_started_after_s"] == 0.25


def test_a_retried_slot_counts_once_at_its_first_call() -> None:
    first = first_calls([(5_000_000, "t/j:1"), (9_000_000, "t/j:1"), (7_000_000, "t/k:1")])
    assert first == {"t/j:1": 5_000_000, "t/k:1": 7_000_000}
    assert slot_of("bench/job-0000001:1796089772000") == 1796089772000
    assert slot_of("no-slot") is None


def _document(path: str, schema: dict[str, object]) -> dict[str, object]:
    body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/B"}}}}
    return {
        "paths": {path: {"post": {"requestBody": body}}},
        "components": {"schemas": {"B": schema}},
    }


def test_the_batch_endpoint_is_found_in_the_openapi_document() -> None:
    wrapped = _document(
        "/v1/jobs:batch",
        {"type": "object", "properties": {"jobs": {"type": "array", "maxItems": 500}}},
    )
    assert find_batch_endpoint(wrapped) == BatchEndpoint("/v1/jobs:batch", "jobs", 500)
    bare_list = _document("/v1/jobs/batch", {"type": "array"})
    assert find_batch_endpoint(bare_list) == BatchEndpoint("/v1/jobs/batch", None, 1000)
    assert find_batch_endpoint(_document("/v1/jobs", {"type": "object"})) is None
    claim = _document(
        "/v1/workers/claim", {"type": "object", "properties": {"pool": {}, "wait_sec": {}}}
    )
    assert claim_wait_field(claim) == "wait_sec"


def _sane(record: dict[str, object], jobs: int) -> dict[str, float]:
    figures = record["figures"]
    assert isinstance(figures, dict)
    lag = figures["lag"]
    assert lag["started"] == jobs, lag
    assert lag["missing"] == 0, lag
    # lags are measured from the slot: none far before it (clock skew within one machine is
    # nil; a call before its slot would mean the slot was misread), none absurdly late
    assert lag["min_ms"] > -50, lag
    assert 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"] < 60_000, lag
    assert math.isclose(lag["all_started_after_s"] * 1000, lag["max_ms"], abs_tol=1)
    return lag  # type: ignore[no-any-return]


@pytest.mark.slow
def test_the_short_herd_measures_every_run(tmp_path: Path) -> None:
    with Recorder() as recorder:
        floor = run_scenario("floor", recorder, JOBS, tmp_path)
        _sane(floor, JOBS)

        http = run_scenario("http", recorder, JOBS, tmp_path, settle_s=SETTLE_S)
        _sane(http, JOBS)
        figures = http["figures"]
        assert figures["registration"]["jobs"] == JOBS
        assert figures["slack_before_slot_ms"] > 0
        assert figures["node_cpu"]["cpu_s"] > 0  # the node's process was found and read
        assert figures["unnamed_calls"] == 0

        aps = run_scenario("aps-memory-threads", recorder, JOBS, tmp_path)
        _sane(aps, JOBS)
        assert aps["figures"]["peer"]["executed"] == JOBS
        assert aps["figures"]["peer"]["missed"] == 0

        # every call of these runs was taken from the recorder: nothing left over
        assert recorder.count() == 0

        pull = run_scenario("pull", recorder, JOBS, tmp_path, settle_s=SETTLE_S)
        _sane(pull, JOBS)
        workers = pull["figures"]["workers"]
        assert workers["claimed"] == JOBS
        assert workers["completed"] == JOBS  # each claimed run was completed under its lease
        received = pull["figures"]["lag_received"]
        assert received["started"] == JOBS
        # the worker cannot receive a lease before the node granted it
        assert received["p50_ms"] >= pull["figures"]["lag"]["p50_ms"]

        sdk = run_scenario("pull-sdk", recorder, JOBS, tmp_path, settle_s=SETTLE_S)
        _sane(sdk, JOBS)
        assert sdk["figures"]["workers"]["completed"] == JOBS
        assert sdk["figures"]["early_starts"] == 0  # held to the instant, never before


def test_a_profile_charges_each_sample_to_the_innermost_module_of_ours(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "run (uvicorn/server.py:1);_http (/w/node/executors.py:470);"
        "_request (/v/site-packages/aiohttp/client.py:500) 3\n"
        "_follow (/w/projections/read_model.py:80);_commit (/w/projections/read_model.py:90) 1\n"
        "select (/usr/lib/python3.11/selectors.py:468) 1\n"
    )
    summary = summarize(raw)
    assert summary["samples"] == 5
    assert summary["by_module"] == [
        ("node/executors.py", 0.6),
        ("projections/read_model.py", 0.2),
        ("(outside cronlog)", 0.2),
    ]
    assert summary["by_function"][0] == ("_request (client.py)", 0.6)
