"""The ``cronlog`` command: run a node, or talk to one.

    cronlog serve [--data-dir DIR] [--host 127.0.0.1] [--port 8080] [--partitions 8]
    cronlog serve --allow-targets 127.0.0.0/8               # let jobs call this machine
    cronlog serve --kafka HOST:PORT [--node-id ID]          # join a cluster
    cronlog serve --limits FILE                             # tenants' quotas and rates
    cronlog jobs create --name N (--schedule CRON | --run-at TIME | --every SEC) --target URL
    cronlog jobs list | get ID | pause ID | resume ID | cancel ID
    cronlog runs JOB_ID [--limit N]
    cronlog dead | replay RUN_ID | cancel-run RUN_ID

The client speaks the HTTP API: ``--url`` (or ``CRONLOG_URL``) and ``--token`` (or
``CRONLOG_TOKEN``; otherwise the first token in the data directory's ``tokens`` file, which
``cronlog serve`` writes when no tokens are configured).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from cli import serve
from cli.serve import read_kafka_config, target_producer_config

__all__ = ["main", "read_kafka_config", "target_producer_config"]

DEFAULT_DATA_DIR = Path(os.environ.get("CRONLOG_DATA_DIR", "~/.local/share/cronlog")).expanduser()
DEFAULT_URL = os.environ.get("CRONLOG_URL", "http://127.0.0.1:8080")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cronlog", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve.add_parser(sub)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the node's API (default: $CRONLOG_URL, else {DEFAULT_URL})",
    )
    client.add_argument("--token", default=os.environ.get("CRONLOG_TOKEN"))
    client.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)

    jobs = sub.add_parser("jobs", help="create, list, inspect, pause, resume, cancel jobs")
    jobs_sub = jobs.add_subparsers(dest="action", required=True)
    create = jobs_sub.add_parser("create", parents=[client])
    create.add_argument("--name", required=True)
    when = create.add_mutually_exclusive_group(required=True)
    when.add_argument("--schedule", help='cron, e.g. "0 9 * * *"')
    when.add_argument("--run-at", help="an RFC 3339 instant, e.g. 2026-12-01T09:00:00Z")
    when.add_argument("--every", type=float, metavar="SEC", help="an interval in seconds")
    create.add_argument(
        "--target", required=True, help="http(s)://..., kafka://topic or pull://pool"
    )
    create.add_argument("--timezone", default="UTC")
    create.add_argument("--payload", default="null", help="JSON")
    create.add_argument("--retries", type=int)
    create.add_argument("--critical", action="store_true")
    create.add_argument("--idempotency-key")
    lst = jobs_sub.add_parser("list", parents=[client])
    lst.add_argument("--status")
    for action in ("get", "pause", "resume", "cancel"):
        jobs_sub.add_parser(action, parents=[client]).add_argument("job_id")

    runs = sub.add_parser("runs", parents=[client], help="a job's runs, newest first")
    runs.add_argument("job_id")
    runs.add_argument("--limit", type=int, default=20)
    sub.add_parser("dead", parents=[client], help="the dead-letter list")
    sub.add_parser("replay", parents=[client], help="requeue a dead run").add_argument("run_id")
    sub.add_parser("cancel-run", parents=[client], help="cancel a run").add_argument("run_id")

    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve.serve_command(args)
    return client_command(args)


# -- the client ----------------------------------------------------------------------------------


def _token(args: argparse.Namespace) -> str:
    if args.token:
        return str(args.token)
    from api.auth import read_tokens_file

    path = args.data_dir / "tokens"
    if path.exists():
        for token in read_tokens_file(path):
            return token
    sys.exit(
        "no token: pass --token, set CRONLOG_TOKEN, or run next to `cronlog serve`'s "
        f"data directory ({path})"
    )


def client_command(args: argparse.Namespace) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {_token(args)}"}
    method, path, body = _request(args)
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=30) as http:
            response = http.request(method, path, json=body)
    except httpx.TransportError as e:
        sys.exit(f"cronlog: cannot reach {args.url} ({e}); is `cronlog serve` running there?")
    try:
        shown: Any = response.json()
    except ValueError:
        shown = response.text
    try:
        print(json.dumps(shown, indent=2) if not isinstance(shown, str) else shown, flush=True)
    except BrokenPipeError:  # `cronlog jobs list | head` ends quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as the Python docs do
    return 0 if response.is_success else 1


def _json_argument(flag: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        sys.exit(f"cronlog: {flag} is not JSON: {e}")


def _request(args: argparse.Namespace) -> tuple[str, str, Any]:
    if args.command == "jobs":
        if args.action == "create":
            body: dict[str, Any] = {
                "name": args.name,
                "target": args.target,
                "timezone": args.timezone,
                "payload": _json_argument("--payload", args.payload),
            }
            if args.schedule:
                body["schedule"] = args.schedule
            elif args.run_at:
                body["run_at"] = args.run_at
            else:
                body["interval_sec"] = args.every
            if args.retries is not None:
                body["retries"] = args.retries
            if args.critical:
                body["critical"] = True
            if args.idempotency_key:
                body["idempotency_key"] = args.idempotency_key
            return "POST", "/v1/jobs", body
        if args.action == "list":
            return "GET", "/v1/jobs" + (f"?status={args.status}" if args.status else ""), None
        if args.action == "get":
            return "GET", f"/v1/jobs/{args.job_id}", None
        if args.action in ("pause", "resume"):
            status = "paused" if args.action == "pause" else "active"
            return "PATCH", f"/v1/jobs/{args.job_id}", {"status": status}
        return "DELETE", f"/v1/jobs/{args.job_id}", None
    if args.command == "runs":
        return "GET", f"/v1/jobs/{args.job_id}/runs?limit={args.limit}", None
    if args.command == "dead":
        return "GET", "/v1/runs?state=dead", None
    if args.command == "replay":
        return "POST", f"/v1/runs/{args.run_id}/replay", None
    return "POST", f"/v1/runs/{args.run_id}/cancel", None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
