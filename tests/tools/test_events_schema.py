"""The events' JSON Schema in docs/ is what the msgspec types give, and a change to it is
versioned and never takes a field away."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec

from core import events_schema
from tools import events_schema as tool


def test_the_published_schema_is_what_the_types_give() -> None:
    # Fails when core/events.py changes and the file was not written again:
    #   python -m tools.events_schema
    assert tool.PATH.read_bytes() == events_schema.encoded()
    assert tool.main(["--check"]) == 0


def test_it_validates_real_events() -> None:
    schema = json.loads(tool.PATH.read_text())
    assert schema["x-cronlog-schema-version"] == events_schema.SCHEMA_VERSION
    names = {ref["$ref"].rsplit("/", 1)[1] for ref in schema["anyOf"]}
    assert "RunDeadLettered" in names and "LeaseGranted" in names
    lease = schema["$defs"]["LeaseGranted"]
    assert {"at", "job_id", "tenant", "run_id", "fencing_token", "lateness_ms"} <= set(
        lease["properties"]
    )
    assert lease["properties"]["type"] == {"enum": ["LeaseGranted"]}


def test_a_check_of_a_stale_file_fails(tmp_path: Path) -> None:
    stale = tmp_path / "events.schema.json"
    schema = events_schema.json_schema()
    del schema["$defs"]["RunFailed"]["properties"]["ambiguous"]
    stale.write_bytes(msgspec.json.encode(schema))
    assert tool.main(["--check", "--path", str(stale)]) == 1


def test_writing_refuses_a_field_taken_away(tmp_path: Path) -> None:
    old = events_schema.json_schema()
    old["$defs"]["RunFailed"]["properties"]["reason_code"] = {"type": "string"}
    old["$defs"]["Gone"] = {"properties": {}}
    path = tmp_path / "events.schema.json"
    path.write_bytes(msgspec.json.encode(old))
    problems = tool.problems_writing(path)
    assert "RunFailed.reason_code was removed" in problems
    assert "Gone was removed" in problems
    assert tool.main(["--path", str(path)]) == 1
    assert msgspec.json.decode(path.read_bytes()) == old  # not overwritten


def test_writing_refuses_a_retyped_field() -> None:
    old = events_schema.json_schema()
    new = copy.deepcopy(old)
    new["$defs"]["LeaseGranted"]["properties"]["lateness_ms"] = {"type": "string"}
    assert events_schema.incompatibilities(old, new) == [
        "LeaseGranted.lateness_ms changed from {'type': 'integer'} to {'type': 'string'}"
    ]


def test_a_changed_schema_needs_a_new_version(tmp_path: Path) -> None:
    old = events_schema.json_schema()
    del old["$defs"]["RunFailed"]["properties"]["ambiguous"]  # the types added a field since
    path = tmp_path / "events.schema.json"
    path.write_bytes(msgspec.json.encode(old))
    assert tool.problems_writing(path) == [
        "the events changed: raise core.events_schema.SCHEMA_VERSION"
        f" (now {events_schema.SCHEMA_VERSION})"
    ]
    old["x-cronlog-schema-version"] = events_schema.SCHEMA_VERSION - 1
    path.write_bytes(msgspec.json.encode(old))
    assert tool.problems_writing(path) == []
    assert tool.main(["--path", str(path)]) == 0
    assert path.read_bytes() == events_schema.encoded()


def test_a_reworded_description_needs_no_new_version(tmp_path: Path) -> None:
    old = events_schema.json_schema()
    old["$defs"]["RunFailed"]["description"] = "Said\n    another way."
    path = tmp_path / "events.schema.json"
    path.write_bytes(msgspec.json.encode(old))
    assert tool.problems_writing(path) == []


def test_descriptions_carry_no_docstring_indentation() -> None:
    # msgspec 0.22 copies a docstring's indentation into the schema, 0.23 does not; the
    # published file is the same under either.
    descriptions = [d.get("description", "") for d in events_schema.json_schema()["$defs"].values()]
    assert any("\n" in d for d in descriptions)
    assert not any("\n    " in d for d in descriptions)
