"""The API document describes what it lists: every field of every body, every parameter with
its type and bounds, required fields marked, and every error status a route answers."""

from __future__ import annotations

import json
from typing import Any

from api import openapi
from api.app import ROUTES

DOCUMENT = json.loads(
    openapi.document(
        [(m, p) for m, p, _ in ROUTES] + [("GET", "/metrics"), ("GET", "/v1/operator/state")]
    )
)
SCHEMAS: dict[str, Any] = DOCUMENT["components"]["schemas"]


def test_every_field_of_every_body_is_described() -> None:
    missing = [
        f"{name}.{field}"
        for name, schema in SCHEMAS.items()
        for field, spec in schema.get("properties", {}).items()
        if not spec.get("description")
    ]
    assert missing == [], "describe them in api/field_docs.py"
    undescribed = [
        name
        for name, schema in SCHEMAS.items()
        if "properties" in schema and not schema.get("description")
    ]
    assert undescribed == []


def test_required_fields_are_marked() -> None:
    assert set(SCHEMAS["JobDefinition"]["required"]) == {"name", "target"}
    assert "fencing_token" in SCHEMAS["CompleteIn"]["required"]
    assert "required" not in SCHEMAS["JobPatch"] or SCHEMAS["JobPatch"]["required"] == []
    out = SCHEMAS["RunOut"]
    assert set(out["required"]) == set(out["properties"])  # a response always holds them all


def test_every_parameter_has_a_type_description_and_bounds() -> None:
    for path, operations in DOCUMENT["paths"].items():
        for method, op in operations.items():
            for p in op["parameters"]:
                where = f"{method} {path} {p['name']}"
                assert p["description"], where
                schema = p["schema"]
                assert "type" in schema or "enum" in schema, where
                if schema.get("type") == "integer":
                    assert "minimum" in schema and "maximum" in schema, where
                if schema.get("type") == "string" and "enum" not in schema:
                    assert {"pattern", "maxLength"} & set(schema) or p["name"] == "cursor", where


def test_every_route_lists_its_errors() -> None:
    for path, operations in DOCUMENT["paths"].items():
        for method, op in operations.items():
            codes = set(op["responses"])
            if path.startswith("/v1/"):
                assert {"401", "429"} <= codes, f"{method} {path}"
            if "requestBody" in op:
                assert {"400", "413", "415"} <= codes, f"{method} {path}"
            if "{" in path:
                assert "404" in codes, f"{method} {path}"
            for code, response in op["responses"].items():
                assert response["description"], f"{method} {path} {code}"


def test_every_operation_is_in_one_named_group() -> None:
    named = [t["name"] for t in DOCUMENT["tags"]]
    groups: dict[str, list[str]] = {name: [] for name in named}
    for path, operations in DOCUMENT["paths"].items():
        for method, op in operations.items():
            assert len(op["tags"]) == 1 and op["tags"][0] in named, f"{method} {path}"
            groups[op["tags"][0]].append(f"{method.upper()} {path}")
    assert all(groups.values()), groups  # no group is empty
    assert "POST /v1/jobs" in groups["jobs"] and "GET /v1/runs" in groups["runs"]
    assert "POST /v1/runs/{run_id}/complete" in groups["workers"]
    assert "GET /healthz" in groups["probes"]
