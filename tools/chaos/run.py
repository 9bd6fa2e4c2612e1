"""One chaos run, start to finish: a cluster on loopback, the workload, the faults, the drain,
and the checker.

1. Three KRaft brokers (:mod:`tools.kafka.broker`; replication 3, ``min.insync.replicas`` 2),
   the recording target and three nodes (six partitions; ``n3`` under libfaketime, its wall
   clock the one the clock faults move).
2. The cron jobs are created (:mod:`tools.chaos.workload`), the pull workers started, and the
   cluster left to settle for a few seconds.
3. For ``duration`` seconds the faults of the seeded plan strike (:mod:`tools.chaos.faults`)
   while bursts of one-shot jobs are created.
4. The drain: no more faults; the jobs go on firing for ``drain`` seconds. The window ends a
   few seconds before every job is paused through the API; the run then waits (bounded) for
   every run to end, reading the events topic.
5. The checker (:mod:`tools.chaos.checker`) gets the history; its report goes to
   ``report.json`` and ``report.txt`` in the run's directory, beside everything a failure
   needs to be understood: the node and broker logs, the target's and workers' records, the
   faults log, the events as read (``events.jsonl``), so ``python -m tools.chaos check
   DIR`` can check a run again without its cluster, and the commands sent to the partitions
   (``commands.jsonl``: API requests and outcomes forwarded to a partition's owner).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.chaos import faults as fl
from tools.chaos import gather, skew
from tools.chaos.checker import History, NodeHealth, Report, check, summary
from tools.chaos.nodes import METRICS_TOKEN, REPO, Cluster, NodeConfig
from tools.chaos.procs import free_port, now_ms, popen
from tools.chaos.records import Recorder, read, read_all
from tools.chaos.target import GUARDED, HOOK, STATUS
from tools.chaos.watch import HealthWatch
from tools.chaos.workload import GUARD_SECRET_NAME, POOL, TEAM_TOPIC, Shape, Workload, create
from tools.kafka import broker

log = logging.getLogger("chaos")

TENANT = "chaos"
TOKEN = "chaos-token"
GUARD_SECRET = "chaos-guard-secret"  # asks at the target's status path carry it as a bearer
NODES = ("n1", "n2", "n3")
SKEWED = "n3"
WINDOW_MARGIN_MS = 3000  # slots this close to the pause may not have fired yet: not checked
SETTLE_TIMEOUT_S = 120.0
PAUSE_TRIES = 6
PROBES_PER_STEP = 12  # spread over the partitions, so some land on the skewed node's


@dataclass
class Settings:
    seed: int
    duration_s: float
    out: Path
    kinds: list[str] = field(default_factory=lambda: list(fl.KINDS))
    mode: str = "random"  # random | each_once | sequence
    combine_p: float = 0.35
    shape: Shape = field(default_factory=Shape)
    partitions: int = 6
    workers: int = 2
    warmup_s: float = 8.0
    drain_s: float = 25.0
    node_drain_s: float = 10.0  # serve --drain-sec, for the rolling restart's SIGTERMs
    serve_args: tuple[str, ...] = ()  # more `cronlog serve` options for every node


CI_SEED = 12


# The harness's team: one token for its workers, its checks and its reading at the end.
LIMITS = """\
[defaults]
requests_per_sec = 2000
request_burst = 4000
"""


def ci_settings(out: Path, seed: int = CI_SEED) -> Settings:
    """The bounded form CI runs (``tests/chaos/test_chaos.py``; ``python -m tools.chaos run
    --ci``): every fault kind once, paired where they combine, on a small workload; a few
    minutes on two cores."""
    return Settings(
        seed=seed,
        duration_s=420.0,  # a bound: every episode of the plan runs, then the drain
        out=out,
        mode="each_once",
        combine_p=1.0,
        shape=Shape(
            every_second=12,
            every_second_critical=6,  # 3 guarded (slow, flaky, beat), 3 unguarded likewise
            every_second_guarded=3,
            every_five=3,
            pull=2,
            pull_critical=1,
            oneshot_bursts=2,
            oneshot_per_burst=30,
            # Two kafka:// jobs on "* * * * * *": their records, read_committed from the
            # team's topic, exactly once for each run that succeeded (topic_record_twice,
            # topic_record_missing). Two runs of this form with them passed on 2026-12-05 at
            # load medians of 15-18; two of four had failed on timing on 2026-12-03.
            topic=2,
            topic_critical=0,
        ),
        warmup_s=5.0,
        drain_s=20.0,
    )


def make_plan(s: Settings) -> fl.Plan:
    common: dict[str, Any] = {
        "nodes": list(NODES),
        "partitions": s.partitions,
        "workers": s.workers,
    }
    if s.mode == "sequence":
        return _sequence(s, common)
    if s.mode == "each_once":
        return fl.plan(
            s.seed,
            s.kinds,
            episodes=len(s.kinds),
            combine_p=s.combine_p,
            each_once=True,
            **common,
        )
    # Enough episodes for any duration; the run stops starting them when the time is up.
    return fl.plan(
        s.seed,
        s.kinds,
        episodes=max(1, int(s.duration_s / 5)),
        combine_p=s.combine_p,
        **common,
    )


def _sequence(s: Settings, common: dict[str, Any]) -> fl.Plan:
    """The kinds in the order given, one at a time, spaced over the duration."""
    rng = random.Random(s.seed)
    gap = max(5.0, s.duration_s / max(1, len(s.kinds)) - 20.0)
    episodes = tuple(
        fl.Episode((fl.draw(rng, kind, common["nodes"], s.partitions, s.workers),), gap)
        for kind in s.kinds
    )
    return fl.Plan(s.seed, episodes)


class Run:
    def __init__(self, s: Settings) -> None:
        self.s = s
        self.out = s.out
        self.rng = random.Random(s.seed)
        self.kafka: broker.KafkaCluster | None = None
        self.cluster: Cluster | None = None
        self.target: subprocess.Popen[bytes] | None = None
        self.target_port = free_port()
        self.workers: fl.Workers | None = None
        self.clock: skew.SkewedClock | None = None
        self.faults_log = Recorder(self.out / "faults.jsonl")
        self.creates = Recorder(self.out / "creates.jsonl")
        self.probes = Recorder(self.out / "probes.jsonl")
        self.health_log = Recorder(self.out / "health.jsonl")
        self.watch: HealthWatch | None = None
        self._closing = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor")
        self._probing: list[threading.Thread] = []
        # The machine's 1-minute load average through the run: lateness, duplicates after a
        # lease ran out and outcome_unknown all grow on a busy machine, so a report says how
        # busy it was.
        self.load_1m: list[float] = []

    # -- processes ----------------------------------------------------------------------------

    def _python(self, *args: str, log_name: str) -> subprocess.Popen[bytes]:
        # This checkout's SDK (the target's guard), as pytest's pythonpath gives the harness.
        path = os.pathsep.join(
            p for p in (str(REPO), str(REPO / "sdk" / "python"), os.environ.get("PYTHONPATH")) if p
        )
        with (self.out / log_name).open("ab") as out:
            return popen(
                [sys.executable, "-m", "tools.chaos", *args],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": path},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def _start_target(self) -> None:
        self.target = self._python(
            "target",
            "--port",
            str(self.target_port),
            "--record",
            str(self.out / "target.jsonl"),
            "--max-seconds",
            str(self._lifetime()),
            "--guard-secret",
            GUARD_SECRET,
            log_name="target.log",
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.target_port}/", timeout=1.0)
                return
            except httpx.HTTPError:
                if self.target.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the recording target did not start") from None
                time.sleep(0.1)

    def _lifetime(self) -> float:
        s = self.s
        return s.warmup_s + s.duration_s + s.drain_s + SETTLE_TIMEOUT_S + 600

    def _start_worker(self, worker_id: str) -> tuple[subprocess.Popen[bytes], Path]:
        assert self.cluster is not None
        record = self.out / "workers" / f"{worker_id}.jsonl"
        record.parent.mkdir(exist_ok=True)
        args = [
            "worker",
            "--worker-id",
            worker_id,
            "--pool",
            POOL,
            "--token",
            TOKEN,
            "--record",
            str(record),
            "--max-seconds",
            str(self._lifetime()),
        ]
        for node in self.cluster.nodes.values():
            args += ["--node", node.url]
        return self._python(*args, log_name=f"workers/{worker_id}.log"), record

    # -- the run ------------------------------------------------------------------------------

    def execute(self) -> Report:
        s = self.s
        self.out.mkdir(parents=True, exist_ok=True)
        the_plan = make_plan(s)
        (self.out / "plan.json").write_text(
            json.dumps(
                {"seed": s.seed, "settings": _settings_json(s), "plan": the_plan.describe()},
                indent=2,
            )
        )
        log.info("plan: %s", json.dumps(the_plan.describe()))
        # libfaketime costs the node it is preloaded into: under it n3 dispatched its calls
        # seconds late (its offset at zero), so only a plan with clock faults preloads it.
        skewing = any(f.kind.startswith("clock_") for e in the_plan.episodes for f in e.faults)
        if skewing:
            skew.check(work_dir=self.out)
        began = time.monotonic()
        self.kafka = broker.start(3, self.out / "kafka")
        log.info("3 brokers ready in %.1f s", time.monotonic() - began)
        self._start_target()
        if s.shape.topic:
            _create_team_topic(self.kafka.bootstrap_servers)
        # The team's token carries the whole harness (pull workers, checks, the end's reading
        # of every run) and its rate holds across the nodes: the operator sizes it for that.
        limits = self.out / "limits.toml"
        limits.write_text(LIMITS)
        config = NodeConfig(
            partitions=s.partitions,
            replication_factor=3,
            min_insync_replicas=2,
            tokens=f"{TENANT}={TOKEN}",
            token=TOKEN,
            drain_sec=s.node_drain_s,
            serve_args=(
                "--allow-topics",
                f"{TENANT}={TEAM_TOPIC.partition('.')[0]}.",
                "--limits",
                str(limits),
                *s.serve_args,
            ),
        )
        self.cluster = Cluster(
            self.kafka.bootstrap_servers, self.out, config, prefix=f"chaos-{s.seed}"
        )
        self.clock = skew.SkewedClock(self.out / f"{SKEWED}.faketime") if skewing else None
        for node_id in NODES:
            # One node runs as worker processes (the process_kill fault's), the others as one.
            extra = ("--workers", str(fl.PROCESSES)) if node_id == fl.PROCESSES_NODE else ()
            node = self.cluster.add(node_id, self.clock if node_id == SKEWED else None, extra)
            _write_secret(node.data_dir, GUARD_SECRET_NAME, f"Bearer {GUARD_SECRET}")
        for node in self.cluster.nodes.values():
            node.start(self.kafka.bootstrap_servers, self.cluster.prefix)
        self._supervisor.start()
        for node in self.cluster.nodes.values():
            node.wait_ready(supervised=True)
        log.info("nodes ready at %.1f s", time.monotonic() - began)
        # What the nodes say of themselves, through the run (the checker's ready_while_dark).
        self.watch = HealthWatch(
            {n.node_id: n.url for n in self.cluster.nodes.values()}, METRICS_TOKEN, self.health_log
        )
        self.watch.start()

        here = f"http://127.0.0.1:{self.target_port}"
        workload = Workload(
            s.shape,
            f"{here}{HOOK}",
            self.rng,
            guarded_url=f"{here}{GUARDED}",
            status_url=f"{here}{STATUS}",
        )
        clients = [n.http for n in self.cluster.nodes.values()]
        self._create_all(clients, workload.cron_jobs())
        self.workers = fl.Workers(self._start_worker, s.workers)
        self.workers.start_all()
        time.sleep(s.warmup_s)  # the cluster runs undisturbed first: a baseline to recover to

        chaos = fl.Chaos(
            self.cluster,
            self.kafka,
            self.workers,
            self.cluster.nodes[SKEWED],
            self.faults_log,
            f"{self.cluster.prefix}.events",
            on_step_back=lambda before, after, at: self._probe_step(
                workload, clients, before, after, at
            ),
        )
        faults_began = now_ms()
        until = time.monotonic() + s.duration_s
        bursts = self._burst_episodes(the_plan)
        creating: list[threading.Thread] = []

        def on_episode(index: int) -> None:
            if index in bursts:
                t = threading.Thread(
                    target=self._burst, args=(workload, clients, bursts[index]), name="burst"
                )
                t.start()
                creating.append(t)

        episodes = chaos.run(the_plan, until, on_episode)
        for t in creating:
            t.join()
        faults_ended = now_ms()
        log.info(
            "%d episodes of faults in %.0f s; draining",
            episodes,
            (faults_ended - faults_began) / 1000,
        )
        time.sleep(s.drain_s)  # the drain: the cluster runs without faults, as it must recover

        window_end = now_ms() - WINDOW_MARGIN_MS
        self.watch.stop()
        pauses = self._pause_all(clients, workload)
        reader = gather.EventReader(
            self.kafka.bootstrap_servers, f"{self.cluster.prefix}.events", self.out / "events.jsonl"
        )
        try:
            live = self._settle(reader)
            self.workers.stop_all()
            history = self._history(reader, window_end)
        finally:
            reader.close()
        self._save(history)
        report = check(history)
        report.figures["settings"] = _settings_json(s)
        report.figures["fault_episodes"] = episodes
        report.figures["faults_seconds"] = round((faults_ended - faults_began) / 1000, 1)
        report.figures["pauses_not_acknowledged"] = pauses
        report.figures["live_runs_after_settle"] = len(live)
        report.figures["node_log"] = node_log_figures(self.out, NODES)
        if self.load_1m:
            report.figures["load_1m"] = {
                "min": round(min(self.load_1m), 2),
                "median": round(statistics.median(self.load_1m), 2),
                "max": round(max(self.load_1m), 2),
                "cores": os.cpu_count(),
            }
        write_report(self.out, report)
        return report

    def _create_all(self, clients: list[httpx.Client], jobs: list[dict[str, Any]]) -> None:
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda ij: create(
                        [*clients[ij[0] % 3 :], *clients[: ij[0] % 3]], ij[1], self.creates
                    ),
                    enumerate(jobs),
                )
            )

    def _supervise(self) -> None:
        """Start again a node that exited by itself, as a process supervisor would, and say so
        in the faults log (a finding, not a fault the plan made)."""
        assert self.cluster is not None
        ticks = 0
        while not self._closing.wait(0.5):
            if ticks % 10 == 0:
                self.load_1m.append(os.getloadavg()[0])
            ticks += 1
            for node in self.cluster.nodes.values():
                code = node.revive()
                if code is None:
                    continue
                last = [line for line in node.log_tail(200).splitlines() if "Error" in line]
                self.faults_log.write(
                    {
                        "record": "exit",
                        "node": node.node_id,
                        "code": code,
                        "at": now_ms(),
                        "error": last[-1][-500:] if last else "",
                    }
                )
                log.warning("%s exited by itself (%s); started again", node.node_id, code)

    def _probe_step(
        self,
        workload: Workload,
        clients: list[httpx.Client],
        before_s: float,
        after_s: float,
        stepped_at: int,
    ) -> None:
        """One-shot jobs due where a clock stepped back from ``before_s`` to ``after_s`` has
        been before: by the node's clock still to come, by its partitions' earlier decisions
        already past. Each must still fire (``docs/reliability.md``, clock skew)."""
        number = len(self._probing)

        def probe() -> None:
            # libfaketime reads the new offset within two seconds.
            if self._closing.wait(2.2):
                return
            created = now_ms()
            low = created + round(after_s * 1000) + 100  # the node's clock now
            high = stepped_at + round(before_s * 1000) - 100  # its latest reading before
            if high - low < 200:
                return
            rng = random.Random(self.s.seed * 7919 + 500 + number)
            jobs = []
            for i in range(PROBES_PER_STEP):
                run_at = rng.randint(low, high)
                body = workload.probe(f"probe-{number:02d}-{i:02d}", run_at)
                jobs.append(body)
                self.probes.write({"job": body["job_id"], "run_at": run_at, "at": created})
            self._create_all(clients, jobs)

        t = threading.Thread(target=probe, name="probe")
        t.start()
        self._probing.append(t)

    def _burst_episodes(self, the_plan: fl.Plan) -> dict[int, int]:
        """Which episodes a burst of one-shot jobs is created with: episode -> burst number."""
        s = self.s
        rng = random.Random(s.seed * 7919 + 1)  # apart from the plan's draws
        horizon = len(the_plan.episodes)
        if s.mode == "random":
            horizon = min(horizon, max(1, int(s.duration_s / 20)))  # ones that will run
        chosen = sorted(rng.sample(range(horizon), min(horizon, s.shape.oneshot_bursts)))
        return {episode: number for number, episode in enumerate(chosen)}

    def _burst(self, workload: Workload, clients: list[httpx.Client], number: int) -> None:
        """A burst of one-shot jobs all due in one second, a few seconds from now."""
        rng = random.Random(self.s.seed * 7919 + 100 + number)
        due = (now_ms() + rng.randint(4000, 9000)) // 1000 * 1000
        self._create_all(clients, workload.burst(number, due, rng))

    def _pause_all(self, clients: list[httpx.Client], workload: Workload) -> int:
        """Pause every job; how many could not be paused (their partitions did not answer)."""
        pauses = Recorder(self.out / "pauses.jsonl")
        failed = 0

        def pause(i_job: tuple[int, dict[str, Any]]) -> bool:
            i, job = i_job
            for attempt in range(PAUSE_TRIES):
                client = clients[(i + attempt) % len(clients)]
                try:
                    status = client.patch(
                        f"/v1/jobs/{job['job_id']}", json={"status": "paused"}, timeout=15.0
                    ).status_code
                except httpx.HTTPError:
                    status = 0
                pauses.write({"job": job["job_id"], "status": status, "at": now_ms()})
                if status == 200:
                    return True
            return False

        with ThreadPoolExecutor(8) as pool:
            failed = sum(not ok for ok in pool.map(pause, enumerate(workload.crons)))
        pauses.close()
        return failed

    def _settle(self, reader: gather.EventReader) -> set[str]:
        """Read the events until no run is live (or the bound passes); the runs still live."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            reader.catch_up()
            live = gather.live_runs(reader.events)
            if not live or time.monotonic() >= deadline:
                return live
            time.sleep(2.0)  # runs end on lease and retry timers: nothing to wait on but the log

    def _history(self, reader: gather.EventReader, window_end: int) -> History:
        assert self.cluster is not None
        reader.catch_up()
        assert self.kafka is not None
        if self.s.shape.topic:
            topic = self.out / "topic.jsonl"  # the kafka:// jobs' records
            gather.EventReader(self.kafka.bootstrap_servers, TEAM_TOPIC, topic).catch_up()
        # The commands as sent, for a reader of the run (the checker does not need them): a
        # request forwarded to a partition's owner is one, and where it went is in them.
        commands = self.out / "commands.jsonl"
        gather.EventReader(
            self.kafka.bootstrap_servers, f"{self.cluster.prefix}.commands", commands
        ).catch_up()
        calls, bad_calls = read(self.out / "target.jsonl")
        work, bad_work = read_all(sorted((self.out / "workers").glob("*.jsonl")))
        creates, _ = read(self.out / "creates.jsonl")
        faults_log, _ = read(self.out / "faults.jsonl")
        probes, _ = read(self.out / "probes.jsonl")
        samples, _ = read(self.out / "health.jsonl")
        job_ids = sorted({c["job"] for c in creates})
        history = History(
            tenant=TENANT,
            partitions=self.s.partitions,
            events=reader.events,
            calls=calls,
            work=work,
            creates=creates,
            faults=faults_log,
            window_end_ms=window_end,
            unreadable_records=bad_calls + bad_work,
            probes=probes,
            health_samples=samples,
            topic_records=gather.topic_records(self.out / "topic.jsonl"),
        )
        for node in self.cluster.nodes.values():
            history.health[node.node_id] = _settled_health(node.url, self.s.partitions)
            if not history.health[node.node_id].ready:
                node.dump_stacks()  # where it is stuck, into its log, before it is stopped
            try:
                history.api_runs[node.node_id] = gather.api_runs(node.url, TOKEN, job_ids)
            except httpx.HTTPError as e:
                history.health[node.node_id].error += f" runs: {e}"
        return history

    def _save(self, history: History) -> None:
        # The events as read are in events.jsonl already (gather.EventReader).
        saved = {
            "window_end_ms": history.window_end_ms,
            "partitions": history.partitions,
            "tenant": history.tenant,
            "unreadable_records": history.unreadable_records,
            "health": {k: asdict(v) for k, v in history.health.items()},
        }
        (self.out / "history.json").write_text(json.dumps(saved, indent=1))
        (self.out / "api_runs.json").write_text(json.dumps(history.api_runs))

    def close(self) -> None:
        self._closing.set()
        if self.watch is not None:
            self.watch.stop()
        if self._supervisor.is_alive():
            self._supervisor.join()
        for t in self._probing:
            t.join()
        if self.workers is not None:
            with contextlib.suppress(Exception):
                self.workers.stop_all(grace_s=5.0)
        if self.cluster is not None:
            self.cluster.stop()
        if self.target is not None and self.target.poll() is None:
            self.target.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.target.wait(10)
            if self.target.poll() is None:
                self.target.kill()
        if self.kafka is not None:
            # Keep the brokers' logs beside the run; their data goes.
            for node in self.kafka.nodes:
                with contextlib.suppress(OSError):
                    (self.out / f"broker-{node.node_id}.log").write_bytes(
                        node.log_path.read_bytes()
                    )
            self.kafka.stop()
        self.faults_log.close()
        self.creates.close()
        self.probes.close()
        self.health_log.close()


def _write_secret(data_dir: Path, name: str, value: str) -> None:
    """The team's secret ``name`` in a node's secrets directory (``node/secrets.py``: the data
    directory's ``secrets/<tenant>/<name>``), before the node first starts."""
    team = data_dir / "secrets" / TENANT
    for directory in (data_dir, team.parent, team):  # the node's own, as serve makes them
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    (team / name).write_text(value + "\n")


def _settled_health(url: str, partitions: int) -> NodeHealth:
    # A rebalance may be finishing as the run ends: look a few times before saying "not ready".
    health = gather.node_health(url, METRICS_TOKEN)
    for _ in range(20):
        if health.ready and not health.error:
            return health
        time.sleep(1.0)
        health = gather.node_health(url, METRICS_TOKEN)
    return health


def _settings_json(s: Settings) -> dict[str, Any]:
    return {
        "seed": s.seed,
        "duration_s": s.duration_s,
        "kinds": s.kinds,
        "mode": s.mode,
        "combine_p": s.combine_p,
        "shape": asdict(s.shape),
        "partitions": s.partitions,
        "workers": s.workers,
        "drain_s": s.drain_s,
    }


def node_log_figures(out: Path, nodes: tuple[str, ...]) -> dict[str, Any]:
    """Errors the nodes logged: runner failures, tracebacks, ERROR lines by logger."""
    figures: dict[str, Any] = {}
    for node in nodes:
        path = out / f"{node}.log"
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        errors: dict[str, int] = {}
        for line in text.splitlines():
            parts = line.split(" ", 4)
            if len(parts) >= 4 and parts[2] == "ERROR":
                name = parts[3].rstrip(":")
                errors[name] = errors.get(name, 0) + 1
        figures[node] = {
            "runner_failed": text.count("runner failed"),
            "tracebacks": text.count("Traceback (most recent call last)"),
            "errors_by_logger": errors,
        }
    return figures


def write_report(out: Path, report: Report) -> None:
    (out / "report.json").write_text(json.dumps(report.as_json(), indent=2) + "\n")
    (out / "report.txt").write_text(summary(report) + "\n")


def load_history(out: Path) -> History:
    """A finished run's history from its directory (``check`` without the cluster)."""
    saved = json.loads((out / "history.json").read_text())
    events = {
        p: [(o, e) for o, e, _ in records]
        for p, records in gather.read_file(out / "events.jsonl").items()
    }
    calls, _ = read(out / "target.jsonl")
    work, _ = read_all(sorted((out / "workers").glob("*.jsonl")))
    creates, _ = read(out / "creates.jsonl")
    faults_log, _ = read(out / "faults.jsonl")
    probes, _ = read(out / "probes.jsonl")
    samples, _ = read(out / "health.jsonl")
    return History(
        tenant=saved["tenant"],
        partitions=saved["partitions"],
        events=events,
        calls=calls,
        work=work,
        creates=creates,
        faults=faults_log,
        window_end_ms=saved["window_end_ms"],
        api_runs=json.loads((out / "api_runs.json").read_text()),
        health={k: NodeHealth(**v) for k, v in saved["health"].items()},
        unreadable_records=saved["unreadable_records"],
        probes=probes,
        health_samples=samples,
        topic_records=gather.topic_records(out / "topic.jsonl"),
    )


def _create_team_topic(bootstrap: str) -> None:
    """The team's topic the ``kafka://`` jobs produce to, replicated as the cluster's own."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(TEAM_TOPIC, 3, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])[TEAM_TOPIC].result(60)


def run(s: Settings) -> Report:
    r = Run(s)
    try:
        return r.execute()
    finally:
        r.close()
