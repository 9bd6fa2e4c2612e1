"""``bench/RESULTS.md`` from the records of one ``run_all`` (the latest by default).

    python -m bench.report [--run-id ID]

Every figure is the median of the run's rounds, with their range; the load average at the
start of every scenario run is listed, and a run taken while it was above 2 says that its
figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import re
import shlex
import statistics
from collections.abc import Callable, Iterable
from functools import cache, partial
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR

OUT = Path(__file__).parent / "RESULTS.md"
QUIET_LOAD = 2.0
# Sections written by hand from benchmarks that run_all does not run (on demand: minutes to
# build a history), included as they are.
EXTRA_SECTIONS = ("registration-single.md", "takeover.md")

HERD_ROWS = [
    ("floor", "floor: bare aiohttp client, 512 at once"),
    ("http", "cronlog serve, HTTP jobs"),
    ("pull", "cronlog serve, pull jobs (lease granted)"),
    ("pull-sdk", "cronlog serve, pull jobs, the SDK's Worker reaching ahead (handler began)"),
    ("http-w2", "cronlog serve --workers 2, HTTP jobs"),
    ("pull-w2", "cronlog serve --workers 2, pull jobs (lease granted)"),
    ("aps-memory-asyncio", "APScheduler, memory, asyncio executor, no misfire limit"),
    ("aps-memory-threads", "APScheduler, memory, 20 threads, no misfire limit"),
    ("aps-memory-defaults", "APScheduler, memory, defaults (10 threads, grace 1 s)"),
    ("aps-sqlite-asyncio", "APScheduler, SQLite (WAL), asyncio executor, no misfire limit"),
    ("aps-sqlite-threads", "APScheduler, SQLite (WAL), 20 threads, no misfire limit"),
    ("aps-sqlite-defaults", "APScheduler, SQLite, defaults (10 threads, grace 1 s)"),
    ("http-kafka", "cronlog serve on Kafka (1 broker), HTTP jobs"),
]

# For each goal, the profile that shows where its time goes and what would close it: a file
# under bench/results/ and one of its headings (``anchor`` checks that the heading is there).
NOW = (
    "The goals with the node's work divided, and where the time goes now (2026-12-03,"
    " 21:17-22:45 UTC)"
)
CLOSE = "What would close the goals still missed, now"
OUTCOMES = "The executors' outcomes answered where they are decided (2026-12-07, night)"
LEFT = "The full form after them, and what is left"
WHERE = {
    "herd-http": [("perfherd.md", OUTCOMES), ("perfherd.md", LEFT)],
    "herd-pull": [("perfherd.md", NOW), ("perfherd.md", CLOSE)],
    "sustained": [("perfherd.md", OUTCOMES), ("perfherd.md", LEFT), ("perfherd.md", CLOSE)],
    "single": [("registration-single.md", "Where the time goes now, and what would close the "
                "gaps")],
    "batch": [("registration-batch.md", "Where the time goes, and what is left"),
              ("registration-single.md", "Where the time goes now, and what would close the "
               "gaps")],
    "restart": [("memory.md", "Where a job's memory goes"),
                ("memory.md", "The goals (issue 8): 1,000,000 jobs, ≤ 1 KB per job, `/readyz` "
                 "≤ 5 s")],
    "kafka-single": [("registration-single.md", "Where an append's time goes now: the GIL, not "
                      "the broker"), ("registration-single.md", "What is left")],
    "kafka-spike": [("perfherd.md", NOW)],
}  # fmt: skip


def slug(heading: str) -> str:
    """The anchor a Markdown renderer such as GitHub's gives ``heading``: lower case, only
    letters, digits, spaces, hyphens and underscores kept, spaces made hyphens."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


@cache
def _headings(file: str) -> frozenset[str]:
    lines = (RESULTS_DIR / file).read_text().splitlines()
    return frozenset(line.lstrip("#").strip() for line in lines if line.startswith("#"))


def anchor(file: str, heading: str) -> str:
    """A link to ``heading`` of ``bench/results/<file>``; a heading that is not there (renamed,
    moved) is an error, not a dead link."""
    if heading not in _headings(file):
        raise ValueError(f"bench/results/{file} has no heading {heading!r}")
    short = re.sub(r" \(.*\)$", "", heading.split(": ")[0])  # no date, no subtitle
    return f"[{file} § {short}](results/{file}#{slug(heading)})"


def where(goal: str) -> str:
    return ", ".join(anchor(file, heading) for file, heading in WHERE[goal])


def records(name: str, run_id: str) -> list[dict[str, Any]]:
    path = RESULTS_DIR / f"{name}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("run_id") == run_id:
                out.append(record)
    return out


def latest_run() -> dict[str, Any]:
    lines = (RESULTS_DIR / "run_all.jsonl").read_text().splitlines()
    return dict(json.loads(lines[-1]))


def find_run(run_id: str) -> dict[str, Any]:
    for line in (RESULTS_DIR / "run_all.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["run_id"] == run_id:
            return dict(record)
    raise SystemExit(f"no run {run_id} in {RESULTS_DIR / 'run_all.jsonl'}")


# -- figures ---------------------------------------------------------------------------------


def dig(record: dict[str, Any], path: str) -> Any:
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def med(values: Iterable[float | None]) -> float | None:
    """The median, a missing value (a run that never finished) counting as infinitely bad."""
    xs = [math.inf if v is None else float(v) for v in values]
    if not xs:
        return None
    m = statistics.median(xs)
    return None if math.isinf(m) else m


def fmt_num(v: float | None, unit: str = "", digits: int = 0) -> str:
    if v is None:
        return "n/a"
    if math.isinf(v):
        return "never"
    return f"{v:,.{digits}f}{unit}"


def cell(values: list[float | None], unit: str = "", digits: int = 0) -> str:
    """``median (min-max)`` over the rounds; a round with no value shows as "never"."""
    if not values:
        return "—"
    xs = [math.inf if v is None else float(v) for v in values]
    m = statistics.median(xs)
    text = fmt_num(m, unit, digits)
    if len(xs) > 1:
        text += f" ({fmt_num(min(xs), '', digits)}-{fmt_num(max(xs), '', digits)})"
    return text


def loads(rs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['load_at_start'][0]:g}" for r in rs) or "—"


def column(rs: list[dict[str, Any]], path: str, scale: float = 1.0) -> list[float | None]:
    out: list[float | None] = []
    for r in rs:
        v = dig(r, path)
        out.append(None if v is None else v * scale)
    return out


# -- sections --------------------------------------------------------------------------------


def herd_table(herd: list[dict[str, Any]]) -> tuple[list[str], dict[str, list[dict[str, Any]]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in herd:
        by.setdefault(r["scenario"], []).append(r)
    lines = [
        "| scenario | N | start lag p50 | p99 | all started after | not started | CPU, cores"
        " (mean / busiest s) | registration, jobs/s | load at start, per round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label in HERD_ROWS:
        rs = by.get(key, [])
        if not rs:
            continue
        cpu = "node_cpu" if any("node_cpu" in r["figures"] for r in rs) else "peer_cpu"
        cores = "—"
        if cpu in rs[0]["figures"]:
            cores = (
                f"{cell(column(rs, f'figures.{cpu}.cores_mean'), '', 2)} / "
                f"{cell(column(rs, f'figures.{cpu}.cores_peak_1s'), '', 2)}"
            )
        reg_path = (
            "figures.registration.jobs_per_s"
            if "registration" in rs[0]["figures"]
            else "figures.peer.registration.jobs_per_s"
        )
        registration = cell(column(rs, reg_path)) if key != "floor" else "—"
        not_started = column(rs, "figures.lag.missing")
        lines.append(
            f"| {label} | {rs[0]['jobs']:,} | {cell(column(rs, 'figures.lag.p50_ms'), ' ms')} | "
            f"{cell(column(rs, 'figures.lag.p99_ms'), ' ms')} | "
            f"{cell(column(rs, 'figures.lag.all_started_after_s'), ' s', 2)} | "
            f"{cell(not_started)} | {cores} | {registration} | {loads(rs)} |"
        )
        if key.startswith("pull") and key != "pull-sdk":
            lines.append(
                f"| ↳ the same runs, claim answer received by the worker | {rs[0]['jobs']:,} | "
                f"{cell(column(rs, 'figures.lag_received.p50_ms'), ' ms')} | "
                f"{cell(column(rs, 'figures.lag_received.p99_ms'), ' ms')} | "
                f"{cell(column(rs, 'figures.lag_received.all_started_after_s'), ' s', 2)} | | | | |"
            )
    return lines, by


def goal_rows(
    by: dict[str, list[dict[str, Any]]],
    reg: dict[str, list[dict[str, Any]]],
    restarts: list[dict[str, Any]],
    searches: dict[str, list[dict[str, Any]]],
) -> list[str]:
    rows = [
        "| goal | target | measured (median) | met | where the time goes, what would close it |",
        "|---|---|---|---|---|",
    ]

    def row(
        goal: str,
        target: str,
        value: float | None,
        ok: Callable[[float], bool],
        shown: str,
        profile: str,
    ) -> None:
        met = "—" if value is None else ("yes" if ok(value) else "**no**")
        rows.append(f"| {goal} | {target} | {shown} | {met} | {where(profile)} |")

    floor = med(column(by.get("floor", []), "figures.lag.all_started_after_s"))
    http = med(column(by.get("http", []), "figures.lag.all_started_after_s"))
    for key, how in (("http", ""), ("http-w2", ", --workers 2")):
        took = med(column(by.get(key, []), "figures.lag.all_started_after_s"))
        if floor and by.get(key):
            ratio = None if took is None else took / floor
            row(f"HTTP herd{how}: every call started within 1.5 x the floor", "≤ 1.5 x", ratio,
                lambda v: v <= 1.5,
                f"{fmt_num(took, ' s', 2)} vs floor {fmt_num(floor, ' s', 2)} = "
                f"{fmt_num(ratio, ' x', 2)}", "herd-http")  # fmt: skip
    if by.get("http-w2"):
        cores = med(column(by["http-w2"], "figures.node_cpu.cores_mean"))
        row("HTTP herd, --workers 2: the node's processes use the cores (mean over the herd)",
            "≥ 1.7 cores", cores, lambda v: v >= 1.7, fmt_num(cores, " cores", 2),
            "herd-http")  # fmt: skip
    for key, how in (
        ("pull-sdk", ", the SDK's Worker reaching ahead (the goal's form)"),
        ("pull", ", workers claiming at the slot"),
        ("pull-w2", ", --workers 2, workers claiming at the slot"),
    ):
        if by.get(key):
            pull = med(column(by[key], "figures.lag.p99_ms"))
            row(f"pull herd{how}: p99 start lag (issue 22; the seeds ask 1 s)", "≤ 500 ms",
                pull, lambda v: v <= 500, fmt_num(pull, " ms"), "herd-pull")  # fmt: skip
    for kind, target in (("http", 2000), ("pull", 5000)):
        rs = searches.get(f"sustained-{kind}", [])
        if rs:
            best = med(column(rs, "highest_holding_per_s"))
            shown = (
                fmt_num(best, "/s") if best else f"below {rs[0]['rates'][0]:,}/s (the lowest step)"
            )
            row(f"sustained {kind} runs/s with p99 ≤ 100 ms", f"≥ {target:,}/s", best,
                partial(operator.le, float(target)), shown, "sustained")  # fmt: skip
    single = reg.get("register-single", [])
    bare = reg.get("register-bare-starlette", [])
    if single and bare:
        ratios = [
            s["figures"]["ok_per_s"] / b["figures"]["ok_per_s"]
            for s, b in zip(single, bare, strict=False)
            if b["figures"]["ok_per_s"]
        ]
        ratio = med(ratios)
        row("registration, single requests, vs bare Starlette", "≥ 0.8 x", ratio,
            lambda v: v >= 0.8, fmt_num(ratio, " x", 2), "single")  # fmt: skip
    batch = reg.get("register-batch", [])
    if batch:
        rate = med(column(batch, "figures.jobs_per_s"))
        row("registration through the batch endpoint", "≥ 20,000 jobs/s", rate,
            lambda v: v >= 20000, fmt_num(rate, " jobs/s"), "batch")  # fmt: skip
    else:
        rows.append("| registration through the batch endpoint | ≥ 20,000 jobs/s | no batch"
                    f" endpoint served | **no** | {where('batch')} |")  # fmt: skip
    if restarts:
        jobs = restarts[0]["jobs"]
        ready = med(column(restarts, "figures.ready_s"))
        per_job = med(column(restarts, "figures.bytes_per_job"))
        row(f"restart with {jobs:,} jobs: /readyz", "≤ 5 s", ready, lambda v: v <= 5,
            fmt_num(ready, " s", 2), "restart")  # fmt: skip
        row(f"restart with {jobs:,} jobs: memory per job (RSS / jobs)", "≤ 1 KB", per_job,
            lambda v: v <= 1024, fmt_num(per_job, " B"), "restart")  # fmt: skip
    kafka_reg = reg.get("register-single-kafka", [])
    if kafka_reg:
        rate = med(column(kafka_reg, "figures.ok_per_s"))
        row("Kafka: registration", "≥ 2,000 jobs/s", rate, lambda v: v >= 2000,
            fmt_num(rate, " jobs/s"), "kafka-single")  # fmt: skip
    kafka = by.get("http-kafka", [])
    if kafka and by.get("http"):
        k = med(column(kafka, "figures.lag.all_started_after_s"))
        ratio = None if k is None or not http else k / http
        same_n = kafka[0]["jobs"] == by["http"][0]["jobs"]
        row("Kafka: the spike within 2 x embedded (all started after)", "≤ 2 x", ratio,
            lambda v: v <= 2,
            f"{fmt_num(k, ' s', 2)} vs {fmt_num(http, ' s', 2)} = {fmt_num(ratio, ' x', 2)}"
            + ("" if same_n else f" (N {kafka[0]['jobs']:,} vs {by['http'][0]['jobs']:,})"),
            "kafka-spike",
        )  # fmt: skip
    rows += scaleout_rows()
    return rows


def scaleout_rows() -> list[str]:
    """The scale-out goal from the latest full run of :mod:`bench.scaleout` (run apart from
    run_all: it starts its own broker and nodes), linked to the report that run wrote."""
    from bench import scaleout

    path = RESULTS_DIR / "scaleout.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    full = [r for r in rows if r.get("form") == "full"]
    if not full:
        return []
    run_id = full[-1]["run_id"]
    mine = [r for r in full if r["run_id"] == run_id]
    ratio = med(scaleout.ratios(mine, 1, 3))
    if ratio is None:
        return []
    words = shlex.split(mine[0]["command"])
    at = words.index("--out") + 1 if "--out" in words else len(words)
    file = Path(words[at]).name if at < len(words) else "scaleout.md"
    history = mine[0].get("history_on", "every-node")
    met = "yes" if ratio <= 1.25 else "**no**"
    heading = "Scale-out: the same steady workload on 1 and 3 Kafka nodes (issue 21)"
    return [
        f"| scale-out: 3 Kafka nodes' CPU per 1,000 runs over 1 node's (--history-on {history},"
        f" run {run_id}) | ≤ 1.25 x | {ratio:.2f} x | {met} | {anchor(file, heading)} |"
    ]


# What the profiles of the run path show, and what would close the goals it still misses; kept
# by hand beside the figures of the latest side-by-side run (bench/results/perfherd.md has the
# profiles and the measurements behind it).
RUN_PATH_NOTES = """\
This table is the comparison that judged materialising runs a lead time ahead (the baseline,
9bb7e51, is the commit before it; 2 rounds, builds taking turns going first, load 0.5-1.6).
The full run above, at the goals' sizes on a machine running nothing else, has the figures of
main as it is now: the HTTP herd's every call after 13.5 s against the floor's 6.35 s (2.13 x;
12.8 s on `--workers 2`), the pull herd's p99 6.2 s.

Where the time goes now, from profiles taken right after that run, and what would close each
goal still missed: {now}.
In short: leases granted and calls armed ahead of the slot, and completions in batches, took
the HTTP herd from 16.4 s to 13.5 s and sustained HTTP from 500 to 3,000 runs a second; two
worker processes use both cores (1.74) but shorten the HTTP herd by 5 % only, because one
process with its executor process already used 1.65. What is left is work a run: the read
model's scans and commits, the executors' bookkeeping, and at steady pull rates batches of
few runs (a linger on each hop, issue 22)."""


def run_path_section() -> list[str]:
    """The latest ``bench.side_by_side`` run's table and the notes on the run path."""
    from bench import side_by_side

    path = RESULTS_DIR / "side_by_side.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    rows = side_by_side.latest([json.loads(line) for line in lines if line.strip()])
    if not rows:
        return []
    rounds = max(len(rs) for rs in rows.values())
    first = min(r["timestamp"] for rs in rows.values() for r in rs)
    return [
        "",
        "## The run path, side by side with a baseline",
        "",
        f"`python -m bench.side_by_side` from {first}: this checkout against a baseline checkout"
        " (`--baseline`), interleaved round by round; medians of the rounds. Herd: HTTP jobs due"
        " in one second, lag = arrival at the recorder - slot; sustained: one step of the rate,"
        " a fresh node each (pull: lease granted - slot). Node CPU: the node and its children"
        " over the window, and (in brackets) its main process alone.",
        "",
        side_by_side.table(rows, rounds, load_now=False).rstrip(),
        "",
        RUN_PATH_NOTES.format(now=anchor("perfherd.md", NOW)),
    ]


def write(run_id: str | None = None) -> Path:
    run = find_run(run_id) if run_id else latest_run()
    run_id = run["run_id"]
    herd = records("herd_serve", run_id)
    reg_records = records("registration", run_id)
    restarts = records("restart", run_id)
    steps = records("sustained", run_id)
    search_records = records("sustained_search", run_id)
    reg: dict[str, list[dict[str, Any]]] = {}
    for r in reg_records:
        reg.setdefault(r["scenario"], []).append(r)
    searches: dict[str, list[dict[str, Any]]] = {}
    for r in search_records:
        searches.setdefault(r["scenario"], []).append(r)
    every = herd + reg_records + restarts + steps
    worst = max((r["load_at_start"][0] for r in every), default=0.0)
    m = run["machine"]
    plan = run["plan"]
    herd_lines, by = herd_table(herd)
    out = [
        "# cronlog benchmarks: results",
        "",
        f"Generated by `python -m bench.report` from run `{run_id}` ({plan['form']} form, "
        f"{plan['repeat']} rounds, {run['started']} to {run['ended']}). Every figure is the "
        "median of the rounds, with their range in brackets; the rounds ran every scenario in "
        "turn, so a noisy minute fell on all of them alike.",
        "",
    ]
    began = run["load_at_start"][0]
    if worst > QUIET_LOAD:
        # A run is judged by the load it began at (the full form refuses to begin above
        # QUIET_LOAD): past that, the 1-minute average also counts the run's own last minute.
        verdict = (
            f"It began on a quiet machine ({began:g}; the full form refuses to begin above "
            f"{QUIET_LOAD:g}): the average trails by a minute and counts the run's own work just "
            f"done, a sustained step keeping both cores busy for {plan['window_s']} s."
            if began <= QUIET_LOAD
            else f"It began at {began:g}, on a machine shared with other work: these figures "
            "show that the instrument works and roughly where cronlog stands; judge the goals "
            f"only by a run that begins below {QUIET_LOAD:g}."
        )
        out += [
            f"> **Load:** the 1-minute load average reached {worst:g} at the start of a scenario"
            f" run on this {m['cores']}-core machine. {verdict} Each scenario's loads are listed"
            " at the end.",
            "",
        ]
    if plan["form"] != "full":
        out += [
            "> **Short form:** smaller sizes than the goals name (see the N column); the goals' "
            "verdicts below apply to these sizes only.",
            "",
        ]
    out += ["## Goals (issue 8)", ""]
    out += goal_rows(by, reg, restarts, searches)
    out += [
        "",
        "## The midnight herd: N jobs due in the same second",
        "",
        "Start lag = when the call reached the recorder (a separate process) - the slot; for "
        "pull jobs, when the node granted the lease - the slot (and, below it, when the claim's "
        "answer reached the worker). A run not started by the end counts as infinitely late "
        '("never"). CPU: user + system time of the node process and its children (or of the '
        "APScheduler process), from /proc, over the window from the slot to the last start, in "
        "cores; the machine has "
        f"{m['cores']}.",
        "",
        *herd_lines,
        "",
    ]
    aps_notes = []
    for key, _ in HERD_ROWS:
        for r in by.get(key, []):
            peer = r["figures"].get("peer", {})
            if peer.get("missed") or peer.get("max_instances_skipped"):
                aps_notes.append(
                    f"- {key}, round {r.get('round')}: {peer.get('missed', 0):,} of "
                    f"{r['jobs']:,} runs missed (APScheduler's `EVENT_JOB_MISSED`: dropped "
                    "without running, logged at WARNING only)"
                )
    if aps_notes:
        out += ["APScheduler dropped runs:", "", *aps_notes, ""]
    for store in ("memory", "sqlite"):
        tuned = {
            k: med(column(v, "figures.lag.all_started_after_s"))
            for k, v in by.items()
            if k.startswith(f"aps-{store}-") and not k.endswith("-defaults")
        }
        done = {k: v for k, v in tuned.items() if v is not None}
        if done:
            best = min(done, key=lambda k: done[k])
            out += [f"APScheduler's best on {store} in this run: `{best}` (every run started"
                    f" after {done[best]:.2f} s, median).", ""]  # fmt: skip
    out += [
        "APScheduler's job store on SQLite takes one transaction a job, so its N is smaller: "
        + ", ".join(f"{k} {v:,}" for k, v in plan["aps_jobs"].items())
        + ".",
        "",
        "## Sustained load: the highest rate holding p99 start lag ≤ 100 ms",
        "",
        f"Each step: a fresh node, R interval jobs of 1 s spread over the second, "
        f"{plan['window_s']} s measured after a 3 s warm-up; the search stops at the first "
        "rate that does not hold.",
        "",
        "| kind | highest rate holding, per round | median | p99 at each rate (median over "
        "the rounds that reached it) |",
        "|---|---|---|---|",
    ]
    for kind in ("http", "pull"):
        rs = searches.get(f"sustained-{kind}", [])
        if not rs:
            continue
        per_rate: dict[str, list[float | None]] = {}
        for r in rs:
            for rate, p99 in r["p99_by_rate"].items():
                per_rate.setdefault(rate, []).append(p99)
        p99s = "; ".join(
            f"{int(rate):,}/s: "
            + (fmt_num(med(v), " ms") if med(v) is not None else "over 1 % never started")
            for rate, v in per_rate.items()
        )
        highest = ", ".join(f"{r['highest_holding_per_s']:,}" for r in rs)
        out.append(
            f"| {kind} | {highest} | {fmt_num(med(column(rs, 'highest_holding_per_s')), '/s')} |"
            f" {p99s} |"
        )
    out += [
        "",
        "## Registration: POST /v1/jobs, 64 at a time",
        "",
        "| target | requests answered 2xx per second | tool | latency p99 (last round) |"
        " load at start, per round |",
        "|---|---|---|---|---|",
    ]
    for key, label in (
        ("register-single", "cronlog serve, embedded, one job a request"),
        ("register-batch", "cronlog serve, embedded, batch endpoint (jobs/s)"),
        ("register-bare-starlette", "bare Starlette endpoint, same uvicorn settings"),
        ("register-single-kafka", "cronlog serve on Kafka, one job a request"),
        ("register-batch-kafka", "cronlog serve on Kafka, batch endpoint (jobs/s)"),
    ):
        rs = reg.get(key, [])
        if not rs:
            continue
        path = "figures.jobs_per_s" if "batch" in key else "figures.ok_per_s"
        out.append(
            f"| {label} | {cell(column(rs, path))} | {rs[-1]['figures']['tool']} | "
            f"{rs[-1]['figures'].get('latency_p99') or '—'} | {loads(rs)} |"
        )
    if restarts:
        f0 = restarts[0]["figures"]
        out += [
            "",
            f"## Restart with {restarts[0]['jobs']:,} jobs",
            "",
            f"Built once ({f0['built'].get('via')}); each round starts `cronlog serve` on it and "
            "times from the process start to the first 200 from `/readyz`; RSS is the node's "
            "(with its children) at ready or 5 s later, whichever is larger. The goal's own size,"
            " 1,000,000 jobs, takes minutes to build: its side-by-side rounds and profiles are in"
            " [results/memory.md](results/memory.md) (`python -m bench.restart --jobs 1000000`).",
            "",
            "| /readyz after | RSS | per job | per job over an empty node | empty node: ready, RSS"
            " | data on disk | load at start, per round |",
            "|---|---|---|---|---|---|---|",
            f"| {cell(column(restarts, 'figures.ready_s'), ' s', 2)} | "
            f"{cell(column(restarts, 'figures.rss_mb'), ' MB')} | "
            f"{cell(column(restarts, 'figures.bytes_per_job'), ' B')} | "
            f"{cell(column(restarts, 'figures.bytes_per_job_over_empty'), ' B')} | "
            f"{cell(column(restarts, 'figures.empty_node.ready_s'), ' s', 2)}, "
            f"{cell(column(restarts, 'figures.empty_node.rss_mb'), ' MB')} | "
            f"{fmt_num(f0.get('disk_mb'), ' MB')} | {loads(restarts)} |",
        ]
    out += run_path_section()
    for extra in EXTRA_SECTIONS:  # analyses of benchmarks run on their own, kept by hand
        section = RESULTS_DIR / extra
        if section.exists():
            out += ["", *section.read_text().rstrip().splitlines()]
    out += [
        "",
        "## How to run",
        "",
        "```sh",
        ".venv/bin/pip install -e '.[test,bench]'       # APScheduler and SQLAlchemy for the peer",
        ".venv/bin/python -m bench.run_all --short      # about 10 minutes here; any load",
        ".venv/bin/python -m bench.run_all              # full form: 50 min here; not above load 2",
        "```",
        "",
        f"This run: `{run['command']}`. Each part alone (each appends to `bench/results/`):",
        "",
        "```sh",
        "python -m bench.herd_serve --jobs 50000 --only floor,http,pull,aps-memory-threads",
        "python -m bench.herd_serve --jobs 50000 --only http --kafka   # on a broker of its own",
        "python -m bench.sustained --kind http --rates 250,500,1000,2000,3000 --window-s 60",
        "python -m bench.sustained --kind pull --rates 500,1000,2500,5000,7500 --window-s 60",
        "python -m bench.registration --seconds 15",
        "python -m bench.restart --jobs 1000000 --restarts 3",
        "python -m bench.report [--run-id ID]                  # rewrite this file",
        "python -m bench.side_by_side --baseline /tmp/base     # the run path against a checkout",
        "python -m bench.herd_serve --jobs 50000 --only http,pull --profile  # where the node's"
        " CPU goes (py-spy)",
        "```",
        "",
        "## The machine",
        "",
        f"- {m['cores']} cores, {m['cpu']}, {m['ram_gib']} GiB RAM, Linux {m['kernel']}, "
        f"Python {m['python']}",
        "- packages: "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
        + "; not installed: "
        + (", ".join(k for k, v in m["packages"].items() if not v) or "none"),
        f"- load generator: {m.get('wrk') or 'wrk not installed (bench.post_load instead)'}",
        "- `cronlog serve` extra arguments (`CRONLOG_BENCH_SERVE_ARGS`): "
        + (f"`{' '.join(m['serve_args'])}`" if m.get("serve_args") else "none (the defaults)"),
        f"- cronlog at commit {m.get('commit')}"
        + (" (with uncommitted changes)" if m.get("dirty") else ""),
        f"- 1-minute load average when the run began: {run['load_at_start'][0]:g} "
        f"(5 and 15 min: {run['load_at_start'][1]:g}, {run['load_at_start'][2]:g})",
        "",
        "## Load average at the start of each scenario run",
        "",
        "| scenario | round | load (1, 5, 15 min) |",
        "|---|---|---|",
    ]
    for r in sorted(every, key=lambda r: r["timestamp"]):
        name = r["scenario"] + (f" {r['rate']}/s" if "rate" in r else "")
        out.append(f"| {name} | {r.get('round', '')} | {', '.join(map(str, r['load_at_start']))} |")
    if run.get("failures"):
        out += ["", "## Scenario runs that failed", ""]
        out += [f"- {f['what']}, round {f['round']}: {f['error']}" for f in run["failures"]]
    OUT.write_text("\n".join(out) + "\n")
    return OUT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-id")
    print(write(parser.parse_args().run_id))


if __name__ == "__main__":
    main()
