"""Small process helpers every part of the harness shares."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Linux sends PR_SET_PDEATHSIG when the *thread* that forked the child ends, not the process.
# Faults strike from threads that end, so every child is started by one of these threads,
# which live as long as the harness.
_spawner = ThreadPoolExecutor(4, thread_name_prefix="spawner")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """``preexec_fn`` for a child that must not outlive the harness: a run that dies hard
    leaves no node, target or worker behind (Linux: SIGKILL when the parent goes)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def in_spawner(fn: Callable[[], T]) -> T:
    """Call ``fn`` (which starts a child process that must die with the harness) on a thread
    that outlives it."""
    return _spawner.submit(fn).result()


def popen(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` with :func:`die_with_parent`, from a thread that outlives it."""

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, preexec_fn=die_with_parent, **kwargs)

    return in_spawner(start)


def children(pid: int) -> set[int]:
    """The processes ``pid`` started and that still run (Linux's /proc): a node's worker
    processes (``cronlog serve --workers N``)."""
    found: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        with contextlib.suppress(FileNotFoundError):
            found.update(int(t) for t in (task / "children").read_text().split())
    return found


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")
