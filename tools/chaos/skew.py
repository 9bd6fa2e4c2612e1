"""A node whose wall clock is off: libfaketime (Debian's ``faketime`` package) preloaded into
the node's process, reading its offset from a file the harness rewrites while the node runs.

Only the wall clock (``CLOCK_REALTIME``: ``time.time()``) moves. The monotonic clock stays
true (``FAKETIME_DONT_FAKE_MONOTONIC``), as it does when NTP steps a real machine's clock:
timeouts, sleeps and Kafka's own timers are unaffected, and what cronlog reads as "now" is
wrong by the offset. libfaketime reads the file again at most once a second
(``FAKETIME_CACHE_DURATION``), so a change takes effect within two seconds.

Debian's libfaketime (0.9.10) breaks Python 3.11's ``time.sleep`` in that mode (an absolute
monotonic ``clock_nanosleep`` comes back ``EINVAL``), and leaves glibc's C11 ``cnd_timedwait``
unwrapped, whose wall-clock deadline librdkafka computes from the faked clock, so that every
one of its timed waits took the offset longer (a ``poll(1.0)`` 6 s at 5 s ahead); a small shim
compiled from ``monotonic_sleep.c``, preloaded first, mends both. It needs a C compiler
(``cc``), once per machine.
:func:`check` proves the whole arrangement works with a given Python before a run relies on
it: the wall clock moves, steps back, and ``time.sleep``, timed waits and asyncio keep time.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

# The thread-safe build: a node has many threads reading the clock.
LIBRARY_GLOB = "/usr/lib/*/faketime/libfaketimeMT.so.1"
SHIM_SOURCE = Path(__file__).with_name("monotonic_sleep.c")


class SkewUnavailable(RuntimeError):
    """libfaketime is missing or does not work with this Python; the message says why."""


def library() -> Path:
    found = sorted(glob.glob(LIBRARY_GLOB))
    if not found:
        raise SkewUnavailable(
            f"libfaketime is not installed (no {LIBRARY_GLOB}): apt-get install faketime"
        )
    return Path(found[0])


def shim() -> Path:
    """The compiled ``monotonic_sleep.c``, built once into the cache."""
    source = SHIM_SOURCE.read_bytes()
    cache = Path(os.environ.get("CRONLOG_CACHE") or "~/.cache/cronlog").expanduser() / "chaos"
    built = cache / f"monotonic_sleep-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if built.exists():
        return built
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SkewUnavailable("no C compiler (cc) to build the libfaketime shim")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = built.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SHIM_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SkewUnavailable(f"building the libfaketime shim failed:\n{result.stderr}")
    tmp.replace(built)
    return built


def offset_text(offset_s: float) -> str:
    return f"{offset_s:+.3f}s"


class SkewedClock:
    """The offset of one process's wall clock, kept in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset_s = 0.0
        self.set(0.0)

    def set(self, offset_s: float) -> None:
        # Written whole and renamed over, so libfaketime never reads half a line.
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(offset_text(offset_s) + "\n")
        tmp.replace(self.path)
        self.offset_s = offset_s

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": f"{shim()} {library()}",
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_CACHE_DURATION": "1",
        }


_PROBE = """
import asyncio, ctypes, sys, threading, time

class Deadline(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

def c11_wait(seconds):
    # A C11 timed wait (glibc's cnd_timedwait), as librdkafka waits, its deadline read from the
    # wall clock; looked up as librdkafka's calls are, so the preloaded shim answers it.
    libc = ctypes.CDLL(None)
    mtx, cnd = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    libc.mtx_init(mtx, 0)
    libc.cnd_init(cnd)
    libc.mtx_lock(mtx)
    at = time.time() + seconds
    t = time.monotonic()
    libc.cnd_timedwait(cnd, mtx, ctypes.byref(Deadline(int(at), int(at % 1 * 1e9))))
    took = time.monotonic() - t
    libc.mtx_unlock(mtx)
    return took

def report(tag):
    mono = time.monotonic()
    t = time.monotonic(); time.sleep(0.05); slept = time.monotonic() - t
    t = time.monotonic(); threading.Event().wait(0.05); waited = time.monotonic() - t
    t = time.monotonic(); asyncio.run(asyncio.sleep(0.05)); looped = time.monotonic() - t
    print(tag, time.time(), mono, slept, waited, looped, c11_wait(0.05), flush=True)
report("before")
sys.stdin.readline()  # the offset file changes now
time.sleep(2.5)  # libfaketime looks at the file again within two seconds
report("after")
"""


def check(python: str = sys.executable, work_dir: Path | None = None) -> None:
    """Run ``python`` under the preload 30 s ahead, then step its clock 40 s back; raise
    :class:`SkewUnavailable` unless its wall clock followed and its monotonic clock, sleeps,
    timed waits (Python's, and C11's as librdkafka waits) and asyncio did not."""
    import time

    directory = work_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    clock = SkewedClock(directory / f"faketime-check-{os.getpid()}.rc")
    try:
        clock.set(30.0)
        try:
            probe = subprocess.Popen(
                [python, "-c", _PROBE],
                env={**os.environ, **clock.env()},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert probe.stdin is not None and probe.stdout is not None
            first = probe.stdout.readline().split()
            if len(first) != 7:
                _, err = probe.communicate(timeout=30)
                raise SkewUnavailable(f"{python} under libfaketime failed:\n{err[-2000:]}")
            clock.set(-10.0)
            probe.stdin.write("\n")
            probe.stdin.flush()
            second = probe.stdout.readline().split()
            _, err = probe.communicate(timeout=30)
        except (subprocess.SubprocessError, OSError) as e:
            raise SkewUnavailable(f"{python} does not run under libfaketime: {e}") from e
        if len(first) != 7 or len(second) != 7:
            raise SkewUnavailable(f"{python} under libfaketime failed:\n{err[-2000:]}")
        now, mono = time.time(), time.monotonic()
        for (_, wall, their_mono, *waits), expected in ((first, 30.0), (second, -10.0)):
            lead = float(wall) - now
            if not expected - 3 <= lead <= expected + 1:
                raise SkewUnavailable(
                    f"libfaketime did not set {python}'s wall clock {expected:+.0f} s off "
                    f"(it read {lead:+.1f} s)"
                )
            if not mono - 10 <= float(their_mono) <= mono:
                raise SkewUnavailable("libfaketime moved the monotonic clock")
            if not all(0.04 <= float(w) < 2 for w in waits):
                raise SkewUnavailable(f"sleeps or waits broke under libfaketime: {waits}")
    finally:
        clock.path.unlink(missing_ok=True)
