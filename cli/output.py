"""How the command line shows what the API answered: tables for people, JSON or YAML for
programs.

``-o table`` (the default on a terminal) draws a table per listing and a two-column table per
object; ``-o json`` (the default when standard output is not a terminal, so ``cronlog jobs list
| jq`` just works) prints the API's own JSON; ``-o yaml`` the same as YAML. Instants are shown
as the API writes them (RFC 3339, UTC); a table, being for reading, shows them to the second,
never breaks an id or an instant over lines, cuts a long error to the line and folds the rest.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import msgspec

FORMATS = ("table", "json", "yaml")

Column = tuple[str, Callable[[dict[str, Any]], Any]]


def builtins(value: Any) -> Any:
    """A model (or a list of them) as plain JSON-able values, instants as the API writes them."""
    return _instants(msgspec.to_builtins(value, builtin_types=(dt.datetime,)))


def _instants(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return instant(value)
    if isinstance(value, dict):
        return {k: _instants(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_instants(v) for v in value]
    return value


def instant(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def default_format(stream: TextIO | None = None) -> str:
    return "table" if (stream or sys.stdout).isatty() else "json"


def show(
    value: Any,
    fmt: str,
    columns: Sequence[Column] | None = None,
    *,
    key: str | None = None,
    out: TextIO | None = None,
) -> None:
    """Print ``value`` (a model, a page, or a list) in ``fmt``. ``key`` names the list inside a
    page (``jobs``, ``runs``) shown as rows with ``columns``; without columns an object is shown
    as fields and values."""
    out = out or sys.stdout
    data = builtins(value)
    if fmt == "json":
        out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        return
    if fmt == "yaml":
        import yaml

        out.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        return
    rows = data.get(key) if key is not None and isinstance(data, dict) else data
    if columns is not None and isinstance(rows, list):
        _table(rows, columns, out)
        if isinstance(data, dict) and data.get("next_cursor"):
            out.write(f"more: --cursor {data['next_cursor']}\n")
        return
    _fields(data, out)


def _console(out: TextIO) -> Any:
    from rich.console import Console

    return Console(file=out, soft_wrap=False, highlight=False)


# Columns whose values are copied into the next command (ids) or compared down the page
# (instants): a broken one is useless, so they keep their whole width and the others give way.
WHOLE = frozenset(
    {
        "JOB",
        "RUN",
        "SCHEDULED FOR",
        "STARTED",
        "NEXT RUN",
        "AT",
        "UTC",
        "LOCAL",
        "SLOT",
        "LEASE UNTIL",
    }
)
ONE_LINE = frozenset({"ERROR"})  # cut to what fits: `runs get RUN` shows it whole
_INSTANT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{3}Z")


def _table(rows: list[dict[str, Any]], columns: Sequence[Column], out: TextIO) -> None:
    from rich.table import Table

    console = _console(out)
    cells = [[_table_cell(pick(row)) for _, pick in columns] for row in rows]
    widths = [max([len(name), *(len(r[i]) for r in cells)]) for i, (name, _) in enumerate(columns)]
    # The others need at least their header's width; where that leaves no room for the whole
    # ids and instants (a narrow terminal), every column folds alike.
    least = [
        w if name in WHOLE else min(w, len(name))
        for (name, _), w in zip(columns, widths, strict=True)
    ]
    pin = sum(least) + 2 * (len(columns) - 1) <= console.width
    table = Table(box=None, pad_edge=False, header_style="bold")
    for i, (name, _) in enumerate(columns):
        if name in WHOLE and pin:
            table.add_column(name, no_wrap=True, min_width=widths[i])
        elif name in ONE_LINE:
            # What the other columns leave of the line (2 between columns), at least a word.
            others = sum(w + 2 for j, w in enumerate(widths) if j != i)
            room = max(len(name), min(widths[i], console.width - others))
            table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=room)
        else:
            table.add_column(name, overflow="fold", min_width=min(widths[i], len(name)))
    for row_cells in cells:
        table.add_row(*row_cells)
    console.print(table)
    if not rows:
        out.write("(none)\n")


def _table_cell(value: Any) -> str:
    """A value as a table shows it: an instant to the second (the JSON has its milliseconds)."""
    return _INSTANT.sub(r"\1Z", _cell(value))


def _fields(data: Any, out: TextIO) -> None:
    from rich.table import Table

    if not isinstance(data, dict):
        out.write(f"{_cell(data)}\n")
        return
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in data.items():
        table.add_row(name, _cell(value))
    _console(out).print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def target_text(target: Any) -> str:
    if isinstance(target, dict):
        kind = target.get("type")
        if kind == "http":
            return str(target.get("url"))
        if kind == "kafka":
            return f"kafka://{target.get('topic')}"
        if kind == "pull":
            return f"pull://{target.get('pool')}"
    return str(target)


def when_text(job: dict[str, Any]) -> str:
    if job.get("schedule"):
        seconds = f" (s {job['seconds']})" if job.get("seconds") else ""
        return f"{job['schedule']}{seconds} {job.get('timezone', '')}".strip()
    if job.get("run_at"):
        return f"at {job['run_at']}"
    if job.get("interval_sec"):
        return f"every {job['interval_sec']:g} s"
    if job.get("depends_on"):
        return "after " + ",".join(job["depends_on"])
    return "-"


JOB_COLUMNS: list[Column] = [
    ("JOB", lambda j: j["job_id"]),
    ("NAME", lambda j: j["name"]),
    ("STATUS", lambda j: j["status"]),
    ("WHEN", when_text),
    ("NEXT RUN", lambda j: j.get("next_fire_at") or j.get("next_run_at")),
    ("TARGET", lambda j: target_text(j["target"])),
    ("TAGS", lambda j: ",".join(j.get("tags") or [])),
]
BATCH_COLUMNS: list[Column] = [
    ("#", lambda r: r["index"]),
    ("STATUS", lambda r: r["status"]),
    ("JOB", lambda r: r.get("job_id")),
    ("FIELD", lambda r: (r.get("error") or {}).get("field")),
    ("ERROR", lambda r: (r.get("error") or {}).get("message", "")[:80] or None),
]
RUN_COLUMNS: list[Column] = [
    ("RUN", lambda r: r["run_id"]),
    ("STATE", lambda r: r["state"]),
    ("ATTEMPT", lambda r: r["attempt"]),
    ("SCHEDULED FOR", lambda r: r["scheduled_for"]),
    ("LATE MS", lambda r: r["lateness_ms"]),  # started: the slot and this much later
    ("ERROR", lambda r: r["error"] or None),
]
CLAIM_COLUMNS: list[Column] = [
    ("RUN", lambda r: r["run_id"]),
    ("ATTEMPT", lambda r: r["attempt"]),
    ("FENCING TOKEN", lambda r: r["fencing_token"]),
    ("LEASE UNTIL", lambda r: r["lease_expires_at"]),
    ("IDEMPOTENCY KEY", lambda r: r["idempotency_key"]),
]
FIRE_COLUMNS: list[Column] = [
    ("UTC", lambda f: f["at"]),
    ("LOCAL", lambda f: f["local"]),
]
SLOT_COLUMNS: list[Column] = [
    ("SLOT", lambda s: s["scheduled_for"]),
    ("RUN", lambda s: s["run_id"]),
    ("STATE", lambda s: s["state"] or ("to trigger" if s["due"] else "future")),
]


def show_stats(stats: Any, out: TextIO | None = None) -> None:
    """``cronlog stats`` as a table: the steps in which anything happened, then the window's
    totals, then the runs by state now. A quiet step is a row of zeros: counted, not shown."""
    out = out or sys.stdout
    data = builtins(stats)
    points = data["points"]
    busy = [p for p in points if any(p[name] for name in _ACTIVITY)]
    total = {**data["total"], "at": "total"}
    _table([*busy, total], STATS_COLUMNS, out)
    quiet = len(points) - len(busy)
    step = data["step_min"]
    out.write(
        f"{data['since']} to {data['until']}, {len(points)} steps of {step} min"
        + (f" ({quiet} without a run not shown)" if quiet else "")
        + "\n"
    )
    states = ", ".join(f"{n} {s}" for s, n in data["runs_by_state"].items() if n)
    out.write(f"runs now: {states or 'none'}\n")


def show_team(team: Any, out: TextIO | None = None) -> None:
    """``cronlog team`` as a table: the team, its jobs, then one limit a row."""
    out = out or sys.stdout
    data = builtins(team)
    limits = data.pop("limits", {}) or {}
    quota = limits.get("max_jobs")
    data["jobs"] = f"{data['jobs']} of {quota} allowed" if quota else data["jobs"]
    _fields(data, out)
    out.write("limits:\n")
    _table([{"limit": k, "value": v} for k, v in limits.items()], _LIMIT_COLUMNS, out)


_ACTIVITY = ("started", "succeeded", "failed", "retried", "dead", "cancelled", "skipped")
_LIMIT_COLUMNS: list[Column] = [
    ("  LIMIT", lambda x: "  " + x["limit"]),
    ("VALUE", lambda x: x["value"]),
]
STATS_COLUMNS: list[Column] = [
    ("AT", lambda p: p["at"]),
    ("STARTED", lambda p: p["started"]),
    ("DELAY P50 MS", lambda p: p["delay_p50_ms"]),
    ("DELAY P99 MS", lambda p: p["delay_p99_ms"]),
    ("SUCCEEDED", lambda p: p["succeeded"]),
    ("FAILED", lambda p: p["failed"]),
    ("DEAD", lambda p: p["dead"]),
    ("SKIPPED", lambda p: p["skipped"]),
]
