"""One team's flood beside another team's few runs, on three ``cronlog serve --kafka`` nodes: how
late the small team's runs start while 40,000 of the other's come due in one second.

    python -m bench.flood_three [--rounds 1] [--flood 40000] [--b-jobs 20] [--partitions 6]
        [--after-s 40] [--out bench/results/flood-three.md]

One Kafka broker on loopback and three nodes as a user starts them (:mod:`tools.chaos.nodes`,
each with its executor process), the benchmarks' limits file (rates at their ceilings: the
flood is registered through the batch endpoint). Team B registers ``--b-jobs`` HTTP jobs that
run every second from 15 s before the slot S; team A registers ``--flood`` one-shot HTTP jobs
all due at S, through the three nodes in turn (1,000 a batch, six batches at once). Each team
calls its own server (:mod:`bench.recorder`, a process each), as two teams would; with
``--shared-target`` both call one. Measured from the recorders' arrivals: each of B's slots from
10 s before S to ``--after-s`` after it (lag = first call's arrival - slot; a slot never called
counts as infinitely late), and A's calls (first, median, p99, last, against S). B's runs are
also read back through the API, for the start each executor reported (``RunStarted``): how much
of a late arrival was cronlog's start and how much the way to the target. Appends a JSON line
per round to bench/results/flood_three.jsonl and writes ``--out``.

A server each is what two teams would have. One server for both (``--shared-target``, the
benchmark's first form) gave the same picture on 2026-12-06: B's calls p50 2.8 s late with one
server and 2.6 s with two before the executors' socket was made fair, 3.9 ms and 4-6 ms after;
the shared server (which never overflowed its accept queue) was not what held B back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from cronlog_client import Client
from cronlog_client.models import Run

from bench.common import (
    LIMITS,
    Recorder,
    first_calls,
    iso_ms,
    lag_summary,
    log,
    now_ms,
    rounds_on_kafka,
    sleep_until_ms,
    stamp,
    team_lags,
)
from tools.chaos.nodes import Cluster, NodeConfig, NodeProcess

B_LEAD_S = 15
B_FROM_S = 10
BATCH = 1000
AT_ONCE = 6
SETTLE_S = 5
STALL_WORDS = ("after they were due", "behind its timers", "stood still")
STALLS_KEPT = 30


async def _register(nodes: list[NodeProcess], token: str, jobs: list[dict[str, Any]]) -> float:
    """Every job through ``POST /v1/jobs:batch``, the batches spread over the nodes; seconds."""
    batches = [jobs[i : i + BATCH] for i in range(0, len(jobs), BATCH)]
    queue = list(enumerate(batches))
    headers = {"Authorization": f"Bearer {token}"}
    began = time.perf_counter()

    async def worker() -> None:
        async with httpx.AsyncClient(headers=headers, timeout=120.0) as client:
            while queue:
                i, batch = queue.pop()
                node = nodes[i % len(nodes)]
                response = await client.post(f"{node.url}/v1/jobs:batch", json={"jobs": batch})
                assert response.status_code in (200, 201, 207), response.text[:300]
                refused = [r for r in response.json()["results"] if r["status"] >= 300]
                assert not refused, refused[:3]

    await asyncio.gather(*(worker() for _ in range(AT_ONCE)))
    return time.perf_counter() - began


def _team_runs(node: NodeProcess, token: str) -> list[Run]:
    """Every run of the team's jobs, as the API lists them (through the SDK)."""
    with Client(node.url, token, timeout_s=60.0) as client:
        return [run for job in client.iter_jobs() for run in client.iter_job_runs(job.job_id)]


def _ms(instant: dt.datetime) -> int:
    return round(instant.timestamp() * 1000)


def _started_late(
    team: str,
    runs: list[Run],
    arrivals: list[tuple[int, str]],
    b_from: int,
    b_until: int,
) -> dict[str, Any]:
    """B's slots in the window: how late each first attempt started by its executor's word, and
    how long its call then took to reach the target (arrival - that start)."""
    firsts = first_calls(arrivals)
    started: list[float] = []
    on_the_way: list[float] = []
    for run in runs:
        slot = _ms(run.scheduled_for)
        if not (b_from <= slot < b_until) or not run.attempts:
            continue
        start = _ms(run.attempts[0].started_at)
        started.append(start - slot)
        arrived = firsts.get(f"{team}/{run.job_id}:{slot}")
        if arrived is not None:
            on_the_way.append(arrived / 1e6 - start)
    lag, way = lag_summary(started, len(started)), lag_summary(on_the_way, len(on_the_way))
    return {
        "runs": len(started),
        "started_p50_ms": lag.get("p50_ms"),
        "started_p99_ms": lag.get("p99_ms"),
        "started_over_1s": sum(late > 1000 for late in started),
        "to_target_p50_ms": way.get("p50_ms"),
        "to_target_p99_ms": way.get("p99_ms"),
    }


def one_round(kafka: str, args: argparse.Namespace, recorder: Recorder) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        b_recorder = recorder if args.shared_target else stack.enter_context(Recorder())
        return _round(kafka, args, recorder, b_recorder)


def _round(
    kafka: str, args: argparse.Namespace, recorder: Recorder, b_recorder: Recorder
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flood-three-") as tmp:
        base = Path(tmp)
        limits = base / "limits.toml"
        limits.write_text(LIMITS)
        config = NodeConfig(
            partitions=args.partitions, log_level="warning", serve_args=("--limits", str(limits))
        )
        cluster = Cluster(kafka, base, config)
        try:
            nodes = cluster.start("n1", "n2", "n3")
            time.sleep(3)
            recorder.take()
            b_recorder.take()
            slot = (now_ms() + 1000 * (B_LEAD_S + 5) + args.flood) // 1000 * 1000
            b_jobs = [
                {
                    "name": f"every second {i}",
                    "target": b_recorder.url,
                    "interval_sec": 1,
                    "start_at": iso_ms(slot - B_LEAD_S * 1000),
                }
                for i in range(args.b_jobs)
            ]
            a_jobs = [
                {"name": f"flood {i}", "target": recorder.url, "run_at": iso_ms(slot)}
                for i in range(args.flood)
            ]
            asyncio.run(_register(nodes, "token-b", b_jobs))
            seconds = asyncio.run(_register(nodes, "token-a", a_jobs))
            log(
                f"registered {args.flood} in {seconds:.1f} s; S in {(slot - now_ms()) / 1000:.1f} s"
            )
            if now_ms() >= slot:
                raise RuntimeError("team A's registration ran past its slot")
            b_until = slot + args.after_s * 1000
            sleep_until_ms(b_until + SETTLE_S * 1000)
            arrivals = recorder.take()
            b_arrivals = arrivals if b_recorder is recorder else b_recorder.take()
            b_runs = _team_runs(nodes[0], "token-b")
        finally:
            cluster.stop()
            stalls = _stall_lines(nodes_logs(cluster))
    b_from = slot - B_FROM_S * 1000
    a, _ = team_lags(arrivals, b_from, b_until)
    _, b = team_lags(b_arrivals, b_from, b_until)
    slots_b = (b_until - b_from) // 1000
    return {
        "timestamp": stamp(),
        "flood": args.flood,
        "registration_s": round(seconds, 1),
        "team_a": lag_summary(a, args.flood),
        "team_b": lag_summary(b, args.b_jobs * slots_b),
        "team_b_over_1s": sum(lag > 1000 for lag in b),
        "team_b_started": _started_late("team-b", b_runs, b_arrivals, b_from, b_until),
        "shared_target": args.shared_target,
        "team_b_window_s": [-B_FROM_S, args.after_s],
        "stalls_logged": {"count": len(stalls), "first": stalls[:STALLS_KEPT]},
    }


def nodes_logs(cluster: Cluster) -> dict[str, str]:
    return {
        node_id: node.log_path.read_text(errors="replace")
        for node_id, node in cluster.nodes.items()
        if node.log_path.exists()
    }


def _stall_lines(logs: dict[str, str]) -> list[str]:
    """The nodes' own words on what was late and why (node.stalls' warnings)."""
    return [
        f"{node_id}: {line[line.find('partition') :]}" if "partition" in line else line
        for node_id, text in logs.items()
        for line in text.splitlines()
        if any(word in line for word in STALL_WORDS)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--flood", type=int, default=40_000)
    parser.add_argument("--b-jobs", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--after-s", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("bench/results/flood-three.md"))
    parser.add_argument(
        "--shared-target", action="store_true", help="both teams call one server (see above)"
    )
    args = parser.parse_args()
    rounds = rounds_on_kafka(
        "flood_three", args.rounds, lambda kafka, recorder: one_round(kafka, args, recorder)
    )
    lines = [
        "# One team's flood beside another team's runs, three nodes",
        "",
        f"`python -m bench.flood_three --flood {args.flood} --b-jobs {args.b_jobs}"
        f" --partitions {args.partitions}{' --shared-target' if args.shared_target else ''}`,"
        f" {stamp()}; three `cronlog serve --kafka` nodes on one broker, this machine; the teams"
        f" call {'one server' if args.shared_target else 'a server each'}. Lags in ms from the"
        " slot to the first call's arrival; B started: by its executor's word (RunStarted).",
        "",
        "| round | B p50 | B p99 | B max | B over 1 s | B missing | B started p50 | B started"
        " p99 | A first | A p50 | A p99 | A last |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rounds):
        b, a, s = r["team_b"], r["team_a"], r["team_b_started"]
        lines.append(
            f"| {i + 1} | {b.get('p50_ms')} | {b.get('p99_ms')} | {b.get('max_ms')}"
            f" | {r['team_b_over_1s']} | {b.get('missing')} | {s['started_p50_ms']}"
            f" | {s['started_p99_ms']} | {a.get('min_ms')}"
            f" | {a.get('p50_ms')} | {a.get('p99_ms')} | {a.get('max_ms')} |"
        )
    lines += ["", "```json", *(json.dumps(r) for r in rounds), "```", ""]
    args.out.write_text("\n".join(lines))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
