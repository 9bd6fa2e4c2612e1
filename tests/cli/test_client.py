"""The ``cronlog`` client at a terminal, against a real ``cronlog serve``.

The node runs without configured tokens, so it creates one for the ``default`` team in its data
directory; the client, pointed at the same directory, finds it there as a newcomer's would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cli.main import main
from tests.cli.test_serve import Serve, data_dir  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow


@pytest.fixture
def node(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Serve]:  # noqa: F811
    monkeypatch.delenv("CRONLOG_TOKEN", raising=False)
    monkeypatch.delenv("CRONLOG_OPERATOR_TOKEN", raising=False)
    served = Serve(data_dir, tokens=None).start()
    yield served
    assert served.stop() == 0


def cronlog(capsys: pytest.CaptureFixture[str], node: Serve, *argv: str) -> tuple[int, Any]:
    """Run the client (global flags after the command); its exit status and the JSON it
    printed (standard output is not a terminal: JSON unless told otherwise)."""
    status = main([*argv, "--url", node.url, "--data-dir", str(node.data_dir)])
    out = capsys.readouterr().out
    return status, json.loads(out) if out.strip() else None


def test_the_client_drives_a_job_through_its_life(
    node: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (node.data_dir / "tokens").exists()
    run_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    status, job = cronlog(
        capsys, node, "jobs", "create", "--name", "report", "--run-at", run_at,
        "--target", "pull://reports", "--payload", '{"day": 1}', "--retries", "2",
        "--priority", "7", "--timeout", "90", "--lease", "15", "--overlap", "skip",
        "--jitter", "5", "--end-at", "2099-01-01T00:00:00Z", "--backoff-base", "3",
        "--no-backoff-jitter", "--critical",
    )  # fmt: skip
    assert status == 0, job
    assert job["tenant"] == "default" and job["payload"] == {"day": 1}
    assert job["retries"] == 2 and job["next_run_at"] == run_at.replace("Z", ".000Z")
    assert (job["priority"], job["timeout_sec"], job["lease_sec"]) == (7, 90.0, 15.0)
    assert (job["overlap_policy"], job["allow_jitter_sec"], job["critical"]) == ("skip", 5.0, True)
    assert job["backoff"] == {"base_sec": 3.0, "factor": 2.0, "cap_sec": 3600.0, "jitter": False}
    assert job["end_at"] == "2099-01-01T00:00:00.000Z"
    job_id = job["job_id"]

    status, listed = cronlog(capsys, node, "jobs", "list")
    assert status == 0 and [j["job_id"] for j in listed["jobs"]] == [job_id]
    status, paused = cronlog(capsys, node, "jobs", "pause", job_id)
    assert status == 0 and paused["status"] == "paused"
    status, listed = cronlog(capsys, node, "jobs", "list", "--status", "active")
    assert status == 0 and listed["jobs"] == []
    status, resumed = cronlog(capsys, node, "jobs", "resume", job_id)
    assert status == 0 and resumed["status"] == "active"
    status, changed = cronlog(
        capsys, node, "jobs", "update", job_id, "--priority", "2", "--clear", "end_at",
        "--if-version", "3",
    )  # fmt: skip
    assert status == 0 and (changed["priority"], changed["end_at"]) == (2, None), changed
    status, change = cronlog(
        capsys, node, "jobs", "update", job_id, "--schedule", "0 9 * * *", "--dry-run"
    )
    assert status == 0 and change["after"]["schedule"] == "0 9 * * *" and change["added"]
    status, still = cronlog(capsys, node, "jobs", "get", job_id)
    assert still["run_at"] is not None and still["version"] == 4  # nothing was changed
    status, team = cronlog(capsys, node, "team")
    assert status == 0 and team["tenant"] == "default" and team["jobs"] == 1
    status, found = cronlog(capsys, node, "jobs", "list", "--search", job_id[-6:])
    assert [j["job_id"] for j in found["jobs"]] == [job_id]
    status, run = cronlog(capsys, node, "jobs", "trigger", job_id)
    assert status == 0 and run["trigger"] == "manual" and run["state"] == "pending"
    status, runs = cronlog(capsys, node, "runs", "list", job_id, "--limit", "1")
    assert status == 0 and [r["run_id"] for r in runs["runs"]] == [run["run_id"]]
    status, claimed = cronlog(capsys, node, "runs", "claim", "reports", "--wait", "5")
    assert status == 0 and [c["run_id"] for c in claimed] == [run["run_id"]]
    token = str(claimed[0]["fencing_token"])
    status, beat = cronlog(capsys, node, "runs", "heartbeat", run["run_id"], "--fencing-token",
                           token)  # fmt: skip
    assert status == 0 and beat["run_id"] == run["run_id"]
    status, dead = cronlog(
        capsys, node, "runs", "complete", run["run_id"], "--fencing-token", token, "--failed",
        "--error", "disk full", "--permanent",
    )  # fmt: skip
    assert status == 0 and dead["state"] == "dead"
    status, cancelled = cronlog(capsys, node, "jobs", "cancel", job_id)
    assert status == 0 and cancelled["status"] == "cancelled"
    status, got = cronlog(capsys, node, "jobs", "get", job_id)
    assert status == 0 and got["status"] == "cancelled"

    # A refusal is the API's error, shown as it came, with a failing exit status.
    status, error = cronlog(
        capsys, node, "jobs", "create", "--name", "bad", "--schedule", "61 * * * *",
        "--target", "pull://reports",
    )  # fmt: skip
    assert status == 1 and error["field"] == "schedule"
    status, missing = cronlog(capsys, node, "jobs", "get", "j_nosuchjob")
    assert status == 1 and missing["error"] == "not_found", missing

    # The operator's token for GET /metrics was made beside the tenants' tokens.
    operator = (node.data_dir / "metrics_token").read_text().strip()
    tenant = (node.data_dir / "tokens").read_text().split("default=")[1].strip()
    scrape = httpx.get(f"{node.url}/metrics", headers={"Authorization": f"Bearer {operator}"})
    assert scrape.status_code == 200
    assert 'cronlog_jobs{status="cancelled"} 1.0' in scrape.text.splitlines()
    refused = httpx.get(f"{node.url}/metrics", headers={"Authorization": f"Bearer {tenant}"})
    assert refused.status_code == 401


def test_backfill_dead_letters_and_the_audit_tail(
    node: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    status, job = cronlog(
        capsys, node, "jobs", "create", "--id", "daily", "--name", "d", "--schedule",
        "0 6 * * *", "--target", "pull://daily", "--retries", "0",
    )  # fmt: skip
    assert status == 0, job
    window = ("--from", "2026-01-01T00:00:00Z", "--to", "2026-01-03T23:00:00Z")
    status, plan = cronlog(capsys, node, "jobs", "backfill", "daily", *window)
    assert status == 0 and [s["state"] for s in plan["slots"]] == [None, None, None]
    status, runs = cronlog(capsys, node, "jobs", "slots", "daily", *window)
    assert status == 0 and len(runs["slots"]) == 3
    status, made = cronlog(capsys, node, "jobs", "backfill", "daily", *window, "--apply")
    assert status == 0 and [r["scheduled_for"][:10] for r in made] == [
        "2026-01-01",
        "2026-01-02",
        "2026-01-03",
    ]
    status, again = cronlog(capsys, node, "jobs", "backfill", "daily", *window, "--apply")
    assert status == 0 and again == []  # each slot once

    # Fail two of the three for good: they are dead letters; replay one job's by filter.
    for _ in range(2):
        status, [claimed] = cronlog(capsys, node, "runs", "claim", "daily", "--wait", "5")
        status, _ = cronlog(
            capsys, node, "runs", "complete", claimed["run_id"], "--fencing-token",
            str(claimed["fencing_token"]), "--failed", "--error", "upstream 500", "--permanent",
        )  # fmt: skip
    status, dead = cronlog(capsys, node, "dead", "list", "--error-contains", "upstream")
    assert status == 0 and len(dead) == 2
    status, none = cronlog(capsys, node, "dead", "replay")
    assert status == 2 and none is None  # says which runs first
    status, would = cronlog(capsys, node, "dead", "replay", "--job", "daily", "--dry-run")
    assert status == 0 and len(would) == 2
    status, replayed = cronlog(capsys, node, "dead", "replay", "--job", "daily")
    assert status == 0 and {r["state"] for r in replayed} == {"pending"}
    status, dead = cronlog(capsys, node, "dead")
    assert status == 0 and dead == []
    status, figures = cronlog(capsys, node, "stats", "--window", "60")
    assert status == 0 and figures["points"] and figures["runs_by_state"]["pending"] == 3

    # The team's events, from the start, as JSON lines; without --follow it ends.
    main(["tail", "--from", "start", "--no-follow", "--job", "daily", "--type", "RunReplayed",
          "--url", node.url, "--data-dir", str(node.data_dir)])  # fmt: skip
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["event"]["type"] for line in lines] == ["RunReplayed", "RunReplayed"]
    assert all(line["cursor"] for line in lines)
    # The operator's tail sees every team's.
    main(["tail", "--operator", "--from", "start", "--no-follow", "--max", "1",
          "--url", node.url, "--data-dir", str(node.data_dir)])  # fmt: skip
    assert json.loads(capsys.readouterr().out)["event"]["type"] == "JobRegistered"


def test_tables_yaml_global_flags_version_and_completion(
    node: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--url", node.url, "--data-dir", str(node.data_dir)]
    # Global flags before the command, and -o table: a table with headers.
    assert main([*flags, "-o", "table", "jobs", "create", "--id", "t", "--name", "tabled",
                 "--every", "3600", "--target", "pull://t"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main([*flags, "-o", "table", "jobs", "list"]) == 0
    table = capsys.readouterr().out
    assert "JOB" in table and "NEXT RUN" in table and "tabled" in table and "every 3600 s" in table
    assert main(["jobs", "get", "t", "-o", "yaml", *flags]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["name"] == "tabled"
    assert main(["preview", "0 9 * * 1-5", "--timezone", "Europe/London", "-n", "2", "-o",
                 "table", *flags]) == 0  # fmt: skip
    assert "+00:00" in capsys.readouterr().out
    # The figures as a person reads them: busy steps and totals, not 60 rows of zeros.
    assert main([*flags, "-o", "table", "stats", "--window", "60"]) == 0
    figures = capsys.readouterr().out
    assert "total" in figures and "without a run not shown" in figures
    assert len(figures.splitlines()) < 20
    assert main([*flags, "-o", "table", "team"]) == 0
    team = capsys.readouterr().out
    assert "max_jobs" in team and "{" not in team
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("cronlog ")
    for shell, marker in (("bash", "complete "), ("zsh", "compdef"), ("fish", "complete ")):
        assert main(["completion", shell]) == 0
        script = capsys.readouterr().out
        assert "cronlog" in script and marker in script, shell


def test_tags_from_the_command_line(node: Serve, capsys: pytest.CaptureFixture[str]) -> None:
    status, tagged = cronlog(
        capsys, node, "jobs", "create", "--name", "tagged", "--every", "3600",
        "--target", "pull://t", "--tag", "team=payments", "--tag", "env:prod",
    )  # fmt: skip
    assert status == 0 and tagged["tags"] == ["team=payments", "env:prod"], tagged
    status, _ = cronlog(capsys, node, "jobs", "create", "--name", "other", "--every", "3600",
                        "--target", "pull://t", "--tag", "team=search")  # fmt: skip
    assert status == 0
    status, listed = cronlog(capsys, node, "jobs", "list", "--tag", "team=payments")
    assert status == 0 and [j["job_id"] for j in listed["jobs"]] == [tagged["job_id"]]
    status, listed = cronlog(capsys, node, "jobs", "list", "--tag", "env:prod", "--all")
    assert status == 0 and [j["job_id"] for j in listed] == [tagged["job_id"]]
    flags = ["--url", node.url, "--data-dir", str(node.data_dir)]
    assert main([*flags, "-o", "table", "jobs", "list", "--tag", "env:prod"]) == 0
    table = capsys.readouterr().out
    assert "TAGS" in table and "tagged" in table and "other" not in table
    status, cleared = cronlog(capsys, node, "jobs", "update", tagged["job_id"], "--clear", "tags")
    assert status == 0 and cleared["tags"] == []
    status, listed = cronlog(capsys, node, "jobs", "list", "--tag", "team=payments")
    assert status == 0 and listed["jobs"] == []


def test_completion_answers_through_the_entry_point(tmp_path: Path) -> None:
    """What the shell scripts ask the command: the words that may follow ``cronlog jobs``."""
    answer = tmp_path / "candidates"
    line = "cronlog jobs "
    env = {
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli.main"],
        env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    candidates = set(answer.read_text().split())
    assert {"create", "list", "backfill", "trigger", "update"} <= candidates


def test_the_client_explains_what_it_cannot_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CRONLOG_TOKEN", raising=False)
    assert main(["jobs", "list", "--data-dir", str(tmp_path)]) == 2
    assert "no token" in capsys.readouterr().err
    assert main(["jobs", "list", "--url", "http://127.0.0.1:9", "--token", "t"]) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
    assert main(["jobs", "create", "--name", "x", "--every", "60", "--target", "pull://p",
                 "--payload", "{nope", "--token", "t"]) == 2  # fmt: skip
    assert "--payload is not JSON" in capsys.readouterr().err


def test_apply_creates_a_files_jobs_in_batches(
    node: Serve, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    listing = tmp_path / "jobs.yaml"
    listing.write_text(
        """\
- name: nightly
  schedule: "0 2 * * *"
  timezone: Europe/London
  target: pull://reports
  payload: {"ratio": 1.0}
- job_id: hourly
  name: hourly
  interval_sec: 3600
  target: pull://reports
- name: broken
  schedule: "0 0 31 2 *"
  target: pull://reports
"""
    )
    status, out = cronlog(
        capsys, node, "jobs", "apply", "-f", str(listing), "--idempotency-key", "m1"
    )
    assert status == 1  # one job was refused
    assert [r["status"] for r in out["results"]] == [201, 201, 422]
    assert out["results"][2]["error"]["field"] == "jobs[2].schedule"
    nightly = out["results"][0]["job_id"]
    status, job = cronlog(capsys, node, "jobs", "get", nightly)
    assert job["payload"] == {"ratio": 1.0} and job["timezone"] == "Europe/London"
    # Applying the file again changes nothing: the same jobs answer 200.
    status, again = cronlog(
        capsys, node, "jobs", "apply", "-f", str(listing), "--idempotency-key", "m1"
    )
    assert [r["status"] for r in again["results"]] == [200, 200, 422]
    assert again["results"][0]["job_id"] == nightly
    # JSON, as an object holding the list; every job created: exit 0, and a table on request.
    as_json = tmp_path / "jobs.json"
    as_json.write_text(
        json.dumps({"jobs": [{"name": "j", "interval_sec": 60, "target": "pull://r"}]})
    )
    status, done = cronlog(capsys, node, "jobs", "apply", "-f", str(as_json))
    assert status == 0 and done["created"] == 1
    assert main(["jobs", "apply", "-f", str(as_json), "-o", "table", "--url", node.url,
                 "--data-dir", str(node.data_dir)]) == 0  # fmt: skip
    assert "1 created, 0 already there, 0 refused" in capsys.readouterr().out
    # The node names a bad field; a file that is not a list of jobs is a usage error.
    as_json.write_text(json.dumps([{"name": "j", "interval_sec": "often", "target": "pull://r"}]))
    status, refused = cronlog(capsys, node, "jobs", "apply", "-f", str(as_json))
    assert status == 1 and refused["results"][0]["error"]["field"] == "jobs[0].interval_sec"
    as_json.write_text(json.dumps([{"name": "j", "every": 60, "target": "pull://r"}]))
    assert main(["jobs", "apply", "-f", str(as_json), "--url", node.url,
                 "--data-dir", str(node.data_dir)]) == 2  # fmt: skip
    assert "jobs[0] has no field 'every'" in capsys.readouterr().err
    as_json.write_text("{}")
    assert main(["jobs", "apply", "-f", str(as_json), "--url", node.url,
                 "--data-dir", str(node.data_dir)]) == 2  # fmt: skip
    assert "expected a list of jobs" in capsys.readouterr().err


def test_a_job_is_named_by_its_id_or_by_the_name_the_team_chose(
    node: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    status, report = cronlog(capsys, node, "jobs", "create", "--name", "report",
                             "--every", "3600", "--target", "pull://reports")  # fmt: skip
    assert status == 0, report
    status, run = cronlog(capsys, node, "jobs", "trigger", "report")
    assert status == 0 and run["job_id"] == report["job_id"], run
    status, runs = cronlog(capsys, node, "runs", "list", "report")
    assert status == 0 and run["run_id"] in [r["run_id"] for r in runs["runs"]]
    status, paused = cronlog(capsys, node, "jobs", "pause", "report")
    assert status == 0 and paused["job_id"] == report["job_id"]
    status, fires = cronlog(capsys, node, "jobs", "preview", "report", "-n", "1")
    assert status == 0 and len(fires["fires"]) == 1
    # A name with a space is not an id's form; it is found all the same.
    status, spaced = cronlog(capsys, node, "jobs", "create", "--name", "daily report",
                             "--every", "3600", "--target", "pull://reports")  # fmt: skip
    status, got = cronlog(capsys, node, "jobs", "get", "daily report")
    assert status == 0 and got["job_id"] == spaced["job_id"]
    # An id comes before a name: a job whose id is another's name is the one meant.
    status, _ = cronlog(capsys, node, "jobs", "create", "--id", "daily", "--name", "report",
                            "--every", "60", "--target", "pull://reports")  # fmt: skip
    status, got = cronlog(capsys, node, "jobs", "get", "daily")
    assert status == 0 and got["name"] == "report"
    # Two live jobs of one name: the command says which ids, and sends nothing.
    flags = ["--url", node.url, "--data-dir", str(node.data_dir)]
    assert main(["jobs", "trigger", "report", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "2 jobs are named 'report'" in err and report["job_id"] in err and "daily" in err
    # Cancelling one leaves the name to the other.
    status, _ = cronlog(capsys, node, "jobs", "cancel", "daily")
    status, run = cronlog(capsys, node, "jobs", "trigger", "report")
    assert status == 0 and run["job_id"] == report["job_id"]
    # A name no job has: the node's 404, naming the job as the team does (no tenant prefix).
    status, missing = cronlog(capsys, node, "jobs", "trigger", "nightly-report")
    assert status == 1 and missing["error"] == "not_found"
    assert missing["message"] == "job nightly-report not found"
    assert main(["-o", "table", "jobs", "trigger", "nightly-report", *flags]) == 1
    assert "default/" not in capsys.readouterr().err


def test_completion_offers_the_teams_job_ids_and_names(node: Serve, tmp_path: Path) -> None:
    for job_id, name in (("rep-1", "report"), ("other", "repack"), ("x", "unrelated")):
        assert main(["jobs", "create", "--id", job_id, "--name", name, "--every", "3600",
                     "--target", "pull://p", "--url", node.url,
                     "--data-dir", str(node.data_dir)]) == 0  # fmt: skip
    answer = tmp_path / "candidates"
    line = "cronlog jobs trigger re"
    env = {
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "PATH": "/usr/bin:/bin",
        "CRONLOG_URL": node.url,
        "CRONLOG_DATA_DIR": str(node.data_dir),
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli.main"],
        env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(answer.read_text().split("\n")) == {"rep-1", "report", "repack"}
