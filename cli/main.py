"""The ``cronlog`` command: run a node, or talk to one. Every client command speaks the HTTP API
through the client SDK (``cronlog_client``).

    cronlog serve [--data-dir DIR] [--port 8080] [--allow-targets 127.0.0.0/8] ...
    cronlog jobs list [--status S] [--all] | get JOB | preview JOB [-n N] | slots JOB --from --to
    cronlog jobs create --name N (--schedule CRON [--seconds S] | --run-at T | --every SEC)
                        --target URL [--header K=V] [--priority P] [--start-at T] [--end-at T] ...
    cronlog jobs put JOB ... | update JOB ... [--clear FIELD] | pause | resume | cancel JOB
    cronlog jobs apply -f FILE [--idempotency-key KEY]   (a JSON or YAML list of jobs)
    cronlog jobs trigger JOB [--at T] | backfill JOB --from T --to T [--apply]
    cronlog runs list JOB [--all] | list --state S | get | cancel | replay RUN
    cronlog runs claim POOL | heartbeat RUN --token T | complete RUN --token T [--failed ...]
    cronlog dead [list] [--job J] [--error-contains S] | dead replay (RUN... | --job J | --all)
    cronlog preview "0 9 * * 1-5" [--timezone TZ] [-n N]
    cronlog tail [--job J] [--from start|end|TIME] [--no-follow] [--operator]
    cronlog log dump|verify|rebuild|stats|backfill ...     (python -m tools.replay)
    cronlog completion bash|zsh|fish

Global flags, before or after the command: ``--url`` (or ``CRONLOG_URL``), ``--token`` (or
``CRONLOG_TOKEN``; else the first token in the data directory's ``tokens`` file, which ``cronlog
serve`` writes when no tokens are configured), ``--data-dir``, ``-o table|json|yaml`` (tables
on a terminal, JSON otherwise). Exit status: 0 done, 1 refused or failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cli import output, serve
from cli.serve import read_kafka_config, target_producer_config

__all__ = ["main", "read_kafka_config", "target_producer_config"]

DEFAULT_DATA_DIR = Path(os.environ.get("CRONLOG_DATA_DIR", "~/.local/share/cronlog")).expanduser()
DEFAULT_URL = os.environ.get("CRONLOG_URL", "http://127.0.0.1:8080")
CLEARABLE = (
    "schedule",
    "seconds",
    "run_at",
    "interval_sec",
    "start_at",
    "end_at",
    "payload",
    "depends_on",
    "tags",
)


MAX_COMPLETIONS = 200  # jobs a shell's completion asks the node for


class UsageError(Exception):
    """A command that cannot be sent as given (exit 2)."""


# -- the parser ----------------------------------------------------------------------------------


def _globals(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The global flags. On every subcommand too, with nothing as default there, so they may
    stand before or after the command and a value given before is not overwritten."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--url", default=default(DEFAULT_URL), help=f"the node's API (default {DEFAULT_URL})"
    )
    parser.add_argument(
        "--token", default=default(os.environ.get("CRONLOG_TOKEN")), help="or CRONLOG_TOKEN"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=default(DEFAULT_DATA_DIR),
        help="where `cronlog serve` keeps its tokens (used when no token is given)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=output.FORMATS,
        default=default(None),
        help="table (default on a terminal), json (default otherwise) or yaml",
    )


class _Parsers:
    """Builds subcommands that all take the global flags."""

    def __init__(self, sub: Any) -> None:
        self.sub = sub

    def add(self, sub: Any, name: str, help_: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=help_, **kwargs)
        _globals(parser, suppress=True)
        return parser


def _job_fields(parser: argparse.ArgumentParser, *, whole: bool) -> None:
    """Every field of a job. ``whole``: create and put (name and target required)."""
    g = parser.add_argument_group("the job")
    g.add_argument("--name", required=whole)
    g.add_argument("--target", required=whole, help="http(s)://..., kafka://topic, pull://pool")
    when = g.add_mutually_exclusive_group()
    when.add_argument("--schedule", help='5-field cron, e.g. "0 9 * * 1-5", or @daily')
    when.add_argument("--run-at", help="one instant (RFC 3339), e.g. 2026-12-01T09:00:00Z")
    when.add_argument("--every", type=float, metavar="SEC", help="an interval in seconds")
    _complete_jobs(
        when.add_argument(
            "--depends-on",
            action="append",
            metavar="JOB",
            help="run after these jobs, by id or name (repeat)",
        )
    )
    g.add_argument("--seconds", help='the seconds of a per-second schedule, e.g. "*/10"')
    g.add_argument(
        "--tag",
        action="append",
        dest="tags",
        metavar="TAG",
        help="a label to find the job by, e.g. team=payments (repeat; replaces the job's tags)",
    )
    g.add_argument("--start-at", help="no slot before this instant (any kind of schedule)")
    g.add_argument("--end-at", help="no slot after this instant")
    g.add_argument("--timezone", help="IANA name for the schedule (default UTC)")
    g.add_argument("--payload", help="JSON sent with every run")
    g.add_argument("--payload-file", type=Path, help="the payload, as JSON in a file")
    g.add_argument(
        "--header", action="append", metavar="NAME=VALUE", help="an HTTP target's header (repeat)"
    )
    g.add_argument(
        "--secret-header",
        action="append",
        metavar="NAME=SECRET",
        help="a header whose value the node reads from the team's secret SECRET (repeat)",
    )
    g.add_argument("--max-calls-per-sec", type=float, help="what the HTTP target tolerates")
    g.add_argument(
        "--status-url",
        help="where the HTTP target's guard answers what became of an attempt (critical jobs)",
    )
    g.add_argument("--retries", type=int, help="retries after the first attempt")
    g.add_argument("--timeout", type=float, metavar="SEC", help="one attempt's time limit")
    g.add_argument("--lease", type=float, metavar="SEC", help="a pull worker's lease")
    g.add_argument("--priority", type=int, help="0-9, higher first")
    g.add_argument("--misfire", choices=("skip", "fire_once", "catch_up"))
    g.add_argument("--misfire-grace", type=float, metavar="SEC")
    g.add_argument("--catch-up-limit", type=int)
    g.add_argument("--overlap", choices=("allow", "skip", "buffer_one", "cancel_other"))
    g.add_argument("--jitter", type=float, metavar="SEC", help="spread runs over this window")
    g.add_argument("--critical", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--backoff-base", type=float, metavar="SEC")
    g.add_argument("--backoff-factor", type=float)
    g.add_argument("--backoff-cap", type=float, metavar="SEC")
    g.add_argument("--backoff-jitter", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument(
        "--allow-past",
        action="store_true",
        help="accept a --run-at or --end-at that has passed",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cronlog",
        description="Run a cronlog node, or talk to one.",
        epilog="Global flags may stand before or after the command. Docs: README.md.",
    )
    _globals(parser, suppress=False)
    parser.add_argument("--version", action=_Version, help="show the versions and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = _Parsers(sub)
    serve.add_parser(sub)

    jobs = p.add(sub, "jobs", "create, change, inspect and run jobs")
    js = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = p.add(js, "list", "the team's jobs")
    c.add_argument("--status", choices=("active", "paused", "cancelled", "finished"))
    c.add_argument("--search", help="only jobs whose name or id holds this text")
    c.add_argument("--tag", help="only jobs labelled with this tag")
    _paging(c)
    _job_arg(p.add(js, "get", "one job"))
    c = p.add(js, "create", "a new job")
    id_or_key = c.add_mutually_exclusive_group()
    id_or_key.add_argument("--id", dest="job_id", help="choose the job's id")
    id_or_key.add_argument("--idempotency-key", help="a retried create makes one job")
    _job_fields(c, whole=True)
    c = p.add(js, "apply", "create many jobs from a JSON or YAML file (a list, or {jobs: [...]})")
    c.add_argument(
        "-f",
        "--file",
        required=True,
        help="the file ('-': standard input); each job as POST /v1/jobs takes it",
    )
    c.add_argument(
        "--idempotency-key",
        help="makes applying the same file again safe: a job without job_id or"
        " idempotency_key gets the job of KEY#<its place in the file>",
    )
    c = p.add(js, "put", "create or replace a job by id (the whole definition)")
    c.add_argument("job_id")
    c.add_argument("--if-version", type=int, help="only if the job is at this version")
    _job_fields(c, whole=True)
    c = p.add(js, "update", "change some fields of a job")
    _job_arg(c)
    c.add_argument("--if-version", type=int, help="only if the job is at this version")
    c.add_argument("--clear", action="append", choices=CLEARABLE, help="set a field to null")
    c.add_argument(
        "--dry-run",
        action="store_true",
        help="show the fire times before and after the change, and the slots it adds and"
        " drops; change nothing",
    )
    _job_fields(c, whole=False)
    for action, text in (
        ("pause", "stop firing"),
        ("resume", "fire again"),
        ("cancel", "for good"),
    ):
        c = p.add(js, action, f"{action} a job ({text})")
        _job_arg(c)
        if action == "cancel":
            c.add_argument("--if-version", type=int)
    c = p.add(js, "trigger", "run a job now, or one past slot")
    _job_arg(c)
    c.add_argument("--at", help="the past slot to run (RFC 3339); default: now")
    c.add_argument("--idempotency-key", help="a repeat with the same key makes no new run")
    c = p.add(js, "preview", "a job's next fire times")
    _job_arg(c)
    c.add_argument("-n", type=int, default=10)
    c = p.add(js, "slots", "a job's slots in a range and their runs")
    _job_arg(c)
    c.add_argument("--from", dest="start", required=True)
    c.add_argument("--to", dest="end", required=True)
    c = p.add(js, "backfill", "run a job's missed past slots (a dry run unless --apply)")
    _job_arg(c)
    c.add_argument("--from", dest="start", required=True, help="RFC 3339, inclusive")
    c.add_argument("--to", dest="end", required=True, help="RFC 3339, inclusive")
    c.add_argument("--apply", action="store_true", help="trigger them (default: only show)")
    c.add_argument("--limit", type=int, default=1000, help="refuse a range with more slots")
    _progress_flag(c)

    runs = p.add(sub, "runs", "list, inspect, cancel and replay runs; work a pull pool by hand")
    rs = runs.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = p.add(rs, "list", "a job's runs, newest first, or every run in one state")
    _job_arg(c, nargs="?")
    c.add_argument(
        "--state",
        choices=(
            "blocked",
            "pending",
            "running",
            "succeeded",
            "failed",
            "retrying",
            "dead",
            "cancelled",
        ),
        help="without a job: the runs in this state (default dead)",
    )
    _paging(c)
    for action, text in (
        ("get", "one run"),
        ("cancel", "cancel a run"),
        ("replay", "requeue a dead run"),
    ):
        p.add(rs, action, text).add_argument("run_id")
    c = p.add(rs, "claim", "lease ready runs of a pull pool")
    c.add_argument("pool")
    c.add_argument("--worker-id", default=f"cli-{os.getpid()}")
    c.add_argument("--limit", type=int, default=1)
    c.add_argument("--wait", type=float, default=0.0, metavar="SEC", help="long-poll this long")
    c = p.add(rs, "heartbeat", "extend a lease")
    c.add_argument("run_id")
    c.add_argument("--fencing-token", type=int, required=True)
    c = p.add(rs, "complete", "report an attempt's outcome")
    c.add_argument("run_id")
    c.add_argument("--fencing-token", type=int, required=True)
    c.add_argument("--failed", action="store_true", help="it failed (default: succeeded)")
    c.add_argument("--error", default="")
    c.add_argument("--permanent", action="store_true", help="retrying cannot help")
    c.add_argument("--ambiguous", action="store_true", help="it may have taken effect")
    c.add_argument("--retry-after", type=float, metavar="SEC")

    dead = p.add(sub, "dead", "the dead-letter list: list it, replay by id or by filter")
    ds = dead.add_subparsers(dest="action", metavar="ACTION")
    dead.set_defaults(job=None, error_contains=None, since=None, until=None, limit=None)
    listing = p.add(ds, "list", "dead runs (the default)")
    replay = p.add(ds, "replay", "requeue dead runs")
    for parser_ in (listing, replay):
        _complete_jobs(parser_.add_argument("--job", help="only this job's (its id or name)"))
        parser_.add_argument(
            "--error-contains", metavar="TEXT", help="only those whose error has it"
        )
        parser_.add_argument("--since", metavar="TIME", help="slots at or after this instant")
        parser_.add_argument("--until", metavar="TIME", help="slots at or before this instant")
    listing.add_argument("--limit", type=int, help="show at most this many")
    replay.add_argument("run_ids", nargs="*", metavar="RUN")
    replay.add_argument("--all", action="store_true", help="every dead run (no filter)")
    replay.add_argument("--dry-run", action="store_true", help="list what would be replayed")
    _progress_flag(replay)

    c = p.add(sub, "preview", "the next fire times of a cron expression")
    c.add_argument("schedule")
    c.add_argument("--seconds")
    c.add_argument("--timezone", default="UTC")
    c.add_argument("-n", type=int, default=10)
    c.add_argument("--after", help="from this instant (default now)")

    c = p.add(sub, "tail", "follow the team's events live (GET /v1/events)")
    _complete_jobs(c.add_argument("--job", help="only this job's events (its id or name)"))
    c.add_argument("--from", dest="start", help="start, end (default) or an instant")
    c.add_argument("--cursor", help="resume after the event with this id")
    c.add_argument("--tenant", help="only this team's (the operator's token)")
    c.add_argument(
        "--operator",
        action="store_true",
        help="use the operator's token (CRONLOG_OPERATOR_TOKEN or the data directory's"
        " operator_token): every team's events",
    )
    c.add_argument("--no-follow", dest="follow", action="store_false", help="stop at the end")
    c.add_argument("--max", type=int, help="stop after this many events")
    c.add_argument("--type", action="append", metavar="EVENT", help="only these event types")

    c = p.add(sub, "status", "whether the node is up and ready")
    c = p.add(sub, "team", "the team the token speaks for: its jobs and its limits")
    c = p.add(sub, "stats", "the team's scheduling delay and outcomes over a window")
    c.add_argument("--window", type=int, metavar="MIN", help="minutes (default 60)")
    c.add_argument("--step", type=int, metavar="MIN", help="minutes a row adds up")

    c = sub.add_parser(
        "log",
        help="the log's tools: dump, verify, rebuild, stats, backfill (python -m tools.replay)",
        add_help=False,
        # No option prefix: every word after `log`, --help included, is the log tools' to read
        # (a REMAINDER does not take a leading option otherwise).
        prefix_chars="\0",
    )
    c.add_argument("rest", nargs=argparse.REMAINDER)

    c = sub.add_parser("completion", help="a shell completion script: bash, zsh or fish")
    c.add_argument("shell", choices=("bash", "zsh", "fish"))
    return parser


def _job_arg(parser: argparse.ArgumentParser, **kwargs: Any) -> None:
    _complete_jobs(
        parser.add_argument(
            "job_id",
            metavar="JOB",
            help="the job's id, or its name when no job has that id and one job has that name",
            **kwargs,
        )
    )


def _complete_jobs(action: argparse.Action) -> None:
    action.completer = _job_candidates  # type: ignore[attr-defined]  # argcomplete's hook


def _job_candidates(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """What a shell completes a job to: the ids and names of the team's jobs that begin with
    what was typed, as the node lists them (nothing when it cannot be asked)."""
    from cronlog_client import Client, CronlogError

    try:
        token = _token(parsed_args)
        with Client(getattr(parsed_args, "url", DEFAULT_URL), token, timeout_s=3, retries=0) as c:
            jobs = c.list_jobs(q=prefix or None, limit=MAX_COMPLETIONS).jobs
    except (UsageError, CronlogError, OSError):
        return []
    words = {w for job in jobs for w in (job.job_id, job.name) if w.startswith(prefix)}
    return sorted(words)


def _paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, help="items per page")
    parser.add_argument("--cursor", help="the page after the one that printed it")
    parser.add_argument("--all", action="store_true", help="every page")


def _progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar with an ETA on standard error (default: on a terminal)",
    )


class _Version(argparse.Action):
    """``--version``, worked out only when asked: reading it imports the client library and
    the package metadata, a quarter of a second at every start of every command otherwise
    (a node's start included)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        sys.stdout.write(_version() + "\n")  # where argparse's own version action writes
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    import cronlog_client

    try:
        service = version("cronlog")
    except PackageNotFoundError:
        service = "unknown"
    return f"cronlog {service} (client {cronlog_client.__version__})"


# -- running a command ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        import argcomplete

        argcomplete.autocomplete(parser)
    except ImportError:  # pragma: no cover - a dependency; completion is not vital
        pass
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve.serve_command(args)
    if args.command == "log":
        from tools.replay.cli import main as replay_main

        return replay_main(args.rest, prog="cronlog log")
    if args.command == "completion":
        from argcomplete import shell_integration

        print(shell_integration.shellcode(["cronlog"], shell=args.shell), end="")
        return 0
    args.output = args.output or output.default_format()
    try:
        return _client_command(args)
    except UsageError as e:
        print(f"cronlog: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `cronlog jobs list | head` ends quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as the Python docs do
        return 0
    except KeyboardInterrupt:
        return 130


def _token(args: argparse.Namespace) -> str:
    if getattr(args, "operator", False):
        from cli.serve import load_operator_token_if_any

        found = load_operator_token_if_any(args.data_dir)
        if found is None:
            raise UsageError(
                "--operator: set CRONLOG_OPERATOR_TOKEN or run beside `cronlog serve`'s data"
                f" directory ({args.data_dir / 'operator_token'})"
            )
        return found
    if args.token:
        return str(args.token)
    from api.auth import read_tokens_file

    path = args.data_dir / "tokens"
    if path.exists():
        for token in read_tokens_file(path):
            return token
    raise UsageError(
        "no token: pass --token, set CRONLOG_TOKEN, or run next to `cronlog serve`'s "
        f"data directory ({path})"
    )


def _client_command(args: argparse.Namespace) -> int:
    from cronlog_client import ApiError, Client, CronlogError, Unreachable

    try:
        with Client(args.url, _token(args)) as client:
            _resolve_job_names(client, args)
            return _COMMANDS[(args.command, getattr(args, "action", None) or "list")](client, args)
    except Unreachable as e:
        print(
            f"cronlog: cannot reach {args.url} ({e}); is `cronlog serve` running?", file=sys.stderr
        )
        return 1
    except ApiError as e:
        if args.output != "table":
            output.show(e.body or {"error": e.error, "message": e.message}, args.output)
        where = f" ({e.field})" if e.field else ""
        print(f"cronlog: {e.status} {e.error}{where}: {e.message}", file=sys.stderr)
        return 1
    except CronlogError as e:
        print(f"cronlog: {e}", file=sys.stderr)
        return 1


# -- a job by its name ---------------------------------------------------------------------------

_IDS_ONLY = {("jobs", "create"), ("jobs", "put")}  # these name the id a job is to have


def _resolve_job_names(client: Any, args: argparse.Namespace) -> None:
    """Every job the command names, by id or by name, as its id. The job ``job_id`` names, as
    it was found, is ``args.found_job`` (None when none was): ``jobs get`` shows it rather than
    ask for it again."""
    taken = (args.command, getattr(args, "action", None))
    args.found_job = None
    if getattr(args, "job_id", None) and taken not in _IDS_ONLY:
        args.found_job = job_of(client, args.job_id)
        if args.found_job is not None:
            args.job_id = str(args.found_job.job_id)
    if getattr(args, "job", None):
        args.job = job_id_of(client, args.job)
    if getattr(args, "depends_on", None):
        args.depends_on = [job_id_of(client, j) for j in args.depends_on]


def job_id_of(client: Any, text: str) -> str:
    """The id of the job ``text`` names (:func:`job_of`); a name no job has is left as it is:
    the node answers 404 for it."""
    job = job_of(client, text)
    return text if job is None else str(job.job_id)


def job_of(client: Any, text: str) -> Any:
    """The job ``text`` names, or None: the job whose id it is, else the one job the team
    named so. Of several with that name, the one not cancelled is meant (a team that cancelled
    a job and made another of the same name); more than one left is ambiguous, and the error
    lists their ids. Text that is not even an id's form (``daily report``) is only a name."""
    from cronlog_client import ApiError

    from core.jobs import JOB_ID

    if JOB_ID.match(text):
        try:
            return client.get_job(text)
        except ApiError as e:
            if e.status not in (400, 404):
                raise
    named = list(client.iter_jobs(name=text, page_size=100))
    if len(named) > 1:
        named = [j for j in named if j.status != "cancelled"] or named
    if len(named) == 1:
        return named[0]
    if not named:
        return None
    ids = ", ".join(f"{j.job_id} ({j.status})" for j in named)
    raise UsageError(f"{len(named)} jobs are named {text!r}: {ids}; give one of their ids")


# -- jobs ----------------------------------------------------------------------------------------


def _json(flag: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise UsageError(f"{flag} is not JSON: {e}") from None


def _pairs(flag: str, items: list[str] | None) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} takes NAME=VALUE, not {item!r}")
        pairs[name] = value
    return pairs


def _fields(args: argparse.Namespace, client: Any | None = None) -> dict[str, Any]:
    """The job fields the flags give, in the API's names."""
    from cronlog_client import UNSET, BackoffIn, HttpTarget, SecretRef

    fields: dict[str, Any] = {}
    simple = {
        "name": "name",
        "schedule": "schedule",
        "seconds": "seconds",
        "run_at": "run_at",
        "every": "interval_sec",
        "start_at": "start_at",
        "end_at": "end_at",
        "timezone": "timezone",
        "retries": "retries",
        "timeout": "timeout_sec",
        "lease": "lease_sec",
        "priority": "priority",
        "misfire": "misfire_policy",
        "misfire_grace": "misfire_grace_sec",
        "catch_up_limit": "catch_up_limit",
        "overlap": "overlap_policy",
        "jitter": "allow_jitter_sec",
        "critical": "critical",
        "depends_on": "depends_on",
        "tags": "tags",
    }
    for flag, name in simple.items():
        value = getattr(args, flag, None)
        if value is not None:
            fields[name] = value
    if args.payload is not None and args.payload_file is not None:
        raise UsageError("give --payload or --payload-file, not both")
    if args.payload is not None:
        fields["payload"] = _json("--payload", args.payload)
    elif args.payload_file is not None:
        fields["payload"] = _json("--payload-file", args.payload_file.read_text())
    headers: dict[str, str | SecretRef] = dict(_pairs("--header", args.header))
    for name, secret in _pairs("--secret-header", args.secret_header).items():
        headers[name] = SecretRef(from_file=secret)
    if headers or args.max_calls_per_sec is not None or args.status_url is not None:
        url, status_url = args.target, args.status_url
        if url is None and client is not None:  # an update of an HTTP job's headers
            current = client.get_job(args.job_id).target
            url = getattr(current, "url", None)
            if status_url is None:
                status_url = getattr(current, "status_url", None)
        if not url or not str(url).startswith(("http://", "https://")):
            raise UsageError(
                "--header, --max-calls-per-sec and --status-url are for an http(s):// --target"
            )
        fields["target"] = HttpTarget(
            url=url,
            headers=headers,
            max_calls_per_sec=args.max_calls_per_sec,
            status_url=status_url,
        )
    elif args.target is not None:
        fields["target"] = args.target
    backoff = {
        "base_sec": args.backoff_base,
        "factor": args.backoff_factor,
        "cap_sec": args.backoff_cap,
        "jitter": args.backoff_jitter,
    }
    if any(v is not None for v in backoff.values()):
        fields["backoff"] = BackoffIn(
            **{k: (UNSET if v is None else v) for k, v in backoff.items()}
        )
    if args.allow_past:
        fields["allow_past"] = True
    for name in getattr(args, "clear", None) or []:
        if name in fields:
            raise UsageError(f"--clear {name} and a value for it: give one")
        fields[name] = [] if name == "tags" else None  # a job without tags has an empty list
    return fields


def _jobs_list(client: Any, args: argparse.Namespace) -> int:
    if args.all:
        jobs = list(
            client.iter_jobs(args.status, page_size=args.limit, q=args.search, tag=args.tag)
        )
        output.show(jobs, args.output, output.JOB_COLUMNS)
    else:
        page = client.list_jobs(
            args.status, limit=args.limit, cursor=args.cursor, q=args.search, tag=args.tag
        )
        output.show(page, args.output, output.JOB_COLUMNS, key="jobs")
    return 0


def _jobs_create(client: Any, args: argparse.Namespace) -> int:
    from cronlog_client import NewJob

    fields = _fields(args)
    if args.job_id:
        fields["job_id"] = args.job_id
    if args.idempotency_key:
        fields["idempotency_key"] = args.idempotency_key
    output.show(client.create_job(NewJob(**fields)), args.output)
    return 0


def _jobs_apply(client: Any, args: argparse.Namespace) -> int:
    """Create the file's jobs in batches; one row per job, and exit 1 if any was refused."""
    from cronlog_client import NewJob

    jobs = []
    for i, item in enumerate(_job_list(args.file)):
        if not isinstance(item, dict):
            raise UsageError(f"{args.file}: jobs[{i}] is not a job (an object of its fields)")
        # The node checks each job's fields and answers for each; only a name NewJob does not
        # have cannot be sent at all.
        unknown = sorted(set(item) - set(NewJob.__struct_fields__))
        if unknown:
            raise UsageError(f"{args.file}: jobs[{i}] has no field {unknown[0]!r}")
        jobs.append(NewJob(**item))
    done = client.create_jobs(jobs, idempotency_key=args.idempotency_key)
    output.show(done, args.output, output.BATCH_COLUMNS, key="results")
    if args.output == "table":
        print(f"{done.created} created, {done.existing} already there, {done.failed} refused")
    return 1 if done.failed else 0


def _job_list(path: str) -> list[Any]:
    """The jobs a file lists: a JSON or YAML list of jobs, or an object whose ``jobs`` is one."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise UsageError(f"{path} is neither JSON nor YAML: {e}") from None
    if isinstance(data, dict) and "jobs" in data:
        data = data["jobs"]
    if not isinstance(data, list) or not data:
        raise UsageError(f"{path}: expected a list of jobs, or an object with a jobs list")
    return data


def _jobs_put(client: Any, args: argparse.Namespace) -> int:
    from cronlog_client import JobDefinition

    job = client.put_job(args.job_id, JobDefinition(**_fields(args)), if_version=args.if_version)
    output.show(job, args.output)
    return 0


def _jobs_update(client: Any, args: argparse.Namespace) -> int:
    from cronlog_client import JobPatch

    fields = _fields(args, client)
    if not fields:
        raise UsageError("nothing to change: give a field, or --clear one")
    if args.dry_run:
        change = client.preview_change(args.job_id, JobPatch(**fields))
        if args.output != "table":
            output.show(change, args.output)
            return 0
        _show_change(output.builtins(change))
        print("dry run: nothing was changed", file=sys.stderr)
        return 0
    if args.if_version is not None:
        fields["version"] = args.if_version
    output.show(client.patch_job(args.job_id, JobPatch(**fields)), args.output)
    return 0


def _show_change(change: dict[str, Any]) -> None:
    """A change's fire times as one list: each time the job would fire after it, once, marked
    ``+`` where the change adds it, and the times it drops marked ``-``."""
    added = {f["at"] for f in change["added"]}
    rows = [
        {**f, "change": "+ added" if f["at"] in added else ""} for f in change["after"]["fires"]
    ]
    rows += [{**f, "change": "- dropped"} for f in change["dropped"]]
    rows.sort(key=lambda f: f["at"])
    output.show(rows, "table", [*output.FIRE_COLUMNS, ("CHANGE", lambda f: f["change"])])
    until = change.get("compared_until")
    print(
        f"{len(change['added'])} added, {len(change['dropped'])} dropped"
        + (f" (compared up to {until})" if until else "")
    )


def _jobs_trigger(client: Any, args: argparse.Namespace) -> int:
    run = client.trigger(args.job_id, scheduled_for=args.at, idempotency_key=args.idempotency_key)
    output.show(run, args.output)
    return 0


def _jobs_backfill(client: Any, args: argparse.Namespace) -> int:
    from tools.replay.progress import meter_for

    plan = client.backfill_plan(args.job_id, args.start, args.end, limit=args.limit)
    if plan.more:
        print(
            f"cronlog: more than {args.limit} slots in the range; narrow it or raise --limit",
            file=sys.stderr,
        )
        return 1
    todo = [s for s in plan.slots if s.due and s.state is None]
    if not args.apply:
        output.show(plan, args.output, output.SLOT_COLUMNS, key="slots")
        print(
            f"dry run: {len(todo)} of {len(plan.slots)} slots would be triggered"
            " (pass --apply to trigger them)",
            file=sys.stderr,
        )
        return 0
    meter = meter_for(args.progress)
    meter.start(f"backfill {args.job_id}", len(todo))
    started = time.monotonic()
    try:
        runs = client.backfill(
            args.job_id,
            args.start,
            args.end,
            limit=args.limit,
            progress=lambda done, total, run: meter.advance(),
        )
    finally:
        meter.stop()
    output.show(runs, args.output, output.RUN_COLUMNS)
    print(
        f"triggered {len(runs)} runs of {len(plan.slots)} slots in"
        f" {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


def _show(call: Callable[[Any, argparse.Namespace], Any], columns: Any = None, key: Any = None):  # type: ignore[no-untyped-def]
    def command(client: Any, args: argparse.Namespace) -> int:
        output.show(call(client, args), args.output, columns, key=key)
        return 0

    return command


def _for_people(  # type: ignore[no-untyped-def]
    call: Callable[[Any, argparse.Namespace], Any], table: Callable[[Any], None]
):
    """A command whose table is drawn by ``table``; JSON and YAML are the API's answer."""

    def command(client: Any, args: argparse.Namespace) -> int:
        answer = call(client, args)
        if args.output == "table":
            table(answer)
        else:
            output.show(answer, args.output)
        return 0

    return command


# -- runs ----------------------------------------------------------------------------------------


def _runs_list(client: Any, args: argparse.Namespace) -> int:
    if args.job_id is not None and args.state is not None:
        raise UsageError("give a job or --state, not both")
    if args.job_id is not None:
        if args.all:
            runs = list(client.iter_job_runs(args.job_id, page_size=args.limit))
            output.show(runs, args.output, output.RUN_COLUMNS)
        else:
            page = client.job_runs(args.job_id, limit=args.limit, cursor=args.cursor)
            output.show(page, args.output, output.RUN_COLUMNS, key="runs")
        return 0
    state = args.state or "dead"
    if args.all:
        output.show(
            list(client.iter_runs(state, page_size=args.limit)), args.output, output.RUN_COLUMNS
        )
    else:
        page = client.list_runs(state, limit=args.limit, cursor=args.cursor)
        output.show(page, args.output, output.RUN_COLUMNS, key="runs")
    return 0


def _runs_complete(client: Any, args: argparse.Namespace) -> int:
    run = client.complete(
        args.run_id,
        args.fencing_token,
        "failed" if args.failed else "succeeded",
        error=args.error,
        permanent=args.permanent,
        ambiguous=args.ambiguous,
        retry_after_sec=args.retry_after,
    )
    output.show(run, args.output)
    return 0


# -- dead letters --------------------------------------------------------------------------------


def _instant(flag: str, text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    try:
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise UsageError(f"{flag} must be an RFC 3339 instant with Z or an offset")
    return at


def _dead(client: Any, args: argparse.Namespace) -> Iterator[Any]:
    """The dead runs the filters select, newest slot first."""
    since, until = _instant("--since", args.since), _instant("--until", args.until)
    for run in client.iter_runs("dead"):
        if args.job is not None and run.job_id != args.job:
            continue
        if args.error_contains is not None and args.error_contains not in run.error:
            continue
        if since is not None and run.scheduled_for < since:
            continue
        if until is not None and run.scheduled_for > until:
            continue
        yield run


def _dead_list(client: Any, args: argparse.Namespace) -> int:
    runs: list[Any] = []
    for run in _dead(client, args):
        if args.limit is not None and len(runs) >= args.limit:
            break
        runs.append(run)
    output.show(runs, args.output, output.RUN_COLUMNS)
    return 0


def _dead_replay(client: Any, args: argparse.Namespace) -> int:
    from cronlog_client import ApiError

    from tools.replay.progress import meter_for

    filtered = any(v is not None for v in (args.job, args.error_contains, args.since, args.until))
    if args.run_ids and (filtered or args.all):
        raise UsageError("give run ids, or a filter (or --all), not both")
    if not (args.run_ids or filtered or args.all):
        raise UsageError(
            "say which: run ids, a filter (--job, --error-contains, --since, --until), or --all"
        )
    chosen = (
        [client.get_run(r) for r in args.run_ids] if args.run_ids else list(_dead(client, args))
    )
    if args.dry_run:
        output.show(chosen, args.output, output.RUN_COLUMNS)
        print(f"dry run: {len(chosen)} dead runs would be replayed", file=sys.stderr)
        return 0
    meter = meter_for(args.progress)
    meter.start("replay", len(chosen))
    replayed, refused = [], []
    try:
        for run in chosen:
            try:
                replayed.append(client.replay_run(run.run_id))
            except ApiError as e:  # replayed meanwhile, say: report it, go on with the rest
                refused.append(f"{run.run_id}: {e.message}")
            meter.advance()
    finally:
        meter.stop()
    output.show(replayed, args.output, output.RUN_COLUMNS)
    for line in refused:
        print(f"cronlog: not replayed: {line}", file=sys.stderr)
    print(f"replayed {len(replayed)} of {len(chosen)} dead runs", file=sys.stderr)
    return 1 if refused else 0


# -- the rest ------------------------------------------------------------------------------------


def _tail(client: Any, args: argparse.Namespace) -> int:
    types = set(args.type or ())
    shown = 0
    for event in client.events(
        start=args.start,
        cursor=args.cursor,
        job=args.job,
        tenant=args.tenant,
        follow=args.follow,
        max_events=None,
    ):
        if types and event.type not in types:
            continue
        if args.output == "table":
            print(_event_line(event.event), flush=True)
        else:
            record = output.builtins(event)
            print(json.dumps(record) if args.output == "json" else _yaml_doc(record), flush=True)
        shown += 1
        if args.max is not None and shown >= args.max:
            break
    return 0


def _yaml_doc(value: Any) -> str:
    import yaml

    return "---\n" + str(yaml.safe_dump(value, sort_keys=False)).rstrip()


def _event_line(event: dict[str, Any]) -> str:
    at = dt.datetime.fromtimestamp(event.get("at", 0) / 1000, dt.UTC)
    job = str(event.get("job_id", "")).partition("/")[2] or event.get("job_id", "")
    detail = []
    if "run_id" in event:
        detail.append(
            f"run {str(event['run_id']).rpartition('.')[2]} attempt {event.get('attempt')}"
        )
    for name in ("reason", "error", "worker_id", "lateness_ms", "trigger"):
        if event.get(name) not in (None, ""):
            detail.append(f"{name}={event[name]}")
    kind = event.get("type", "?")
    where = f"{event.get('tenant')}/{job}"
    return f"{output.instant(at)}  {kind:<16} {where}  {' '.join(detail)}"


def _status(client: Any, args: argparse.Namespace) -> int:
    health = {"url": client.url, "up": client.health(), "ready": client.ready()}
    output.show(health, args.output)
    return 0 if health["ready"] else 1


def _preview(client: Any, args: argparse.Namespace) -> Any:
    return client.preview_schedule(
        args.schedule, seconds=args.seconds, timezone=args.timezone, n=args.n, after=args.after
    )


_COMMANDS: dict[tuple[str, str], Callable[[Any, argparse.Namespace], int]] = {
    ("jobs", "list"): _jobs_list,
    ("jobs", "get"): _show(lambda c, a: a.found_job or c.get_job(a.job_id)),
    ("jobs", "create"): _jobs_create,
    ("jobs", "put"): _jobs_put,
    ("jobs", "apply"): _jobs_apply,
    ("jobs", "update"): _jobs_update,
    ("jobs", "pause"): _show(lambda c, a: c.pause_job(a.job_id)),
    ("jobs", "resume"): _show(lambda c, a: c.resume_job(a.job_id)),
    ("jobs", "cancel"): _show(lambda c, a: c.cancel_job(a.job_id, if_version=a.if_version)),
    ("jobs", "trigger"): _jobs_trigger,
    ("jobs", "preview"): _show(
        lambda c, a: c.preview_job(a.job_id, a.n), output.FIRE_COLUMNS, "fires"
    ),
    ("jobs", "slots"): _show(
        lambda c, a: c.job_slots(a.job_id, a.start, a.end), output.SLOT_COLUMNS, "slots"
    ),
    ("jobs", "backfill"): _jobs_backfill,
    ("runs", "list"): _runs_list,
    ("runs", "get"): _show(lambda c, a: c.get_run(a.run_id)),
    ("runs", "cancel"): _show(lambda c, a: c.cancel_run(a.run_id)),
    ("runs", "replay"): _show(lambda c, a: c.replay_run(a.run_id)),
    ("runs", "claim"): _show(
        lambda c, a: c.claim(a.pool, a.worker_id, limit=a.limit, wait_sec=a.wait),
        output.CLAIM_COLUMNS,
    ),
    ("runs", "heartbeat"): _show(lambda c, a: c.heartbeat(a.run_id, a.fencing_token)),
    ("runs", "complete"): _runs_complete,
    ("dead", "list"): _dead_list,
    ("dead", "replay"): _dead_replay,
    ("preview", "list"): _show(_preview, output.FIRE_COLUMNS, "fires"),
    ("tail", "list"): _tail,
    ("status", "list"): _status,
    ("team", "list"): _for_people(lambda c, a: c.team(), output.show_team),
    ("stats", "list"): _for_people(
        lambda c, a: c.stats(window_min=a.window, step_min=a.step), output.show_stats
    ),
}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
