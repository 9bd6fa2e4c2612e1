"""The run path's scenarios, this checkout against a baseline checkout, interleaved round by round
so a noisy minute of a shared machine falls on both alike.

    python -m bench.side_by_side --baseline SRC [--rounds 4] [--herd-jobs 2000]
        [--http-rates 1000] [--pull-rates 1000,2500] [--window-s 5] [--no-pull-herd]
        [--settle-s 35]

``SRC`` is a checkout of another commit (``git worktree add --detach /tmp/base main``); its
``cronlog serve`` runs under this interpreter from that directory (``CRONLOG_BENCH_SOURCE``),
measured by this checkout's benchmarks. Each round runs, in turn: the floor (a bare aiohttp
client, :mod:`bench.floor`), the HTTP herd of ``--herd-jobs`` (:mod:`bench.herd_serve`) on the
baseline and on this checkout, then the pull herd of as many (lag = lease granted - slot)
on both, and each sustained rate (:mod:`bench.sustained`, one step of
``--window-s``) on both. The builds take turns going first (baseline first in odd rounds,
this checkout first in even ones): the second of two herds in a row started its calls later
in 8 rounds of 9 on 2026-12-01, whichever build it was, so an even number of rounds gives
each build the same share of second places. Every record is appended to
``bench/results/side_by_side.jsonl`` with its ``build``, and the medians are printed as a
Markdown table at the end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import herd_serve, sustained
from bench.common import ROOT, Recorder, append_result, loadavg, log


def _commit(source: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True, text=True
    ).stdout.strip()


@contextmanager
def _built_from(source: Path | None) -> Iterator[None]:
    before = os.environ.pop("CRONLOG_BENCH_SOURCE", None)
    if source is not None:
        os.environ["CRONLOG_BENCH_SOURCE"] = str(source)
    try:
        yield
    finally:
        os.environ.pop("CRONLOG_BENCH_SOURCE", None)
        if before is not None:
            os.environ["CRONLOG_BENCH_SOURCE"] = before


def _median(values: list[float | None], missing_is_never: bool = False) -> float | None:
    """The median; a missing lag (too many runs never started) counts as infinitely late."""
    if missing_is_never:
        present = [float("inf") if v is None else v for v in values]
    else:
        present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--herd-jobs", type=int, default=2000)
    parser.add_argument("--http-rates", default="1000")
    parser.add_argument("--pull-rates", default="1000,2500")
    parser.add_argument("--window-s", type=int, default=5)
    parser.add_argument("--no-pull-herd", action="store_true", help="the HTTP herd only")
    parser.add_argument("--settle-s", type=float, default=herd_serve.SETTLE_S)
    args = parser.parse_args()
    builds: dict[str, Path | None] = {
        f"baseline@{_commit(args.baseline)}": args.baseline.resolve(),
        f"this@{_commit(ROOT)}": None,
    }
    rates = [("http", int(r)) for r in args.http_rates.split(",") if r] + [
        ("pull", int(r)) for r in args.pull_rates.split(",") if r
    ]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    run = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"

    def note(scenario: str, build: str, record: dict[str, Any]) -> None:
        record.update(
            {"bench": "side_by_side", "build": build, "sbs_run": run, "sbs_label": scenario}
        )
        append_result("side_by_side", record)
        rows.setdefault((scenario, build), []).append(record)

    with tempfile.TemporaryDirectory(prefix="cronlog-sbs-") as tmp, Recorder() as recorder:
        for n in range(args.rounds):
            log(f"round {n + 1} of {args.rounds}")
            floor = herd_serve.run_scenario("floor", recorder, args.herd_jobs, Path(tmp))
            note("floor", "-", floor)
            order = list(builds.items())
            if n % 2:
                order.reverse()
            herds = ["http"] if args.no_pull_herd else ["http", "pull"]
            for herd in herds:
                for build, source in order:
                    with _built_from(source):
                        record = herd_serve.run_scenario(
                            herd, recorder, args.herd_jobs, Path(tmp), settle_s=args.settle_s
                        )
                    log(f"{build}: {herd_serve.describe(record)}")
                    note(f"herd {herd}", build, record)
            for kind, rate in rates:
                for build, source in order:
                    try:
                        with _built_from(source):
                            record = sustained.step(
                                kind,
                                rate,
                                args.window_s,
                                Path(tmp),
                                recorder if kind == "http" else None,
                            )
                    except (RuntimeError, subprocess.SubprocessError) as err:
                        # a step that could not finish (its workers never drained, say) is a
                        # step that did not hold: its runs count as never started
                        log(f"{build}: sustained {kind} {rate}/s failed: {err!r}")
                        record = {"load_at_start": loadavg(), "error": repr(err)[:500],
                                  "figures": {"lag": {}}}  # fmt: skip
                    lag = record["figures"]["lag"]
                    log(f"{build}: sustained {kind} {rate}/s p99 {lag.get('p99_ms')} ms")
                    note(f"sustained {kind} {rate}/s", build, record)
    print(table(rows, args.rounds))


def latest(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The records of the latest side-by-side run, by (scenario, build), in their order."""
    ours = [r for r in records if r.get("bench") == "side_by_side" and r.get("sbs_run")]
    if not ours:
        return {}
    run = max(r["sbs_run"] for r in ours)
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in ours:
        if r["sbs_run"] == run:
            rows.setdefault((r["sbs_label"], r["build"]), []).append(r)
    return rows


def table(
    rows: dict[tuple[str, str], list[dict[str, Any]]], rounds: int, *, load_now: bool = True
) -> str:
    """Medians over the rounds: start lag p50/p99, all started after, the node's CPU (all of
    it, and its main process), and the 1-minute load at each run's start."""

    def col(records: list[dict[str, Any]], get: Callable[[dict[str, Any]], Any]) -> Any:
        return _median([get(r) for r in records])

    def lag(records: list[dict[str, Any]], name: str) -> Any:
        value = _median([r["figures"]["lag"].get(name) for r in records], missing_is_never=True)
        return "never" if value == float("inf") else value

    lines = [
        f"| scenario | build | p50 ms | p99 ms | all started after s | node CPU s "
        f"(main process) | load at start, per round ({rounds} rounds) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (scenario, build), records in rows.items():
        cpu = col(records, lambda r: (r["figures"].get("node_cpu") or {}).get("cpu_s"))
        main = col(records, lambda r: (r["figures"].get("node_cpu") or {}).get("main_cpu_s"))
        loads = ", ".join(str(r["load_at_start"][0]) for r in records)
        lines.append(
            f"| {scenario} | {build} | {lag(records, 'p50_ms')} | {lag(records, 'p99_ms')}"
            f" | {lag(records, 'all_started_after_s')}"
            f" | {cpu if cpu is not None else '—'} ({main if main is not None else '—'})"
            f" | {loads} |"
        )
    if not load_now:
        return "\n".join(lines) + "\n"
    return "\n".join(lines) + f"\n\nload average when the table was printed: {loadavg()}\n"


if __name__ == "__main__":
    main()
