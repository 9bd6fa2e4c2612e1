"""Faults, alone and combined, at moments drawn from a seeded RNG, and the log of what was done.

A run's faults are a :class:`Plan`: episodes, each one fault or two overlapping ones, with a
quiet gap after each. The plan is drawn from the seed before anything starts, so ``--seed N``
replays the same faults in the same order at the same offsets (what they hit, such as "the
broker leading events partition 3", is resolved when they strike). Two faults are combined only
when they touch different things: never two broker faults at once (the fault model keeps two
of three brokers up), never two faults on one node, never anything beside a fault on all nodes.

The kinds, and what each does:

==================  =============================================================================
``node_kill``       SIGKILL a node; start it again after a few seconds (same port, same data)
``node_pause``      SIGSTOP a node past the group's session timeout, then SIGCONT: a zombie
``broker_leader``   SIGKILL the broker leading an events partition; restart it
``broker_controller``  SIGKILL the active KRaft controller; restart it
``restart_all``     SIGKILL every node at once and start them all again
``worker_kill``     SIGKILL a pull worker while it holds a run; start another
``process_kill``    SIGKILL one worker process of the node that runs several (``--workers``);
                    the node starts it again by itself
``rolling_restart`` SIGTERM each node in turn (a graceful drain), start it again, wait for ready
``clock_ahead``     the skewed node's wall clock jumps seconds ahead, then steps back to true
``clock_behind``    the skewed node's wall clock steps seconds back, then jumps to true again
==================  =============================================================================

Every fault is logged to ``faults.jsonl`` when it strikes and when it is healed (times are the
harness's true wall clock), with what it hit; clock changes are logged as ``clock`` records
the checker uses for the skew rule.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventlog.kafka import SESSION_TIMEOUT_MS
from tools.chaos.nodes import Cluster, NodeProcess
from tools.chaos.procs import in_spawner, now_ms
from tools.chaos.records import Recorder
from tools.kafka.broker import KafkaCluster

SESSION_TIMEOUT_S = SESSION_TIMEOUT_MS / 1000  # the nodes' group session (tools/kafka allows it)
READY_TIMEOUT_S = 120.0
IN_SYNC_TIMEOUT_S = 120.0

KINDS = (
    "node_kill",
    "node_pause",
    "broker_leader",
    "broker_controller",
    "restart_all",
    "worker_kill",
    "process_kill",
    "rolling_restart",
    "clock_ahead",
    "clock_behind",
)
# The node of the three that runs as several worker processes, and how many.
PROCESSES_NODE = "n2"
PROCESSES = 2
WORKER_RESTART_TIMEOUT_S = 60.0
ISSUE_12 = ("node_kill", "node_pause", "broker_leader", "restart_all")


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict[str, Any]
    delay_s: float = 0.0  # after the start of its episode

    def resources(self) -> set[str]:
        match self.kind:
            case "node_kill" | "node_pause" | "process_kill":
                return {f"node:{self.params['node']}"}
            case "restart_all" | "rolling_restart":
                return {"node:*"}
            case "broker_leader" | "broker_controller":
                return {"broker"}
            case "worker_kill":
                return {f"worker:{self.params['worker']}"}
            case _:
                return {"clock"}


def _compatible(a: Fault, b: Fault) -> bool:
    ra, rb = a.resources(), b.resources()
    if ra & rb:
        return False
    nodes = {r for r in ra | rb if r.startswith("node:")}
    return not ("node:*" in nodes and len(nodes) > 1)


@dataclass(frozen=True)
class Episode:
    faults: tuple[Fault, ...]
    gap_s: float  # quiet time after it


@dataclass(frozen=True)
class Plan:
    seed: int
    episodes: tuple[Episode, ...]

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "faults": [
                    {"kind": f.kind, "delay_s": round(f.delay_s, 1), **f.params} for f in e.faults
                ],
                "gap_s": round(e.gap_s, 1),
            }
            for e in self.episodes
        ]


def draw(
    rng: random.Random,
    kind: str,
    nodes: list[str],
    partitions: int,
    workers: int,
) -> Fault:
    """One fault of ``kind`` with its parameters drawn from ``rng``."""
    match kind:
        case "node_kill":
            params: dict[str, Any] = {"node": rng.choice(nodes), "down_s": rng.uniform(1, 6)}
        case "node_pause":
            params = {
                "node": rng.choice(nodes),
                "stopped_s": SESSION_TIMEOUT_S + rng.uniform(2, 5),
            }
        case "broker_leader":
            params = {"partition": rng.randrange(partitions), "down_s": rng.uniform(2, 8)}
        case "broker_controller":
            params = {"down_s": rng.uniform(2, 8)}
        case "restart_all":
            params = {"down_s": rng.uniform(0, 3)}
        case "worker_kill":
            params = {"worker": rng.randrange(workers), "down_s": rng.uniform(1, 3)}
        case "process_kill":
            params = {"node": PROCESSES_NODE, "process": rng.randrange(PROCESSES)}
        case "rolling_restart":
            params = {"order": rng.sample(nodes, len(nodes))}
        case "clock_ahead" | "clock_behind":
            params = {"skew_s": round(rng.uniform(2, 5), 1), "hold_s": rng.uniform(8, 15)}
        case _:
            raise ValueError(f"no fault kind {kind!r}; kinds: {', '.join(KINDS)}")
    return Fault(kind, params)


def plan(
    seed: int,
    kinds: list[str],
    *,
    nodes: list[str],
    partitions: int,
    workers: int,
    episodes: int,
    combine_p: float,
    gap_s: tuple[float, float] = (3.0, 8.0),
    each_once: bool = False,
) -> Plan:
    """``episodes`` episodes of faults drawn from ``kinds``. With ``each_once`` the kinds are
    used in a shuffled order, each once (combined ones count); otherwise drawn at random.
    A fault is combined with the next one with probability ``combine_p`` when compatible."""
    rng = random.Random(seed)
    queue = rng.sample(kinds, len(kinds)) if each_once else []

    def next_kind() -> str | None:
        if each_once:
            return queue.pop(0) if queue else None
        return rng.choice(kinds)

    out: list[Episode] = []
    while len(out) < episodes:
        kind = next_kind()
        if kind is None:
            break
        first = draw(rng, kind, nodes, partitions, workers)
        faults = [first]
        if rng.random() < combine_p:
            candidates = queue if each_once else kinds
            for other_kind in rng.sample(list(candidates), len(candidates)):
                second = draw(rng, other_kind, nodes, partitions, workers)
                if _compatible(first, second):
                    faults.append(Fault(second.kind, second.params, delay_s=rng.uniform(0.5, 4.0)))
                    if each_once:
                        queue.remove(other_kind)
                    break
        out.append(Episode(tuple(faults), rng.uniform(*gap_s)))
    return Plan(seed, tuple(out))


class Workers:
    """The pull worker processes, by index; a killed one is replaced by a new incarnation.
    ``start(worker_id)`` starts one and gives its process and the file it records to."""

    def __init__(
        self, start: Callable[[str], tuple[subprocess.Popen[bytes], Path]], count: int
    ) -> None:
        self._start = start
        self.incarnation = [0] * count
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self.records: list[Path] = []

    def worker_id(self, index: int) -> str:
        return f"w{index}.{self.incarnation[index]}"

    def start(self, index: int) -> None:
        self.incarnation[index] += 1
        proc, record = self._start(self.worker_id(index))
        self.procs[index] = proc
        self.records.append(record)

    def start_all(self) -> None:
        for i in range(len(self.procs)):
            self.start(i)

    def stop_all(self, grace_s: float = 15.0) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def record(self, index: int) -> Path:
        """The record of worker ``index``'s current incarnation."""
        wid = self.worker_id(index)
        for path in reversed(self.records):
            if path.stem == wid:
                return path
        raise KeyError(wid)


def in_hand(path: Path) -> list[str]:
    """The runs a worker has begun and not yet finished or given up, from its record."""
    open_runs: dict[tuple[str, int], bool] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        key = (r.get("run"), r.get("token"))
        if r.get("kind") == "work":
            open_runs[key] = True
        elif r.get("kind") in ("abandon", "complete"):
            open_runs.pop(key, None)
    return [run for run, _ in open_runs]


@dataclass
class Chaos:
    """What faults act on, and the log they write."""

    cluster: Cluster
    kafka: KafkaCluster
    workers: Workers
    skewed: NodeProcess
    log: Recorder
    events_topic: str
    stop: threading.Event = field(default_factory=threading.Event)
    # Called (old offset, new offset, when) as the skewed node's clock steps back.
    on_step_back: Callable[[float, float, int], None] | None = None

    def note(self, record: dict[str, Any]) -> None:
        self.log.write({**record, "logged_at": now_ms()})

    # -- running a plan -----------------------------------------------------------------------

    def run(
        self,
        the_plan: Plan,
        until_monotonic: float,
        on_episode: Callable[[int], None] = lambda i: None,
    ) -> int:
        """Run episodes until the plan ends or ``until_monotonic``; how many episodes ran.
        ``on_episode(i)`` is called as episode ``i`` starts."""
        ran = 0
        for index, episode in enumerate(the_plan.episodes):
            if time.monotonic() >= until_monotonic or self.stop.is_set():
                break
            on_episode(index)
            threads = [
                threading.Thread(target=self._strike, args=(f,), name=f"fault-{f.kind}")
                for f in episode.faults
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(READY_TIMEOUT_S * 3)
            ran += 1
            self.stop.wait(max(0.0, min(episode.gap_s, until_monotonic - time.monotonic())))
        return ran

    def _strike(self, fault: Fault) -> None:
        self.stop.wait(fault.delay_s)
        record: dict[str, Any] = {"kind": fault.kind, **fault.params}
        try:
            for update in getattr(self, f"_{fault.kind}")(fault.params):
                record.update(update)
        except Exception as e:  # a fault that could not be healed is a finding, not a crash
            record["error"] = f"{type(e).__name__}: {e}"[:2000]
        self.note({"record": "fault", **record})

    # Each fault is a generator: it yields what the log should say as it goes, so the record
    # has "injected_at" even if healing fails.

    def _node_kill(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        node = self.cluster.nodes[p["node"]]
        node.kill()
        yield {"injected_at": now_ms()}
        self.stop.wait(p["down_s"])
        node.restart()
        yield {"healed_at": now_ms()}
        node.wait_ready(READY_TIMEOUT_S, supervised=True)
        yield {"ready_at": now_ms()}

    def _node_pause(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        node = self.cluster.nodes[p["node"]]
        node.pause()
        yield {"injected_at": now_ms()}
        try:
            self.stop.wait(p["stopped_s"])
        finally:
            node.resume()
        yield {"healed_at": now_ms()}
        node.wait_ready(READY_TIMEOUT_S, supervised=True)
        yield {"ready_at": now_ms()}

    def _restart_all(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        nodes = list(self.cluster.nodes.values())
        for node in nodes:
            node.kill()
        yield {"injected_at": now_ms()}
        self.stop.wait(p["down_s"])
        for node in nodes:
            node.restart()
        yield {"healed_at": now_ms()}
        for node in nodes:
            node.wait_ready(READY_TIMEOUT_S, supervised=True)
        yield {"ready_at": now_ms()}

    def _rolling_restart(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield {"injected_at": now_ms()}
        for node_id in p["order"]:
            node = self.cluster.nodes[node_id]
            node.stop(grace_s=60.0)
            node.restart()
            node.wait_ready(READY_TIMEOUT_S, supervised=True)
        yield {"healed_at": now_ms(), "ready_at": now_ms()}

    def _broker_leader(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        broker_id = events_leader(self.kafka, self.events_topic, p["partition"])
        yield from self._broker_down(broker_id, p["down_s"])

    def _broker_controller(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield from self._broker_down(active_controller(self.kafka), p["down_s"])

    def _broker_down(self, broker_id: int, down_s: float) -> Iterator[dict[str, Any]]:
        self.kafka.kill(broker_id)
        yield {"broker": broker_id, "injected_at": now_ms()}
        self.stop.wait(down_s)
        # The broker dies with the thread that starts it (PR_SET_PDEATHSIG): start it from one
        # that lives as long as the harness.
        in_spawner(lambda: self.kafka.restart(broker_id, timeout_s=READY_TIMEOUT_S))
        yield {"healed_at": now_ms()}
        wait_in_sync(self.kafka, IN_SYNC_TIMEOUT_S)
        yield {"ready_at": now_ms()}

    def _worker_kill(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        index = p["worker"]
        record = self.workers.record(index)
        deadline = time.monotonic() + 10
        held: list[str] = []
        while not (held := in_hand(record)) and time.monotonic() < deadline:
            self.stop.wait(0.05)  # the worker's record is a file: no event to wait on
        proc = self.workers.procs[index]
        assert proc is not None
        proc.kill()
        proc.wait()
        yield {"injected_at": now_ms(), "worker_id": record.stem, "runs_in_hand": held}
        self.stop.wait(p["down_s"])
        self.workers.start(index)
        yield {"healed_at": now_ms(), "ready_at": now_ms()}

    def _process_kill(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        node = self.cluster.nodes[p["node"]]
        before = node.workers()
        if not before:
            raise RuntimeError(f"{node.node_id} runs no worker processes")
        victim = before[p["process"] % len(before)]
        os.kill(victim, signal.SIGKILL)
        yield {"injected_at": now_ms(), "pid": victim}
        deadline = time.monotonic() + WORKER_RESTART_TIMEOUT_S
        while len(after := node.workers()) < len(before) or victim in after:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.node_id} did not start its worker again")
            self.stop.wait(0.05)  # another process's children: nothing to wait on but /proc
        yield {"healed_at": now_ms()}
        node.wait_ready(READY_TIMEOUT_S, supervised=True)
        yield {"ready_at": now_ms()}

    def _clock_ahead(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield from self._skew(p["skew_s"], p["hold_s"])

    def _clock_behind(self, p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield from self._skew(-p["skew_s"], p["hold_s"])

    def _skew(self, offset_s: float, hold_s: float) -> Iterator[dict[str, Any]]:
        clock = self.skewed.clock
        assert clock is not None
        self.set_clock(offset_s)
        yield {"node": self.skewed.node_id, "injected_at": now_ms()}
        try:
            self.stop.wait(hold_s)
        finally:
            self.set_clock(0.0)
        yield {"healed_at": now_ms(), "ready_at": now_ms()}

    def set_clock(self, offset_s: float) -> None:
        assert self.skewed.clock is not None, "a plan with clock faults preloads libfaketime"
        before = self.skewed.clock.offset_s
        self.skewed.clock.set(offset_s)
        if offset_s < before and self.on_step_back is not None:
            self.on_step_back(before, offset_s, now_ms())
        self.note(
            {"record": "clock", "node": self.skewed.node_id, "offset_s": offset_s, "at": now_ms()}
        )


# -- Kafka facts ---------------------------------------------------------------------------------


def events_leader(kafka: KafkaCluster, topic: str, partition: int) -> int:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 0})
    meta = admin.list_topics(topic, timeout=10)
    leader = meta.topics[topic].partitions[partition].leader
    if leader < 0:
        raise RuntimeError(f"{topic}[{partition}] has no leader")
    return int(leader)


def active_controller(kafka: KafkaCluster) -> int:
    """The KRaft quorum's leader, as the nodes' own quorum-state files record it (the newest
    epoch wins); clients are not told which controller is active."""
    best: tuple[int, int] | None = None
    for node in kafka.nodes:
        path = node.data_dir / "__cluster_metadata-0" / "quorum-state"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
        if leader >= 0 and (best is None or epoch > best[1]):
            best = (leader, epoch)
    if best is None:
        raise RuntimeError("no quorum-state names a controller")
    return best[0]


def wait_in_sync(kafka: KafkaCluster, timeout_s: float) -> None:
    """Return once every partition of every topic has all its replicas in sync again."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    lagging: list[str] = []
    while time.monotonic() < deadline:
        try:
            meta = admin.list_topics(timeout=5)
        except Exception:
            time.sleep(0.5)
            continue
        lagging = [
            f"{t}[{p}]"
            for t, topic in meta.topics.items()
            for p, part in topic.partitions.items()
            if len(part.isrs) < len(part.replicas)
        ]
        if not lagging:
            return
        time.sleep(0.5)  # ISR changes are metadata; there is nothing to wait on but a poll
    raise RuntimeError(f"replicas not in sync after {timeout_s:.0f} s: {lagging[:10]}")
