"""The status UI's and the docs page's static files: served without a token, every one under
a Content-Security-Policy that allows this origin's scripts only, none of them in the API
document; the events' schema served as published."""

from __future__ import annotations

import re

import pytest

from api.ui import STATIC
from tests.api.conftest import Api
from tools.events_schema import PATH as SCHEMA_PATH

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "path",
    [
        "/ui/",
        "/ui/js/app.js",
        "/ui/style.css",
        "/static/uplot-1.6.32/uPlot.esm.js",
        "/docs",
        "/docs/docs.js",
        "/static/swagger-ui-5.35.0/swagger-ui-bundle.js",
        "/docs/events.schema.json",
    ],
)
async def test_static_files_go_out_under_a_strict_policy(api: Api, path: str) -> None:
    r = await api.anon.get(path)
    assert r.status_code == 200
    policy = r.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"  # no inline script, no eval
    assert directives["connect-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    if not path.startswith("/docs"):
        assert directives["style-src"] == "'self'"


async def test_the_root_leads_to_the_ui(api: Api) -> None:
    for path in ("/", "/ui"):
        r = await api.anon.get(path)
        assert (r.status_code, r.headers["location"]) == (307, "/ui/")


async def test_the_ui_is_not_in_the_api_document(api: Api) -> None:
    paths = (await api.anon.get("/openapi.json")).json()["paths"]
    assert all(p.startswith("/v1/") or p in ("/healthz", "/readyz") for p in paths)


async def test_the_served_events_schema_is_the_published_one(api: Api) -> None:
    r = await api.anon.get("/docs/events.schema.json")
    assert r.content == SCHEMA_PATH.read_bytes()
    assert r.headers["content-type"].startswith("application/schema+json")


async def test_a_missing_file_is_404_not_a_listing(api: Api) -> None:
    assert (await api.anon.get("/ui/js/")).status_code == 404
    assert (await api.anon.get("/ui/../api/app.py")).status_code == 404


def test_the_ui_builds_no_markup_from_strings() -> None:
    """Values reach the page as text: no innerHTML, outerHTML, insertAdjacentHTML,
    document.write or eval in the UI's own code (the vendored libraries aside)."""
    sources = sorted((STATIC / "ui").rglob("*.js"))
    assert sources
    forbidden = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(")
    for source in sources:
        code = re.sub(r"^\s*//.*$", "", source.read_text(), flags=re.M)  # comments may say it
        assert not forbidden.search(code), source


def test_every_file_a_page_names_is_there() -> None:
    for page in (STATIC / "ui" / "index.html", STATIC / "docs" / "index.html"):
        for ref in re.findall(r'(?:src|href)="(/[^"]+)"', page.read_text()):
            if ref.startswith("/ui/"):
                assert (STATIC / "ui" / ref.removeprefix("/ui/")).exists(), ref
            elif ref.startswith("/static/"):
                assert (STATIC / "vendor" / ref.removeprefix("/static/")).exists(), ref
            elif ref.startswith("/docs/") and ref != "/docs/events.schema.json":
                assert (STATIC / "docs" / ref.removeprefix("/docs/")).exists(), ref


async def test_a_literal_path_beside_a_template_answers_its_own_allow(api: Api) -> None:
    r = await api.a.request("OPTIONS", "/v1/runs/replay")
    assert (r.status_code, r.headers["allow"]) == (405, "POST")
    r = await api.a.get("/v1/runs/replay")  # not the run "replay"
    assert (r.status_code, r.json()["error"], r.headers["allow"]) == (
        405,
        "method_not_allowed",
        "POST",
    )
    r = await api.a.request("OPTIONS", "/v1/runs/x.1")
    assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")
    r = await api.a.request("PATCH", "/v1/jobs")
    assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD, POST")
