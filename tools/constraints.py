"""Write (or check) ``constraints.txt``: the exact versions CI tests, from the installed venv.

    python -m tools.constraints          # write it from what .venv has installed
    python -m tools.constraints --check  # exit 1 if it is not what the venv holds

``pyproject.toml`` declares ranges (cronlog installs beside other packages); this file pins
every distribution in the dependency closure of ``cronlog[test,bench]`` (what
``scripts/test`` installs) to the version installed now, and ``scripts/test``,
``scripts/serve`` and the Dockerfile install with ``-c constraints.txt``, so what runs is what
was tested. To move a pin: ``pip install -U foo`` in the venv (within the range), run the
tests, then write the file again. Each pin must satisfy the range pyproject.toml gives
(``tests/tools/test_constraints.py``).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PATH = Path(__file__).resolve().parents[1] / "constraints.txt"
ROOT = "cronlog"
EXTRAS = ("test", "bench")  # what scripts/test installs
HEADER = (
    "# The exact versions CI tests: the dependency closure of cronlog[test,bench] as installed\n"
    "# by scripts/test. pyproject.toml declares ranges; install with -c constraints.txt.\n"
    "# Written by python -m tools.constraints (do not edit by hand).\n"
)


def closure(root: str = ROOT, extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """Every installed distribution ``root[extras]`` needs, transitively: name -> version.
    The root itself is left out (it is this project)."""
    found: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:  # bounded: each (distribution, extras) pair is expanded once
        name, wanted = todo.pop()
        key = (canonicalize_name(name), wanted)
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(name)
        if canonicalize_name(name) != canonicalize_name(root):
            found[canonicalize_name(name)] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": extra}) for extra in (wanted or {""})
            ):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return dict(sorted(found.items()))


def text() -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in closure().items())


def read(path: Path = PATH) -> dict[str, str]:
    """The pins of a constraints file: name -> version."""
    pins: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.constraints", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    parser.add_argument("--path", type=Path, default=PATH)
    args = parser.parse_args(argv)
    wanted = text()
    current = args.path.read_text(encoding="utf-8") if args.path.exists() else ""
    if args.check:
        if current != wanted:
            print(f"{args.path} is not what the venv holds: python -m tools.constraints")
            return 1
        print(f"{args.path} is current")
        return 0
    args.path.write_text(wanted, encoding="utf-8")
    print(f"wrote {args.path} ({len(closure())} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
