"""Write (or check) ``docs/events.schema.json``, the events' JSON Schema.

    python -m tools.events_schema          # write it again from core/events.py
    python -m tools.events_schema --check  # exit 1 if the file is not what the types give

Writing refuses a schema that takes something away from the one in the file (an event type, a
field, a field's type: consumers would break), and a changed schema whose version
(``core.events_schema.SCHEMA_VERSION``) was not raised.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core import events_schema

PATH = Path(__file__).resolve().parents[1] / "docs" / "events.schema.json"


def problems_writing(path: Path) -> list[str]:
    """Why the schema the types give may not replace ``path``'s (nothing: it may)."""
    if not path.exists():
        return []
    old = json.loads(path.read_text(encoding="utf-8"))
    new = events_schema.json_schema()
    found = events_schema.incompatibilities(old, new)
    # Words are not the events: a description reworded (or re-indented) needs no new version.
    changed = _shape(old) != _shape(new)
    if changed and old.get("x-cronlog-schema-version") == events_schema.SCHEMA_VERSION:
        found.append(
            "the events changed: raise core.events_schema.SCHEMA_VERSION"
            f" (now {events_schema.SCHEMA_VERSION})"
        )
    return found


def _shape(schema: Any) -> Any:
    """``schema`` without its version, its id and every description."""
    unversioned = ("$id", "x-cronlog-schema-version", "description")
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items() if k not in unversioned}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.events_schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    parser.add_argument("--path", type=Path, default=PATH)
    args = parser.parse_args(argv)
    wanted = events_schema.encoded()
    current = args.path.read_bytes() if args.path.exists() else b""
    if args.check:
        if current != wanted:
            print(f"{args.path} is not what core/events.py gives: python -m tools.events_schema")
            return 1
        print(f"{args.path} is current (version {events_schema.SCHEMA_VERSION})")
        return 0
    if current == wanted:
        print(f"{args.path} is current (version {events_schema.SCHEMA_VERSION})")
        return 0
    problems = problems_writing(args.path)
    if problems:
        for problem in problems:
            print(f"refused: {problem}", file=sys.stderr)
        return 1
    args.path.write_bytes(wanted)
    print(f"wrote {args.path} (version {events_schema.SCHEMA_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
