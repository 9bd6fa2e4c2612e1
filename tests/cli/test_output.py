"""The command line's tables, as a person at a 120-column terminal reads them."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from cli import output
from cli.main import _show_change, main

RUN_ID = "j_5fhdbiyg3dqharkkp5okjszr.1796316672649"  # a 28-character job id and its slot


@pytest.fixture(autouse=True)
def columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")


def _run(error: str = "") -> dict[str, Any]:
    return {
        "run_id": RUN_ID,
        "state": "succeeded",
        "attempt": 1,
        "scheduled_for": "2026-11-29T10:01:00.000Z",
        "started_at": "2026-11-29T10:01:00.123Z",
        "lateness_ms": 12,
        "error": error,
    }


def test_a_run_table_keeps_each_run_on_one_line_and_its_id_whole() -> None:
    out = io.StringIO()
    output.show([_run("HTTP 503 from the hook: " + "upstream unavailable " * 6), _run()], "table",
                output.RUN_COLUMNS, out=out)  # fmt: skip
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # the header and one line a run
    assert all(len(line.rstrip()) <= 120 for line in lines)
    assert lines[1].startswith(RUN_ID + " ") and lines[1].rstrip().endswith("…")
    assert "2026-11-29T10:01:00Z" in lines[1]  # to the second


def test_a_job_table_keeps_ids_and_instants_whole() -> None:
    job = {
        "job_id": RUN_ID.split(".")[0],
        "name": "the nightly report for the finance team",
        "status": "active",
        "schedule": "0 9 * * 1-5",
        "timezone": "America/New_York",
        "next_run_at": "2026-11-30T14:00:00.000Z",
        "target": {"type": "http", "url": "https://reports.internal/hooks/nightly/finance"},
        "tags": ["team=payments", "env=prod"],
    }
    out = io.StringIO()
    output.show([job], "table", output.JOB_COLUMNS, out=out)
    first = out.getvalue().splitlines()[1]
    assert first.startswith(job["job_id"] + " ") and "2026-11-30T14:00:00Z" in first


def _figures(started: int) -> dict[str, Any]:
    return {
        "started": started,
        "delay_p50_ms": 3.0 if started else None,
        "delay_p99_ms": 9.0 if started else None,
        "delay_max_ms": 9 if started else None,
        "delay_mean_ms": 4.0 if started else None,
        "succeeded": started,
        "failed": 0,
        "retried": 0,
        "dead": 0,
        "cancelled": 0,
        "skipped": 0,
    }


def test_stats_show_the_busy_steps_and_the_totals() -> None:
    points = [
        {**_figures(2 if i in (7, 42) else 0), "at": f"2026-11-29T10:{i:02d}:00.000Z"}
        for i in range(60)
    ]
    stats = {
        "since": "2026-11-29T10:00:00.000Z",
        "until": "2026-11-29T11:00:00.000Z",
        "step_min": 1,
        "points": points,
        "total": _figures(4),
        "runs_by_state": {"pending": 1, "running": 0, "succeeded": 4},
    }
    out = io.StringIO()
    output.show_stats(stats, out)
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines[1:4]] == [
        "2026-11-29T10:07:00Z",
        "2026-11-29T10:42:00Z",
        "total",
    ]
    assert lines[3].split()[1] == "4"
    assert "60 steps of 1 min (58 without a run not shown)" in lines[4]
    assert lines[5] == "runs now: 1 pending, 4 succeeded"


def test_team_limits_are_one_a_row() -> None:
    team = {"tenant": "default", "jobs": 3, "limits": {"max_jobs": 10000, "max_page_size": 200}}
    out = io.StringIO()
    output.show_team(team, out)
    text = out.getvalue()
    assert "{" not in text and "3 of 10000 allowed" in text
    rows = [line.split() for line in text.splitlines()]
    assert ["max_jobs", "10000"] in rows and ["max_page_size", "200"] in rows


def test_a_dry_run_lists_each_new_time_once_and_the_dropped_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fire(hour: int) -> dict[str, str]:
        at = f"2026-11-30T{hour:02d}:00:00"
        return {"at": f"{at}.000Z", "local": f"{at}Z"}

    _show_change(
        {
            "before": {"fires": [fire(9), fire(12)]},
            "after": {"fires": [fire(9), fire(10)]},
            "added": [fire(10)],
            "dropped": [fire(12)],
            "compared_until": None,
        }
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == [
        "2026-11-30T09:00:00Z",
        "2026-11-30T10:00:00Z",
        "2026-11-30T12:00:00Z",
    ]
    assert lines[2].rstrip().endswith("+ added") and lines[3].rstrip().endswith("- dropped")
    assert sum("T10:00:00" in line for line in lines) == 1
    assert lines[4] == "1 added, 1 dropped"


def test_the_log_tools_speak_as_cronlog_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["log", "verify", "--data-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cronlog log: ") and "replay:" not in err


@pytest.mark.parametrize("argv", [["log", "--help"], ["log", "-h"]])
def test_log_help_is_the_log_tools_help(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cronlog log ") and "verify" in out and "rebuild" in out
