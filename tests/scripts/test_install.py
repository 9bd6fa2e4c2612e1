"""``./scripts/serve`` and ``./scripts/test`` install cronlog into the ``.venv`` they share only
when it is out of date, and quietly: a service started during a test run must not reinstall the
package under the tests, and no start prints setuptools' notice about editable installations.

The scripts run for real in a copy of the repository's install inputs, with a stand-in
``.venv`` whose python records each pip call (and prints that notice, as setuptools does)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTICE = "InformationOnly: Editable installation."

FAKE_PYTHON = f"""#!/usr/bin/env bash
case "$1" in
  -c) echo "3.11.2 (stand-in)" ;;
  -m)
    [ "$2" = pip ] || exit 3
    shift 2
    echo "$*" >>"$(dirname "$0")/../pip-calls"
    echo "{NOTICE}" >&2
    [ ! -e "$(dirname "$0")/../pip-fails" ] ;;
  *) exit 3 ;;
esac
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    for name in ("scripts/serve", "scripts/venv.sh", "pyproject.toml", "constraints.txt"):
        shutil.copy2(ROOT / name, tmp_path / name)
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text(FAKE_PYTHON)
    (bin_ / "cronlog").write_text('#!/usr/bin/env bash\necho "cronlog $*"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    return tmp_path


def _serve(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo / "scripts" / "serve"), "--port", "9000"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _install_for_tests(repo: Path) -> subprocess.CompletedProcess[str]:
    # What scripts/test runs before its apt and Kafka steps.
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail; . scripts/venv.sh; install_cronlog test,bench"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _pip_calls(repo: Path) -> list[str]:
    calls = repo / ".venv" / "pip-calls"
    lines = calls.read_text().splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return lines


def test_serve_installs_once_then_starts_without_pip(repo: Path) -> None:
    first = _serve(repo)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "cronlog serve --port 9000\n"
    assert NOTICE not in first.stdout + first.stderr
    assert _pip_calls(repo) == [
        "install --upgrade pip",
        "install -c constraints.txt -e .",
    ]
    again = _serve(repo)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert again.stderr == ""  # not one line before the service's own
    assert _pip_calls(repo) == []


def test_the_tests_install_covers_the_service(repo: Path) -> None:
    assert _install_for_tests(repo).returncode == 0
    assert _pip_calls(repo)[-1] == "install -c constraints.txt -e .[test,bench]"
    assert _serve(repo).returncode == 0  # a start during a test run
    assert _pip_calls(repo) == []
    assert _install_for_tests(repo).returncode == 0
    assert _pip_calls(repo) == []


def test_the_service_install_gains_the_tests_extras(repo: Path) -> None:
    assert _serve(repo).returncode == 0
    _pip_calls(repo)
    done = _install_for_tests(repo)
    assert done.returncode == 0 and NOTICE not in done.stderr
    assert _pip_calls(repo)[-1] == "install -c constraints.txt -e .[test,bench]"


@pytest.mark.parametrize("changed", ["pyproject.toml", "constraints.txt"])
def test_a_changed_input_installs_again(repo: Path, changed: str) -> None:
    assert _install_for_tests(repo).returncode == 0
    _pip_calls(repo)
    with (repo / changed).open("a") as f:
        f.write("\n# changed\n")
    assert _serve(repo).returncode == 0
    assert _pip_calls(repo)[-1] == "install -c constraints.txt -e ."


def test_a_failed_install_shows_pips_output_and_installs_again(repo: Path) -> None:
    (repo / ".venv" / "pip-fails").touch()
    failed = _serve(repo)
    assert failed.returncode != 0 and failed.stdout == ""
    assert NOTICE in failed.stderr
    (repo / ".venv" / "pip-fails").unlink()
    _pip_calls(repo)
    assert _serve(repo).returncode == 0
    assert _pip_calls(repo) == ["install --upgrade pip", "install -c constraints.txt -e ."]
