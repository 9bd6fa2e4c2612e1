"""Where a node's CPU goes during a scenario: py-spy sampling the ``cronlog serve`` process (and
its children) from outside, summed by the project module each sample was in. Only the thread
holding each process's GIL is sampled (py-spy's ``--gil``): what runs Python, not the threads
waiting for it.

Used by ``python -m bench.herd_serve --profile``: the samples of the herd's window, attributed
to the innermost frame of cronlog's own code on each stack (``node/executors.py``,
``projections/read_model.py``, ...; ``(outside cronlog)`` for a stack with none, e.g. a
thread waiting in a library), and the functions where the samples were taken. py-spy (the
``bench`` extra) must be able to ptrace the node: root, or ``kernel.yama.ptrace_scope`` 0.
Sampling slows the node a little; a profiled run's timings are not recorded as figures.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

PACKAGES = ("core", "eventlog", "projections", "node", "api", "cli", "tools")
RATE = 100  # samples a second per thread
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^():]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def start(pid: int, out: Path, duration_s: float) -> subprocess.Popen[bytes] | None:
    """Sample ``pid`` and its children into ``out`` (py-spy's raw, collapsed stacks) until
    :func:`finish` or ``duration_s``; ``None`` when py-spy is not installed."""
    tool = py_spy()
    if tool is None:
        return None
    return subprocess.Popen(
        [tool, "record", "--pid", str(pid), "--subprocesses", "--gil", "--rate", str(RATE),
         "--duration", str(max(1, round(duration_s))), "--format", "raw",
         "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def _module(file: str) -> str | None:
    parts = Path(file).parts
    for i, part in enumerate(parts):
        if part in PACKAGES and i + 1 < len(parts) and "site-packages" not in parts[:i]:
            return "/".join(parts[i:])
    return None


def summarize(raw: Path, top: int = 15) -> dict[str, Any]:
    """Shares of the samples by cronlog module (innermost frame of ours) and by function."""
    by_module: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        leaf = frames[-1]
        match = _FRAME.match(leaf)
        by_function[f"{match['function']} ({Path(match['file']).name})" if match else leaf] += count
        ours = "(outside cronlog)"
        for frame in reversed(frames):
            m = _FRAME.match(frame)
            module = _module(m["file"]) if m else None
            if module is not None:
                ours = module
                break
        by_module[ours] += count

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(v / total, 3)) for k, v in counter.most_common(top)] if total else []

    return {"samples": total, "by_module": shares(by_module), "by_function": shares(by_function)}


def finish(proc: subprocess.Popen[bytes] | None, raw: Path) -> dict[str, Any] | None:
    """Stop the sampler (it writes what it has on SIGINT) and summarize it (``None`` without
    py-spy)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if not raw.exists():
        return {"error": (err or b"").decode(errors="replace")[-500:]}
    keep = os.environ.get("CRONLOG_BENCH_PROFILE_KEEP")
    if keep:  # the raw stacks, for callers the summary does not show
        shutil.copyfile(raw, keep)
    return summarize(raw)
