"""Packaging: ranges in pyproject.toml, exact pins in constraints.txt (what CI tests), every
installer using the pins, and an image that runs unprivileged with a health check."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from api.app import ROUTES
from tools import constraints

REPO = Path(__file__).resolve().parents[2]
# Calendar-versioned data: a newer release is only ever more correct.
NO_UPPER_BOUND = {"tzdata"}


def requirements(pyproject: Path, extras: tuple[str, ...] | None = None) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    found = [Requirement(r) for r in project.get("dependencies", [])]
    for extra, listed in project.get("optional-dependencies", {}).items():
        if extras is None or extra in extras:
            found += [Requirement(r) for r in listed]
    return found


@pytest.mark.parametrize("pyproject", ["pyproject.toml", "sdk/python/pyproject.toml"])
def test_dependencies_are_ranges_with_an_upper_bound(pyproject: str) -> None:
    for req in requirements(REPO / pyproject):
        operators = {spec.operator for spec in req.specifier}
        assert "==" not in operators and "===" not in operators, f"{req} is an exact pin"
        assert ">=" in operators, f"{req} has no lower bound"
        if canonicalize_name(req.name) not in NO_UPPER_BOUND:
            assert "<" in operators, f"{req} has no upper bound"


@pytest.mark.parametrize("pyproject", ["pyproject.toml", "sdk/python/pyproject.toml"])
def test_constraints_pin_every_dependency_within_its_range(pyproject: str) -> None:
    pins = constraints.read(REPO / "constraints.txt")
    for req in requirements(REPO / pyproject, constraints.EXTRAS):
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[name]}, outside {req}"
        )


def test_constraints_hold_what_the_venv_installed(capsys: pytest.CaptureFixture[str]) -> None:
    # scripts/test installs with -c constraints.txt, so under CI this holds by construction; a
    # dependency added or moved without writing the file again fails here.
    assert constraints.main(["--check"]) == 0, capsys.readouterr().out


def pip_installs(path: Path) -> list[str]:
    """The ``pip install`` lines of a script, and of the scripts it sources (``. FILE``)."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#"):
            continue
        sourced = re.fullmatch(r"\s*(?:\.|source)\s+(\S+)\s*", line)
        if sourced:
            found += pip_installs(REPO / sourced.group(1))
        elif re.search(r"\bpip install\b", line):
            found.append(line)
    return found


@pytest.mark.parametrize("path", ["scripts/test", "scripts/serve", "Dockerfile"])
def test_every_install_of_cronlog_uses_the_constraints(path: str) -> None:
    installs = [line for line in pip_installs(REPO / path) if "--upgrade pip" not in line]
    assert installs, f"{path} installs nothing"
    for line in installs:
        assert "-c constraints.txt" in line, f"{path}: {line.strip()}"


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per instruction, continuation lines joined."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def test_the_image_runs_as_a_user_of_its_own_with_a_health_check() -> None:
    steps = dockerfile()
    names = [instruction for instruction, _ in steps]
    users = [rest for instruction, rest in steps if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    assert names.index("USER") < names.index("ENTRYPOINT")
    assert max(i for i, n in enumerate(names) if n == "RUN") < names.index("USER")
    (check,) = [rest for instruction, rest in steps if instruction == "HEALTHCHECK"]
    # It asks a route the node serves, on the port the entrypoint listens on.
    (url,) = re.findall(r"http://127\.0\.0\.1:(\d+)(/\w+)", check)
    entrypoint = next(rest for instruction, rest in steps if instruction == "ENTRYPOINT")
    assert f'"--port", "{url[0]}"' in entrypoint
    assert ("GET", url[1]) in {(method, path) for method, path, _ in ROUTES}
    assert "--interval" in check and "--timeout" in check
    assert "constraints.txt" in next(r for i, r in steps if i == "COPY")
    # The exec form (JSON) runs Python the image has (the slim image has no curl).
    command = json.loads(check.split("CMD", 1)[1])
    assert command[:2] == ["python", "-c"]
    compile(command[2], "HEALTHCHECK", "exec")
