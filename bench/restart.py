"""Restart with many jobs: how long ``cronlog serve`` takes to answer ``/readyz`` 200 on a data
directory holding ``--jobs`` jobs, and the memory it holds per job.

    python -m bench.restart [--jobs 1000000] [--restarts 3] [--data-dir DIR] [--baseline SRC]

The data directory is built once, fast: through the node's batch endpoint when it serves one
(``cronlog serve``, 4 requests at once), else by a :class:`~node.node.Node` in this process on
the embedded log, writing what ``cronlog serve`` reads (``DIR/log``, ``DIR/node``; 8
partitions). The jobs: 100 teams of ``jobs / 100`` each, HTTP targets with a small payload, cron
schedules at spread times of leap days only (so the wheel holds distinct far slots and nothing
fires). Then each restart starts ``cronlog serve`` on it and times from the process start to
the first 200 from ``/readyz``; the node's RSS is read then and 5 s later (the larger is kept
as ``rss_mb``; both are recorded, and the peak).
An empty node's RSS, measured the same way, gives the memory per job beside the total per job.

``--data-dir`` keeps the built directory (and reuses one already built with the same count).
``--baseline SRC`` (a checkout of another commit, e.g. ``git archive main | tar -x -C SRC``)
restarts that cronlog on the same directory in each round too, right after this one: before
and after side by side, under the same load. Its figures are recorded under ``baseline``.
``--baseline-data-dir DIR`` is for a baseline that stores its state in an earlier format: the
baseline builds the data directory, a copy of it in ``DIR`` is the baseline's, and this build
upgrades the original in place at its first start (that start is recorded apart, with
``"upgrade": true``), as a node upgraded in place would.
Appends one JSON line per restart to bench/results/restart.jsonl.

The nodes run from compiled bytecode, as an installed cronlog does (``pip install`` and the
image compile it): an environment that sets ``PYTHONDONTWRITEBYTECODE`` (this machine's does)
would have every start compile cronlog's sources again, about 0.2 s of CPU a start that no
installed node spends. The bytecode is kept under the run's temporary directory
(``PYTHONPYCACHEPREFIX``), and each build starts once on an empty directory before the rounds
(not recorded) to fill it. ``--compile-each-start`` measures as before (records say which:
``"bytecode_cached"``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    Serve,
    append_result,
    find_batch_endpoint,
    loadavg,
    log,
    own_cpu_seconds,
    register,
    rss_bytes,
    stamp,
)

PARTITIONS = 8
TEAMS = 100
CHUNK = 2000
SETTLE_S = 5.0
BUILT = "bench-built-jobs"


def job_fields(i: int) -> dict[str, Any]:
    return {
        "name": f"nightly export {i}",
        "schedule": f"{i % 60} {i // 60 % 24} 29 2 *",
        "target": f"http://127.0.0.1:9/hooks/{i % 1000}",
        "payload": {"n": i, "report": "daily"},
    }


async def _build_in_process(data_dir: Path, jobs: int) -> None:
    from core.commands import PutJob
    from core.ids import log_job_id
    from core.jobs import HttpTarget, JobSpec
    from eventlog.embedded import EmbeddedLog
    from node.node import Node

    log_ = EmbeddedLog.open(data_dir / "log", PARTITIONS)
    node = Node(log_, data_dir / "node", node_id="bench")
    node.start()
    try:
        if not node.wait_ready(60):
            raise RuntimeError("the building node did not become ready in 60 s")
        per_team = max(1, jobs // TEAMS)
        for start in range(0, jobs, CHUNK):
            commands = []
            for i in range(start, min(jobs, start + CHUNK)):
                fields = job_fields(i)
                tenant = f"team-{i // per_team:03d}"
                spec = JobSpec(
                    name=fields["name"],
                    tenant=tenant,
                    target=HttpTarget(url=fields["target"]),
                    schedule=fields["schedule"],
                    payload=fields["payload"],
                )
                commands.append(PutJob(job_id=log_job_id(tenant, f"job-{i:07d}"), spec=spec))
            await asyncio.gather(*(_execute(node, c) for c in commands))
            if start and start % 100_000 == 0:
                log(f"built {start:,} jobs")
    finally:
        node.stop()
        log_.close()


async def _execute(node: Any, command: Any, attempts: int = 10) -> None:
    """A registration, again while the node says it was decided but is not readable yet (a
    loaded machine's read model trails): a repeated PutJob of the same definition is a no-op."""
    from core.errors import Unavailable

    for attempt in range(attempts):
        try:
            await node.execute(command)
            return
        except Unavailable:
            if attempt == attempts - 1:
                raise


def build(data_dir: Path, jobs: int, source: Path | None = None) -> dict[str, Any]:
    """Fill ``data_dir`` with ``jobs`` jobs (with the cronlog of ``source``, if given); how it
    was done and how long it took."""
    marker = data_dir / BUILT
    if marker.exists() and marker.read_text() == str(jobs):
        return {"jobs": jobs, "via": "reused"}
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with Serve(data_dir, source=source) as serve:
        batch = find_batch_endpoint(serve.openapi())
        if batch is not None:
            for start in range(0, jobs, 100_000):
                chunk = [
                    {**job_fields(i), "job_id": f"job-{i:07d}"}
                    for i in range(start, min(jobs, start + 100_000))
                ]
                register(serve, chunk, concurrency=4, batch=batch)
            via = f"batch endpoint {batch.path}"
    if batch is None:
        asyncio.run(_build_in_process(data_dir, jobs))
        via = "a node in the bench process"
    marker.write_text(str(jobs))
    built = {"jobs": jobs, "via": via, "seconds": round(time.monotonic() - began, 1)}
    if source is not None:
        built["by"] = str(source)
    return built


def restart(data_dir: Path, source: Path | None = None) -> dict[str, Any]:
    """One start of ``cronlog serve`` on ``data_dir``: seconds to /readyz, RSS."""
    load = loadavg()
    serve = Serve(data_dir, source=source)
    serve.start()
    try:
        ready_s = serve.wait_ready(timeout_s=600, poll_s=0.02)
        cpu_at_ready = own_cpu_seconds(serve.pid)
        at_ready, _ = rss_bytes(serve.pid)
        time.sleep(SETTLE_S)
        settled, peak = rss_bytes(serve.pid)
    finally:
        serve.stop()
    return {
        "load_at_start": load,
        "ready_s": round(ready_s, 3),
        # The main process's user + system CPU at the first 200: the restart is one core's
        # work under the interpreter lock, so this moves less with the machine's load.
        "cpu_s_at_ready": None if cpu_at_ready is None else round(cpu_at_ready, 2),
        "rss_mb": round(max(at_ready, settled) / 2**20, 1),
        "rss_at_ready_mb": round(at_ready / 2**20, 1),
        "rss_settled_mb": round(settled / 2**20, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
    }


def disk_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


def _per_job(full: dict[str, Any], empty: dict[str, Any], jobs: int) -> dict[str, Any]:
    rss = full["rss_mb"] * 2**20
    settled = full["rss_settled_mb"] * 2**20
    return {
        **full,
        "bytes_per_job": round(rss / jobs),
        "bytes_per_job_over_empty": round((rss - empty["rss_mb"] * 2**20) / jobs),
        "bytes_per_job_settled": round(settled / jobs),
        "bytes_per_job_settled_over_empty": round(
            (settled - empty["rss_settled_mb"] * 2**20) / jobs
        ),
        "peak_bytes_per_job": round(full["peak_rss_mb"] * 2**20 / jobs),
        "empty_node": empty,
    }


def run(
    data_dir: Path,
    jobs: int,
    restarts: int,
    tmp: Path,
    baseline: Path | None = None,
    baseline_dir: Path | None = None,
) -> list[dict[str, Any]]:
    built = build(data_dir, jobs, baseline if baseline_dir is not None else None)
    log(f"data directory with {jobs:,} jobs: {built}")
    empty_dir = tmp / f"empty-{secrets.token_hex(4)}"
    base_empty_dir = tmp / f"empty-base-{secrets.token_hex(4)}"
    records = []
    if bytecode_cached():
        restart(tmp / f"warm-{secrets.token_hex(4)}")  # fills the bytecode cache; not recorded
        if baseline is not None:
            restart(tmp / f"warm-base-{secrets.token_hex(4)}", baseline)
    if baseline_dir is not None and built["via"] != "reused":
        if baseline_dir.exists():
            shutil.rmtree(baseline_dir)
        shutil.copytree(data_dir, baseline_dir, symlinks=True)
        upgrade = restart(data_dir)  # this build's first start on the baseline's format
        log(f"first start of this build on the baseline's directory: {upgrade['ready_s']} s")
        figures = {**upgrade, "upgrade": True, "jobs": jobs, "built": built}
        records.append({"timestamp": stamp(), "scenario": "restart", "jobs": jobs,
                        "load_at_start": upgrade["load_at_start"], "figures": figures})  # fmt: skip
    for _ in range(restarts):
        empty = restart(empty_dir)
        full = restart(data_dir)
        figures = {
            **_per_job(full, empty, jobs),
            "jobs": jobs,
            "disk_mb": disk_mb(data_dir),
            "built": built,
        }
        if baseline is not None:
            base_dir = data_dir if baseline_dir is None else baseline_dir
            base = _per_job(restart(base_dir, baseline), restart(base_empty_dir, baseline), jobs)
            figures["baseline"] = {"source": str(baseline), "data_dir": str(base_dir), **base}
            log(f"baseline with {jobs:,} jobs: ready in {base['ready_s']} s, {base['rss_mb']} MB")
        figures["bytecode_cached"] = bytecode_cached()
        records.append({"timestamp": stamp(), "scenario": "restart", "jobs": jobs,
                        "load_at_start": full["load_at_start"], "figures": figures})  # fmt: skip
        log(f"restart with {jobs:,} jobs: ready in {full['ready_s']} s, {full['rss_mb']} MB")
    return records


def cache_bytecode(directory: Path) -> None:
    """Have the nodes this process starts (they inherit its environment) keep their compiled
    bytecode in ``directory``, whatever ``PYTHONDONTWRITEBYTECODE`` said."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(directory)


def bytecode_cached() -> bool:
    return "PYTHONPYCACHEPREFIX" in os.environ and not os.environ.get("PYTHONDONTWRITEBYTECODE")


def side_by_side(records: list[dict[str, Any]]) -> str:
    """A markdown table of the restarts that ran a baseline beside this build, one row each."""
    head = (
        "| jobs | when | load (1 min) | build | /readyz | CPU at /readyz | empty node's /readyz"
        " | RSS | RSS per job | over an empty node | peak RSS |"
        "\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for record in records:
        figures = record["figures"]
        if record.get("scenario") != "restart" or "baseline" not in figures:
            continue
        for build, f in (("before", figures["baseline"]), ("after", figures)):
            if "empty_node" not in f:  # a first start after the build: no empty node beside it
                build += ", first start"
                empty, per_job, over = (
                    "—",
                    f"{round(f['rss_mb'] * 2**20 / record['jobs']):,} B",
                    "—",
                )
            else:
                empty = f"{f['empty_node']['ready_s']:.1f} s"
                per_job = f"{f['bytes_per_job']:,} B"
                over = f"{f['bytes_per_job_over_empty']:,} B"
            rows.append(
                f"| {record['jobs']:,} | {record['timestamp'][11:19]} | {f['load_at_start'][0]}"
                f" | {build} | {f['ready_s']:.1f} s | {_cpu(f)} | {empty}"
                f" | {f['rss_mb']:.0f} MB | {per_job} | {over} | {f['peak_rss_mb']:.0f} MB |"
            )
    return "\n".join(rows)


def _cpu(figures: dict[str, Any]) -> str:
    cpu = figures.get("cpu_s_at_ready")  # not recorded before
    return "—" if cpu is None else f"{cpu:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--baseline", type=Path, help="a checkout to restart side by side")
    parser.add_argument(
        "--baseline-data-dir",
        type=Path,
        help="the baseline's own copy of the data directory (it builds it; this build upgrades"
        " the original at its first start)",
    )
    parser.add_argument(
        "--table", action="store_true", help="print the side-by-side restarts recorded so far"
    )
    parser.add_argument(
        "--compile-each-start",
        action="store_true",
        help="no bytecode cache for the nodes: each start compiles the sources it imports when"
        " the environment sets PYTHONDONTWRITEBYTECODE (how restarts were measured before)",
    )
    args = parser.parse_args()
    if args.table:
        lines = (RESULTS_DIR / "restart.jsonl").read_text().splitlines()
        print(side_by_side([json.loads(line) for line in lines if line.strip()]))
        return
    with tempfile.TemporaryDirectory(prefix="cronlog-restart-") as tmp:
        if not args.compile_each_start:
            cache_bytecode(Path(tmp) / "pycache")
        data_dir = args.data_dir or Path(tmp) / "data"
        records = run(
            data_dir, args.jobs, args.restarts, Path(tmp), args.baseline, args.baseline_data_dir
        )
        for record in records:
            append_result("restart", record)


if __name__ == "__main__":
    main()
