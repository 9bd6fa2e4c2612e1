"""A team's limits on three ``cronlog serve --kafka`` nodes: what the team gets across the
cluster, against its limit, wherever its requests and calls go (``core.shares``).

    python -m bench.cluster_limits [--rounds 3] [--phase-s 20] [--settle-s 4] [--rate 100]
        [--streams 8] [--downstream-rate 40] [--downstream-jobs 120] [--team-calls 10]
        [--held-jobs 60] [--partitions 6] [--out bench/results/cluster-limits.md]

One Kafka broker on loopback (:mod:`tools.kafka.broker`) and three nodes, each started as a
user starts it (:mod:`tools.chaos.nodes`), with a limits file giving ``team-a``
``requests_per_sec = --rate`` (burst the same) and ``max_event_streams = --streams``, and
``--max-calls-per-team --team-calls``. Each round, on fresh topics and data directories:

* **Requests per token**, three phases of ``--phase-s`` each, the clients in this process
  (an asyncio loop of httpx clients, 8 connections to a node that is pushed, each sending
  ``GET /v1/team`` as fast as it is answered): ``even`` (all three nodes pushed), ``one`` (only
  n1), ``uneven`` (n1 pushed, n2 and n3 at 20 requests a second each). Per second of each
  phase, the requests let through on each node (200) and refused (429). Reported: the median,
  lowest and highest total let through per second after ``--settle-s`` (against the limit),
  the seconds from the phase's start until a second's total is within 15 % of the limit and
  stays so (``settled in``), and what each node got (in ``uneven``, n2 and n3 should get their
  20 a second and n1 the rest).
* **A downstream's rate**: ``--downstream-jobs`` HTTP jobs of team-a calling the recorder
  (:mod:`bench.recorder`) every 2 s, their slots spread over the 2 s, each target saying
  ``max_calls_per_sec = --downstream-rate``: their partitions (and so their calls) are spread
  over the three nodes. Over ``--phase-s`` after ``--settle-s``, the calls a second arriving at
  the recorder (median, highest), against the rate (each node alone would allow the whole
  rate: three times it).
* **Calls in flight**: ``--held-jobs`` one-shot HTTP jobs of team-a due at one instant, each
  call held 2 s by the recorder (``/hold/2000``); their partitions are spread over the nodes.
  From the calls' arrivals: the most in flight at once (arrivals within 2 s of each other),
  against ``--team-calls`` (each node alone would allow that many: three times it), and the
  seconds until the last call arrived.
* **Event streams**: ``GET /v1/events`` streams opened on n1 one after another (each refused
  one tried again after 0.2 s) until ``--streams`` are open or 10 s pass; then one more asked
  of n2 and n3 for 3 s (each should be refused); then half of n1's closed, and the seconds
  until n2 holds that many.

Appends one JSON line per round to bench/results/cluster_limits.jsonl and writes the medians
over rounds (and each round) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.common import Recorder, log, rounds_on_kafka, stamp
from tools.chaos.nodes import Cluster, NodeConfig, NodeProcess

TEAM = "team-a"
PUSH_CONNECTIONS = 8
LIGHT_PER_SEC = 20.0
WITHIN = 0.15  # a second "at the limit": within 15 % of it


async def _client(
    node: NodeProcess, until: float, start: float, seconds: list[Counter[int]], gap_s: float
) -> None:
    async with httpx.AsyncClient(
        base_url=node.url, headers=node.config.auth, timeout=10.0
    ) as client:
        next_at = time.monotonic()
        while (now := time.monotonic()) < until:
            response = await client.get("/v1/team")
            seconds[response.status_code == 200][int(now - start)] += 1
            if gap_s:  # paced: one request every gap_s, whatever the answers took
                next_at += gap_s
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _phase(
    nodes: list[NodeProcess], pushed: list[int], light: list[int], seconds_long: float
) -> list[list[Counter[int]]]:
    """Per node: [refused per second, let through per second]."""
    start = time.monotonic()
    until = start + seconds_long
    counts = [[Counter[int](), Counter[int]()] for _ in nodes]
    clients = []
    for i in pushed:
        clients += [
            _client(nodes[i], until, start, counts[i], 0.0) for _ in range(PUSH_CONNECTIONS)
        ]
    for i in light:
        clients.append(_client(nodes[i], until, start, counts[i], 1.0 / LIGHT_PER_SEC))
    await asyncio.gather(*clients)
    return counts


def _summary(
    counts: list[list[Counter[int]]], limit: float, seconds_long: int, settle: int
) -> dict[str, Any]:
    totals = [sum(node[1].get(s, 0) for node in counts) for s in range(seconds_long)]
    after = totals[settle:]
    settled_in = next(
        (
            s
            for s in range(seconds_long)
            if all(abs(t - limit) <= WITHIN * limit for t in totals[s:])
        ),
        None,
    )
    return {
        "per_second": totals,
        "median": statistics.median(after),
        "lowest": min(after),
        "highest": max(after),
        "settled_in_s": settled_in,
        "per_node_median": [
            statistics.median(node[1].get(s, 0) for s in range(settle, seconds_long))
            for node in counts
        ],
        "refused": sum(sum(node[0].values()) for node in counts),
    }


def _requests(nodes: list[NodeProcess], args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for name, pushed, light in (
        ("even", [0, 1, 2], []),
        ("one", [0], []),
        ("uneven", [0], [1, 2]),
    ):
        counts = asyncio.run(_phase(nodes, pushed, light, args.phase_s))
        out[name] = _summary(counts, args.rate, int(args.phase_s), args.settle_s)
        shown = {k: v for k, v in out[name].items() if k != "per_second"}
        log(f"requests, {name}: {json.dumps(shown)}")
    return out


def _downstream(
    nodes: list[NodeProcess], recorder: Recorder, args: argparse.Namespace
) -> dict[str, Any]:
    first = int(time.time()) + 4
    jobs = [
        {
            "name": f"downstream {i}",
            "target": {
                "type": "http",
                "url": recorder.url,
                "max_calls_per_sec": args.downstream_rate,
            },
            "interval_sec": 2,
            "start_at": _iso(first * 1000 + round(2000 * i / args.downstream_jobs)),
            "timeout_sec": 10,
        }
        for i in range(args.downstream_jobs)
    ]
    ids = [f"down-{i:04d}" for i in range(len(jobs))]
    for i, (job_id, job) in enumerate(zip(ids, jobs, strict=True)):
        while (
            response := nodes[i % len(nodes)].http.put(f"/v1/jobs/{job_id}", json=job)
        ).status_code == 429:
            time.sleep(0.1)  # the token's rate, spent by the phase before
        assert response.status_code in (200, 201), response.text
    recorder.take()
    begin = time.time() + args.settle_s
    time.sleep(args.settle_s + args.phase_s + 1)
    arrivals = recorder.take()
    for job_id in ids:  # cancelled, so the next phase is quiet
        while nodes[0].http.delete(f"/v1/jobs/{job_id}").status_code == 429:
            time.sleep(0.1)
    per_second = Counter(
        int(at / 1e9 - begin) for at, _ in arrivals if begin <= at / 1e9 < begin + args.phase_s
    )
    seconds = [per_second.get(s, 0) for s in range(int(args.phase_s))]
    result = {
        "rate": args.downstream_rate,
        "wanted_per_sec": args.downstream_jobs / 2,
        "per_second": seconds,
        "median": statistics.median(seconds),
        "highest": max(seconds),
    }
    log(f"downstream: {json.dumps({k: v for k, v in result.items() if k != 'per_second'})}")
    return result


def _running_calls(
    nodes: list[NodeProcess], recorder: Recorder, args: argparse.Namespace
) -> dict[str, Any]:
    due = int(time.time() * 1000) + 4000
    hold_url = f"{recorder.base}/hold/2000"
    ids = [f"held-{i:04d}" for i in range(args.held_jobs)]
    recorder.take()
    for i, job_id in enumerate(ids):
        job = {"name": f"held {i}", "target": hold_url, "run_at": _iso(due), "timeout_sec": 30}
        while (
            response := nodes[i % 3].http.put(f"/v1/jobs/{job_id}", json=job)
        ).status_code == 429:
            time.sleep(0.1)
        assert response.status_code in (200, 201), response.text
    deadline = time.monotonic() + 4 + 2 * args.held_jobs + 10
    while recorder.count() < args.held_jobs and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.5)  # the last calls answered
    arrivals = sorted(at / 1e9 for at, key in recorder.take() if "/held-" in key)
    most = max(
        (sum(1 for other in arrivals if at - 2.0 < other <= at) for at in arrivals), default=0
    )
    result = {
        "cap": args.team_calls,
        "calls": len(arrivals),
        "most_in_flight": most,
        "last_call_after_s": round(arrivals[-1] - due / 1000, 2) if arrivals else None,
    }
    log(f"calls in flight: {json.dumps(result)}")
    return result


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def open_stream(
    url: str, headers: dict[str, str], stack: contextlib.ExitStack, wait_s: float
) -> bool:
    """Open one event stream (following, so it stays open) at ``url`` and keep it in
    ``stack``, trying again 0.2 s after each 429 for up to ``wait_s``; False if none opened."""
    deadline = time.monotonic() + wait_s
    while True:
        inner = contextlib.ExitStack()
        client = inner.enter_context(httpx.Client(base_url=url, headers=headers, timeout=30.0))
        response = inner.enter_context(
            client.stream("GET", "/v1/events", params={"follow": "true"})
        )
        if response.status_code == 200:
            stack.enter_context(inner)
            return True
        inner.close()
        if response.status_code != 429:
            raise RuntimeError(f"an event stream answered {response.status_code}")
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _streams(nodes: list[NodeProcess], args: argparse.Namespace) -> dict[str, Any]:
    n1, n2, n3 = nodes
    started = time.monotonic()
    held_n1: list[contextlib.ExitStack] = []
    while len(held_n1) < args.streams and time.monotonic() - started < 10.0:
        stack = contextlib.ExitStack()
        if open_stream(n1.url, n1.config.auth, stack, 10.0 - (time.monotonic() - started)):
            held_n1.append(stack)
    opened_n1_s = time.monotonic() - started
    refused = contextlib.ExitStack()
    more_n2 = open_stream(n2.url, n2.config.auth, refused, 3.0)
    more_n3 = open_stream(n3.url, n3.config.auth, refused, 0.0)
    refused.close()
    half = args.streams // 2
    for stack in held_n1[:half]:
        stack.close()
    moved_at = time.monotonic()
    held_n2: list[contextlib.ExitStack] = []
    while len(held_n2) < half and time.monotonic() - moved_at < 15.0:
        stack = contextlib.ExitStack()
        if open_stream(n2.url, n2.config.auth, stack, 15.0 - (time.monotonic() - moved_at)):
            held_n2.append(stack)
    moved_s = time.monotonic() - moved_at
    for stack in held_n1[half:] + held_n2:
        stack.close()
    result = {
        "limit": args.streams,
        "held_on_n1": len(held_n1),
        "n1_held_them_in_s": round(opened_n1_s, 2),
        "one_more_on_n2_or_n3": more_n2 or more_n3,
        "moved_to_n2": len(held_n2),
        "moved_in_s": round(moved_s, 2),
    }
    log(f"streams: {json.dumps(result)}")
    return result


def one_round(kafka: str, args: argparse.Namespace, recorder: Recorder) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cluster-limits-") as tmp:
        base = Path(tmp)
        limits = base / "limits.toml"
        limits.write_text(
            f"[tenants.{TEAM}]\nrequests_per_sec = {args.rate}\nrequest_burst = {int(args.rate)}\n"
            f"max_event_streams = {args.streams}\n"
        )
        serve_args = ("--limits", str(limits), "--max-calls-per-team", str(args.team_calls))
        config = NodeConfig(partitions=args.partitions, log_level="warning", serve_args=serve_args)
        cluster = Cluster(kafka, base, config)
        try:
            nodes = cluster.start("n1", "n2", "n3")
            time.sleep(3)  # the group settles on its assignment
            return {
                "requests": _requests(nodes, args),
                "downstream": _downstream(nodes, recorder, args),
                "calls": _running_calls(nodes, recorder, args),
                "streams": _streams(nodes, args),
            }
        finally:
            cluster.stop()


def _report(rounds: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def med(path: list[str]) -> float:
        values = []
        for r in rounds:
            v: Any = r
            for p in path:
                v = v[p]
            values.append(v)
        return float(statistics.median(values))

    lines = [
        "# A team's limits across three nodes",
        "",
        f"`python -m bench.cluster_limits --rounds {args.rounds} --phase-s {args.phase_s}"
        f" --rate {args.rate} --streams {args.streams} --downstream-rate {args.downstream_rate}"
        f" --downstream-jobs {args.downstream_jobs} --partitions {args.partitions}`, {stamp()}.",
        "Three `cronlog serve --kafka` nodes on one broker, this machine (medians over rounds;"
        " each round's figures below).",
        "",
        f"**Requests per token** (limit {args.rate:g} a second), total let through per second"
        f" after {args.settle_s} s:",
        "",
        "| phase | median | lowest | highest | settled in (s) | per node (median) |",
        "|---|---|---|---|---|---|",
    ]
    for phase in ("even", "one", "uneven"):
        nodes = [
            statistics.median(r["requests"][phase]["per_node_median"][i] for r in rounds)
            for i in range(3)
        ]
        settled = [r["requests"][phase]["settled_in_s"] for r in rounds]
        low, high = med(["requests", phase, "lowest"]), med(["requests", phase, "highest"])
        lines.append(
            f"| {phase} | {med(['requests', phase, 'median']):g} | {low:g}"
            f" | {high:g} | {', '.join(str(s) for s in settled)}"
            f" | {' / '.join(f'{n:g}' for n in nodes)} |"
        )
    more = [r["streams"]["one_more_on_n2_or_n3"] for r in rounds]
    lines += [
        "",
        f"**A downstream's rate** (`max_calls_per_sec` {args.downstream_rate:g};"
        f" {args.downstream_jobs / 2:g} calls a second wanted): calls a second at the target,"
        f" median {med(['downstream', 'median']):g}, highest {med(['downstream', 'highest']):g}.",
        "",
        f"**Calls in flight** (`--max-calls-per-team` {args.team_calls}; {args.held_jobs} calls"
        f" held 2 s, due at once): most at once {med(['calls', 'most_in_flight']):g}, the last"
        f" call {med(['calls', 'last_call_after_s']):g} s after the slot.",
        "",
        f"**Event streams** (limit {args.streams}): held on n1"
        f" {med(['streams', 'held_on_n1']):g} (in {med(['streams', 'n1_held_them_in_s']):g} s);"
        f" one more on n2 or n3: {', '.join(str(one_more) for one_more in more)};"
        f" half closed on n1, then held on n2 {med(['streams', 'moved_to_n2']):g}"
        f" in {med(['streams', 'moved_in_s']):g} s.",
        "",
        "## Each round",
        "",
        "```json",
        *(json.dumps(r) for r in rounds),
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=int, default=4)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--downstream-rate", type=float, default=40.0)
    parser.add_argument("--downstream-jobs", type=int, default=120)
    parser.add_argument("--team-calls", type=int, default=10)
    parser.add_argument("--held-jobs", type=int, default=60)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("bench/results/cluster-limits.md"))
    args = parser.parse_args()
    rounds = rounds_on_kafka(
        "cluster_limits", args.rounds, lambda kafka, recorder: one_round(kafka, args, recorder)
    )
    args.out.write_text(_report(rounds, args))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
