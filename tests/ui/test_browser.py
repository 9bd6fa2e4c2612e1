"""The status UI in a real browser: Debian's Chromium, headless, driven by Playwright, against
a real ``cronlog serve`` and real HTTP targets on loopback.

A team's afternoon, clicked through: sign in (a wrong token first), create a job and watch it
fire, read its history down to each attempt's fencing token, create a job whose target fails
and watch it dead-letter, replay one dead run and then every one a filter names, preview an
edit's added and dropped slots and save it with tags, find jobs by tag, pause, look at the
figures and the docs page. A job
named like an HTML tag checks the escaping; every page is watched for script errors and
Content-Security-Policy reports.

Screenshots go to ``test-artifacts/ui/`` at the repository's root (git-ignored; the path is
printed). Without Chromium or Playwright the test is skipped on a developer's machine and fails
under CI (``CI=true`` or ``CRONLOG_REQUIRE_BROWSER=1``, which ``scripts/test`` sets): a UI
nobody looked at is not tested.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli.test_serve import Serve
from tests.node.targets import Call, Target

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"
CHROMIUM = os.environ.get("CRONLOG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
TOKEN = "token-a"
WAIT_MS = 20_000  # for a run to happen and the page's 3 s refresh to show it
EVIL = '<img src=x onerror="window.__pwned=1">'
UTC_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}Z")
NEW_YORK_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} -0[45]:00")


def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(
        "CRONLOG_REQUIRE_BROWSER"
    ) in ("1", "true")


def _browser_or_why() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install chromium; ./scripts/test does it)"
    return None


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[Any]:
    why = _browser_or_why()
    if why is not None:
        if _required():
            pytest.fail(f"the browser test cannot run: {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
            # Far from UTC all year: a time shown in the browser's zone instead of UTC differs.
            timezone_id="Asia/Kolkata",
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            context.close()


class Shots:
    def __init__(self, page: Any) -> None:
        self.page = page
        self.taken: list[Path] = []
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        ARTIFACTS.mkdir(parents=True)

    def __call__(self, name: str) -> None:
        path = ARTIFACTS / f"{len(self.taken) + 1:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.taken.append(path)


def _answer(failing: set[str]) -> Any:
    def answer(call: Call) -> tuple[int, dict[str, str], float]:
        return (503 if any(call.path.startswith(p) for p in failing) else 200, {}, 0.0)

    return answer


def test_a_team_works_through_the_ui(browser_page: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    page = browser_page
    failing = {"/fail"}
    target = Target(answer=_answer(failing)).start()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    node = Serve(data_dir).start()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on(
        "console",
        lambda m: (
            problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" and "401" not in m.text
            else None
        ),
    )
    page.on("dialog", lambda d: d.accept())
    shots = Shots(page)
    base = target.url.rsplit("/", 1)[0]
    api = httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        # -- sign in: a wrong token is refused, the right one opens the team's jobs
        page.goto(f"{node.url}/")
        expect(page.get_by_test_id("token")).to_be_visible()
        page.get_by_test_id("token").fill("not-a-token")
        page.get_by_test_id("signin").click()
        expect(page.get_by_test_id("signin-error")).to_contain_text("not one this node knows")
        shots("sign-in")
        page.get_by_test_id("token").fill(TOKEN)
        page.get_by_test_id("signin").click()
        expect(page.get_by_test_id("team")).to_have_text("team team-a")
        assert page.evaluate("sessionStorage.getItem('cronlog.token')") == TOKEN

        # -- create a job and watch it fire
        page.get_by_test_id("new-job").click()
        page.locator("#f-name").fill("Heartbeat")
        page.locator("#f-job_id").fill("heartbeat")
        page.locator("#f-kind").select_option("every")
        page.locator("#f-interval_sec").fill("2")
        page.locator("#f-target").fill(f"{base}/ok")
        page.locator("#f-retries").fill("0")
        expect(page.get_by_test_id("preview")).to_contain_text("every 2 s")
        page.get_by_test_id("save").click()
        expect(page.locator("h1")).to_contain_text("Heartbeat")
        succeeded = page.locator("tr.run-succeeded").first
        expect(succeeded).to_be_visible()
        # -- its history: lateness, and each attempt's outcome, worker and fencing token
        expect(succeeded.get_by_test_id("lateness")).to_have_text(re.compile(r"\d+(\.\d+)? m?s"))
        succeeded.get_by_test_id("attempts-toggle").click()
        attempts = page.get_by_test_id("attempts").first
        expect(attempts).to_contain_text("succeeded")
        expect(attempts).to_contain_text("/executor")  # the node's executor is the worker
        token = attempts.get_by_test_id("fencing-token").first.inner_text()
        run_id = succeeded.get_attribute("data-run")
        run = api.get(f"/v1/runs/{run_id}").json()
        assert int(token) == run["attempts"][0]["fencing_token"] > 0
        expect(page.get_by_test_id("fires")).to_contain_text("Z")  # next fire times, UTC too
        # the last finished run beside the next fire (the newest run is the pending one ahead)
        expect(page.get_by_test_id("last-finished")).to_contain_text("succeeded")
        shots("job-history")

        # -- a job whose target fails dead-letters (retries 0); its name is not markup
        page.goto(f"{node.url}/ui/#/new")
        page.locator("#f-name").fill(f"Export {EVIL}")
        page.locator("#f-job_id").fill("export")
        page.locator("#f-kind").select_option("every")
        page.locator("#f-interval_sec").fill("2")
        page.locator("#f-target").fill(f"{base}/fail")
        page.locator("#f-retries").fill("0")
        page.get_by_test_id("save").click()
        expect(page.locator("h1")).to_contain_text(EVIL)  # shown as the characters it is
        expect(page.locator("tr.run-dead").first).to_be_visible()
        expect(page.locator("tr.run-dead").first).to_contain_text("HTTP 503")
        assert page.locator("main img").count() == 0
        assert page.evaluate("window.__pwned") is None
        shots("dead-lettered")

        # -- the dead letters: replay one once the target is mended, then the rest by filter
        page.get_by_test_id("pause").click()  # no new dead letters while we replay
        expect(page.locator("h1 .badge")).to_have_text("paused")
        failing.clear()
        page.get_by_test_id("nav-dead").click()
        dead_rows = page.get_by_test_id("dead").locator("tr[data-run]")
        expect(dead_rows.first).to_be_visible()
        # a run's job by the name its team gave it (as characters), its id beneath
        expect(dead_rows.first.get_by_test_id("job-name")).to_have_text(f"Export {EVIL}")
        shots("dead-letters")
        dead_before = dead_rows.count()
        first = dead_rows.first.get_attribute("data-run")
        dead_rows.first.get_by_test_id("replay").click()
        expect(page.get_by_test_id("toast").last).to_contain_text(f"Replayed {first}")
        # it leaves the list, and the page says so and where to follow it
        note = page.get_by_test_id("replay-note")
        expect(note).to_contain_text("has left this list")
        expect(note.locator("a")).to_have_attribute("href", "#/jobs/export")
        expect(page.locator(f'tr[data-run="{first}"]')).to_have_count(0)
        _wait_for_state(page, api, first, "succeeded")
        page.get_by_test_id("filter-job").fill("export")
        page.get_by_test_id("filter-reason").select_option("attempts_exhausted")
        # the filter is in the URL: a reload (or the link, shared) opens it filled in
        expect(page).to_have_url(re.compile(r"#/dead\?job_id=export&reason=attempts_exhausted$"))
        page.reload()
        expect(page.get_by_test_id("filter-job")).to_have_value("export")
        expect(page.get_by_test_id("filter-reason")).to_have_value("attempts_exhausted")
        page.get_by_test_id("filter-count").click()
        expect(page.get_by_test_id("filter-outcome")).to_contain_text(
            f"{dead_before - 1} dead run" if dead_before > 1 else "0 dead runs"
        )
        page.get_by_test_id("filter-replay").click()
        expect(page.get_by_test_id("dead")).to_contain_text("No dead letters")
        shots("replayed")
        export_runs = api.get("/v1/jobs/export/runs", params={"limit": 100}).json()["runs"]
        assert {r["state"] for r in export_runs} <= {"pending", "running", "succeeded"}

        # -- edit: a preview of the slots a new schedule adds and drops, then save
        api.put(
            "/v1/jobs/report",
            json={
                "name": "Report",
                "schedule": "0 * * * *",
                "timezone": "America/New_York",  # a local and a UTC column
                "target": f"{base}/ok",
            },
        ).raise_for_status()
        page.goto(f"{node.url}/ui/#/jobs/report/edit")
        expect(page.get_by_test_id("diff-summary")).to_contain_text("No slot added or dropped")
        page.locator("#f-schedule").fill("*/30 * * * *")
        page.locator("#f-tags").fill("team=reports, daily")
        expect(page.get_by_test_id("diff-summary")).to_contain_text("added, 0 dropped")
        # the seconds travel with a schedule but are not named when they did not change
        expect(page.get_by_test_id("changing")).to_have_text("Changing tags, schedule.")
        added = page.get_by_test_id("fires-after").locator("tr.added")
        expect(added.first).to_contain_text(":30:00")
        # every time keeps its seconds (":00" too), so the columns line up
        times = page.locator("[data-testid^=fires-] td.mono").all_inner_texts()
        assert times and all(UTC_TIME.fullmatch(t) for t in times)
        local_times = page.locator("[data-testid^=fires-] td:nth-child(2)").all_inner_texts()
        assert local_times and all(NEW_YORK_TIME.fullmatch(t) for t in local_times)
        # both lists whole: no column clipped by its box
        assert _overflowing(page, "[data-testid^=fires-]") == []
        shots("edit-preview")
        page.get_by_test_id("save").click()
        expect(page.locator("h1")).to_contain_text("Report")
        report = api.get("/v1/jobs/report").json()
        assert report["schedule"] == "*/30 * * * *"
        assert report["tags"] == ["team=reports", "daily"]
        assert report["seconds"] is None
        expect(page.get_by_test_id("facts")).to_contain_text("team=reports, daily")

        # -- seconds go in their own field, never as a sixth field of the expression
        page.goto(f"{node.url}/ui/#/jobs/report/edit")
        expect(page.get_by_test_id("diff-summary")).to_contain_text("No slot added or dropped")
        page.locator("#f-seconds").fill("0,30")
        expect(page.get_by_test_id("diff-summary")).to_contain_text("added, 0 dropped")
        page.get_by_test_id("save").click()
        expect(page.locator("h1")).to_contain_text("Report")
        saved = api.get("/v1/jobs/report").json()
        assert (saved["schedule"], saved["seconds"]) == ("*/30 * * * *", "0,30")
        expect(page.get_by_test_id("facts")).to_contain_text("*/30 * * * * at seconds 0,30")

        # -- pause from the list; the search finds it
        page.get_by_test_id("nav-jobs").click()
        page.get_by_test_id("search").fill("heart")
        rows = page.get_by_test_id("jobs").locator("tr[data-job]")
        expect(rows).to_have_count(1)
        rows.first.get_by_test_id("pause").click()
        expect(rows.first.locator(".badge").first).to_have_text("paused")
        assert api.get("/v1/jobs/heartbeat").json()["status"] == "paused"
        page.get_by_test_id("search").fill("")
        expect(rows).to_have_count(3)
        expect(page.locator("tr[data-job=report]")).to_contain_text("at seconds 0,30")
        shots("jobs")
        # -- find jobs by tag: typed, then by clicking a row's tag
        page.get_by_test_id("tag-filter").fill("team=reports")
        expect(rows).to_have_count(1)
        assert rows.first.get_attribute("data-job") == "report"
        # the filters are in the URL: a reload (or the link, shared) opens the page filtered
        page.get_by_test_id("status-filter").select_option("active")
        expect(page).to_have_url(re.compile(r"#/jobs\?tag=team%3Dreports&status=active$"))
        page.reload()
        expect(page.get_by_test_id("tag-filter")).to_have_value("team=reports")
        expect(page.get_by_test_id("status-filter")).to_have_value("active")
        expect(rows).to_have_count(1)
        page.goto(f"{node.url}/ui/#/jobs?q=heart")
        expect(page.get_by_test_id("search")).to_have_value("heart")
        expect(rows).to_have_count(1)
        assert rows.first.get_attribute("data-job") == "heartbeat"
        page.get_by_test_id("search").fill("")
        expect(page).to_have_url(re.compile(r"#/jobs$"))
        page.get_by_test_id("tag-filter").fill("team=nobody")
        expect(page.get_by_test_id("jobs")).to_contain_text("No job matches.")
        page.get_by_test_id("tag-filter").fill("")
        expect(rows).to_have_count(3)
        page.locator("tr[data-job=report]").get_by_test_id("tag").filter(has_text="daily").click()
        expect(rows).to_have_count(1)
        expect(page.get_by_test_id("tag-filter")).to_have_value("daily")
        shots("jobs-by-tag")
        page.get_by_test_id("tag-filter").fill("")
        expect(rows).to_have_count(3)
        # each job's last finished run, not the pending one materialised ahead
        expect(
            page.locator("tr[data-job=heartbeat]").get_by_test_id("last-finished")
        ).to_contain_text("succeeded")
        # at 800 px every row's buttons stay inside the page: no table wider than its card
        page.set_viewport_size({"width": 800, "height": 900})
        expect(rows).to_have_count(3)
        assert _overflowing(page, ".table-card table") == []
        assert _overflowing(page, "tr[data-job] .actions button") == []
        shots("jobs-800px")
        page.set_viewport_size({"width": 1400, "height": 900})
        # the default leaves cancelled jobs out and says so; "cancelled" lists them
        api.put("/v1/jobs/old", json={"name": "Old", "interval_sec": 3600, "target": f"{base}/ok"})
        api.delete("/v1/jobs/old").raise_for_status()
        status = page.get_by_test_id("status-filter")
        expect(status.locator("option").first).to_have_text("not cancelled")
        expect(page.locator("tr[data-job=old]")).to_have_count(0)
        status.select_option("cancelled")
        expect(rows).to_have_count(1)
        assert rows.first.get_attribute("data-job") == "old"
        status.select_option("")
        expect(rows).to_have_count(3)

        # -- the runs: it opens on a state that has runs, each named by its job's name
        # ("Old" too: under load its first run can come before it is cancelled)
        page.get_by_test_id("nav-runs").click()
        run_rows = page.get_by_test_id("state-runs").locator("tr[data-run]")
        expect(run_rows.first).to_be_visible()
        expect(run_rows.first.get_by_test_id("job-name")).to_have_text(
            re.compile(r"^(Heartbeat|Report|Export .*|Old)$")
        )
        expect(page.locator(".tabs a.active .count")).not_to_have_text(" 0")
        shots("runs")

        # -- the figures, from the team's own GET /v1/stats
        page.get_by_test_id("nav-figures").click()
        expect(page.get_by_test_id("delay-chart").locator("canvas")).to_be_visible()
        expect(page.locator(".tile").first).not_to_contain_text(re.compile(r"^\s*0\s*$"))
        expect(page.get_by_test_id("states").locator("[data-state=succeeded]")).to_be_visible()
        # the time axis reads UTC, like every other time, not the browser's zone (+05:30)
        points = api.get("/v1/stats", params={"window_min": 60}).json()["points"]
        slots = {p["at"][:16].replace("T", " ") + " UTC" for p in points}
        page.get_by_test_id("delay-chart").locator(".u-over").hover()
        legend_time = page.get_by_test_id("delay-chart").locator(".u-legend .u-series .u-value")
        expect(legend_time.first).to_have_text(re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC$"))
        assert legend_time.first.inner_text() in slots
        shots("figures")

        # -- the API reference
        page.goto(f"{node.url}/docs")
        expect(page.locator(".opblock").first).to_be_visible()
        expect(page.locator("body")).to_contain_text("/v1/runs/replay")
        for group in ("jobs", "runs", "workers", "team", "events", "probes"):
            expect(page.locator(".opblock-tag", has_text=group).first).to_be_visible()
        expect(page.locator(".opblock-tag", has_text="default")).to_have_count(0)
        shots("docs")
    finally:
        print(f"\nUI screenshots: {ARTIFACTS}")
        api.close()
        node.stop()
        target.stop()
    assert problems == []


def _overflowing(page: Any, selector: str) -> list[str]:
    """The elements ``selector`` finds whose right edge passes their box's (the nearest
    ancestor that clips or scrolls) or the window's: cut off, or reachable only by scrolling."""
    found: list[str] = page.evaluate(
        """(selector) => [...document.querySelectorAll(selector)].flatMap((el) => {
            let box = el.parentElement;
            while (box && getComputedStyle(box).overflowX === "visible") box = box.parentElement;
            const limit = Math.min(box ? box.getBoundingClientRect().right : Infinity,
                                   document.documentElement.clientWidth);
            const right = el.getBoundingClientRect().right;
            const what = `${el.tagName} ${el.textContent.slice(0, 40)}`;
            return right > limit + 1 ? [`${what}: ${right} > ${limit}`] : [];
        })""",
        selector,
    )
    return found


def _wait_for_state(page: Any, api: httpx.Client, run_id: str, state: str) -> None:
    """Until the run is in ``state``, asking the API at each of the page's refreshes."""
    page.wait_for_function(
        """async ([runId, state]) => {
            const r = await fetch(`/v1/runs/${encodeURIComponent(runId)}`, {
                headers: {Authorization: `Bearer ${sessionStorage.getItem("cronlog.token")}`}});
            return r.ok && (await r.json()).state === state;
        }""",
        arg=[run_id, state],
        polling=500,
    )
