"""The README's first five minutes, run as written against a real ``cronlog serve``.

The section's shell blocks are read from README.md and each line is run by bash, in order, with
a fresh HOME and no token in the environment: the command line must find the token ``serve``
wrote into its data directory by itself, as the README says. The blocks that start the node
(``./scripts/...``) are the one thing the test does its own way: it starts ``cronlog serve``
on a free port (hence ``CRONLOG_URL``) rather than reinstalling .venv on 8080. ``RUN`` and
``N``, which the README asks the reader to copy from the claim, are taken from its answer.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_serve import Serve

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SECTION = "## The first five minutes"


def first_five_minutes() -> list[str]:
    """The command lines of the section's shell blocks, comments and starts of the node aside."""
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith(("#", "./scripts/")):
                lines.append(command)
    return lines


def test_the_section_has_the_commands_a_newcomer_types() -> None:
    commands = first_five_minutes()
    words = [shlex.split(c)[:3] for c in commands]
    assert ["cronlog", "jobs", "create"] in words
    assert ["cronlog", "runs", "claim"] in words
    assert ["cronlog", "runs", "complete"] in words


def test_the_first_five_minutes_run_as_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    checkout = tmp_path / "checkout"  # where the README's commands run: .venv/bin/cronlog
    venv_bin = checkout / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    cronlog = venv_bin / "cronlog"
    cronlog.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cli.main "$@"\n')
    cronlog.chmod(0o755)
    data_dir = home / ".local" / "share" / "cronlog"  # serve's default under this HOME
    data_dir.mkdir(parents=True)
    node = Serve(data_dir, tokens=None, env={"HOME": str(home)}).start()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CRONLOG_")},
        "HOME": str(home),
        "CRONLOG_URL": node.url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "sdk" / "python")]),
        "COLUMNS": "120",
    }
    exports: list[str] = []
    claimed: dict[str, object] = {}
    ran = []
    try:
        for command in first_five_minutes():
            if command.startswith("export "):
                exports.append(command)
                continue
            words = shlex.split(command)
            if "RUN" in words or "N" in words:
                assert claimed, f"{command!r} needs a run from a claim before it"
                run, token = str(claimed["run_id"]), str(claimed["fencing_token"])
                words = [{"RUN": run, "N": token}.get(w, w) for w in words]
                command = shlex.join(words)
            done = subprocess.run(
                ["bash", "-c", "; ".join([*exports, command])],
                cwd=checkout,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
            ran.append(words[:3])
            if words[:3] == ["cronlog", "runs", "claim"]:
                leased = json.loads(done.stdout)  # JSON when not on a terminal
                assert len(leased) == 1, f"{command} leased {leased}"
                claimed = leased[0]
            if words[:3] == ["cronlog", "runs", "list"]:
                assert "succeeded" in done.stdout, done.stdout
    finally:
        assert node.stop() == 0
    assert ["cronlog", "runs", "complete"] in ran
