"""``cronlog serve``: run a node on the embedded log, or join a cluster on Kafka.

cronlog serve [--data-dir DIR] [--host 127.0.0.1] [--port 8080] [--partitions 8]
cronlog serve --allow-targets 127.0.0.0/8               # let jobs call this machine
cronlog serve --kafka HOST:PORT [--node-id ID]          # join a cluster
cronlog serve --limits FILE                             # tenants' quotas and rates
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import gc
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from archive.reading import ArchivedLog
from cli import background
from cli.retention_args import add_retention_arguments, duration_ms, retention_from
from cli.workers import BOOT, die_with_parent, node_dir, worker_node_id
from core.partition import DEFAULT_ARM_MS, DEFAULT_LEAD_MS, MAX_ARM_MS, MAX_LEAD_MS
from eventlog.snapshots import DEFAULT_EVERY_EVENTS, DEFAULT_EVERY_S
from node.admission import DEFAULT_ROOM, default_reserve
from node.calls import COLLECTOR_THRESHOLDS
from node.peer_watch import advertised
from projections.history_checkpoint import DEFAULT_GRACE_MS, DEFAULT_KEEP

if TYPE_CHECKING:
    from api.limits import Limits
    from core.egress import EgressPolicy
    from eventlog.port import EventLog
    from eventlog.snapshots import SnapshotStore
    from node.owned_history import HistoryOn
    from node.produced import ProducedTargets

DEFAULT_DATA_DIR = Path(os.environ.get("CRONLOG_DATA_DIR", "~/.local/share/cronlog")).expanduser()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``serve`` subcommand's parser, added to ``sub``."""
    serve: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run a node (embedded log by default)"
    )
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="where the node keeps its log, state, history and tokens (default"
        f" {DEFAULT_DATA_DIR}, or CRONLOG_DATA_DIR)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address the API and the status UI listen on (default 127.0.0.1: this machine"
        " only; 0.0.0.0 for every interface)",
    )
    serve.add_argument(
        "--port", type=int, default=8080, help="the API's and the status UI's port (default 8080)"
    )
    serve.add_argument(
        "--partitions",
        type=int,
        default=8,
        help="partition count, fixed when the log is created (default 8)",
    )
    serve.add_argument(
        "--kafka",
        metavar="HOST:PORT",
        help="join a cluster on this Kafka instead of the embedded log",
    )
    serve.add_argument(
        "--node-id",
        default=socket.gethostname(),
        help="this node's name in logs, metrics and run attempts (default the host's name)",
    )
    serve.add_argument("--topic-prefix", default="cronlog")
    serve.add_argument(
        "--replication-factor",
        type=int,
        default=3,
        help="for the topics cronlog creates (default 3; 1 on a one-broker test)",
    )
    serve.add_argument(
        "--min-insync-replicas",
        type=int,
        default=2,
        help="for the topics cronlog creates (default 2; 1 on a one-broker test)",
    )
    serve.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        default=None,
        help="the address the other nodes of a cluster reach this one at (default --host:--port;"
        " the machine's name for a wildcard host): they ask it whether the node lives"
        " (node/peer_watch.py)",
    )
    serve.add_argument(
        "--no-peer-watch",
        action="store_true",
        help="on Kafka: do not remove a dead node's group members at once (its partitions then"
        " move when its group session ends)",
    )
    serve.add_argument(
        "--group-session-ms",
        type=int,
        default=None,
        metavar="MS",
        help="the scheduler group's session: the partitions of a node that stops answering move"
        " to the others after this long (a killed node's sooner, by the peer watch); keep it"
        " longer than a broker's fence plus a controller election, or each broker death moves"
        " every partition (default 6000; brokers refuse less than their"
        " group.min.session.timeout.ms, 6000 by Kafka's default, and the node then joins with"
        " 6000 and says so)",
    )
    serve.add_argument(
        "--kafka-config",
        type=Path,
        metavar="FILE",
        help="librdkafka settings for every Kafka client, one key=value a line (e.g."
        " security.protocol, sasl.mechanism, sasl.username, sasl.password, ssl.ca.location);"
        " a file, so secrets stay out of the process list",
    )
    serve.add_argument(
        "--target-kafka",
        metavar="HOST:PORT",
        help="Kafka for kafka:// job targets (default: --kafka)",
    )
    serve.add_argument(
        "--kafka-targets",
        choices=("exactly-once", "at-least-once"),
        help="how kafka:// runs are produced: exactly-once, in the events' own transaction (the"
        " default in cluster mode when the target Kafka is the cluster and has no credentials of"
        " its own), or at-least-once, as a call (the default otherwise; docs/reliability.md)",
    )
    serve.add_argument(
        "--max-calls",
        type=int,
        default=DEFAULT_ROOM,
        metavar="N",
        help="calls to HTTP and Kafka targets this node makes at once (default %(default)s; the"
        " open-files limit is raised to allow them, docs/operations.md 'Calls in flight')",
    )
    serve.add_argument(
        "--max-calls-per-team",
        type=int,
        metavar="N",
        help="the most calls one team's runs may hold at once; on a cluster (or with --workers)"
        " the team's across all of them, each node holding its share (default: no limit beyond"
        " --max-calls and --reserved-calls; when room is short, teams take turns either way)",
    )
    serve.add_argument(
        "--reserved-calls",
        type=int,
        metavar="N",
        help="the last N calls of the room go only to teams holding fewer than a hundredth of"
        " it, so one team's long calls never fill it for the others (default: a tenth of"
        " --max-calls; 0 keeps none)",
    )
    serve.add_argument(
        "--executor-processes",
        type=_processes,
        default=None,
        metavar="N",
        help="make the calls to HTTP and Kafka targets in N processes of their own, so they"
        " run on other cores than the partitions and the API (default: 1 when the node may use"
        " more than one core, else 0: in the node's process)",
    )
    serve.add_argument(
        "--workers",
        type=_processes,
        default=1,
        metavar="N",
        help="embedded log: run the node as N worker processes, each owning a share of the"
        " partitions and serving the API on the same port, beside a parent that serves them"
        " the log (default 1: one process; docs/operations.md, 'Worker processes')",
    )
    # A worker process of `--workers N` (cli/workers.py): set by its parent, never by hand.
    serve.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--worker-fd", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--worker-socket", type=Path, default=None, help=argparse.SUPPRESS)
    serve.add_argument(
        "--drain-sec",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, how long calls in flight may take to finish before they are abandoned"
        " (default 30)",
    )
    serve.add_argument(
        "--limits",
        type=Path,
        metavar="FILE",
        help="the tenants' quotas and request rates: a TOML file with [defaults] and"
        " [tenants.NAME] tables (see docs/security.md); without it every tenant gets the"
        " built-in defaults",
    )
    serve.add_argument(
        "--lead-time",
        type=float,
        default=DEFAULT_LEAD_MS / 1000,
        metavar="SEC",
        help="materialise each scheduled run this long before its slot, so that at the slot"
        " only its start is left (a job with a run still live is decided at the slot);"
        " 0 decides every slot at the slot (default %(default)g, at most 300)",
    )
    serve.add_argument(
        "--arm-ahead",
        type=float,
        default=DEFAULT_ARM_MS / 1000,
        metavar="SEC",
        help="lease each call to an HTTP or Kafka target this long before its start and hand it"
        " to the executor, which makes it at the start on its own timer, so that at a herd's"
        " slot nothing is left to decide; 0 leases each at its start (default %(default)g)",
    )
    serve.add_argument(
        "--job-retention-hours",
        type=float,
        default=24.0,  # core.partition.DEFAULT_RETENTION_MS
        metavar="H",
        help="how long a job that ended (cancelled, a one-shot that ran, a recurring job past"
        " its end_at) stays in its partition's state, so that a repeated request is answered"
        " from it; after that only its history is kept (default 24)",
    )
    serve.add_argument(
        "--rocksdb-memory-mb",
        type=int,
        default=64,  # eventlog.rocks.BLOCK_CACHE_BYTES
        metavar="MB",
        help="what RocksDB may hold in memory, for all of the node's stores together: one"
        " block cache, which the memtables are charged to (default 64; docs/operations.md)",
    )
    serve.add_argument(
        "--skip-log-check",
        action="store_true",
        help="no check of the embedded log, at start or while serving (the start's runs once"
        " the partitions have recovered, and /readyz waits for it; then what is appended is"
        " checked every 10 s; every read still checks what it reads)",
    )
    serve.add_argument(
        "--full-log-check",
        action="store_true",
        help="the start check reads the whole embedded log, not only what was written since"
        " the previous check (about 0.6 s per million records)",
    )
    snapshots = serve.add_argument_group(
        "snapshots",
        "each partition's owner snapshots its state so a new owner replays only the"
        " tail after it (docs/operations.md, 'Snapshots')",
    )
    snapshots.add_argument(
        "--snapshot-every-events",
        type=int,
        default=DEFAULT_EVERY_EVENTS,
        metavar="N",
        help=f"snapshot a partition after N events (default {DEFAULT_EVERY_EVENTS:,})",
    )
    snapshots.add_argument(
        "--snapshot-every-sec",
        type=float,
        default=DEFAULT_EVERY_S,
        metavar="S",
        help="or after S seconds with at least one event since the last snapshot (default"
        f" {DEFAULT_EVERY_S:.0f})",
    )
    snapshots.add_argument(
        "--standby-replicas",
        type=int,
        default=0,
        metavar="N",
        help="with --kafka: for each partition this node owns, keep the N partitions after it"
        " warm (their state followed in memory and on disk), so a takeover reads only the"
        " last events (default 0)",
    )
    snapshots.add_argument(
        "--cold-join",
        action="store_true",
        help="with --kafka: join the group at once, without first catching up the partitions"
        " it may give this node (a take-over from a live owner is then a cold one)",
    )
    snapshots.add_argument(
        "--no-snapshots",
        action="store_true",
        help="neither write nor restore snapshots: every recovery without a local store folds"
        " the partition's log from its first event",
    )
    history = serve.add_argument_group(
        "history checkpoints",
        "a node without a read model restores the newest read-model checkpoint from the"
        " archive directory and folds only the events after it (docs/operations.md)",
    )
    history.add_argument(
        "--history-on",
        choices=("every-node", "owner"),
        default=None,
        help="where each partition's history (its runs, dead letters, figures) is kept:"
        " every-node folds every partition into one read model on every node (and every"
        " worker process); owner folds each partition only where it is owned and asks its"
        " owner about the others (docs/architecture.md, 'History kept with its partition')."
        " Every node of a cluster must keep it the same way. Default: owner for an"
        " embedded node of --workers above 1, else every-node",
    )
    history.add_argument(
        "--history-checkpoint-every",
        type=_period_ms,
        default="2m",
        metavar="DURATION",
        help="how often the owner of partition 0 writes a checkpoint of its read model to the"
        " archive directory's history/ (default 2m: a joining node folds at most what came"
        " since)",
    )
    history.add_argument(
        "--history-checkpoints-kept",
        type=int,
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"the newest N checkpoints are kept, older ones dropped (default {DEFAULT_KEEP})",
    )
    history.add_argument(
        "--history-checkpoint-grace",
        type=_period_ms,
        default=f"{DEFAULT_GRACE_MS // 60_000}m",
        metavar="DURATION",
        help="how long a dropped checkpoint's files, and those of an upload not renewed, are"
        " kept before they are deleted (default %(default)s: longer than a node takes to"
        " fetch a checkpoint, and than two nodes' clocks disagree)",
    )
    history.add_argument(
        "--no-history-checkpoints",
        action="store_true",
        help="neither write nor restore read-model checkpoints: a new read model folds every"
        " partition from its first event",
    )
    egress = serve.add_argument_group(
        "egress policy", "where jobs' targets may call (docs/security.md)"
    )
    egress.add_argument(
        "--allow-targets",
        action="append",
        default=[],
        metavar="LIST",
        help="addresses, CIDR ranges, host names or *.patterns (each with an optional :PORT)"
        " that targets may reach beyond the public internet, e.g. 127.0.0.0/8 or"
        " 10.1.0.0/16,*.svc.internal; by default loopback, private and link-local ranges are"
        " refused",
    )
    egress.add_argument(
        "--deny-targets",
        action="append",
        default=[],
        metavar="LIST",
        help="entries as for --allow-targets that targets may never reach (before any allow);"
        " cloud metadata and this node's own API are always refused",
    )
    egress.add_argument(
        "--allow-topics",
        action="append",
        default=[],
        metavar="TEAM=PREFIX,...",
        help="kafka:// topics a team may produce to, by prefix (TEAM * is every team; {tenant}"
        " in PREFIX is the team's name; PREFIX * is any topic); none by default, and never the"
        " cluster's own topics or Kafka's __ ones",
    )
    egress.add_argument(
        "--egress-config",
        type=Path,
        metavar="FILE",
        help="the same settings in a TOML file (allow_targets, deny_targets, allow_topics,"
        " error_excerpt_bytes); the command line's entries are added to the file's",
    )
    egress.add_argument(
        "--error-excerpt-bytes",
        type=int,
        metavar="N",
        help="how much of a failing target's answer a team reads in run.error (default 200,"
        " at most 1024; 0 shows the status only)",
    )
    egress.add_argument(
        "--secrets-dir",
        type=Path,
        metavar="DIR",
        help='where header secret references ({"from_file": NAME}) are read:'
        " DIR/TEAM/NAME (default: the data directory's secrets/)",
    )
    egress.add_argument(
        "--target-kafka-config",
        type=Path,
        metavar="FILE",
        help="librdkafka settings for the producer of kafka:// targets only (default:"
        " --kafka-config); give it credentials whose ACLs deny the cluster's own topics",
    )
    add_retention_arguments(serve)
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text: one readable line a record; json: one JSON object a line, with the job,"
        " run, partition and tenant ids of each decision as fields (docs/operations.md)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log every HTTP request (off by default: at thousands of requests a second the"
        " log costs more than the requests)",
    )
    return serve


def history_on(args: argparse.Namespace) -> HistoryOn:
    """Where history is kept (``--history-on``): as asked, else with the partition's owner
    when an embedded node runs several worker processes (each would otherwise fold every
    partition). On Kafka the default stays every-node, as every node of a cluster must keep
    history the same way and a node of one process keeps it on every node by default."""
    if args.history_on is not None:
        return cast("HistoryOn", args.history_on)
    return "owner" if args.workers > 1 and not args.kafka else "every-node"


def _period_ms(text: str) -> int:
    """A duration that must be set (``none`` is not one)."""
    value = duration_ms(text)
    if value is None:
        raise argparse.ArgumentTypeError("this setting needs a duration; none is not one")
    return value


EXIT_FAILED = 1  # could not start, or stopped on an error
EXIT_LOG_DAMAGED = 3  # the log is damaged: the node refused to start, or stopped

DAMAGED_HINT = "the node will not run on a damaged log; see docs/operations.md, 'A damaged log'"


def _processes(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {count}")
    return count


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset sets),
    or the machine's where the platform cannot say."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def executor_processes(requested: int | None, cores: int) -> int:
    """How many executor processes a node starts: what ``--executor-processes`` asked for, else
    one when it has a second core. One process takes the HTTP client's share of a herd (about
    a third of the node's CPU per run, measured) off the interpreter lock the partitions, the
    read model and the API share; more only pay with cores to spare, which the operator knows
    and says (docs/operations.md, Capacity)."""
    if requested is not None:
        return requested
    return 1 if cores > 1 else 0


# How long an idle HTTP connection stays open (uvicorn closes it after 5 s unless told). Longer
# than any client's pool keeps one idle: the SDK's drops its idle connections after 30 s
# (cronlog_client.client.KEEPALIVE_S), so a request is never sent on a connection the node is
# closing; and longer than the 60 s a load balancer in front commonly keeps one.
KEEP_ALIVE_S = 75
# On SIGTERM, once the node has handed its partitions over, how long requests still open may
# take before the server cancels them and closes its port (uvicorn waits for them without end
# by default). Nothing they wait for is the node's any more: a client's create, claim or read
# cut here is answered by the next owner when it sends it again (each is idempotent or fenced).
# A node of a chaos run's rolling restart once waited here until it was killed, 20 s later.
REQUESTS_GRACE_S = 5

# Descriptors a node needs besides its calls' connections: RocksDB's table files, the API's
# connections, the log's and the executor processes' sockets.
OTHER_DESCRIPTORS = 1024


def call_room(
    max_calls: int, reserved_calls: int | None, per_team: int | None
) -> tuple[int, tuple[int, int]]:
    """The calls a node makes at once and the room kept for teams with few calls (with the
    share of it one team may hold), after raising the open-files limit to the system's hard
    limit: every call in flight holds a connection. Where the hard limit is too low for the
    room asked, the room shrinks to what it allows, and the start says so."""
    if max_calls < 1:
        sys.exit("cronlog: --max-calls must be at least 1")
    if per_team is not None and per_team < 1:
        sys.exit("cronlog: --max-calls-per-team must be at least 1")
    allowed = raise_open_files(max_calls + OTHER_DESCRIPTORS)
    room = max_calls
    if allowed is not None and allowed < max_calls + OTHER_DESCRIPTORS:
        room = max(1, allowed - OTHER_DESCRIPTORS)
        print(
            f"cronlog: the open-files limit is {allowed}: room for {room} calls at once, not"
            f" the {max_calls} of --max-calls; raise the hard limit (ulimit -Hn, systemd's"
            " LimitNOFILE=) to have all of it",
            file=sys.stderr,
            flush=True,
        )
    kept, share = default_reserve(room)
    if reserved_calls is not None:
        if not 0 <= reserved_calls < room:
            sys.exit(f"cronlog: --reserved-calls must be between 0 and {room - 1}")
        kept = reserved_calls
        share = max(1, room // 100) if kept else 0
    return room, (kept, share)


def raise_open_files(need: int) -> int | None:
    """Raise this process's soft open-files limit to ``need`` (or to the hard limit, if that is
    lower), as far as the system allows; the soft limit then, or None where there is none to
    read. Executor processes inherit it."""
    try:
        import resource
    except ImportError:  # not on a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None if soft == resource.RLIM_INFINITY else soft
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def serve_command(args: argparse.Namespace) -> int:
    """``cronlog serve``; a failure to start (or a damaged log) is one line on stderr, not a
    traceback (``--log-level debug`` logs the traceback too)."""
    from core.errors import CronlogError, LogCorrupted

    log = logging.getLogger("cronlog")
    # A crash in native code called from Python (RocksDB, a librdkafka call) kills the process
    # with a signal and says nothing; with the fault handler it leaves every thread's Python
    # stack on stderr first. (librdkafka's own threads block signals: a crash in one of them
    # still ends the process without a word.) SIGUSR1 prints the stacks too, and the node goes
    # on: where a stuck node is stuck.
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        if args.workers > 1 and args.worker_index is None:
            from cli.workers import serve_workers

            return serve_workers(args, sys.argv[1:])
        return _serve(args)
    except LogCorrupted as e:
        log.debug("the log is damaged", exc_info=True)
        print(f"cronlog: {e}\ncronlog: {DAMAGED_HINT}", file=sys.stderr, flush=True)
        return EXIT_LOG_DAMAGED
    except (CronlogError, OSError, ValueError) as e:
        log.debug("cannot start", exc_info=True)
        print(f"cronlog: cannot start: {e}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except Exception as e:  # rocksdict raises bare Exceptions with RocksDB's status text
        log.debug("cannot start", exc_info=True)
        print(f"cronlog: cannot start: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return EXIT_FAILED


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app
    from api.request_head import BoundedHttpToolsProtocol
    from api.time_travel import PastStates
    from eventlog.embedded import EmbeddedLog
    from node import integrity
    from node.executors import DEFAULT_ERROR_EXCERPT, Executors
    from node.node import Node
    from node.secrets import Secrets
    from node.snapshotter import SnapshotPolicy

    configure_logging(args)
    # Everything the node writes (the log, the stores, tokens, and the files RocksDB makes on
    # its own) is its owner's alone, whatever umask the node was started with.
    os.umask(0o077)
    data_dir: Path = args.data_dir
    make_private_dir(data_dir)
    tokens = load_tokens(data_dir)
    limits = load_limits(args.limits)

    kafka_config = read_kafka_config(args.kafka_config) if args.kafka_config else {}
    target_kafka_config = target_producer_config(args.target_kafka_config, kafka_config)
    egress, excerpt = load_egress(args)
    secrets_dir = args.secrets_dir or data_dir / "secrets"
    if args.secrets_dir is None and not secrets_dir.exists():
        secrets_dir.mkdir()
        secrets_dir.chmod(0o700)  # whatever the umask: it holds teams' credentials
    if not 0 <= args.lead_time <= MAX_LEAD_MS / 1000:
        sys.exit(f"cronlog: --lead-time must be between 0 and {MAX_LEAD_MS // 1000}")
    if not 0 <= args.arm_ahead <= MAX_ARM_MS / 1000:
        sys.exit(f"cronlog: --arm-ahead must be between 0 and {MAX_ARM_MS // 1000}")
    if args.job_retention_hours < 0:
        sys.exit("cronlog: --job-retention-hours must not be negative")
    if args.rocksdb_memory_mb < 8:
        sys.exit("cronlog: --rocksdb-memory-mb must be at least 8")
    from eventlog import rocks

    # Worker processes (cli/workers.py) share the budget with each other and their parent.
    worker = args.worker_index is not None
    if worker:
        die_with_parent()
    shares = args.workers + 1 if worker else 1
    rocks.set_memory_budget(max(8, args.rocksdb_memory_mb // shares) * rocks.MIB)
    if args.snapshot_every_events < 1 or not args.snapshot_every_sec > 0:
        sys.exit("cronlog: --snapshot-every-events and --snapshot-every-sec must be positive")
    if args.standby_replicas < 0:
        sys.exit("cronlog: --standby-replicas must not be negative")
    room, reserved = call_room(args.max_calls, args.reserved_calls, args.max_calls_per_team)
    per_team = args.max_calls_per_team
    node_id = args.node_id
    cores = usable_cores()
    if worker:
        # The node's room and its reserve, divided among its workers; the cores too, for the
        # executor processes' default. Each team's cap is divided by what its runs want
        # (core.shares), as over a cluster's nodes.
        room = max(1, room // args.workers)
        reserved = (reserved[0] // args.workers, reserved[1])
        node_id = worker_node_id(args.node_id, args.worker_index)
        cores = max(1, cores // args.workers)
    # the first line with a time: a restart's log says how long the start itself took
    logging.getLogger("cronlog").info("%s starting (pid %d)", node_id, os.getpid())
    if args.history_checkpoints_kept < 1:
        sys.exit("cronlog: --history-checkpoints-kept must be at least 1")
    if args.history_checkpoint_grace <= 0:
        sys.exit("cronlog: --history-checkpoint-grace must be positive")
    snapshots: SnapshotStore | None = None
    retention = retention_from(args)
    # This start of the node (its worker processes share it), and where the others reach it
    boot = os.environ.get(BOOT) or secrets.token_hex(4)
    address = advertised(args.host, args.port, args.advertise)
    raw_log: EventLog
    archive = None
    history_store = None
    if args.archive_dir is not None or not (args.kafka or args.no_archive):
        from archive.archive import Archive
        from archive.store import DirectoryStore

        archive_dir = args.archive_dir or data_dir / "archive"
        make_private_dir(archive_dir)
        archive = Archive(DirectoryStore(archive_dir))
        if not args.no_history_checkpoints:
            history_store = DirectoryStore(archive_dir)
    if args.kafka:
        from confluent_kafka import KafkaException

        from core.errors import CronlogError
        from eventlog.kafka import KafkaLog

        try:
            raw_log = KafkaLog.open(
                args.kafka,
                args.partitions,
                prefix=args.topic_prefix,
                replication_factor=args.replication_factor,
                min_insync_replicas=args.min_insync_replicas,
                retention=retention,
                client_config=kafka_config,
                **(
                    {}
                    if args.group_session_ms is None
                    else {"session_timeout_ms": args.group_session_ms}
                ),
                # The node answers a write once its read model holds it: that is the wait.
                readable_appends=False,
            )
        except (KafkaException, CronlogError) as e:
            sys.exit(f"cronlog: cannot open the Kafka log at {args.kafka}: {e}")
        from node.peer_watch import member_name

        raw_log.member_name = member_name(node_id, boot, address)
        if not args.no_snapshots:
            from eventlog.kafka_snapshots import KafkaSnapshots

            try:
                snapshots = KafkaSnapshots.open(
                    args.kafka,
                    args.partitions,
                    prefix=args.topic_prefix,
                    replication_factor=args.replication_factor,
                    min_insync_replicas=args.min_insync_replicas,
                    client_config=kafka_config,
                )
            except (KafkaException, CronlogError) as e:
                raw_log.close()
                sys.exit(f"cronlog: cannot open the snapshots topic at {args.kafka}: {e}")
        target_kafka = args.target_kafka or args.kafka
    elif worker:  # embedded, in a worker process: the parent's log, through its socket
        from eventlog.remote import RemoteLog

        raw_log = RemoteLog(args.worker_socket, member_id=node_id)
        if not args.no_snapshots:
            from eventlog.snapshots import FileSnapshots

            snapshots = FileSnapshots(data_dir / "snapshots")
        target_kafka = args.target_kafka
        # This worker's stores ahead of the log (exit 3: the parent stops, 'A damaged log').
        integrity.check_not_ahead(
            raw_log,
            node_dir(data_dir, args.worker_index),
            snapshots,
            history_store,
            where=str(data_dir / "log"),
        )
    else:
        raw_log = EmbeddedLog.open(
            data_dir / "log",
            _stored_partitions(data_dir, args.partitions),
            segment_bytes=retention.segment_bytes,
            segment_ms=retention.segment_ms,
        )
        if not args.no_snapshots:
            from eventlog.snapshots import FileSnapshots

            snapshots = FileSnapshots(data_dir / "snapshots")
        target_kafka = args.target_kafka
        # Stores ahead of the log: it lost acknowledged records (exit 3, 'A damaged log').
        integrity.check_not_ahead(
            raw_log, data_dir / "node", snapshots, history_store, where=str(data_dir / "log")
        )
    # Every reader of the events stream reads archive + log, so offset 0 is still readable.
    log_: EventLog = raw_log if archive is None else ArchivedLog(raw_log, archive)
    node = Node(
        log_,
        node_dir(data_dir, args.worker_index or 0),
        node_id=node_id,
        retention_ms=round(args.job_retention_hours * 3_600_000),
        lead_ms=round(args.lead_time * 1000),
        arm_ms=round(args.arm_ahead * 1000),
        executors=Executors(
            node_id,
            max_in_flight=room,
            max_in_flight_per_tenant=per_team,
            reserved=reserved,
            kafka_bootstrap=target_kafka,
            kafka_config=target_kafka_config,
            egress=egress,
            secrets=Secrets(secrets_dir),
            error_excerpt_bytes=DEFAULT_ERROR_EXCERPT if excerpt is None else excerpt,
            processes=executor_processes(args.executor_processes, cores),
        ),
        snapshots=snapshots,
        snapshot_policy=SnapshotPolicy(args.snapshot_every_events, args.snapshot_every_sec),
        standby_replicas=args.standby_replicas,
        history_store=history_store,
        history_checkpoint_every_s=args.history_checkpoint_every / 1000,
        history_checkpoints_kept=args.history_checkpoints_kept,
        history_checkpoint_grace_ms=args.history_checkpoint_grace,
        history_window_ms=args.history_window,
        history_on=history_on(args),
        archive=archive,
        produced=produced_targets(args, raw_log, target_kafka, egress),
        # One member of several: a team's limits are the cluster's (core.shares).
        cluster_limits=bool(args.kafka) or worker,
    )
    # Of a node's worker processes, the first speaks for them all (the parent says where).
    speaks = not worker or args.worker_index == 0
    if archive is None and args.history_window is not None and speaks:
        print(
            "cronlog: no archive: runs older than the history window"
            f" ({args.history_window / 86_400_000:g} days) leave history for good",
            flush=True,
        )
    metrics: Any = node.metrics
    if worker:
        from cli.workers import metrics_path
        from node.worker_metrics import MergedMetrics

        # Whichever worker a scrape reaches answers for them all (node/worker_metrics.py).
        metrics = MergedMetrics(
            node.metrics,
            args.worker_index,
            {i: metrics_path(data_dir, i) for i in range(args.workers) if i != args.worker_index},
        )
    app = create_app(
        node,
        tokens,
        metrics=metrics,
        metrics_token=load_metrics_token(data_dir),
        limits=limits,
        egress=egress,
        operator_token=load_operator_token(data_dir),
        past_states=PastStates(log_, snapshots),
        shares=node.shares,
        boot=boot,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        lifespan="on",
        access_log=args.access_log,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=REQUESTS_GRACE_S,
        http=BoundedHttpToolsProtocol,  # 431 for a head over 64 KiB or 100 fields
        # In JSON, uvicorn's own lines go through the root handler like every other; in text
        # it keeps its usual look.
        log_config=None if args.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
    )
    server = _server(config, on_stop=node.wakeups.close, before_close=node.hand_over)
    # A read that finds damage stops the node (the log watch appends it here): nothing is
    # served from a damaged log.
    damaged: list[BaseException] = []
    # serve's own background services (cli.background), under the node's supervisor after
    # the node's: started by node.start(), stopped by node.stop().
    for service in background.services(args, raw_log, archive, retention, node, server, damaged):
        node.services.add(service)
    if args.kafka:
        from eventlog.kafka import KafkaLog
        from node.peer_watch import group_admin, kafka_watch

        kafka_log = cast("KafkaLog", raw_log)
        # one watch a node (its first worker's, when it has several), under its supervisor
        watching = not args.no_peer_watch and not args.worker_index
        admin = group_admin(args.kafka, kafka_log.group, kafka_config, say_why=watching)
        if admin is not None:
            # A graceful stop counts the group's other members through the same kafka-python
            # client the watch keeps warm, never librdkafka's admin client, which can abort the
            # process mid-fault.
            kafka_log.read_members_with(admin.members)
            if not args.cold_join:
                subscribed = kafka_log.topics["commands"]  # the group's members subscribe to it
                node.warm_before_joining(lambda: admin.holdings(subscribed))
            if watching:
                node.services.add(kafka_watch(admin, address, boot))
    node.start()
    # Let allocation bursts (a midnight herd) run between collections; once recovery has
    # loaded what lives as long as the node, the gc-freeze service keeps the collector off it.
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    if speaks:
        print(f"cronlog: {egress.describe()}", flush=True)
    if speaks and egress.topics:  # without a grant every kafka:// target is refused: nothing to say
        how = "exactly once" if node.produced is not None else "at least once"
        print(f"cronlog: kafka:// targets: {how} (docs/reliability.md)", flush=True)
    if speaks and args.kafka and target_kafka == args.kafka and args.target_kafka_config is None:
        print(
            "cronlog: kafka:// targets are produced with the cluster's own credentials; give"
            " them their own (--target-kafka-config) whose ACLs deny the cluster's topics",
            flush=True,
        )
    if speaks:
        print(
            f"cronlog: status UI at http://{args.host}:{args.port}/ui/ (sign in with a team's"
            f" token), API reference at http://{args.host}:{args.port}/docs",
            flush=True,
        )
    if not worker:
        print(
            f"cronlog {args.node_id} serving on http://{args.host}:{args.port} "
            f"({'kafka ' + args.kafka if args.kafka else 'embedded log in ' + str(data_dir)})",
            flush=True,
        )
    # uvicorn drains HTTP on SIGTERM/SIGINT, then raises the signal again with the handler it
    # found installed: make that handler a clean exit, so the node below stops gracefully too.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    try:
        if worker:
            # The parent's listening socket, shared by every worker's accepts.
            server.run(sockets=[socket.socket(fileno=args.worker_fd)])
        else:
            server.run()
    finally:
        # The stop has begun: another SIGTERM (a supervisor asking again, a worker's parent
        # making sure) must not cut it short, leaving calls armed ahead unmade and the stores
        # open; a second Ctrl-C still ends the process at once.
        signal.signal(signal.SIGTERM, _already_stopping)
        # Outcomes cannot be recorded in a damaged log: do not wait for calls in flight.
        node.stop(drain_s=0 if damaged else args.drain_sec)
        if snapshots is not None:
            snapshots.close()
        log_.close()
    if damaged:
        raise damaged[0]
    return 0


def configure_logging(args: argparse.Namespace) -> None:
    """The node's log lines (a worker process's, and its parent's alike): ``--log-format`` and
    ``--log-level`` on standard error."""
    from node import decisions

    handler = logging.StreamHandler()
    handler.setFormatter(decisions.formatter(args.log_format))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    # kafka-python (the peer watch's admin client) says each connection it makes at INFO, and
    # at WARNING each turn of its own I/O loop that a busy process held past 0.1 s: its errors
    # are what matters here, and the watch logs those it meets.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    logging.getLogger("kafka.net.selector").setLevel(logging.ERROR)
    # Its connections' errors come again each round of the watch (four a second) while a
    # broker is down; the watch says what failed, once and then every few seconds.
    logging.getLogger("kafka.net").setLevel(logging.CRITICAL)


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) readable by its owner only; an existing one that
    others can read is used as it is, with a warning (it is the operator's to change)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        logging.getLogger("cronlog").warning(
            "data directory %s is readable by others (mode %o); chmod 700 it", path, mode
        )


def load_tokens(data_dir: Path) -> dict[str, str]:
    """token -> tenant from ``CRONLOG_TOKENS``, else the data directory's ``tokens`` file, else
    a new token for the ``default`` tenant, written to that file and printed once."""
    from api.auth import create_default_token, parse_tokens, read_tokens_file

    configured = os.environ.get("CRONLOG_TOKENS", "").strip()
    if configured:
        return parse_tokens(configured)
    path = data_dir / "tokens"
    if not path.exists():
        token = create_default_token(path)
        print(f"cronlog: created a token for tenant 'default' in {path}: {token}", flush=True)
    return read_tokens_file(path)


def load_limits(path: Path | None) -> Limits:
    """The tenants' limits from ``--limits``, or the built-in defaults; a file that cannot be
    used stops the start with one line that says why."""
    from api.limits import Limits, LimitsError, read_limits

    if path is None:
        return Limits()
    try:
        return read_limits(path)
    except LimitsError as e:
        sys.exit(f"cronlog: {e}")


def read_kafka_config(path: Path) -> dict[str, str]:
    """``key=value`` lines (blank lines and ``#`` comments ignored), as librdkafka settings."""
    settings: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        sys.exit(f"cronlog: cannot read {path}: {e.strerror or e}")
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            sys.exit(f"cronlog: {path}:{n}: expected key=value")
        settings[key.strip()] = value.strip()
    return settings


def target_producer_config(path: Path | None, cluster: dict[str, str]) -> dict[str, str]:
    """The settings of the producer for ``kafka://`` targets: its own file's when given, none of
    the cluster's (whose credentials may write the cluster's own topics); else the cluster's."""
    return read_kafka_config(path) if path is not None else cluster


def load_egress(args: argparse.Namespace) -> tuple[EgressPolicy, int | None]:
    """The node's egress policy from ``--egress-config`` and the command line, and the error
    excerpt size if one was set; a bad entry ends the command with a message naming it."""
    from node.egress_config import policy_from, read_config
    from node.executors import MAX_ERROR_EXCERPT

    try:
        config = read_config(args.egress_config) if args.egress_config else {}
        policy = policy_from(
            config,
            allow=args.allow_targets,
            deny=args.deny_targets,
            topics=args.allow_topics,
            api_port=args.port,
            kafka_bootstrap=[args.kafka] if args.kafka else [],
            topic_prefix=args.topic_prefix,
        )
    except (OSError, ValueError) as e:
        sys.exit(f"cronlog: egress policy: {e}")
    excerpt = args.error_excerpt_bytes
    if excerpt is None:
        excerpt = config.get("error_excerpt_bytes")
    if excerpt is not None and not 0 <= excerpt <= MAX_ERROR_EXCERPT:
        sys.exit(f"cronlog: --error-excerpt-bytes must be between 0 and {MAX_ERROR_EXCERPT}")
    return policy, excerpt


def load_metrics_token(data_dir: Path) -> str:
    """The bearer token of ``GET /metrics``: ``CRONLOG_METRICS_TOKEN``, else the data
    directory's ``metrics_token`` file, created (mode 0600) on the first start."""
    return _operator_token(data_dir, "CRONLOG_METRICS_TOKEN", "metrics_token", "GET /metrics")


def load_operator_token(data_dir: Path) -> str:
    """The operator's bearer token, which reads every team's events (``GET /v1/events``):
    ``CRONLOG_OPERATOR_TOKEN``, else the data directory's ``operator_token`` file, created
    (mode 0600) on the first start. Not the metrics token: that one sits in Prometheus'
    configuration and sees figures only, while events carry every team's payloads."""
    return _operator_token(
        data_dir, "CRONLOG_OPERATOR_TOKEN", "operator_token", "every team's events"
    )


def load_operator_token_if_any(data_dir: Path) -> str | None:
    """The operator's token as a client finds it: ``CRONLOG_OPERATOR_TOKEN``, else the data
    directory's ``operator_token`` file if there is one (never created here)."""
    configured = os.environ.get("CRONLOG_OPERATOR_TOKEN", "").strip()
    if configured:
        return configured
    path = data_dir / "operator_token"
    if not path.exists():
        return None
    return path.read_text(encoding="utf-8").strip() or None


def _operator_token(data_dir: Path, variable: str, name: str, what: str) -> str:
    from api.auth import create_token_file

    configured = os.environ.get(variable, "").strip()
    if configured:
        return configured
    path = data_dir / name
    if not path.exists():
        try:
            create_token_file(path)
            print(f"cronlog: created the token for {what} in {path}", flush=True)
        except FileExistsError:
            pass  # another process made it first: read theirs
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        sys.exit(f"cronlog: {path} is empty; put the token for {what} in it")
    return token


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server that first ends what waits (event streams, long-polling claims):
        they would otherwise hold its graceful stop open; then, its port still answering, lets
        the node hand its partitions over (``before_close``): a port that refused while the
        node still owned partitions would have its peers remove it from the group at once
        (``node.peer_watch``), not just after a whole second."""

        def __init__(
            self,
            config: uvicorn.Config,
            on_stop: Callable[[], None],
            before_close: Callable[[], None] | None,
        ) -> None:
            super().__init__(config)
            self._on_stop = on_stop
            self._before_close = before_close

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            self._on_stop()
            if self._before_close is not None:
                await asyncio.to_thread(self._before_close)
            await super().shutdown(sockets)

    return Server


def _server(
    config: Any, on_stop: Callable[[], None], before_close: Callable[[], None] | None = None
) -> Any:
    return _server_class()(config, on_stop, before_close)


def _exit_cleanly(signum: int, _frame: object) -> None:
    raise SystemExit(0)


def _already_stopping(signum: int, _frame: object) -> None:
    logging.getLogger("cronlog").info(
        "SIGTERM again: the node is stopping already (its calls in flight end first; SIGINT or"
        " SIGKILL ends it now)"
    )


def _stored_partitions(data_dir: Path, requested: int) -> int:
    """The partition count is the log's for life: the first start records it."""
    marker = data_dir / "partitions"
    if marker.exists():
        text = marker.read_text().strip()
        if not text.isascii() or not text.isdigit():
            raise ValueError(f"{marker} should hold the log's partition count, not {text[:20]!r}")
        return int(text)
    marker.write_text(f"{requested}\n")
    return requested


def produced_targets(
    args: argparse.Namespace, raw_log: Any, target_kafka: str | None, egress: EgressPolicy
) -> ProducedTargets | None:
    """Whether ``kafka://`` runs go into the events' own transaction (:mod:`node.produced`):
    only on the cluster itself, with the cluster's credentials, as its partitions' writers are
    the producers. Exits when ``--kafka-targets exactly-once`` asks for it elsewhere."""
    from node.produced import ProducedTargets

    can = bool(args.kafka) and target_kafka == args.kafka and args.target_kafka_config is None
    if args.kafka_targets == "exactly-once" and not can:
        sys.exit(
            "cronlog: --kafka-targets exactly-once needs cluster mode (--kafka), kafka:// targets"
            " on the cluster itself (no other --target-kafka) and its own credentials (no"
            " --target-kafka-config): the record goes into the events' transaction"
        )
    if not can or args.kafka_targets == "at-least-once":
        return None
    return ProducedTargets(egress, raw_log.topic_names)
