"""The midnight herd as a user meets it: ``cronlog serve``, jobs registered over HTTP, every call
landing on a recorder in another process; beside it the floor and APScheduler, same recorder.

    python -m bench.herd_serve [--jobs 50000] [--only floor,http,pull,aps-memory,...]
                               [--aps-jobs N] [--aps-sqlite-jobs N] [--repeat 1] [--kafka]

Scenarios (each its own processes, started afresh; one recorder for all):

* ``floor``: :mod:`bench.floor`, a bare aiohttp client making the same N calls with the
  concurrency cronlog's executors use (512): the fastest these calls can start on this machine.
* ``http``: ``cronlog serve --allow-targets 127.0.0.0/8`` on a fresh embedded data directory
  (``--kafka``: on the run's Kafka). N jobs with an HTTP target on the recorder, registered
  through ``POST /v1/jobs`` 64 at a time (or the batch endpoint when ``/openapi.json`` has one),
  ending at least ``--settle-s`` (35) before the slot, longer than the node's lead time, so
  the runs are materialised by the node's timers as for jobs registered long before, all due
  at one second: cron ``M H * * *`` with ``seconds`` S (``--when run_at``: one-shots). Start
  lag = the call's arrival at the recorder - the slot its ``Idempotency-Key`` names; the node's
  CPU (user + sys of it and any processes it started, from /proc) over the window from the
  slot to the last call, in cores.
* ``pull``: the same with ``pull://`` targets, and :mod:`bench.pull_workers` (4 claim loops, 100
  runs a claim, completing each run) in another process from one second before the slot. Lag
  = lease granted - slot (the node's own statement in the claim), and the answer's arrival at
  the worker - slot.
* ``pull-sdk``: the same jobs, claimed by two processes of the SDK's ``Worker``
  (:mod:`bench.held_workers`) with its defaults: claims reaching ahead (15 s, for a worker with
  room for a herd), each lease checked a second before its start, each handler begun at the
  instant and done a second later. Lag = when the handler began - the slot (0 early is the
  rule).
* ``http-wN``, ``pull-wN``: the same on ``cronlog serve --workers N`` (N worker processes
  beside the parent that serves them the log); the CPU is the whole process tree's.
  ``http-aS``: with ``--arm-ahead S`` (``http-a0``: every call leased at its slot).
* ``aps-*``: :mod:`bench.aps_peer` with the variants of :data:`APS_VARIANTS`.

Appends one JSON line per scenario run to bench/results/herd_serve.jsonl and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
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
    append_result,
    claim_max,
    claim_wait_field,
    daily_at_fields,
    find_batch_endpoint,
    first_calls,
    http_job,
    iso_ms,
    lag_summary,
    loadavg,
    log,
    machine,
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

POOL = "herd"
LEASE_SEC = 600.0  # no lease runs out while the workers claim the herd
MAX_CALLS = 512  # cronlog serve's --max-calls default: the floor's concurrency
# The least time between the end of the herd's registration and its slot: more than cronlog
# serve's default lead time (30 s), so the runs are materialised ahead of the slot by the
# node's own timers, after registration ended, as for jobs registered long before their slot
# (registered within the lead, they would be materialised as they are registered).
SETTLE_S = 35.0
SDK_WORKERS = 2  # pull-sdk: processes of the SDK's Worker, each with room for its share
# pull-sdk: each handler holds its run this long, as work does, so that the outcomes follow the
# starts rather than share the workers' loop with them (with none, the p99 ran 0.4-1.4 s)
SDK_HOLD_S = 1.0
SDK_SETTLE_MS = 20_000  # pull-sdk: the longest the workers run after the slot before they stop

# name -> aps_peer arguments: APScheduler's settings that start a herd soonest and drop none
# (no misfire limit, coalescing; the asyncio executor on the floor's client or a pool of 20
# threads; SQLite in WAL mode), and its defaults as shipped. Which is best depends on N and the
# machine: the report names the best of each store.
APS_VARIANTS: dict[str, list[str]] = {
    "aps-memory-asyncio": ["--store", "memory", "--executor", "asyncio", "--coalesce"],
    "aps-memory-threads": ["--store", "memory", "--executor", "threads", "--pool", "20",
                           "--coalesce"],
    "aps-memory-defaults": ["--store", "memory", "--executor", "threads", "--defaults"],
    "aps-sqlite-asyncio": ["--store", "sqlite", "--sqlite-wal", "--executor", "asyncio",
                           "--coalesce"],
    "aps-sqlite-threads": ["--store", "sqlite", "--sqlite-wal", "--executor", "threads",
                           "--pool", "20", "--coalesce"],
    "aps-sqlite-defaults": ["--store", "sqlite", "--executor", "threads", "--defaults"],
}  # fmt: skip


def _lags_of(arrivals: list[tuple[int, str]], prefix: str) -> tuple[list[float], int]:
    """Start lags (ms) of each slot's first call whose key starts with ``prefix``, and how many
    calls named no slot."""
    lags, unnamed = [], 0
    for key, at in first_calls(arrivals).items():
        if not key.startswith(prefix):
            continue
        slot = slot_of(key)
        if slot is None:
            unnamed += 1
            continue
        lags.append(at / 1e6 - slot)
    return lags, unnamed


def _wait_calls(recorder: Recorder, jobs: int, cpu: CpuWindow | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and recorder.count() < jobs:
        if cpu is not None:
            cpu.sample()
        time.sleep(0.1)


def floor(recorder: Recorder, jobs: int, concurrency: int = MAX_CALLS) -> dict[str, Any]:
    recorder.take()
    at = now_ms() + 2000
    proc = subprocess.run(
        [PYTHON, "-m", "bench.floor", recorder.url, "--jobs", str(jobs), "--at-ms", str(at),
         "--concurrency", str(concurrency)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    client = json.loads(proc.stdout)
    lags, _ = _lags_of(recorder.take(), "floor/")
    return {
        "lag": lag_summary(lags, jobs),
        # the floor's own span, first call to last at the recorder
        "first_to_last_s": round((max(lags) - min(lags)) / 1000, 3) if lags else None,
        "client": client,
        "concurrency": concurrency,
    }


def _margin_s(jobs: int, settle_s: float) -> float:
    return max(2.0 + jobs / 20_000, settle_s)  # common.place_slot's margin, or the settling


def herd_http(
    recorder: Recorder,
    jobs: int,
    tmp: Path,
    *,
    kafka: str | None = None,
    when: str = "cron",
    extra: list[str] | None = None,
    profile: bool = False,
    settle_s: float = SETTLE_S,
) -> dict[str, Any]:
    data = tmp / f"serve-{secrets.token_hex(4)}"
    raw = tmp / f"profile-{secrets.token_hex(4)}.txt"
    with Serve(data, kafka=kafka, extra=extra or []) as serve:
        batch = find_batch_endpoint(serve.openapi())

        def make(i: int, w: dict[str, Any]) -> dict[str, Any]:
            return http_job(i, recorder.url, **w)

        slot, warm = place_slot(serve, jobs, make, batch, margin_s=_margin_s(jobs, settle_s))
        due = daily_at_fields(slot) if when == "cron" else {"run_at": iso_ms(slot)}
        recorder.take()
        registered = register(serve, [make(i, due) for i in range(jobs)], batch=batch)
        slack_ms = slot - now_ms()
        if slack_ms < 200:
            raise RuntimeError(f"registration ended {-slack_ms} ms after the slot")
        cpu = CpuWindow(serve.pid)
        timeout_s = max(120.0, jobs / 100)
        sleep_until_ms(slot)
        sampler = profiling.start(serve.pid, raw, timeout_s) if profile else None
        cpu.begin()
        _wait_calls(recorder, jobs, cpu, timeout_s)
        window = cpu.end()
        profiled = profiling.finish(sampler, raw)
        rss, peak = rss_bytes(serve.pid)
        arrivals = recorder.take()
    lags, unnamed = _lags_of(arrivals, f"{TENANT}/")
    return {
        "lag": lag_summary(lags, jobs),
        "calls": len(arrivals),
        "unnamed_calls": unnamed,
        "node_cpu": window,
        "registration": registered.figures(),
        "warm_up_jobs_per_s": round(warm.rate),
        "slack_before_slot_ms": slack_ms,
        "rss_mb": round(rss / 2**20, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
        "when": when,
        "log": "kafka" if kafka else "embedded",
        **({"profile": profiled} if profile else {}),
    }


def herd_pull(
    jobs: int,
    tmp: Path,
    *,
    kafka: str | None = None,
    loops: int = 4,
    poll_ms: float = 50.0,
    extra: list[str] | None = None,
    profile: bool = False,
    settle_s: float = SETTLE_S,
) -> dict[str, Any]:
    data = tmp / f"serve-{secrets.token_hex(4)}"
    out = tmp / f"claims-{secrets.token_hex(4)}"
    raw = tmp / f"profile-{secrets.token_hex(4)}.txt"
    with Serve(data, kafka=kafka, extra=extra or []) as serve:
        document = serve.openapi()
        batch = find_batch_endpoint(document)
        wait_field = claim_wait_field(document)
        limit = claim_max(document)

        def make(i: int, w: dict[str, Any]) -> dict[str, Any]:
            return pull_job(i, POOL, LEASE_SEC, **w)

        slot, warm = place_slot(serve, jobs, make, batch, margin_s=_margin_s(jobs, settle_s))
        registered = register(
            serve, [make(i, daily_at_fields(slot)) for i in range(jobs)], batch=batch
        )
        slack_ms = slot - now_ms()
        if slack_ms < 1200:
            raise RuntimeError(f"registration ended {1000 - slack_ms} ms after the workers' start")
        command = [
            PYTHON, "-m", "bench.pull_workers", serve.url, serve.token, POOL,
            "--out", str(out), "--expect", str(jobs), "--start-ms", str(slot - 1000),
            "--loops", str(loops), "--limit", str(limit), "--poll-ms", str(poll_ms),
        ]  # fmt: skip
        if wait_field:
            command += ["--wait-field", wait_field]
        workers = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        printed = ""
        try:
            cpu = CpuWindow(serve.pid)
            timeout_s = max(120.0, jobs / 100)
            sleep_until_ms(slot)
            sampler = profiling.start(serve.pid, raw, timeout_s) if profile else None
            cpu.begin()
            deadline = time.monotonic() + timeout_s
            # the workers write their claims once every run is leased
            while not out.exists() and workers.poll() is None and time.monotonic() < deadline:
                cpu.sample()
                time.sleep(0.1)
            window = cpu.end()
            profiled = profiling.finish(sampler, raw)
            rss, peak = rss_bytes(serve.pid)
            if not out.exists() and workers.poll() is None:
                workers.send_signal(signal.SIGTERM)  # runs never leased: end the claims
            with contextlib.suppress(subprocess.TimeoutExpired):
                workers.wait(150)  # the completions drain (bounded by the workers themselves)
        finally:
            printed = stop_process(workers, 10)
        counts = json.loads(printed or "{}")
    granted, received = [], []
    for line in (out.read_text() if out.exists() else "").splitlines():
        received_ns, granted_ms, slot_ms, _ = line.split()
        granted.append(int(granted_ms) - int(slot_ms))
        received.append(int(received_ns) / 1e6 - int(slot_ms))
    return {
        "lag": lag_summary(granted, jobs),
        "lag_received": lag_summary(received, jobs),
        "workers": {**counts, "loops": loops, "limit": limit, "poll_ms": poll_ms,
                    "long_poll_field": wait_field},
        "node_cpu": window,
        "registration": registered.figures(),
        "warm_up_jobs_per_s": round(warm.rate),
        "slack_before_slot_ms": slack_ms,
        "rss_mb": round(rss / 2**20, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
        "log": "kafka" if kafka else "embedded",
        **({"profile": profiled} if profile else {}),
    }  # fmt: skip


def herd_pull_sdk(
    jobs: int,
    tmp: Path,
    *,
    kafka: str | None = None,
    extra: list[str] | None = None,
    settle_s: float = SETTLE_S,
) -> dict[str, Any]:
    """The pull herd as a team runs it: ``SDK_WORKERS`` processes of the SDK's ``Worker``
    (:mod:`bench.held_workers`, its defaults: claims reaching ahead, checks, starts at the
    instant), each with room for its share, each run held ``SDK_HOLD_S`` as work would. Lag
    = when the handler began - the slot, on the same machine's clock. The node's CPU is
    taken over the second before the slot to the last start: the checks come in that second."""
    data = tmp / f"serve-{secrets.token_hex(4)}"
    with Serve(data, kafka=kafka, extra=extra or []) as serve:
        batch = find_batch_endpoint(serve.openapi())

        def make(i: int, w: dict[str, Any]) -> dict[str, Any]:
            return pull_job(i, POOL, LEASE_SEC, **w)

        slot, warm = place_slot(serve, jobs, make, batch, margin_s=_margin_s(jobs, settle_s))
        registered = register(
            serve, [make(i, daily_at_fields(slot)) for i in range(jobs)], batch=batch
        )
        settle_ms = min(SDK_SETTLE_MS, 3_000 + jobs // 5)
        until = slot + settle_ms
        outs = [tmp / f"held-{i}-{secrets.token_hex(4)}" for i in range(SDK_WORKERS)]
        share = -(-jobs // SDK_WORKERS)
        workers = []
        for out in outs:
            command = [
                PYTHON, "-m", "bench.held_workers", serve.url, serve.token, POOL,
                "--out", str(out), "--until-ms", str(until), "--hold-s", str(SDK_HOLD_S),
                "--concurrency", str(share), "--worker-id", out.name,
            ]  # fmt: skip
            workers.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True))
        try:
            cpu = CpuWindow(serve.pid)
            sleep_until_ms(slot - 1000)
            cpu.begin()
            while now_ms() < until - settle_ms // 2:
                cpu.sample()
                time.sleep(0.1)
            window = cpu.end()
            rss, peak = rss_bytes(serve.pid)
            for worker in workers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.wait(max(60.0, (until - now_ms()) / 1000 + 60))
        finally:
            counts = [json.loads(stop_process(worker, 30) or "{}") for worker in workers]
    lags: list[float] = []
    for out in outs:
        for line in (out.read_text() if out.exists() else "").splitlines():
            started_ns, slot_ms, _ = line.split(" ", 2)
            lags.append(int(started_ns) / 1e6 - int(slot_ms))
    return {
        "lag": lag_summary(lags, jobs),
        "early_starts": sum(1 for lag in lags if lag < 0),
        "workers": {k: sum(c.get(k, 0) for c in counts) for k in (counts[0] if counts else {})},
        "worker_processes": SDK_WORKERS,
        "node_cpu": window,
        "registration": registered.figures(),
        "warm_up_jobs_per_s": round(warm.rate),
        "rss_mb": round(rss / 2**20, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
        "log": "kafka" if kafka else "embedded",
    }


def aps(recorder: Recorder, jobs: int, tmp: Path, variant: str) -> dict[str, Any]:
    recorder.take()
    command = [PYTHON, "-m", "bench.aps_peer", recorder.url, "--jobs", str(jobs),
               "--sqlite", str(tmp / f"aps-{secrets.token_hex(4)}.sqlite"),
               *APS_VARIANTS[variant]]  # fmt: skip
    peer = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    printed = ""
    try:
        assert peer.stdout is not None
        first = peer.stdout.readline().split()
        if not first or first[0] != "slot":
            raise RuntimeError(f"the APScheduler peer did not register its jobs: {first}")
        slot = int(first[1])
        cpu = CpuWindow(peer.pid)
        sleep_until_ms(slot)
        cpu.begin()
        deadline = time.monotonic() + max(120.0, jobs / 50)
        while peer.poll() is None and time.monotonic() < deadline:
            cpu.sample()
            time.sleep(0.1)
        window = cpu.end()
        timed_out = peer.poll() is None
    finally:
        printed = stop_process(peer, 10)
    figures = json.loads(printed or "{}")
    lags, _ = _lags_of(recorder.take(), "aps/")
    return {
        "lag": lag_summary(lags, jobs),
        "peer": figures,
        "peer_cpu": window,
        "timed_out": timed_out,
        "settings": APS_VARIANTS[variant],
    }


def _workers(name: str) -> list[str]:
    """The serve options a scenario's suffixes name: ``-wN`` (``--workers N``: ``http-w2``),
    ``-aS`` (``--arm-ahead S``: ``http-a0``), ``-he``/``-ho`` (``--history-on every-node``
    or ``owner``), in any order (``http-w2-a0``)."""
    out: list[str] = []
    for part in name.split("-")[1:]:
        if part[:1] == "w" and part[1:].isdigit():
            out += ["--workers", part[1:]]
        elif part[:1] == "a" and part[1:].replace(".", "", 1).isdigit():
            out += ["--arm-ahead", part[1:]]
        elif part in ("he", "ho"):  # history on every node (process), or with its owner
            out += ["--history-on", "every-node" if part == "he" else "owner"]
    return out


def run_scenario(
    name: str,
    recorder: Recorder,
    jobs: int,
    tmp: Path,
    kafka: str | None = None,
    profile: bool = False,
    settle_s: float = SETTLE_S,
) -> dict[str, Any]:
    """One run of one scenario, as a record with its load average at the start (``profile``:
    py-spy samples cronlog's node during the herd; see :mod:`bench.profiling`)."""
    load = loadavg()
    began = time.monotonic()
    if name == "floor":
        figures = floor(recorder, jobs)
    elif name.split("-")[0] == "http":
        figures = herd_http(
            recorder,
            jobs,
            tmp,
            kafka=kafka,
            extra=_workers(name),
            profile=profile,
            settle_s=settle_s,
        )
    elif name == "pull-sdk":
        figures = herd_pull_sdk(jobs, tmp, kafka=kafka, settle_s=settle_s)
    elif name.split("-")[0] == "pull":
        figures = herd_pull(
            jobs, tmp, kafka=kafka, extra=_workers(name), profile=profile, settle_s=settle_s
        )
    elif name in APS_VARIANTS:
        figures = aps(recorder, jobs, tmp, name)
    else:
        raise ValueError(f"no scenario {name!r}")
    if name.split("-")[0] in ("http", "pull"):
        figures["settle_s"] = settle_s
    return {
        "timestamp": stamp(),
        # which build's ``cronlog serve`` ran: a baseline's source (CRONLOG_BENCH_SOURCE)
        "source": os.environ.get("CRONLOG_BENCH_SOURCE") or "this checkout",
        "scenario": name + ("-kafka" if kafka else ""),
        "jobs": jobs,
        "profiled": profile,
        "load_at_start": load,
        "wall_s": round(time.monotonic() - began, 1),
        "figures": figures,
    }


def describe(record: dict[str, Any]) -> str:
    lag = record["figures"]["lag"]
    extra = ""
    cpu = record["figures"].get("node_cpu") or record["figures"].get("peer_cpu")
    if cpu:
        extra = f", {cpu['cores_mean']} cores (peak {cpu['cores_peak_1s']}), {cpu['cpu_s']} CPU s"
        if "main_cpu_s" in cpu:
            extra += f" ({cpu['main_cpu_s']} in the main process)"
    return (
        f"{record['scenario']} {record['jobs']:,}: p50 {lag.get('p50_ms')} ms, p99 "
        f"{lag.get('p99_ms')} ms, all after {lag.get('all_started_after_s')} s, "
        f"missing {lag.get('missing')}{extra}"
    )


def describe_profile(profile: dict[str, Any]) -> str:
    if "error" in profile:
        return f"py-spy: {profile['error']}"
    lines = [f"node samples: {profile['samples']}; by cronlog module (innermost frame of ours):"]
    lines += [f"  {share:6.1%}  {module}" for module, share in profile["by_module"]]
    lines += ["by function where the sample was taken:"]
    lines += [f"  {share:6.1%}  {function}" for function, share in profile["by_function"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--aps-jobs", type=int, help="for the in-memory peers (default: --jobs)")
    parser.add_argument("--aps-sqlite-jobs", type=int, default=20_000)
    parser.add_argument("--only", default="floor,http,pull,aps-memory-threads,aps-memory-defaults")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S,
        help="at least this long from the end of registration to the slot (default %(default)g:"
        " longer than the node's lead time)",
    )
    parser.add_argument("--kafka", action="store_true", help="the cronlog scenarios on Kafka")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the node with py-spy during the herd and print where its CPU went"
        " (timings are inflated a little; such records are marked profiled)",
    )
    args = parser.parse_args()
    names = args.only.split(",")
    log(f"machine: {machine()}")
    cluster = None
    with tempfile.TemporaryDirectory(prefix="cronlog-herd-serve-") as tmp, Recorder() as recorder:
        bootstrap = None
        if args.kafka:
            from tools.kafka import broker

            cluster = broker.start(1, Path(tmp) / "kafka")
            bootstrap = cluster.bootstrap_servers
        try:
            for _ in range(args.repeat):
                for name in names:
                    jobs = args.jobs
                    if name.startswith("aps-sqlite"):
                        jobs = min(args.jobs, args.aps_sqlite_jobs)
                    elif name.startswith("aps-"):
                        jobs = args.aps_jobs or args.jobs
                    kafka = bootstrap if name.split("-")[0] in ("http", "pull") else None
                    record = run_scenario(
                        name, recorder, jobs, Path(tmp), kafka, args.profile, args.settle_s
                    )
                    append_result("herd_serve", record)
                    log(describe(record))
                    if record["figures"].get("profile"):
                        print(describe_profile(record["figures"]["profile"]), flush=True)
        finally:
            if cluster is not None:
                cluster.stop()


if __name__ == "__main__":
    main()
