"""``cronlog serve --workers N``: one node of several processes on the embedded log.

The parent process keeps what only one process may hold, and the workers do the rest:

- **The parent** opens the embedded log (one RocksDB directory, one process), serves it to the
  workers on a Unix socket (:class:`eventlog.log_server.LogServer`: appends, reads, the group
  that shares the partitions, the reply mailboxes), opens the API's listening socket once,
  runs the log's start check, its damage watch and its archive-then-prune loop, and keeps the
  workers running: each is a :class:`WorkerProcess` service of the parent's supervisor, started
  again with a doubling backoff when it exits while it should run (``kill -9`` included).
- **A worker** is a whole node, ``cronlog serve`` with the same settings (`_serve` in
  ``cli/serve.py`` with ``--worker-index``): its log is a :class:`eventlog.remote.RemoteLog`,
  it owns the partitions the group gives it (partition p to member p mod m of the live ones),
  forwards the requests for the others exactly as cluster nodes do on Kafka, makes its own
  partitions' calls, folds its read model and serves the API on the inherited socket, which the
  kernel shares among the workers' accepts. Worker 0 keeps the single process's ``node``
  directory; worker i > 0 has ``node-<i>``.
- **Retention** in the parent never prunes what a worker still needs: each worker writes, every
  few seconds, its read model's durable positions and its owned partitions' recovery floors
  (:class:`FloorReport`, ``workers/<i>.floor``); the parent prunes a partition only below the
  least of every worker's report, and not at all while a worker has not reported or no worker
  reports owning the partition. A report only rises, so an old one is a safe one.

What is per process, and so per worker: the call room and the team caps (``--max-calls`` and
``--max-calls-per-team`` are divided among the workers), the request rates of ``--limits``
(per process, as they are per node in a cluster), ``/metrics`` (each worker's own, labelled with
its node id: see docs/operations.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING, Any

from node.worker import OneShot, PeriodicWorker, Worker

if TYPE_CHECKING:
    from eventlog.remote import RemoteLog
    from node.node import Node
    from node.supervisor import Supervisor

log = logging.getLogger("cronlog")

LOG_SOCKET = "log.sock"  # in the data directory
FLOORS_DIR = "workers"
REPORT_EVERY_S = 5.0
LOOK_S = 0.5  # how often a worker process's service looks at its process
STOP_GRACE_S = 15.0  # beyond --drain-sec, how long a worker may take to stop before SIGKILL
LISTEN_BACKLOG = 4096
PARENT_PID = "CRONLOG_WORKER_PARENT"  # in a worker's environment: its parent's pid
BOOT = "CRONLOG_NODE_BOOT"  # ... and its node's boot (node.peer_watch), the parent's


def node_dir(data_dir: Path, index: int) -> Path:
    """A worker's own directory: its state stores and read model (worker 0 keeps the single
    process's, so a node started with and without ``--workers`` finds its stores)."""
    return data_dir / ("node" if index == 0 else f"node-{index}")


def worker_node_id(node_id: str, index: int) -> str:
    return f"{node_id}-w{index}"


def listening_socket(host: str, port: int) -> socket.socket:
    """The API's socket, opened once by the parent and inherited by every worker: connections
    wait in one queue, so a worker that dies leaves them to the others."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def worker_argv(argv: Sequence[str], index: int, fd: int, log_socket: Path) -> list[str]:
    """The command line of worker ``index``: the parent's own ``serve`` arguments, and where
    its log and its listening socket are."""
    return [
        sys.executable,
        "-m",
        "cli.main",
        *argv,
        "--worker-index",
        str(index),
        "--worker-fd",
        str(fd),
        "--worker-socket",
        str(log_socket),
    ]


class WorkerProcess(Worker):
    """One worker process as a service of the parent's supervisor: started, watched, and
    stopped with SIGTERM (SIGKILL after ``--drain-sec`` and a grace). A process that exits
    while it should run fails the service, and the supervisor starts it again after its
    backoff; exit 3 (the log is damaged) stops the parent instead."""

    def __init__(
        self,
        index: int,
        argv: list[str],
        fd: int,
        *,
        drain_s: float,
        on_damaged: Callable[[], None],
        on_died: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(f"worker-{index}", self._run, required=True)
        self._on_died = on_died
        self._stop_timeout_s = drain_s + STOP_GRACE_S + LOOK_S
        self.index = index
        self._argv = argv
        self._fd = fd
        self._drain_s = drain_s
        self._on_damaged = on_damaged
        self.process: subprocess.Popen[bytes] | None = None
        self._ending = False

    def begin_stop(self) -> None:
        """Ask the process to stop now (SIGTERM), without waiting: the parent asks every worker
        at once, so none takes over the partitions of another that is stopping too."""
        self._ending = True
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)

    def _run(self, stopping: threading.Event) -> None:
        # A session of its own: a terminal's Ctrl-C reaches the parent alone, which stops the
        # workers in order (each watches that its parent lives, should the parent be killed).
        process = subprocess.Popen(
            self._argv,
            pass_fds=(self._fd,),
            start_new_session=True,
            env={**os.environ, PARENT_PID: str(os.getpid())},
        )
        self.process = process
        log.info("worker %d started (pid %d)", self.index, process.pid)
        while not stopping.is_set():
            try:  # wakes the moment the process ends, not at the next look
                code = process.wait(LOOK_S)
            except subprocess.TimeoutExpired:
                continue
            if self._ending:
                return
            from cli.serve import EXIT_LOG_DAMAGED

            if code == EXIT_LOG_DAMAGED:
                log.error("worker %d stopped: the log is damaged", self.index)
                self._on_damaged()
                return
            if self._on_died is not None:
                try:
                    self._on_died(self.index)
                except Exception:  # only speeds the hand-over: the group's session still ends
                    log.exception("worker %d: its group members not removed", self.index)
            raise RuntimeError(f"worker {self.index} (pid {process.pid}) exited with {code}")
        self._end(process)

    def _end(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is not None:
            return
        if not self._ending:  # asked already (begin_stop): once is the request, not twice
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(self._drain_s + STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.error("worker %d did not stop in time: killed", self.index)
            process.kill()
            process.wait()


def all_joined(log_: RemoteLog, workers: int) -> OneShot:
    """A worker's start on the embedded log: ready once all ``workers`` have joined the group,
    so the node is ready when the partitions are shared as they will stay, not while they
    still move to the workers starting after this one. Only the start waits for it: a worker
    that dies later leaves its partitions to the others, whose readiness says whether they
    decide."""

    def wait(stopping: threading.Event) -> bool:
        while len(log_.assignment()) < workers:
            if stopping.wait(LOOK_S / 5):
                return False
        return True

    return OneShot("workers-joined", wait, required=True)


def all_up(data_dir: Path, index: int, workers: int) -> OneShot:
    """The same on Kafka, where the group is the brokers': ready once every sibling answers
    on its metrics socket, which it opens after it has joined the group."""
    from node.worker_metrics import ask

    def wait(stopping: threading.Event) -> bool:
        waiting = {i for i in range(workers) if i != index}
        while waiting:
            waiting = {i for i in waiting if ask(metrics_path(data_dir, i), LOOK_S) is None}
            if waiting and stopping.wait(LOOK_S / 5):
                return False
        return True

    return OneShot("workers-joined", wait, required=True)


def die_with_parent() -> None:
    """In a worker process: the kernel kills it the moment its parent dies (Linux's
    ``PR_SET_PDEATHSIG``), so a node killed with ``kill -9`` is down as a whole, as one process
    would be, not its workers draining on. Elsewhere the parent watch stops it within a second."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and name is not None:
        pr_set_pdeathsig = 1
        ctypes.CDLL(name, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid():  # the parent died before the line above
        sys.exit("cronlog: the parent process is gone")


def parent_pid() -> int:
    """The parent a worker process was started by (it tells its workers its pid)."""
    return int(os.environ.get(PARENT_PID, "0") or 0) or os.getppid()


# -- retention's floor, reported by the workers ------------------------------------------------


def metrics_path(data_dir: Path, index: int) -> Path:
    """Where worker ``index`` serves its own metrics to its siblings (node.worker_metrics)."""
    return data_dir / f"metrics-{index}.sock"


def ready_path(data_dir: Path, index: int) -> Path:
    """Where worker ``index`` says why it is not ready, to its siblings' ``/readyz``."""
    return data_dir / f"ready-{index}.sock"


def floor_path(data_dir: Path, index: int) -> Path:
    return data_dir / FLOORS_DIR / f"{index}.floor"


class FloorReport(PeriodicWorker):
    """A worker's part of the recovery floor, written for the parent's retention every
    ``REPORT_EVERY_S``: its read model's durable position on every partition, and the floor of
    each partition it owns (None while unknown)."""

    _thread_name = "floor-report"

    def __init__(self, node: Node, path: Path, every_s: float = REPORT_EVERY_S) -> None:
        self._node = node
        self._path = path
        self._every_s = every_s

    def _interval_s(self) -> float:
        return self._every_s

    def _failed(self) -> None:
        log.exception("could not write the retention floor report %s", self._path)

    def _pass(self) -> None:
        report = {
            "read_model": {str(p): o for p, o in self._node.history_positions().items()},
            # "owner": the read model holds the partitions it keeps only, and binds no other
            "history_on": self._node.history_on,
            "owned": {str(p): self._node.recovery_floor(p) for p in self._node.owned()},
            "at": time.time(),
        }
        self._path.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        os.replace(tmp, self._path)


def reported_floor(
    data_dir: Path,
    workers: int,
    *,
    fresh_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[int], int | None]:
    """The parent's recovery floor of a partition, from the workers' reports: the least of
    every worker's read-model position and of every owner's floor; None (prune nothing) while
    a worker has not reported, or no report owns the partition, or one says its floor is
    unknown. The reports are read once for a retention pass over every partition (again when
    they are older than ``fresh_s``), not once a partition."""
    read_at: float | None = None
    reports: list[dict[str, Any]] | None = None

    def load() -> list[dict[str, Any]] | None:
        nonlocal read_at, reports
        now = clock()
        if read_at is None or now - read_at >= fresh_s:
            read_at, reports = now, []
            for index in range(workers):
                try:
                    reports.append(json.loads(floor_path(data_dir, index).read_text()))
                except (OSError, ValueError):
                    reports = None  # one has not reported (or not readably): keep everything
                    break
        return reports

    def floor(partition: int) -> int | None:
        key = str(partition)
        lowest: int | None = None
        owners = 0
        reports = load()
        if reports is None:
            return None
        for report in reports:
            position = report.get("read_model", {}).get(key)
            if position is None:
                if report.get("history_on") == "owner":
                    pass  # it keeps that partition's history nowhere: no bound from it
                else:
                    return None
            else:
                lowest = position if lowest is None else min(lowest, position)
            owned = report.get("owned", {})
            if key in owned:
                if owned[key] is None:
                    return None
                owners += 1
                lowest = owned[key] if lowest is None else min(lowest, owned[key])
        return lowest if owners else None

    return floor


# -- the parent ---------------------------------------------------------------------------------


def serve_workers(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """The parent of ``args.workers`` worker processes (module docstring); returns serve's exit
    status. On Kafka the parent holds no log: each worker is a member of the consumer group,
    as a node of its own would be, and the parent keeps the port and the workers."""
    from cli.serve import (
        EXIT_LOG_DAMAGED,
        _already_stopping,
        _exit_cleanly,
        configure_logging,
        load_metrics_token,
        load_operator_token,
        load_tokens,
        make_private_dir,
    )
    from core.errors import LogCorrupted
    from node.supervisor import Supervisor

    configure_logging(args)
    os.umask(0o077)
    data_dir: Path = args.data_dir
    make_private_dir(data_dir)
    # What the workers would otherwise race to create on a first start.
    load_tokens(data_dir)
    load_metrics_token(data_dir)
    load_operator_token(data_dir)
    if args.secrets_dir is None:
        secrets = data_dir / "secrets"
        if not secrets.exists():
            secrets.mkdir(mode=0o700)
    stop = threading.Event()
    damaged: list[BaseException] = []
    supervisor = Supervisor()
    # one boot for the node: every worker started, and started again, says the same
    os.environ[BOOT] = token_hex(4)

    def found_damaged() -> None:  # a worker stopped on a damaged log (exit 3): so does the node
        damaged.append(LogCorrupted("a worker process found the log damaged; see its log"))
        stop.set()

    closing: list[Callable[[], None]] = []
    log_socket = data_dir / LOG_SOCKET
    try:
        if not args.kafka:
            closing = _serve_log(args, supervisor, stop, damaged)
        listener = listening_socket(args.host, args.port)
        closing.insert(0, listener.close)
        on_died = None
        if args.kafka and not args.no_peer_watch:
            on_died, close_admin = _member_remover(args)
            closing.append(close_admin)
        workers = [
            WorkerProcess(
                index,
                worker_argv(argv, index, listener.fileno(), log_socket),
                listener.fileno(),
                drain_s=args.drain_sec,
                on_damaged=found_damaged,
                on_died=on_died,
            )
            for index in range(args.workers)
        ]
        for worker in workers:
            supervisor.add(worker)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())
        supervisor.start()
        where = f"kafka {args.kafka}" if args.kafka else f"embedded log in {data_dir}"
        print(
            f"cronlog {args.node_id} serving on http://{args.host}:{args.port} with"
            f" {args.workers} worker processes ({where})",
            flush=True,
        )
        try:
            stop.wait()
        finally:
            # Stopping: a second SIGTERM must not cut the workers' drain short (the parent
            # would close the log under them); a second Ctrl-C still ends it at once.
            signal.signal(signal.SIGTERM, _already_stopping)
            signal.signal(signal.SIGINT, _exit_cleanly)
            for worker in workers:
                worker.begin_stop()
            supervisor.stop()
    finally:
        for close in closing:
            close()
    if damaged:
        print(f"cronlog: {damaged[0]}", file=sys.stderr, flush=True)
        return EXIT_LOG_DAMAGED
    return 0


def _member_remover(
    args: argparse.Namespace,
) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """On Kafka, what removes a dead worker's group members at once (node.peer_watch's
    ``remove_process``), so its partitions move to its siblings and the other nodes now, not
    when the group's session runs out; and what closes the admin client. The peer watch
    cannot see such a death: the node's port still answers, with the node's boot."""
    from cli.serve import read_kafka_config
    from eventlog.kafka import scheduler_group
    from node.peer_watch import group_admin, remove_process

    config = read_kafka_config(args.kafka_config) if args.kafka_config else {}
    admin = group_admin(args.kafka, scheduler_group(args.topic_prefix), config)
    if admin is None:
        return None, lambda: None
    boot = os.environ[BOOT]
    threading.Thread(target=admin.warm, name="group-admin-warm", daemon=True).start()

    def died(index: int) -> None:
        remove_process(admin, worker_node_id(args.node_id, index), boot)

    return died, admin.close


def _serve_log(
    args: argparse.Namespace,
    supervisor: Supervisor,
    stop: threading.Event,
    damaged: list[BaseException],
) -> list[Callable[[], None]]:
    """The embedded log in the parent: opened, served to the workers on a Unix socket, its
    start check, damage watch and archive-then-prune loop added to ``supervisor``; what closes
    it, in order."""
    from prometheus_client import CollectorRegistry

    from archive.archive import Archive
    from archive.archiver import Archiver
    from archive.store import DirectoryStore
    from cli import background
    from cli.retention_args import retention_from
    from cli.serve import _stored_partitions, make_private_dir
    from eventlog.embedded import EmbeddedLog
    from eventlog.log_server import LogServer
    from node.retention import EmbeddedRetention, RetentionMetrics, gap_counter

    data_dir: Path = args.data_dir
    (data_dir / FLOORS_DIR).mkdir(mode=0o700, exist_ok=True)
    for index in range(args.workers):
        floor_path(data_dir, index).unlink(missing_ok=True)  # reported afresh by this start's
    retention = retention_from(args)
    archive = None
    if args.archive_dir is not None or not args.no_archive:
        archive_dir = args.archive_dir or data_dir / "archive"
        make_private_dir(archive_dir)
        archive = Archive(DirectoryStore(archive_dir))
    raw_log = EmbeddedLog.open(
        data_dir / "log",
        _stored_partitions(data_dir, args.partitions),
        segment_bytes=retention.segment_bytes,
        segment_ms=retention.segment_ms,
    )
    try:
        server = LogServer(raw_log, data_dir / LOG_SOCKET)
    except BaseException:
        raw_log.close()
        raise

    class _StopFlag:
        """What the log watch stops: the parent's wait."""

        @property
        def should_exit(self) -> bool:
            return stop.is_set()

        @should_exit.setter
        def should_exit(self, value: bool) -> None:
            if value:
                stop.set()

    supervisor.add(background.log_watch(raw_log, _StopFlag(), damaged))
    if not args.skip_log_check:
        start_check = background.log_check_now(raw_log, full=args.full_log_check)
        supervisor.add(start_check)
        supervisor.add(background.log_check_serving(raw_log, start_check))
    # The archive's and retention's counters: logged, not served (the workers serve /metrics).
    metrics = RetentionMetrics(CollectorRegistry())
    archiver = None if archive is None else Archiver(raw_log, archive, on_gap=gap_counter(metrics))
    supervisor.add(
        EmbeddedRetention(
            raw_log,
            retention,
            reported_floor(data_dir, args.workers),
            metrics,
            archiver=archiver,
            interval_s=args.retention_check / 1000,
        )
    )
    return [server.close, raw_log.close]
