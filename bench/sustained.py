"""Sustained load: the highest rate of runs a second that ``cronlog serve`` starts with p99 start
lag ≤ 100 ms for a whole window, found by steps.

    python -m bench.sustained [--kind http|pull|pull-sdk] [--rates 250,500,1000,2000]
        [--window-s 60] [--workers N]

A rate of R runs a second is R interval jobs of one second, their first slots spread evenly
over a second (``start_at`` = T0 + i/R s), so R runs come due every second, one every 1/R s.
Each step starts a fresh node, registers the jobs (``POST /v1/jobs`` 64 at a time, or the
batch endpoint), lets them run ``--warm-s`` seconds, then measures every slot in the next
``--window-s`` seconds. HTTP targets call the recorder (lag = arrival - slot); pull targets are
claimed and completed by :mod:`bench.pull_workers` (lag = lease granted - slot; the answer's
arrival at the worker is reported beside it); ``pull-sdk`` runs them with two processes of
the SDK's ``Worker`` (:mod:`bench.held_workers`, claims reaching 15 s ahead, the SDK's
default; lag = when the handler began - slot, on the same machine's clock). A slot not started
2 s after the window counts as infinitely late. A step holds when p99 ≤ 100 ms; the search
stops at the first step that does not hold. ``--workers N`` runs the node as ``cronlog serve
--workers N`` (its partitions over N processes; the scenario is named ``...-workers-N``).

Appends one JSON line per step to bench/results/sustained.jsonl and prints it.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import profiling
from bench.common import (
    PYTHON,
    ROOT,
    TENANT,
    CpuWindow,
    Recorder,
    Serve,
    append_counters,
    append_figures,
    append_result,
    claim_max,
    claim_wait_field,
    find_batch_endpoint,
    first_calls,
    http_job,
    iso_ms,
    lag_summary,
    loadavg,
    log,
    now_ms,
    place_slot,
    pull_job,
    register,
    rss_bytes,
    sleep_until_ms,
    slot_of,
    stamp,
    stop_process,
)

GOAL_P99_MS = 100.0
SETTLE_MS = 2000
SDK_WORKERS = 2  # pull-sdk: processes of the SDK's Worker (bench.held_workers)
SDK_AHEAD_S = 15  # how far their claims reach (the SDK's default for a worker this large)
POOL = "steady"
LEASE_SEC = 300.0


def step(
    kind: str,
    rate: int,
    window_s: int,
    tmp: Path,
    recorder: Recorder | None,
    *,
    warm_s: int = 3,
    kafka: str | None = None,
    profile: bool = False,
    processes: int = 0,
) -> dict[str, Any]:
    """One rate for one window on a fresh node: the lags of the window's slots (and, with
    ``profile``, where the node's CPU went over the window; such a step is not a figure)."""
    data = tmp / f"serve-{secrets.token_hex(4)}"
    out = tmp / f"claims-{secrets.token_hex(4)}"
    raw = tmp / f"profile-{secrets.token_hex(4)}.txt"
    profiled = None
    load = loadavg()
    extra = ["--workers", str(processes)] if processes else []
    with Serve(data, kafka=kafka, extra=extra) as serve:
        document = serve.openapi()
        batch = find_batch_endpoint(document)

        def make(i: int, w: dict[str, Any]) -> dict[str, Any]:
            if kind == "http":
                assert recorder is not None
                return http_job(i, recorder.url, **w)
            return pull_job(i, POOL, LEASE_SEC, **w)

        t0, _ = place_slot(serve, rate, make, batch, margin_s=3.0)
        jobs = [
            make(i, {"interval_sec": 1, "start_at": iso_ms(t0 + i * 1000 // rate)})
            for i in range(rate)
        ]
        if recorder is not None:
            recorder.take()
        registered = register(serve, jobs, batch=batch)
        if now_ms() >= t0:
            raise RuntimeError("registration ran past the first slot")
        begin = t0 + warm_s * 1000
        end = begin + window_s * 1000
        workers = None
        counts: dict[str, Any] = {}
        held: list[subprocess.Popen[str]] = []
        held_outs = [tmp / f"held-{i}-{secrets.token_hex(4)}" for i in range(SDK_WORKERS)]
        if kind == "pull-sdk":
            # the SDK's Worker as a team runs it, its claims reaching ahead (the SDK's default)
            room = rate * (SDK_AHEAD_S + 3) // SDK_WORKERS + 1
            for out_i in held_outs:
                command = [
                    PYTHON, "-m", "bench.held_workers", serve.url, serve.token, POOL,
                    "--out", str(out_i), "--until-ms", str(end + SETTLE_MS),
                    "--hold-s", "0", "--concurrency", str(room), "--worker-id", out_i.name,
                ]  # fmt: skip
                held.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True))
        if kind == "pull":
            command = [
                PYTHON, "-m", "bench.pull_workers", serve.url, serve.token, POOL,
                "--out", str(out), "--until-ms", str(end + SETTLE_MS),
                "--start-ms", str(t0 - 500), "--limit", str(claim_max(document)),
                "--poll-ms", "20",
            ]  # fmt: skip
            wait_field = claim_wait_field(document)
            if wait_field:
                command += ["--wait-field", wait_field, "--wait-sec", "0.5"]
            workers = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            cpu = CpuWindow(serve.pid)
            sleep_until_ms(begin)
            cpu.begin()
            appends = append_counters(serve)
            sampler = profiling.start(serve.pid, raw, window_s) if profile else None
            while now_ms() < end:
                cpu.sample()
                time.sleep(0.25)
            window = cpu.end()
            batches = append_figures(appends, append_counters(serve))
            profiled = profiling.finish(sampler, raw) if profile else None
            sleep_until_ms(end + SETTLE_MS)
            rss, _ = rss_bytes(serve.pid)
            if workers is not None:
                workers.wait(60)
            for proc in held:
                proc.wait(60)
        finally:
            if workers is not None:
                counts = json.loads(stop_process(workers, 10) or "{}")
            held_counts = [json.loads(stop_process(proc, 30) or "{}") for proc in held]
            if held:
                counts = {k: sum(c.get(k, 0) for c in held_counts) for k in held_counts[0]}
        arrivals = recorder.take() if recorder is not None else []
    lags: list[float] = []
    received: list[float] = []
    if kind == "http":
        for key, at in first_calls(arrivals).items():
            slot = slot_of(key)
            if key.startswith(f"{TENANT}/") and slot is not None and begin <= slot < end:
                lags.append(at / 1e6 - slot)
    elif kind == "pull-sdk":  # when each handler began, less its slot
        for path in held_outs:
            for line in (path.read_text() if path.exists() else "").splitlines():
                started_ns, slot_ms, _ = line.split(" ", 2)
                if begin <= int(slot_ms) < end:
                    lags.append(int(started_ns) / 1e6 - int(slot_ms))
    else:
        for line in (out.read_text() if out.exists() else "").splitlines():
            received_ns, granted_ms, slot_ms, _ = line.split()
            if begin <= int(slot_ms) < end:
                lags.append(int(granted_ms) - int(slot_ms))
                received.append(int(received_ns) / 1e6 - int(slot_ms))
    expected = rate * window_s
    summary = lag_summary(lags, expected)
    p99 = summary.get("p99_ms")
    figures: dict[str, Any] = {
        "lag": summary,
        "holds": p99 is not None and p99 <= GOAL_P99_MS,
        "runs_per_s_started": round(len(lags) / window_s),
        "node_cpu": window,
        "appends": batches,
        "rss_mb": round(rss / 2**20, 1),
        "registration": registered.figures(),
    }
    if profiled is not None:
        figures["profile"] = profiled
    if kind == "pull":
        figures["lag_received"] = lag_summary(received, expected)
    if kind != "http":
        figures["workers"] = counts
    return {
        "timestamp": stamp(),
        "scenario": f"sustained-{kind}"
        + ("-kafka" if kafka else "")
        + (f"-workers-{processes}" if processes else ""),
        "rate": rate,
        "window_s": window_s,
        "warm_s": warm_s,
        "load_at_start": load,
        "figures": figures,
    }


def search(
    kind: str,
    rates: list[int],
    window_s: int,
    tmp: Path,
    recorder: Recorder | None,
    *,
    kafka: str | None = None,
    tags: dict[str, Any] | None = None,
    profile: bool = False,
    processes: int = 0,
) -> dict[str, Any]:
    """Steps up ``rates`` until one does not hold; the highest that held and every step."""
    steps, best = [], 0
    for rate in rates:
        record = step(
            kind, rate, window_s, tmp, recorder, kafka=kafka, profile=profile, processes=processes
        )
        record.update(tags or {})
        if profile:
            print(json.dumps(record["figures"].pop("profile", None), indent=1))
        else:
            append_result("sustained", record)
        lag = record["figures"]["lag"]
        log(
            f"sustained {kind} {rate}/s: p99 {lag.get('p99_ms')} ms, missing "
            f"{lag.get('missing')}, {record['figures']['node_cpu']['cores_mean']} cores, "
            f"{record['figures']['appends'].get('events_per_append')} events an append"
        )
        steps.append(record)
        if not record["figures"]["holds"]:
            break
        best = rate
    return {"kind": kind, "highest_holding_per_s": best, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("http", "pull", "pull-sdk"), default="http")
    parser.add_argument("--rates", default="250,500,1000,2000,3000,4000")
    parser.add_argument("--window-s", type=int, default=60)
    parser.add_argument(
        "--profile", action="store_true", help="where the node's CPU goes (py-spy); not recorded"
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="cronlog serve --workers N (default: one process)"
    )
    parser.add_argument("--tag", default="", help="a note kept with each result line")
    args = parser.parse_args()
    tags = {"tag": args.tag} if args.tag else None
    rates = [int(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory(prefix="cronlog-sustained-") as tmp:
        if args.kind == "http":
            with Recorder() as recorder:
                result = search(
                    "http", rates, args.window_s, Path(tmp), recorder, profile=args.profile,
                    processes=args.workers, tags=tags,
                )  # fmt: skip
        else:
            result = search(
                args.kind, rates, args.window_s, Path(tmp), None, profile=args.profile,
                processes=args.workers, tags=tags,
            )  # fmt: skip
    print(f"highest {args.kind} rate holding p99 <= 100 ms: {result['highest_holding_per_s']}/s")


if __name__ == "__main__":
    main()
