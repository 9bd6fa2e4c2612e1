"""Scale-out: the same steady workload on 1 and on 3 ``cronlog serve --kafka`` nodes, and what
it costs in CPU (issue 21: 3 nodes should cost at most 1.25 x the total CPU of 1 node).

    python -m bench.scaleout [--short] [--rounds 3] [--http-jobs 1000] [--pull-jobs 1000]
        [--interval-s 10] [--warm-s 40] [--window-s 60] [--partitions 8] [--workers 3]
        [--brokers 1] [--nodes 1,3] [--idle-s 10] [--out bench/results/scaleout.md]
    python -m bench.scaleout --report RUN_ID      # --out again from that run's records

One Kafka (``--brokers`` KRaft brokers on loopback, :mod:`tools.kafka.broker`, one by default)
and one recorder (:mod:`bench.recorder`) serve the whole run. Each round runs every variant in
turn (the order alternates round by round), each on a fresh topic prefix and fresh data
directories, so a variant sees no other's topics, consumer group or history:

* ``--nodes`` nodes, each ``cronlog serve --kafka ... --partitions P`` as a user starts it (a
  process of its own, with its executor process; :class:`bench.common.Serve`), the same
  ``--partitions`` in every variant; the bench waits until every node answers ``/readyz`` and
  the nodes' ``cronlog_partitions_owned`` add up to P, twice in a row.
* The workload, registered through ``POST /v1/jobs:batch`` spread over the nodes:
  ``--http-jobs`` jobs calling the recorder and ``--pull-jobs`` jobs of a pull pool, all every
  ``--interval-s`` seconds, their first slots spread evenly over the interval (so the runs come
  due at a steady (N + M) / interval a second).
* ``--workers`` pull-worker processes, each the SDK's ``Worker`` (long-polling claims reaching
  ahead, batched completions, a handler that does nothing), spread over the nodes round-robin
  (with one node, all on it). The same processes in every variant: only the nodes differ.
* Before registering, ``--idle-s`` seconds with no jobs: each node's CPU then, what a node
  costs for being there (group membership, its consumers' polls, timers).
* After ``--warm-s`` from the first slot, a window of ``--window-s`` (a multiple of the
  interval, so every job has the same number of slots in it). Over the window: each node's CPU
  (user + system from ``/proc/<pid>/stat`` of the node process and its descendants, its
  executor process included), and, per thread of the node's main process
  (``/proc/<pid>/task/*/stat``, named by ``py-spy dump`` for Python threads, by the kernel's
  ``comm`` for native ones such as librdkafka's ``rdk:*``), so the read model's followers
  (``read-model:p<N>``) are told apart; the broker's CPU and the load generators' (recorder,
  pull workers, this driver) are measured the same way and reported apart, never in the node
  figure.
* The window's runs: the slots in the window that started, HTTP by their first call at the
  recorder (lag = arrival - slot, from its ``Idempotency-Key``), pull by the handler's start in
  the worker (lag = handler start - slot). A slot not started ``SETTLE_S`` after the window
  counts as infinitely late. CPU seconds per 1,000 runs = CPU over the window / the window's
  runs started x 1,000, per node and in total; the ratio is the 3-node total over the 1-node
  total of the same round.

Appends one JSON line per variant and round to bench/results/scaleout.jsonl and writes the
medians (and every round) to ``--out`` (bench/results/scaleout.md). ``--short``: one round,
a 20 s warm-up and a 30 s window (a few minutes in all); not a figure to compare goals with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from api.auth import new_token
from bench.common import (
    CLK_TCK,
    PYTHON,
    RESULTS_DIR,
    ROOT,
    TENANT,
    CpuWindow,
    Recorder,
    Serve,
    append_result,
    cpu_seconds,
    find_batch_endpoint,
    first_calls,
    http_job,
    iso_ms,
    lag_summary,
    loadavg,
    log,
    machine,
    now_ms,
    pull_job,
    register,
    sleep_until_ms,
    slot_of,
    stamp,
    stop_process,
)
from bench.profiling import py_spy

POOL = "scaleout"
LEASE_SEC = 60.0
GOAL_RATIO = 1.25
LEAD_S = 10  # from the start of registration to the first slot
SETTLE_S = 3  # after the window, for its last slots to start
SAMPLE_S = 5.0  # how often the nodes' CPU is sampled in the window (its steadiness)
WORKER_CONCURRENCY = 1000  # runs a worker holds at once: leased ahead (5 s) and in flight


# -- the pull workers (a process each) --------------------------------------------------------


async def _work(url: str, token: str, out: Path, concurrency: int) -> dict[str, Any]:
    from cronlog_client import AsyncClient, RunContext, Worker

    starts: list[str] = []

    async def handle(run: RunContext) -> None:
        at = time.time_ns()
        slot = round(run.scheduled_for.timestamp() * 1000)
        starts.append(f"{at} {slot}\n")

    async with AsyncClient(url, token, timeout_s=60) as cronlog:
        worker = Worker(cronlog, POOL, handle, concurrency=concurrency, drain_sec=2.0)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.run()
    out.write_text("".join(starts))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "started": len(starts),
        "completed": worker.completed,
        "lost": worker.lost,
        "refused": worker.refused,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
    }


def worker_main(argv: list[str]) -> None:
    url, token, out, concurrency = argv[0], argv[1], Path(argv[2]), int(argv[3])
    print(json.dumps(asyncio.run(_work(url, token, out, concurrency))), flush=True)


def start_worker(url: str, token: str, out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk/python"), str(ROOT)])}
    command = [PYTHON, "-m", "bench.scaleout", "--worker", url, token, str(out)]
    return subprocess.Popen(
        [*command, str(WORKER_CONCURRENCY)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )


# -- CPU by process and by thread ---------------------------------------------------------------


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each live thread of ``pid``, by thread id."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Each thread's name: the Python name (``py-spy dump``) where there is one, else the
    kernel's ``comm`` (librdkafka names its threads ``rdk:*``; Python 3.11 names none)."""
    names: dict[int, str] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return names
    for tid in tids:
        try:
            names[int(tid)] = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
    tool = py_spy()
    if tool is None:
        return names
    # A dump that reads the interpreter while it runs can fail on a busy machine: a few tries,
    # the later ones pausing the process for the moment of the dump (before the window).
    for attempt in range(5):
        command = [tool, "dump", "--json", "--pid", str(pid)]
        try:
            done = subprocess.run(
                command + (["--nonblocking"] if attempt == 0 else []),
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            threads = json.loads(done.stdout or "[]")
        except (OSError, subprocess.SubprocessError, ValueError):
            threads = []
        named = {
            int(t["os_thread_id"]): str(t["thread_name"])
            for t in threads
            if t.get("os_thread_id") and t.get("thread_name")
        }
        if any(name.startswith("read-model:") for name in named.values()):
            return {**names, **named}
        time.sleep(0.2)
    log(f"py-spy could not name the threads of {pid}: its read model is not told apart")
    return names


def thread_group(name: str) -> str:
    """Threads of one kind together: ``read-model:p3`` -> ``read-model:p*``."""
    return re.sub(r"\d+", "*", name)


class NodeCpu:
    """One node's CPU over the window: its process tree and its main process (a
    :class:`bench.common.CpuWindow`), and its threads."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.prefix = serve.args[serve.args.index("--topic-prefix") + 1]
        self.names: dict[int, str] = {}
        self.window = CpuWindow(serve.pid)
        self.threads0: dict[int, float] = {}

    def name_threads(self) -> None:
        self.names = thread_names(self.serve.pid)

    def begin(self) -> None:
        self.threads0 = thread_cpu(self.serve.pid)
        self.window.begin()

    def sample(self) -> None:
        self.window.sample()

    def end(self) -> dict[str, Any]:
        threads1 = thread_cpu(self.serve.pid)
        whole = self.window.end()
        tree, main = whole["cpu_s"], whole["main_cpu_s"]
        groups: dict[str, float] = {}
        for tid, cpu in threads1.items():
            name = self.names.get(tid, "(started in the window)").replace(self.prefix, "<prefix>")
            group = thread_group(name)
            groups[group] = groups.get(group, 0.0) + cpu - self.threads0.get(tid, 0.0)
        # threads that ended in the window: their time is the main process's, not a live one's
        groups["(ended threads)"] = main - sum(groups.values())
        named = any(k.startswith("read-model:") for k in groups)
        read_model = sum(v for k, v in groups.items() if k.startswith("read-model:"))
        kafka_client = sum(v for k, v in groups.items() if k.startswith("rdk:"))
        steps = [
            (c1 - c0) / (t1 - t0)
            for (t0, c0), (t1, c1) in zip(
                self.window.samples, self.window.samples[1:], strict=False
            )
            if t1 - t0 > 1.0
        ]
        return {
            "node_id": self.serve.args[self.serve.args.index("--node-id") + 1],
            "cpu_s": round(tree, 2),
            "main_cpu_s": round(main, 2),
            "children_cpu_s": round(tree - main, 2),
            "threads_named": named,
            "read_model_cpu_s": round(read_model, 2) if named else None,
            "read_model_share": round(read_model / tree, 3) if tree > 0 and named else None,
            "librdkafka_cpu_s": round(kafka_client, 2),
            "cores_by_sample": [round(s, 2) for s in steps],
            "threads": {k: round(v, 2) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        }


def idle_cpu(serves: list[Serve], seconds: int) -> list[float]:
    """Each node's CPU in cores over ``seconds`` with no jobs: what a node costs for being
    there (its group membership, its consumers' polls, its timers)."""
    if seconds <= 0:
        return []
    began = [cpu_seconds(serve.pid) or 0.0 for serve in serves]
    time.sleep(seconds)
    return [
        round(((cpu_seconds(serve.pid) or b) - b) / seconds, 3)
        for serve, b in zip(serves, began, strict=True)
    ]


def tree_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) or 0.0 for p in pids)


def machine_cpu() -> tuple[float, float]:
    """(busy, stolen) CPU seconds of the whole machine so far, every core, from /proc/stat:
    what everyone ran, this benchmark and the other sessions sharing the machine alike."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the nodes -----------------------------------------------------------------------------------


def _metrics(serve: Serve) -> str | None:
    request = urllib.request.Request(
        f"{serve.url}/metrics", headers={"Authorization": f"Bearer {serve.metrics_token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            text: str = response.read().decode()
    except OSError:
        return None
    return text


_QUESTION = re.compile(
    r'^cronlog_history_questions_total\{question="([^"]+)",side="([^"]+)"\} (\S+)$'
)


def questions(serves: list[Serve]) -> dict[str, float]:
    """The history questions the nodes have asked and answered (``question/side``), summed."""
    found: dict[str, float] = {}
    for serve in serves:
        for line in (_metrics(serve) or "").splitlines():
            m = _QUESTION.match(line)
            if m:
                key = f"{m[1]}/{m[2]}"
                found[key] = found.get(key, 0.0) + float(m[3])
    return found


def owned_partitions(serve: Serve) -> int | None:
    text = _metrics(serve)
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("cronlog_partitions_owned "):
            return int(float(line.split()[1]))
    return None


def wait_settled(serves: list[Serve], partitions: int, timeout_s: float = 180) -> list[int]:
    """Until every node is ready and the nodes own every partition between them, twice in a
    row a second apart (a group that has stopped rebalancing); each node's share."""
    deadline = time.monotonic() + timeout_s
    streak = 0
    owned: list[int | None] = []
    while time.monotonic() < deadline:
        for serve in serves:
            if serve.proc is not None and serve.proc.poll() is not None:
                raise RuntimeError(f"a node exited {serve.proc.returncode}: {serve.tail()}")
        ready = all(serve.ready() for serve in serves)
        owned = [owned_partitions(serve) for serve in serves]
        if ready and None not in owned and sum(o or 0 for o in owned) == partitions:
            streak += 1
            if streak >= 2:
                return [o or 0 for o in owned]
        else:
            streak = 0
        time.sleep(1.0)
    raise RuntimeError(f"the nodes did not settle in {timeout_s} s: owned {owned}")


def start_nodes(
    count: int, bootstrap: str, tmp: Path, partitions: int, history_on: str = "every-node"
) -> tuple[str, list[Serve]]:
    prefix = f"so{count}n{secrets.token_hex(3)}"
    tokens = {TENANT: new_token()}
    metrics_token = new_token()
    serves = [
        Serve(
            tmp / f"{prefix}-n{i + 1}",
            kafka=bootstrap,
            topic_prefix=prefix,
            extra=["--partitions", str(partitions), "--history-on", history_on],
            tokens=tokens,
            metrics_token=metrics_token,
            node_id=f"n{i + 1}",
        )
        for i in range(count)
    ]
    try:
        for serve in serves:
            serve.start()
        for serve in serves:
            serve.wait_ready(timeout_s=180)
    except BaseException:
        stop_nodes(serves)
        raise
    return prefix, serves


def stop_nodes(serves: list[Serve]) -> None:
    for serve in serves:  # all told at once: each drains while the others do
        if serve.proc is not None and serve.proc.poll() is None:
            serve.proc.send_signal(signal.SIGTERM)
    for serve in serves:
        serve.stop()


# -- one variant ---------------------------------------------------------------------------------


def workload(
    recorder_url: str, http_jobs: int, pull_jobs: int, interval_s: int, first_ms: int
) -> list[dict[str, Any]]:
    """``http_jobs`` and ``pull_jobs`` jobs every ``interval_s``, their first slots spread
    evenly over the interval (the pull ones half a step after the HTTP ones)."""
    period = interval_s * 1000
    jobs = [
        http_job(
            i, recorder_url, interval_sec=interval_s,
            start_at=iso_ms(first_ms + i * period // http_jobs),
        )
        for i in range(http_jobs)
    ]  # fmt: skip
    jobs += [
        pull_job(
            http_jobs + i, POOL, LEASE_SEC, interval_sec=interval_s,
            start_at=iso_ms(first_ms + (2 * i + 1) * period // (2 * pull_jobs)),
        )
        for i in range(pull_jobs)
    ]  # fmt: skip
    return jobs


def variant(
    nodes: int,
    args: argparse.Namespace,
    bootstrap: str,
    broker_pids: list[int],
    recorder: Recorder,
    tmp: Path,
) -> dict[str, Any]:
    load_at_start = loadavg()
    prefix, serves = start_nodes(nodes, bootstrap, tmp, args.partitions, args.history_on)
    workers: list[subprocess.Popen[str]] = []
    worker_out = [tmp / f"{prefix}-worker-{k}.txt" for k in range(args.workers)]
    try:
        owned = wait_settled(serves, args.partitions)
        log(f"{nodes} node(s) on '{prefix}' settled, partitions owned {owned}")
        idle = idle_cpu(serves, args.idle_s)
        batch = find_batch_endpoint(serves[0].openapi())
        first_ms = (now_ms() + LEAD_S * 1000) // 1000 * 1000
        jobs = workload(recorder.url, args.http_jobs, args.pull_jobs, args.interval_s, first_ms)
        registered = []
        for k, serve in enumerate(serves):  # spread over the nodes: each forwards to owners
            registered.append(register(serve, jobs[k::nodes], concurrency=4, batch=batch))
        if now_ms() >= first_ms:
            log("registration ran past the first slot (the warm-up covers it)")
        for k in range(args.workers):
            serve = serves[k % nodes]
            workers.append(start_worker(serve.url, serve.token, worker_out[k]))
        begin = first_ms + args.warm_s * 1000
        end = begin + args.window_s * 1000
        sleep_until_ms(begin - 4000)
        cpus = [NodeCpu(serve) for serve in serves]
        for cpu in cpus:
            cpu.name_threads()
        recorder.take()  # the warm-up's calls
        recorder_pids, worker_pids = [recorder.proc.pid], [w.pid for w in workers]
        sleep_until_ms(begin)
        asked0 = questions(serves)
        for cpu in cpus:
            cpu.begin()
        broker0 = tree_cpu(broker_pids)
        recorder0, workers0, driver0 = tree_cpu(recorder_pids), tree_cpu(worker_pids), self_cpu()
        busy0, steal0 = machine_cpu()
        while now_ms() < end - SAMPLE_S * 1000:
            time.sleep(SAMPLE_S)
            for cpu in cpus:
                cpu.sample()
        sleep_until_ms(end)
        node_cpu = [cpu.end() for cpu in cpus]
        asked1 = questions(serves)
        asked = {k: round(v - asked0.get(k, 0.0)) for k, v in sorted(asked1.items())}
        others = {
            "broker_cpu_s": round(tree_cpu(broker_pids) - broker0, 2),
            "recorder_cpu_s": round(tree_cpu(recorder_pids) - recorder0, 2),
            "workers_cpu_s": round(tree_cpu(worker_pids) - workers0, 2),
            "driver_cpu_s": round(self_cpu() - driver0, 2),
        }
        busy1, steal1 = machine_cpu()
        ours = sum(n["cpu_s"] for n in node_cpu) + sum(others.values())
        others["machine_busy_cores"] = round((busy1 - busy0) / args.window_s, 3)
        others["machine_steal_cores"] = round((steal1 - steal0) / args.window_s, 3)
        # what ran on the machine beyond the nodes, the broker and the load generators
        others["others_cores"] = round((busy1 - busy0 - ours) / args.window_s, 3)
        load_in_window = loadavg()
        sleep_until_ms(end + SETTLE_S * 1000)
        arrivals = recorder.take()
    finally:
        counts = []
        for w in workers:
            said = stop_process(w, 30).strip().splitlines()
            counts.append(json.loads(said[-1]) if said else {"exit": w.returncode})
        stop_nodes(serves)
    http_lags = [
        at / 1e6 - slot
        for key, at in first_calls(arrivals).items()
        if key.startswith(f"{TENANT}/")
        and (slot := slot_of(key)) is not None
        and begin <= slot < end
    ]
    pull_lags = []
    for out in worker_out:
        for line in out.read_text().splitlines() if out.exists() else []:
            at, slot = (int(x) for x in line.split())
            if begin <= slot < end:
                pull_lags.append(at / 1e6 - slot)
    per_job = args.window_s // args.interval_s
    runs = len(http_lags) + len(pull_lags)
    total = sum(n["cpu_s"] for n in node_cpu)
    per_1000 = [round(n["cpu_s"] * 1000 / runs, 3) if runs else None for n in node_cpu]
    named = all(n["threads_named"] for n in node_cpu)
    read_model = sum(n["read_model_cpu_s"] or 0.0 for n in node_cpu)
    kafka = sum(n["librdkafka_cpu_s"] for n in node_cpu)
    return {
        "timestamp": stamp(),
        "scenario": "scaleout",
        "nodes": nodes,
        "brokers": len(broker_pids),
        "partitions": args.partitions,
        "topic_prefix": prefix,
        "workload": {
            "http_jobs": args.http_jobs,
            "pull_jobs": args.pull_jobs,
            "interval_s": args.interval_s,
            "runs_per_s": round((args.http_jobs + args.pull_jobs) / args.interval_s, 1),
            "pull_workers": args.workers,
        },
        "warm_s": args.warm_s,
        "window_s": args.window_s,
        "owned_partitions": owned,
        "idle_s": args.idle_s,
        "idle_cores_per_node": idle,
        "idle_cores_total": round(sum(idle), 3),
        "load_at_start": load_at_start,
        "load_in_window": load_in_window,
        "registration": [r.figures() for r in registered],
        "runs": {
            "http": len(http_lags),
            "pull": len(pull_lags),
            "total": runs,
            "expected": (args.http_jobs + args.pull_jobs) * per_job,
        },
        "lag": {
            "http": lag_summary(http_lags, args.http_jobs * per_job),
            "pull": lag_summary(pull_lags, args.pull_jobs * per_job),
            "all": lag_summary(http_lags + pull_lags, (args.http_jobs + args.pull_jobs) * per_job),
        },
        "node_cpu": node_cpu,
        "node_cpu_total_s": round(total, 2),
        "node_cores_mean": round(total / args.window_s, 3),
        "cpu_s_per_1000_runs": {
            "total": round(total * 1000 / runs, 3) if runs else None,
            "per_node": per_1000,
        },
        "read_model_cpu_s": round(read_model, 2) if named else None,
        "read_model_share": round(read_model / total, 3) if total > 0 and named else None,
        "librdkafka_share": round(kafka / total, 3) if total > 0 else None,
        "history_on": args.history_on,
        # history questions over the window, all nodes: "<question>/<asked|answered|stale>"
        "questions": {k: v for k, v in asked.items() if v},
        **others,
        "workers": counts,
    }


def describe(record: dict[str, Any]) -> str:
    lag = record["lag"]
    return (
        f"{record['nodes']} node(s): {record['runs']['total']} runs of "
        f"{record['runs']['expected']}, node CPU {record['node_cpu_total_s']} s "
        f"({record['cpu_s_per_1000_runs']['total']} s per 1,000 runs; per node "
        f"{record['cpu_s_per_1000_runs']['per_node']}), read model "
        f"{record['read_model_share']}, p99 lag http {lag['http'].get('p99_ms')} ms "
        f"pull {lag['pull'].get('p99_ms')} ms, broker {record['broker_cpu_s']} s, "
        f"load {record['load_in_window']}"
    )


# -- the report ----------------------------------------------------------------------------------


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "never" if value is None else f"{value:,.{digits}f}"


def _range(values: list[float | None], digits: int = 2) -> str:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return ""
    return f" ({min(present):,.{digits}f}-{max(present):,.{digits}f})"


def ratios(
    rows: list[dict[str, Any]], base: int, other: int, *, less_idle: bool = False
) -> list[float]:
    """``other`` nodes' total node CPU over ``base``'s, round by round (the same runs in both:
    per 1,000 runs when the runs differ); ``less_idle``: each without what its nodes cost
    with no jobs over as long (the cost the runs add)."""

    def cost(row: dict[str, Any]) -> float | None:
        runs = row["runs"]["total"]
        cpu = row["node_cpu_total_s"]
        if less_idle:
            cpu -= row["idle_cores_total"] * row["window_s"]
        return cpu * 1000 / runs if runs and cpu > 0 else None

    out = []
    for r in sorted({row["round"] for row in rows}):
        by = {row["nodes"]: row for row in rows if row["round"] == r}
        if base in by and other in by:
            a, b = cost(by[base]), cost(by[other])
            if a and b:
                out.append(round(b / a, 3))
    return out


def named(row: dict[str, Any]) -> bool:
    """Whether every node's threads were named (so its read model's CPU is told apart)."""
    return all(any(k.startswith("read-model:") for k in n["threads"]) for n in row["node_cpu"])


def read_model_share(row: dict[str, Any]) -> float | None:
    return row["read_model_share"] if named(row) else None


def components(row: dict[str, Any]) -> dict[str, float]:
    """The variant's node CPU by kind of thread, summed over its nodes."""
    out: dict[str, float] = {}
    for node in row["node_cpu"]:
        for name, cpu in node["threads"].items():
            key = "rdk:* (librdkafka)" if name.startswith("rdk:") else name
            out[key] = out.get(key, 0.0) + cpu
        out["(executor process)"] = out.get("(executor process)", 0.0) + node["children_cpu_s"]
    return out


def _breakdown(rows: list[dict[str, Any]], variants: list[int]) -> list[str]:
    medians: dict[int, dict[str, float]] = {}
    for n in variants:
        parts = [components(row) for row in rows if row["nodes"] == n and named(row)]
        keys = {k for p in parts for k in p}
        medians[n] = {k: _median([p.get(k, 0.0) for p in parts]) or 0.0 for k in keys}
    totals = {n: sum(medians[n].values()) or 1.0 for n in variants}
    shown = sorted(
        {k for n in variants for k, v in medians[n].items() if v >= 0.02 * totals[n]},
        key=lambda k: -medians[variants[0]].get(k, 0.0),
    )
    head = " | ".join(f"{n} node(s), CPU s (share)" for n in variants)
    lines = [
        "| thread (of the nodes' main processes) | "
        + head
        + (f" | {variants[-1]} / {variants[0]} |" if len(variants) > 1 else " |"),
        "|---" * (len(variants) + 1 + (len(variants) > 1)) + "|",
    ]
    rest = {n: totals[n] - sum(medians[n].get(k, 0.0) for k in shown) for n in variants}
    for key, values in [(k, {n: medians[n].get(k, 0.0) for n in variants}) for k in shown] + [
        ("other threads", rest)
    ]:
        cells = " | ".join(f"{values[n]:.2f} ({values[n] / totals[n]:.0%})" for n in variants)
        base = values[variants[0]]
        ratio = f" | {values[variants[-1]] / base:.2f}" if len(variants) > 1 and base else " | —"
        lines.append(f"| `{key}` | {cells}{ratio if len(variants) > 1 else ''} |")
    return lines


def write(args: argparse.Namespace, run_id: str, rows: list[dict[str, Any]], cmd: str) -> None:
    variants = sorted({row["nodes"] for row in rows})
    first = rows[0]
    w = first["workload"]
    info = machine()
    loads = [row["load_in_window"][0] for row in rows]
    lines = [
        "# Scale-out: the same steady workload on 1 and 3 Kafka nodes (issue 21)",
        "",
        f"`{cmd}`: run `{run_id}`, {'short' if args.short else 'full'} form, "
        f"{args.rounds} round(s), {rows[0]['timestamp']} to {rows[-1]['timestamp']}, commit "
        f"{info.get('commit')}{' (plus uncommitted changes)' if info.get('dirty') else ''}; "
        f"{info.get('cpu')}, {info.get('cores')} cores, shared with other sessions.",
        "",
        f"Workload: {w['http_jobs']:,} HTTP jobs (calling the loopback recorder) and "
        f"{w['pull_jobs']:,} pull jobs, each every {w['interval_s']} s, slots spread evenly: "
        f"{w['runs_per_s']:g} runs/s. {w['pull_workers']} SDK `Worker` processes (handler does "
        "nothing) spread over the nodes round-robin. Kafka: "
        f"{first['brokers']} KRaft broker(s) on loopback (tools/kafka), replication factor 1; "
        f"topics of {first['partitions']} partitions in every variant, a fresh topic prefix "
        "each. Each node is `cronlog serve --kafka --history-on "
        f"{first.get('history_on', 'every-node')}` with its other defaults (one executor"
        " process). "
        f"Warm-up {first['warm_s']} s from the first slot, then a {first['window_s']} s window. "
        "Node CPU: user + system of every node process and its descendants over the window, "
        "from /proc; the broker and the load generators (recorder, pull workers, this "
        "driver) are apart. Runs: the window's slots that started (HTTP: first call at the "
        "recorder; pull: handler start in the worker); lag = start - slot. Idle: the nodes' "
        f"CPU over {first['idle_s']} s after they settled, before any job was registered.",
        "",
        f"Load: the 1-minute load average was {rows[0]['load_at_start'][0]} when the run began "
        f"and {min(loads)}-{max(loads)} in the windows. Most of it is this run's own threads "
        "(three nodes' librdkafka and Python threads, the JVM's) on 2 cores: the machine's "
        'CPU from /proc/stat beyond the nodes, the broker and the load generators ("others" '
        "below) says what the other sessions used meanwhile.",
        "",
    ]
    if not args.short:
        lines += ["Figures are medians of the rounds, the range in brackets.", ""]
    if len(variants) > 1:
        ratio = ratios(rows, variants[0], variants[-1])
        marginal = ratios(rows, variants[0], variants[-1], less_idle=True)
        met = "met" if (_median(list(ratio)) or 0) <= GOAL_RATIO else "**not met**"
        lines += [
            f"**{variants[-1]} nodes / {variants[0]} node, total node CPU per 1,000 runs: "
            f"{_fmt(_median(list(ratio)))}{_range(list(ratio))}** (goal ≤ {GOAL_RATIO}: {met}); "
            "per round: " + ", ".join(f"{r:.2f}" for r in ratio) + ".",
            "",
            "Without what the nodes cost idle (each variant's idle CPU over the window "
            "subtracted: the cost the runs themselves add): "
            f"{_fmt(_median(list(marginal)))}{_range(list(marginal))}.",
            "",
        ]
    lines += [
        "| nodes | runs in window (of expected) | node CPU s, total | CPU s per 1,000 runs, "
        "total | per node | node cores (mean) | idle, no jobs: node cores (total) | "
        "read-model threads' share of node CPU | librdkafka threads' share | "
        "p99 start lag HTTP / pull | broker CPU s | load generators' CPU s (recorder / "
        "workers / driver) | machine busy / others, cores | load 1m in window |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in variants:
        vs = [row for row in rows if row["nodes"] == n]

        def med(get: Any, vs: list[dict[str, Any]] = vs) -> float | None:
            return _median([get(row) for row in vs])

        def cell(get: Any, digits: int = 2, vs: list[dict[str, Any]] = vs) -> str:
            values = [get(row) for row in vs]
            return _fmt(_median(values), digits) + _range(values, digits)

        per_node = " / ".join(
            _fmt(med(lambda row, i=i: row["cpu_s_per_1000_runs"]["per_node"][i])) for i in range(n)
        )
        lines.append(
            f"| {n} | {cell(lambda row: row['runs']['total'], 0)} of "
            f"{vs[0]['runs']['expected']:,} | {cell(lambda row: row['node_cpu_total_s'])} | "
            f"**{cell(lambda row: row['cpu_s_per_1000_runs']['total'])}** | {per_node} | "
            f"{cell(lambda row: row['node_cores_mean'])} | "
            f"{cell(lambda row: row['idle_cores_total']) if vs[0]['idle_s'] else '—'} | "
            f"{cell(read_model_share, 3)} | "
            f"{cell(lambda row: row['librdkafka_share'], 3)} | "
            f"{cell(lambda row: row['lag']['http'].get('p99_ms'), 0)} ms / "
            f"{cell(lambda row: row['lag']['pull'].get('p99_ms'), 0)} ms | "
            f"{cell(lambda row: row['broker_cpu_s'])} | "
            f"{_fmt(med(lambda row: row['recorder_cpu_s']))} / "
            f"{_fmt(med(lambda row: row['workers_cpu_s']))} / "
            f"{_fmt(med(lambda row: row['driver_cpu_s']))} | "
            f"{_fmt(med(lambda row: row.get('machine_busy_cores')))} / "
            f"{_fmt(med(lambda row: row.get('others_cores')))} | "
            + ", ".join(str(row["load_in_window"][0]) for row in vs)
            + " |"
        )
    lines += [
        "",
        "Where the nodes' CPU goes, summed over the variant's nodes (median over the rounds), "
        "by thread of each node's main process (`/proc/<pid>/task/*/stat`, named by "
        "`py-spy dump`, or the kernel's name for native threads; `*` stands for a number; "
        "`(executor process)` is the node's child process; `(ended threads)` the time of "
        "threads that ended in the window):",
        "",
        *_breakdown(rows, variants),
        "",
        "Every variant and round, in the order run:",
        "",
        "| round | nodes | partitions owned | runs HTTP + pull | node CPU s (per node) | "
        "read model s (per node) | CPU s per 1,000 runs | p50 / p99 / max lag, all runs | "
        "missing | node cores per 5 s sample (min-max) | broker CPU s | machine busy / "
        "others, cores | load at start; in window |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lag = row["lag"]["all"]
        samples = [s for node in row["node_cpu"] for s in node["cores_by_sample"]]
        lines.append(
            f"| {row['round']} | {row['nodes']} | {row['owned_partitions']} | "
            f"{row['runs']['http']:,} + {row['runs']['pull']:,} | {row['node_cpu_total_s']} "
            f"({', '.join(str(n['cpu_s']) for n in row['node_cpu'])}) | "
            + (
                f"{row['read_model_cpu_s']} "
                f"({', '.join(str(n['read_model_cpu_s']) for n in row['node_cpu'])}) | "
                if named(row)
                else "(threads not named) | "
            )
            + f"{row['cpu_s_per_1000_runs']['total']} | {_fmt(lag.get('p50_ms'), 0)} / "
            f"{_fmt(lag.get('p99_ms'), 0)} / {_fmt(lag.get('max_ms'), 0)} ms | "
            f"{lag.get('missing')} | "
            + (f"{min(samples)}-{max(samples)}" if samples else "—")
            + f" | {row['broker_cpu_s']} | {row.get('machine_busy_cores')} / "
            f"{row.get('others_cores')} | {row['load_at_start'][0]}; {row['load_in_window'][0]} |"
        )
    asked = [row for row in rows if row.get("questions")]
    if asked:
        lines += [
            "",
            "History questions over the window, every node's summed (asked of another node, "
            "through the log; `cronlog_history_questions_total`), per round:",
            "",
        ]
        for row in asked:
            per_s = {
                k.split("/")[0]: v / row["window_s"]
                for k, v in row["questions"].items()
                if k.endswith("/asked")
            }
            lines.append(
                f"- round {row['round']}, {row['nodes']} node(s): "
                + (", ".join(f"`{k}` {v:.1f}/s" for k, v in sorted(per_s.items())) or "none")
            )
    last = {row["nodes"]: row for row in rows}
    lines += ["", "Each node's biggest threads in the last round (CPU s over the window):", ""]
    for n, row in sorted(last.items()):
        for node in row["node_cpu"]:
            top = list(node["threads"].items())[:8]
            lines.append(
                f"- {n} node(s), {node['node_id']}: {node['cpu_s']} s = main process "
                f"{node['main_cpu_s']} + executor process {node['children_cpu_s']}; "
                + ", ".join(f"`{k}` {v}" for k, v in top)
            )
    args.out.write_text("\n".join(lines) + "\n")


def report(args: argparse.Namespace) -> None:
    """``--out`` from the records ``--report`` names in bench/results/scaleout.jsonl."""
    with (RESULTS_DIR / "scaleout.jsonl").open() as records:
        rows = [r for r in map(json.loads, records) if r.get("run_id") == args.report]
    if not rows:
        sys.exit(f"no records of run {args.report}")
    args.short = rows[0]["form"] == "short"
    args.rounds = max(row["round"] for row in rows)
    cmd = rows[0].get("command") or "python -m bench.scaleout" + (" --short" if args.short else "")
    write(args, args.report, rows, cmd)
    log(f"wrote {args.out}")


# -- main ------------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="1 round, 20 s warm, 30 s window")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--short: 1)")
    parser.add_argument("--http-jobs", type=int, default=1000)
    parser.add_argument("--pull-jobs", type=int, default=1000)
    parser.add_argument("--interval-s", type=int, default=10)
    parser.add_argument("--warm-s", type=int, default=None, help="default 40 (--short: 20)")
    parser.add_argument("--window-s", type=int, default=None, help="default 60 (--short: 30)")
    parser.add_argument(
        "--idle-s", type=int, default=10, help="the nodes' CPU with no jobs, before (0: not)"
    )
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=3, help="pull-worker processes")
    parser.add_argument("--brokers", type=int, choices=(1, 3), default=1)
    parser.add_argument("--nodes", default="1,3", help="the variants, node counts")
    parser.add_argument(
        "--history-on",
        choices=("every-node", "owner"),
        default="every-node",
        help="where every node of every variant keeps history (cronlog serve --history-on)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "scaleout.md")
    parser.add_argument(
        "--report", metavar="RUN_ID", help="only write --out again from that run's records"
    )
    args = parser.parse_args()
    if args.report:
        report(args)
        return
    args.rounds = args.rounds or (1 if args.short else 3)
    args.warm_s = args.warm_s if args.warm_s is not None else (20 if args.short else 40)
    window = args.window_s if args.window_s is not None else (30 if args.short else 60)
    args.window_s = max(args.interval_s, window // args.interval_s * args.interval_s)
    counts = [int(n) for n in args.nodes.split(",")]
    cmd = "python -m bench.scaleout " + " ".join(sys.argv[1:])
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
    from tools.kafka import broker

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cronlog-scaleout-") as tmp_dir:
        tmp = Path(tmp_dir)
        log(f"run {run_id}: starting {args.brokers} Kafka broker(s)")
        cluster = broker.start(args.brokers, tmp / "kafka")
        broker_pids = [n.process.pid for n in cluster.nodes if n.process is not None]
        try:
            with Recorder() as recorder:
                for r in range(1, args.rounds + 1):
                    order = counts if r % 2 == 1 else list(reversed(counts))
                    for n in order:
                        log(f"round {r}: {n} node(s)")
                        record = variant(n, args, cluster.bootstrap_servers, broker_pids,
                                         recorder, tmp)  # fmt: skip
                        record.update(
                            run_id=run_id,
                            round=r,
                            form="short" if args.short else "full",
                            command=cmd,
                        )
                        append_result("scaleout", record)
                        rows.append(record)
                        log(describe(record))
                    write(args, run_id, rows, cmd)
        finally:
            cluster.stop()
    for n in counts[1:]:
        log(f"{n} nodes / {counts[0]}: total node CPU per 1,000 runs {ratios(rows, counts[0], n)}")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
