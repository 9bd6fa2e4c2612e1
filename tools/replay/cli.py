"""``python -m tools.replay``: the operator's view of the log, and the tools that fold it.

    python -m tools.replay dump [--partition P] [--from OFFSET] [--job JOB_ID] [--follow]
    python -m tools.replay verify [--from-snapshot]
    python -m tools.replay state [--offset N | --at INSTANT] [--partition P] [--job J] [--tenant T]
    python -m tools.replay rebuild [--state] [--read-model]
    python -m tools.replay backfill JOB_ID --from T1 --to T2 [--tenant T] [--apply --url URL]
    python -m tools.replay stats [--json]
    python -m tools.replay corpus record DIR | corpus check DIR...

Every command reads ``--data-dir`` (the embedded data directory of a stopped node) or
``--kafka HOST:PORT --topic-prefix P --partitions N``. See ``docs/replay.md``.

Exit status: 0 done; 1 ``verify`` found a difference, a corpus no longer replays (``corpus
check``) or a backfill trigger was refused; 2 the tool refused to run (bad arguments, a node
running on the directory, a range too large); 3 the log is damaged (the message names the
stream, partition, offset and file; nothing was changed); 4 ``verify``: the stores match, but
the log holds records that are not events (each is listed and reported on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from core.clock import Clock, Millis, SystemClock
from core.errors import CronlogError, LogCorrupted
from eventlog.port import EventLog, partition_for
from projections import time_travel
from tools.replay import backfill, dump, rebuild, snapshots, stats, verify
from tools.replay.progress import Meter, meter_for
from tools.replay.source import Layout, ReplayError, add_source_arguments, open_log

DEFAULT_DATA_DIR = Path(os.environ.get("CRONLOG_DATA_DIR", "~/.local/share/cronlog")).expanduser()
DEFAULT_URL = os.environ.get("CRONLOG_URL", "http://127.0.0.1:8080")


PROG = "python -m tools.replay"


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog=prog,
        description="The operator's view of the log, and the tools that fold it (docs/replay.md).",
    )
    sub = root.add_subparsers(dest="command", required=True)
    source = argparse.ArgumentParser(add_help=False)
    add_source_arguments(source, DEFAULT_DATA_DIR)
    source.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar with an ETA on standard error (default: when it is a terminal)",
    )

    p = sub.add_parser("dump", parents=[source], help="events as JSON lines (the audit view)")
    p.add_argument("--partition", type=int, help="only this partition (default: every one)")
    p.add_argument("--from", dest="from_offset", type=int, default=0, metavar="OFFSET")
    p.add_argument("--job", metavar="JOB_ID", help="only this job's events")
    p.add_argument("--follow", action="store_true", help="keep printing new events")

    p = sub.add_parser(
        "verify", parents=[source], help="stored state equals a replay from offset 0"
    )
    p.add_argument(
        "--from-snapshot",
        action="store_true",
        help="check each partition's newest snapshot instead: it equals the log folded to its"
        " offset, and with its tail the log folded to the end",
    )

    p = sub.add_parser(
        "state",
        parents=[source],
        help="time travel: a partition's state as of an offset or an instant, from the nearest"
        " snapshot and the events after it (JSON)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--offset", type=int, help="the state of the events below this offset")
    where.add_argument(
        "--at",
        help="the state after the events decided at or before this instant (RFC 3339 or epoch ms)",
    )
    p.add_argument("--partition", type=int, help="the partition (default: the --job's)")
    p.add_argument("--job", metavar="JOB_ID", help="only this job and its runs")
    p.add_argument("--tenant", help="only this tenant's jobs and runs")

    p = sub.add_parser("rebuild", parents=[source], help="rebuild derived stores from the log")
    p.add_argument("--state", action="store_true", help="the partitions' state stores")
    p.add_argument("--read-model", action="store_true", help="the read model")

    p = sub.add_parser("backfill", parents=[source], help="run a job's past slots in a range")
    p.add_argument("job_id")
    p.add_argument("--from", dest="start", required=True, help="RFC 3339 or epoch ms, inclusive")
    p.add_argument("--to", dest="end", required=True, help="RFC 3339 or epoch ms, inclusive")
    p.add_argument("--tenant", help="the job's tenant (refused if it is another's)")
    p.add_argument("--max", type=int, default=backfill.DEFAULT_MAX, help="most slots allowed")
    p.add_argument("--apply", action="store_true", help="trigger the runs (default: dry run)")
    p.add_argument("--url", help=f"a running node's API, e.g. {DEFAULT_URL}")
    p.add_argument("--token", default=os.environ.get("CRONLOG_TOKEN"), help="or CRONLOG_TOKEN")

    p = sub.add_parser("stats", parents=[source], help="events per type, offsets, lag")
    p.add_argument("--json", action="store_true", help="one JSON object per partition")

    p = sub.add_parser(
        "corpus",
        help="record this build's log corpus, or replay recorded ones (tools/replay/corpus.py)",
    )
    p.add_argument("action", choices=["record", "check"])
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a corpus directory")
    return root


def main(
    argv: list[str] | None = None,
    *,
    clock: Clock | None = None,
    transport: httpx.BaseTransport | None = None,
    prog: str | None = None,
) -> int:
    """Run one command. ``backfill`` reads ``clock`` (which slots are past) and sends its
    requests through ``transport`` (tests replace both). ``prog`` is the command as the user
    typed it (``cronlog log``): usage and errors are prefixed with it (else ``replay:``)."""
    args = parser(prog or PROG).parse_args(argv)
    said = prog or "replay"
    try:
        return _run(args, clock or SystemClock(), transport)
    except LogCorrupted as exc:
        print(f"{said}: {exc}", file=sys.stderr)
        return 3
    except ReplayError as exc:
        print(f"{said}: {exc}", file=sys.stderr)
        return 2
    except CronlogError as exc:
        print(f"{said}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


@contextlib.contextmanager
def _log(args: argparse.Namespace) -> Iterator[EventLog]:
    log = open_log(args)
    try:
        yield log
    finally:
        log.close()


def _run(args: argparse.Namespace, clock: Clock, transport: httpx.BaseTransport | None) -> int:
    if args.command == "corpus":
        return _corpus(args)
    layout = Layout(args.data_dir)
    if args.command == "backfill":
        return _backfill(args, clock.now_ms(), transport)
    meter = meter_for(args.progress)
    try:
        with _log(args) as log:
            return _on_log(args, log, layout, meter)
    finally:
        meter.stop()


def _on_log(args: argparse.Namespace, log: EventLog, layout: Layout, meter: Meter) -> int:
    started = time.monotonic()
    if args.command == "dump":
        if args.partition is not None and not 0 <= args.partition < log.num_partitions:
            raise ReplayError(
                f"partition {args.partition} is out of range 0..{log.num_partitions - 1}"
            )
        partitions = list(range(log.num_partitions)) if args.partition is None else [args.partition]
        printed = dump.dump(log, partitions, args.from_offset, args.job, args.follow, meter=meter)
        print(
            f"dump: {printed} lines from {len(partitions)} partitions in"
            f" {time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
        return 0
    if args.command == "verify" and args.from_snapshot:
        return _verify_snapshots(args, log, meter, started)
    if args.command == "state":
        return _state(args, log, meter)
    if args.command == "verify":
        checks = []
        meter.start("verify", sum(log.end_offset("events", p) for p in range(log.num_partitions)))
        for partition in range(log.num_partitions):
            checks.append(verify.verify_partition(log, layout, partition, meter))
            print(checks[-1].describe(), flush=True)
        meter.stop()
        different = [c.partition for c in checks if not c.ok]
        if different:
            print(f"DIFFERENT: partitions {', '.join(map(str, different))}")
            return 1
        foreign = [c for c in checks if c.foreign]
        if foreign:
            print(
                f"FOREIGN: {sum(len(c.foreign) for c in foreign)} records that are not "
                f"events in partitions {', '.join(str(c.partition) for c in foreign)}; the "
                "stores match a replay that passes over them. Find out what wrote them "
                "(docs/operations.md)."
            )
            return 4
        events_read = sum(c.events for c in checks)
        print(
            f"OK: {len(checks)} partitions match a replay from offset 0"
            f" ({events_read} events in {time.monotonic() - started:.1f} s)"
        )
        return 0
    if args.command == "rebuild":
        both = not (args.state or args.read_model)
        rebuild.rebuild(
            log,
            layout,
            state=both or args.state,
            read_model=both or args.read_model,
            meter=meter,
        )
        return 0
    stats.report(stats.collect(log, layout), args.json, sys.stdout)
    return 0


def _verify_snapshots(args: argparse.Namespace, log: EventLog, meter: Meter, started: float) -> int:
    store = snapshots.open_snapshots(args, args.data_dir)
    try:
        total = sum(log.end_offset("events", p) for p in range(log.num_partitions))
        meter.start("verify", total)
        checks = []
        for partition in range(log.num_partitions):
            checks.append(snapshots.verify_partition(log, store, partition, meter))
            print(checks[-1].describe(), flush=True)
        meter.stop()
    finally:
        store.close()
    different = [c.partition for c in checks if not c.ok]
    if different:
        print(f"DIFFERENT: partitions {', '.join(map(str, different))}")
        return 1
    with_snapshot = [c for c in checks if c.offset is not None]
    print(
        f"OK: {len(with_snapshot)} of {len(checks)} partitions have a snapshot, each equal to"
        f" a replay from offset 0 ({time.monotonic() - started:.1f} s)"
    )
    return 0


def _state(args: argparse.Namespace, log: EventLog, meter: Meter) -> int:
    partition = args.partition
    if partition is None:
        if args.job is None:
            raise ReplayError("state needs --partition or --job")
        partition = partition_for(args.job, log.num_partitions)
    if not 0 <= partition < log.num_partitions:
        raise ReplayError(f"partition {partition} is out of range 0..{log.num_partitions - 1}")
    instant = None if args.at is None else backfill.parse_instant(args.at)
    store = snapshots.open_snapshots(args, args.data_dir)
    try:
        meter.start("state", log.end_offset("events", partition))
        state, reached, base, folded = snapshots.state_at(
            log, store, partition, offset=args.offset, instant=instant, meter=meter
        )
        meter.stop()
    finally:
        store.close()
    answer = time_travel.StateAsOf(state, reached, base, folded)
    snapshots.print_state(time_travel.report(answer, instant, args.tenant, args.job))
    return 0


def _corpus(args: argparse.Namespace) -> int:
    from tools.replay import corpus

    if args.action == "record":
        if len(args.dirs) != 1:
            raise ReplayError("corpus record takes one directory, which must not exist yet")
        try:
            manifest = corpus.record(args.dirs[0])
        except corpus.CorpusError as exc:
            raise ReplayError(str(exc)) from exc
        print(
            f"{args.dirs[0]}: {sum(manifest['kinds'].values())} events of"
            f" {len(manifest['kinds'])} kinds, formats {manifest['formats']}"
        )
        return 0
    checks = [corpus.check(d) for d in args.dirs]
    for one in checks:
        print(one.describe())
    return 0 if all(c.ok for c in checks) else 1


def _backfill(args: argparse.Namespace, now: Millis, transport: httpx.BaseTransport | None) -> int:
    start, end = backfill.parse_instant(args.start), backfill.parse_instant(args.end)
    if args.max < 1:
        raise ReplayError("--max must be at least 1")
    if args.url is None:
        if args.apply:
            raise ReplayError(
                "--apply needs --url: only the partition's owner may decide, so runs are "
                "triggered through a running node's API"
            )
        with _log(args) as log:
            job, present = backfill.job_from_log(log, args.job_id, args.tenant)
        backfill.show(job, backfill.plan(job, present, start, end, now, args.max))
        print("dry run: nothing was triggered (pass --apply --url URL to trigger)")
        return 0
    if not args.token:
        raise ReplayError("--url needs a token: pass --token or set CRONLOG_TOKEN")
    headers = {"Authorization": f"Bearer {args.token}"}
    with httpx.Client(base_url=args.url, headers=headers, timeout=30, transport=transport) as http:
        try:
            job, present = backfill.job_from_api(http, args.job_id, args.tenant, start)
            planned = backfill.plan(job, present, start, end, now, args.max)
            backfill.show(job, planned)
            if not args.apply:
                print("dry run: nothing was triggered (pass --apply to trigger)")
                return 0
            meter = meter_for(args.progress)
            meter.start(
                "backfill", sum(1 for p in planned if p.action is backfill.SlotAction.TRIGGER)
            )
            try:
                made, existing = backfill.apply(http, args.job_id, planned, meter=meter)
            finally:
                meter.stop()
        except httpx.HTTPError as exc:
            raise ReplayError(f"{args.url}: {exc}") from exc
    print(f"triggered {made} runs ({existing} were present already)")
    return 0
