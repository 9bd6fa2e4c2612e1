"""A real Kafka broker for tests and benchmarks, run from Maven Central jars, no tarball or Docker.

Three steps, each usable from Python or the command line::

    python -m tools.kafka.broker fetch                 # into ${CRONLOG_CACHE:-~/.cache/cronlog}
    python -m tools.kafka.broker start --nodes 3       # prints KAFKA_BOOTSTRAP_SERVERS=...
    python -m tools.kafka.broker stop

    cluster = start(nodes=1, base_dir=tmp)             # returns once metadata answers
    cluster.bootstrap_servers                          # "127.0.0.1:41234"
    cluster.kill(2)                                    # SIGKILL node 2 (failover tests)
    cluster.restart(2)                                 # back on its ports and data
    cluster.stop()                                     # terminate, then kill; drop data dirs

``fetch`` resolves ``pom.xml`` beside this file with Maven into ``kafka-<version>/`` under the
cache and writes a marker once every jar is there, so later calls cost nothing. ``start`` runs
every node as a combined KRaft broker+controller on 127.0.0.1 with ports picked at runtime. All
nodes share a static ``controller.quorum.voters`` list and one cluster id; one node is simply a
quorum of one, so one and three nodes take the same path. Internal topics get replication factor
1 on one node and 3 with ``min.insync.replicas=2`` on three.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

POM = Path(__file__).with_name("pom.xml")
SERVER_MAIN = "kafka.Kafka"
STORAGE_MAIN = "kafka.tools.StorageTool"
MARKER = ".complete"
STATE_FILE = "cluster.json"
# Light enough for three JVMs on a two-core machine; the broker needs no more for tests.
JVM_FLAGS = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
LOG_FLAGS = (
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
    "-Dorg.slf4j.simpleLogger.showThreadName=false",
)


class BrokerError(RuntimeError):
    """The broker could not be fetched, formatted or started; the message says why."""


def kafka_version() -> str:
    """The Kafka version pinned in ``pom.xml`` (the one source of truth)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    version = ET.parse(POM).getroot().findtext("m:properties/m:kafka.version", namespaces=ns)
    if not version:
        raise BrokerError(f"{POM} does not pin kafka.version")
    return version


def cache_root() -> Path:
    return Path(os.environ.get("CRONLOG_CACHE") or "~/.cache/cronlog").expanduser()


def jars_dir() -> Path:
    return cache_root() / f"kafka-{kafka_version()}"


def _complete(jars: Path) -> bool:
    marker = jars / MARKER
    if not marker.is_file():
        return False
    names = marker.read_text().split()
    return bool(names) and all((jars / name).is_file() for name in names)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def fetch() -> Path:
    """Resolve the broker's jars into the cache (skipped when complete); return their folder."""
    jars = jars_dir()
    if _complete(jars):
        return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("Maven (mvn) is not on PATH; it is needed once to fetch the Kafka jars")
    with _locked(jars.with_name(jars.name + ".lock")):
        if _complete(jars):  # another process fetched while we waited
            return jars
        staging = Path(tempfile.mkdtemp(prefix=jars.name + ".", dir=jars.parent))
        try:
            result = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "-f",
                    str(POM),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={staging}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise BrokerError(f"mvn failed ({result.returncode}):\n{_tail(result.stdout)}")
            names = sorted(p.name for p in staging.glob("*.jar"))
            if not names:
                raise BrokerError(f"mvn copied no jars into {staging}")
            (staging / MARKER).write_text("\n".join(names) + "\n")
            shutil.rmtree(jars, ignore_errors=True)
            staging.rename(jars)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return jars


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _free_ports(count: int) -> list[int]:
    # Hold every socket until all are bound so the kernel hands out distinct ports.
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _cluster_id() -> str:
    # Kafka's Uuid text form: 16 random bytes, URL-safe base64 without padding. Kafka never hands
    # out ids that start with "-" (they read as a command-line flag); neither do we.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java is not on PATH; Kafka 4 needs Java 17 or newer")
    return java


@dataclass
class Node:
    node_id: int
    port: int
    controller_port: int
    home: Path
    pid: int | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def properties(self) -> Path:
        return self.home / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return _tail(self.log_path.read_text(errors="replace"), lines)
        except FileNotFoundError:
            return "(no log)"

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and _is_our_broker(self.pid, self.properties)


def _is_our_broker(pid: int, properties: Path) -> bool:
    """Whether ``pid`` still runs this node's broker (and is not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return SERVER_MAIN.encode() in cmdline and str(properties).encode() in cmdline


class KafkaCluster:
    """One or three combined KRaft nodes on loopback, owned by whoever started them."""

    def __init__(self, nodes: list[Node], base_dir: Path, cluster_id: str) -> None:
        self.nodes = nodes
        self.base_dir = base_dir
        self.cluster_id = cluster_id

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def node(self, node_id: int) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} in cluster {self.cluster_id}")

    def kill(self, node_id: int) -> None:
        """SIGKILL one node, as a crash would; its data stays until :meth:`stop`."""
        node = self.node(node_id)
        if node.process is not None:
            node.process.kill()
            node.process.wait()
        elif node.alive() and node.pid is not None:
            os.kill(node.pid, signal.SIGKILL)

    def restart(self, node_id: int, timeout_s: float = 90.0) -> None:
        """Start a killed node again on its old ports and data; return once all nodes answer."""
        node = self.node(node_id)
        if node.alive():
            raise BrokerError(f"node {node_id} is running; kill it first")
        _launch(_java(), str(fetch() / "*"), node, detach=node.process is None)
        wait_ready(self, timeout_s)

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate every node, kill those still alive after ``grace_s``, remove data dirs."""
        running = [n for n in self.nodes if n.alive()]
        for n in running:
            _signal(n, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for n in running:
            if not _wait_exit(n, deadline):
                _signal(n, signal.SIGKILL)
                _wait_exit(n, time.monotonic() + 5.0)
        for n in self.nodes:
            shutil.rmtree(n.data_dir, ignore_errors=True)
        (self.base_dir / STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def save(self) -> None:
        state = {
            "cluster_id": self.cluster_id,
            "bootstrap_servers": self.bootstrap_servers,
            "nodes": [
                {
                    "node_id": n.node_id,
                    "port": n.port,
                    "controller_port": n.controller_port,
                    "home": str(n.home),
                    "pid": n.process.pid if n.process else n.pid,
                }
                for n in self.nodes
            ],
        }
        (self.base_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load(cls, base_dir: Path) -> KafkaCluster:
        state = json.loads((base_dir / STATE_FILE).read_text())
        nodes = [
            Node(d["node_id"], d["port"], d["controller_port"], Path(d["home"]), pid=d["pid"])
            for d in state["nodes"]
        ]
        return cls(nodes, base_dir, state["cluster_id"])


def _signal(node: Node, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        if node.process is not None:
            node.process.send_signal(sig)
        elif node.pid is not None:
            os.kill(node.pid, sig)


def _wait_exit(node: Node, deadline: float) -> bool:
    if node.process is not None:
        try:
            node.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True
    while node.alive():  # not our child: nothing to wait on but the pid itself
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _server_properties(node: Node, nodes: list[Node]) -> str:
    replicas = min(3, len(nodes))
    min_isr = 2 if replicas == 3 else 1
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes)
    settings = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": node.data_dir,
        "num.partitions": 1,
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 8,  # the default 50 slows the first group join
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": 8,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": 0,
        # A broker that dies is fenced after this (default 9 s): until then every acks=all
        # write to a partition it follows waits for it, and the coordinators it hosts stay
        # with it. So one broker's death darkened every cronlog partition for 10-16 s.
        "broker.session.timeout.ms": 2000,
        "broker.heartbeat.interval.ms": 250,
        # The controllers notice their leader gone after this (default 2 s) and elect within
        # the election timeout (default 1 s): a dead broker that was also the active
        # controller is fenced only once a new one is elected.
        "controller.quorum.fetch.timeout.ms": 1000,
        "controller.quorum.election.timeout.ms": 500,
        # Lets a group session be shorter than the broker default's floor of 6 s (cronlog's
        # default, eventlog.kafka.SESSION_TIMEOUT_MS, is 6 s; tests and --group-session-ms
        # go lower).
        "group.min.session.timeout.ms": 1000,
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def _format(java: str, classpath: str, cluster_id: str, nodes: list[Node]) -> None:
    # Formatting runs a JVM per node; start them together to save seconds on three nodes.
    procs = [
        (
            n,
            subprocess.Popen(
                [
                    java,
                    *JVM_FLAGS,
                    "-cp",
                    classpath,
                    STORAGE_MAIN,
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(n.properties),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            ),
        )
        for n in nodes
    ]
    for n, p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise BrokerError(
                f"formatting node {n.node_id} failed ({p.returncode}):\n"
                f"{_tail(out.decode(errors='replace'))}"
            )


def _launch(java: str, classpath: str, node: Node, *, detach: bool) -> None:
    with node.log_path.open("ab") as log:
        node.process = subprocess.Popen(
            [java, *JVM_FLAGS, *LOG_FLAGS, "-cp", classpath, SERVER_MAIN, str(node.properties)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=detach,
            preexec_fn=None if detach else _die_with_parent,
        )


def _die_with_parent() -> None:
    # A test run that dies hard must not leave brokers behind: ask Linux to SIGKILL the JVM
    # when the process that started it goes away.
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def wait_ready(cluster: KafkaCluster, timeout_s: float = 90.0) -> None:
    """Return once a metadata request lists every node; raise with the log tail otherwise."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    seen = 0
    while True:
        for n in cluster.nodes:
            if not n.alive():
                raise BrokerError(
                    f"Kafka node {n.node_id} exited during start-up; {n.log_path}:\n{n.log_tail()}"
                )
        try:
            seen = len(admin.list_topics(timeout=1.0).brokers)
        except Exception:  # KafkaException until a broker answers
            seen = 0
        if seen == len(cluster.nodes):
            return
        if time.monotonic() >= deadline:
            tails = "\n".join(
                f"--- node {n.node_id} ({n.log_path}):\n{n.log_tail()}" for n in cluster.nodes
            )
            raise BrokerError(
                f"Kafka did not answer metadata with {len(cluster.nodes)} brokers within "
                f"{timeout_s:.0f}s (saw {seen}):\n{tails}"
            )
        time.sleep(0.2)


def start(
    nodes: int = 1,
    base_dir: Path | str | None = None,
    *,
    timeout_s: float = 90.0,
    detach: bool = False,
) -> KafkaCluster:
    """Fetch if needed, format and launch ``nodes`` combined nodes; return once they answer.

    ``detach`` lets the brokers outlive this process (the command line's ``start``); otherwise
    they die with it, should :meth:`KafkaCluster.stop` never run.
    """
    if nodes not in (1, 3):
        raise ValueError(f"nodes must be 1 or 3, not {nodes}")
    base = Path(base_dir) if base_dir is not None else Path(tempfile.mkdtemp(prefix="kafka-"))
    java = _java()
    classpath = str(fetch() / "*")
    ports = _free_ports(2 * nodes)
    members = [
        Node(i + 1, ports[2 * i], ports[2 * i + 1], base / f"node-{i + 1}") for i in range(nodes)
    ]
    for n in members:
        n.home.mkdir(parents=True, exist_ok=True)
    for n in members:
        n.properties.write_text(_server_properties(n, members))
    cluster = KafkaCluster(members, base, _cluster_id())
    _format(java, classpath, cluster.cluster_id, members)
    try:
        for n in members:
            _launch(java, classpath, n, detach=detach)
        wait_ready(cluster, timeout_s)
    except BaseException:
        cluster.stop(grace_s=0.0)
        raise
    cluster.save()
    return cluster


def stop(base_dir: Path | str) -> None:
    """Stop the cluster a detached :func:`start` left in ``base_dir``."""
    KafkaCluster.load(Path(base_dir)).stop()


def main(argv: list[str] | None = None) -> int:
    default_base = cache_root() / "broker"
    parser = argparse.ArgumentParser(
        prog="python -m tools.kafka.broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="resolve the broker's jars into the cache")
    start_p = sub.add_parser("start", help="start a detached cluster")
    start_p.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    start_p.add_argument("--timeout", type=float, default=90.0)
    stop_p = sub.add_parser("stop", help="stop the cluster started by 'start'")
    for p in (start_p, stop_p):
        p.add_argument(
            "--base-dir",
            type=Path,
            default=default_base,
            help=f"where node configs, data and logs live (default {default_base})",
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            began = time.monotonic()
            jars = fetch()
            print(f"{jars} ({time.monotonic() - began:.1f}s)")
        elif args.command == "start":
            if (args.base_dir / STATE_FILE).exists():
                print(f"a cluster is recorded in {args.base_dir}; stop it first", file=sys.stderr)
                return 1
            began = time.monotonic()
            cluster = start(args.nodes, args.base_dir, timeout_s=args.timeout, detach=True)
            print(f"KAFKA_BOOTSTRAP_SERVERS={cluster.bootstrap_servers}")
            print(
                f"# {args.nodes} node(s) ready in {time.monotonic() - began:.1f}s; "
                f"logs in {args.base_dir}/node-*/server.log",
                file=sys.stderr,
            )
        else:
            stop(args.base_dir)
    except BrokerError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
