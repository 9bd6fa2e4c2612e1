"""The events' JSON Schema, made from the msgspec types themselves (``msgspec.json.schema``),
so it cannot describe events other than those the log holds.

Audit consumers read it from ``docs/events.schema.json`` (``python -m tools.events_schema``
writes it; a test fails when the types change and the file was not written again) or from a
node at ``GET /docs/events.schema.json``. It is versioned by :data:`SCHEMA_VERSION`, which
every change to the events raises; events only grow (``core/events.py``), so a consumer written
against version N reads every later version's events, ignoring the fields it does not know.
"""

from __future__ import annotations

import inspect
from typing import Any

import msgspec

from core.events import AnyEvent

SCHEMA_VERSION = 7  # raise it with every change to an event or a type it holds

_ABOUT = (
    'One record of cronlog\'s events stream: a JSON object whose "type" names the event.'
    " Events only grow: a new version adds event types and fields with defaults, and never"
    " removes, renames or retypes one, so a consumer ignores what it does not know."
    " Instants are integer milliseconds since the epoch, UTC."
)


def json_schema() -> dict[str, Any]:
    """The schema of one event (any of them), with its version."""
    # Through JSON and back, so it compares equal to a schema read from the file (a tuple
    # default is a list there).
    schema: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(msgspec.json.schema(AnyEvent)))
    _clean_descriptions(schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:cronlog:events:v{SCHEMA_VERSION}",
        "title": "cronlog event",
        "description": _ABOUT,
        "x-cronlog-schema-version": SCHEMA_VERSION,
        **schema,
    }


def _clean_descriptions(node: Any) -> None:
    """Docstrings as ``inspect.cleandoc`` gives them: msgspec 0.22 copies a docstring's
    indentation into the schema and 0.23 removes it, and the published file must not depend on
    which one wrote it."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "description" and isinstance(value, str):
                    item[key] = inspect.cleandoc(value)
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def encoded() -> bytes:
    """:func:`json_schema` as the file holds it: indented, keys in order, a final newline."""
    return msgspec.json.format(msgspec.json.encode(json_schema(), order="sorted"), indent=2) + b"\n"


def incompatibilities(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What ``new`` takes away from ``old``: an event type, a field, or a field's type. A
    consumer of ``old`` could not read ``new``'s events if any of these were true."""
    problems: list[str] = []
    old_defs, new_defs = old.get("$defs", {}), new.get("$defs", {})
    for name, definition in old_defs.items():
        if name not in new_defs:
            problems.append(f"{name} was removed")
            continue
        kept = new_defs[name].get("properties", {})
        for field, spec in definition.get("properties", {}).items():
            if field not in kept:
                problems.append(f"{name}.{field} was removed")
            elif kept[field] != spec:
                problems.append(f"{name}.{field} changed from {spec} to {kept[field]}")
    return problems
