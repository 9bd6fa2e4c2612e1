"""What the benchmarks share: clocks and percentiles, the machine, processes and their CPU, the
recorder, a ``cronlog serve`` to measure, and the HTTP API's registration paths.

Every benchmark that measures cronlog "as a user runs it" goes through :class:`Serve` (the
``cronlog`` command in a process of its own, jobs registered over HTTP) and a :class:`Recorder`
(the targets' side, another process). The benchmark's own process only drives and reads.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import platform
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from api.auth import new_token

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).parent / "results"
PYTHON = sys.executable
TENANT = "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# The concurrency a client uses against the API: wrk's -c and the registering loaders'.
API_CONCURRENCY = 64

N = TypeVar("N", int, float)


# -- time and figures ----------------------------------------------------------------------------


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def sleep_until_ms(at_ms: int) -> None:
    while (left := at_ms - now_ms()) > 0:
        time.sleep(min(left / 1000, 0.5))


def percentile(sorted_values: Sequence[N], q: float) -> N:
    """Nearest-rank percentile of an ascending sequence."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def lag_summary(lags_ms: Iterable[float], expected: int) -> dict[str, Any]:
    """p50/p99/max of start lags; runs that never started count as infinitely late, so a
    percentile they reach is reported as ``None`` (never better than the truth)."""
    values = sorted(lags_ms)
    missing = max(0, expected - len(values))
    padded: list[float] = values + [math.inf] * missing
    if not padded:
        return {"started": 0, "missing": 0}

    def at(q: float) -> float | None:
        v = percentile(padded, q)
        return None if math.isinf(v) else round(v, 1)

    return {
        "started": len(values),
        "missing": missing,
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": None if missing else round(values[-1], 1),
        "min_ms": round(values[0], 1) if values else None,
        "all_started_after_s": None if missing or not values else round(values[-1] / 1000, 3),
    }


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def log(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')} load {loadavg()[0]:.1f}] {message}", flush=True)


# -- the machine ---------------------------------------------------------------------------------


def _package(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def wrk_version() -> str | None:
    if shutil.which("wrk") is None:
        return None
    out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=10)
    first = (out.stdout or out.stderr).splitlines()
    return first[0].strip() if first else "wrk"


PACKAGES = (
    "msgspec",
    "rocksdict",
    "croniter",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "aiohttp",
    "confluent-kafka",
    "apscheduler",
    "sqlalchemy",
)


def machine() -> dict[str, Any]:
    """What the figures were taken on: cores, CPU, memory, kernel, Python, package versions."""
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "ram_gib": _ram_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {name: _package(name) for name in PACKAGES},
        "wrk": wrk_version(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "serve_args": serve_args(),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


# -- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after its last ')'
    return text[text.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the node may run workers of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of ``pid`` and its descendants, those it has waited for included;
    ``None`` once ``pid`` has exited."""
    root = _stat(pid)
    if root is None or root[0] == "Z":
        return None
    total = 0
    for p in descendants(pid):
        fields = _stat(p)
        if fields is None:
            continue
        # after the command: state ppid ... utime(12) stime(13) cutime(14) cstime(15), 0-based
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / CLK_TCK


def own_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of ``pid`` alone (the node's main process, whose interpreter lock
    every partition, the read model and the API share); ``None`` once it has exited."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> tuple[int, int]:
    """(RSS now, peak RSS) summed over ``pid`` and its descendants."""
    now = peak = 0
    for p in descendants(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                now += int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak += int(line.split()[1]) * 1024
    return now, peak


@dataclass
class CpuWindow:
    """CPU used by a process tree between :meth:`begin` and :meth:`end`, in cores."""

    pid: int
    _cpu0: float = 0.0
    _wall0: float = 0.0
    _own0: float = 0.0
    _own: float = 0.0
    samples: list[tuple[float, float]] = field(default_factory=list)

    def begin(self) -> None:
        self._cpu0, self._wall0 = cpu_seconds(self.pid) or 0.0, time.monotonic()
        self._own0 = self._own = own_cpu_seconds(self.pid) or 0.0
        self.samples = [(self._wall0, self._cpu0)]

    def sample(self) -> None:
        """Note the CPU used so far (nothing once the process has exited: the window then ends
        at its last sample)."""
        cpu = cpu_seconds(self.pid)
        if cpu is not None:
            self.samples.append((time.monotonic(), cpu))
            self._own = own_cpu_seconds(self.pid) or self._own

    def end(self) -> dict[str, float]:
        self.sample()
        wall = self.samples[-1][0] - self._wall0
        cpu = self.samples[-1][1] - self._cpu0
        # the busiest second (or the whole window when shorter), from the samples taken
        peak = 0.0
        j = 0
        for i, (t, c) in enumerate(self.samples):
            while self.samples[j][0] < t - 1.0 and j < i:
                j += 1
            if t - self.samples[j][0] >= 0.5:
                peak = max(peak, (c - self.samples[j][1]) / (t - self.samples[j][0]))
        return {
            "cpu_s": round(cpu, 2),
            # of which the process itself, without the processes it started
            "main_cpu_s": round(self._own - self._own0, 2),
            "wall_s": round(wall, 3),
            "cores_mean": round(cpu / wall, 2) if wall > 0 else 0.0,
            "cores_peak_1s": round(peak or (cpu / wall if wall > 0 else 0.0), 2),
            "machine_cores": os.cpu_count() or 0,
        }


def stop_process(proc: subprocess.Popen[Any], timeout: float = 60) -> str:
    """SIGTERM (then SIGKILL after ``timeout``) unless it has exited; what it wrote to its
    stdout pipe, if it has one, which is then closed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    out = ""
    if proc.stdout is not None:
        out = proc.stdout.read() or ""
        proc.stdout.close()
    return out if isinstance(out, str) else out.decode(errors="replace")


def wait_port(port: int, proc: subprocess.Popen[Any], timeout_s: float = 30) -> None:
    """Until something accepts connections on ``port`` (``proc`` must not exit meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s")


def http_get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body: bytes = response.read()
        return body


# -- the recorder ------------------------------------------------------------------------------


class Recorder:
    """The targets' process (bench/recorder.py) and its control calls."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "bench.recorder"], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        port = self.proc.stdout.readline().strip()
        if not port:
            raise RuntimeError("the recorder did not start")
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/hook"

    def count(self) -> int:
        return int(http_get(f"{self.base}/_bench/count"))

    def take(self) -> list[tuple[int, str]]:
        """Every (arrival ns, key) since the last take, in arrival order."""
        request = urllib.request.Request(f"{self.base}/_bench/take", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        out = []
        for line in text.splitlines():
            at, key = line.split(" ", 1)
            out.append((int(at), key))
        return out

    def wait_for(self, count: int, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Until ``count`` calls have arrived (bounded by ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.count() >= count:
                return True
            time.sleep(poll_s)
        return self.count() >= count

    def close(self) -> None:
        stop_process(self.proc, 10)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def slot_of(key: str) -> int | None:
    """The slot (ms) an ``Idempotency-Key`` of the form ``<tenant>/<job>:<ms>`` names."""
    _, sep, ms = key.rpartition(":")
    return int(ms) if sep and ms.isdigit() else None


def first_calls(arrivals: Iterable[tuple[int, str]]) -> dict[str, int]:
    """key -> arrival ns of its first call (a retried slot counts once, at its first call)."""
    first: dict[str, int] = {}
    for at, key in arrivals:
        if key not in first:
            first[key] = at
    return first


def team_lags(
    arrivals: Iterable[tuple[int, str]], b_from: int, b_until: int
) -> tuple[list[float], list[float]]:
    """The start lags (ms, first call's arrival - slot) of team A's calls, and of team B's
    slots in ``[b_from, b_until)``, from a recorder's arrivals."""
    a: list[float] = []
    b: list[float] = []
    for key, at in first_calls(arrivals).items():
        slot_ms = slot_of(key)
        if slot_ms is None:
            continue
        lag = at / 1e6 - slot_ms
        if key.startswith("team-b/") and b_from <= slot_ms < b_until:
            b.append(lag)
        elif key.startswith("team-a/"):
            a.append(lag)
    return a, b


# -- cronlog serve -----------------------------------------------------------------------------

LIMITS = """\
# The operator's limits for a benchmark: one team registers the whole herd and its workers
# share its token, so its quota and request rate are set to their ceilings.
[defaults]
max_jobs = 10000000
requests_per_sec = 100000
request_burst = 100000
"""


def serve_args() -> list[str]:
    """Extra ``cronlog serve`` arguments from ``CRONLOG_BENCH_SERVE_ARGS`` (none by default)."""
    return shlex.split(os.environ.get("CRONLOG_BENCH_SERVE_ARGS", ""))


_FROM_ROOT = [PYTHON, "-c", "import sys; from cli.main import main; sys.exit(main())"]


@functools.cache
def _installed_root() -> Path | None:
    """Where this environment's installed ``cronlog`` imports its code from (outside any cwd)."""
    found = subprocess.run(
        [PYTHON, "-c", "import cli; print(cli.__file__)"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=30,
    )
    if found.returncode != 0 or not found.stdout.strip():
        return None
    return Path(found.stdout.strip()).resolve().parent.parent


def cronlog_command() -> list[str]:
    """The ``cronlog`` console script of this interpreter's environment, as a user runs it.

    The script imports the code the environment installed, which for an editable install may
    be another checkout than this one (a worktree beside the one installed): then this
    checkout's code is run from its own directory instead, so a figure is always this code's.
    """
    script = Path(PYTHON).parent / "cronlog"
    if script.exists() and _installed_root() == ROOT:
        return [str(script)]
    return list(_FROM_ROOT)


class Serve:
    """``cronlog serve`` in a process of its own, on a data directory, with a token for each of
    ``teams`` (one by default).

    ``tokens`` (team -> token) gives the teams' tokens instead of new ones, and
    ``metrics_token`` the metrics token: the nodes of one cluster share them. ``node_id`` names
    the node (``bench`` by default; each node of a cluster needs its own).

    ``kafka`` (a bootstrap address) runs it as a cluster node on that Kafka; ``extra`` adds
    command-line arguments, and so does ``CRONLOG_BENCH_SERVE_ARGS`` (shell words) for every
    node a benchmark starts: a setting to compare against the defaults a user gets. Output goes
    to ``data_dir.parent / (data_dir.name + '.out')``. ``source`` runs the cronlog of another
    checkout (a baseline) under this interpreter, from that directory (default: the directory
    ``CRONLOG_BENCH_SOURCE`` names, if set, so any benchmark can run a baseline side by side).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        kafka: str | None = None,
        topic_prefix: str | None = None,
        extra: Sequence[str] = (),
        port: int | None = None,
        source: Path | None = None,
        teams: Sequence[str] = (TENANT,),
        tokens: dict[str, str] | None = None,
        metrics_token: str | None = None,
        node_id: str = "bench",
    ) -> None:
        self.data_dir = data_dir
        if source is None and os.environ.get("CRONLOG_BENCH_SOURCE"):
            source = Path(os.environ["CRONLOG_BENCH_SOURCE"])
        self.source = source
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # team -> its token; ``token`` is the first team's (most benchmarks have one team)
        self.tokens = dict(tokens) if tokens else {team: new_token() for team in teams}
        self.token = next(iter(self.tokens.values()))
        self.metrics_token = metrics_token or new_token()
        self.kafka = kafka
        limits = data_dir.parent / f"{data_dir.name}.limits.toml"
        limits.write_text(LIMITS)
        command = cronlog_command()
        if source is not None:  # its own code first on the path: the script would import ours
            command = list(_FROM_ROOT)
        self.args = [
            *command,
            "serve",
            "--data-dir",
            str(data_dir),
            "--port",
            str(self.port),
            "--node-id",
            node_id,
            "--allow-targets",
            "127.0.0.0/8",
            "--limits",
            str(limits),
            "--drain-sec",
            "2",
        ]
        if kafka is not None:
            self.args += [
                "--kafka",
                kafka,
                "--topic-prefix",
                topic_prefix or f"bench{secrets.token_hex(4)}",
                "--replication-factor",
                "1",
                "--min-insync-replicas",
                "1",
            ]
        self.args += list(extra) + serve_args()
        self.output = data_dir.parent / f"{data_dir.name}.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def start(self) -> None:
        env = {
            **os.environ,
            "CRONLOG_TOKENS": ",".join(f"{team}={token}" for team, token in self.tokens.items()),
            "CRONLOG_METRICS_TOKEN": self.metrics_token,
        }
        with self.output.open("ab") as out:
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(
                self.args, cwd=self.source or ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def ready(self) -> bool:
        try:
            http_get(f"{self.url}/readyz", timeout=2)
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 120, poll_s: float = 0.02) -> float:
        """Seconds from the process start until ``/readyz`` answered 200."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cronlog serve exited {self.proc.returncode}: {self.tail()}")
            if self.ready():
                return time.monotonic() - self.started_at
            time.sleep(poll_s)
        raise RuntimeError(f"cronlog serve not ready after {timeout_s} s: {self.tail()}")

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.output.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def openapi(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(http_get(f"{self.url}/openapi.json"))
        return document

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 60)

    def __enter__(self) -> Serve:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# -- the API's registration paths ----------------------------------------------------------------


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while "$ref" in schema and seen < 20:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = document.get("components", {}).get("schemas", {}).get(name, {})
        seen += 1
    return schema


@dataclass(frozen=True)
class BatchEndpoint:
    """A bulk registration path found in ``/openapi.json``: its path, how its body wraps the
    list of jobs (``key`` None: the body is the list) and how many a request may hold."""

    path: str
    key: str | None
    max_items: int

    def body(self, jobs: list[dict[str, Any]]) -> Any:
        return jobs if self.key is None else {self.key: jobs}


def find_batch_endpoint(document: dict[str, Any], cap: int = 1000) -> BatchEndpoint | None:
    """``POST /v1/jobs:batch`` or any POST path under /v1/jobs naming a batch or bulk, if the
    node serves one; ``None`` when it does not (registration then goes one job a request)."""
    for path, operations in document.get("paths", {}).items():
        lowered = path.lower()
        if not lowered.startswith("/v1/jobs") or not ("batch" in lowered or "bulk" in lowered):
            continue
        post = operations.get("post")
        if post is None:
            continue
        content = post.get("requestBody", {}).get("content", {}).get("application/json", {})
        schema = _resolve(document, content.get("schema", {}))
        if schema.get("type") == "array":
            return BatchEndpoint(path, None, min(cap, schema.get("maxItems", cap)))
        for name, prop in schema.get("properties", {}).items():
            prop = _resolve(document, prop)
            if prop.get("type") == "array":
                return BatchEndpoint(path, name, min(cap, prop.get("maxItems", cap)))
    return None


def claim_wait_field(document: dict[str, Any]) -> str | None:
    """The claim request's long-poll field (a property whose name holds "wait"), if it has one."""
    post = document.get("paths", {}).get("/v1/workers/claim", {}).get("post", {})
    content = post.get("requestBody", {}).get("content", {}).get("application/json", {})
    schema = _resolve(document, content.get("schema", {}))
    for name in schema.get("properties", {}):
        if "wait" in name.lower():
            return str(name)
    return None


def claim_max(document: dict[str, Any], default: int = 100) -> int:
    post = document.get("paths", {}).get("/v1/workers/claim", {}).get("post", {})
    content = post.get("requestBody", {}).get("content", {}).get("application/json", {})
    schema = _resolve(document, content.get("schema", {}))
    limit = _resolve(document, schema.get("properties", {}).get("limit", {}))
    return int(limit.get("maximum", default))


def iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def daily_at(slot_ms: int) -> str:
    """A 6-field expression (seconds last) firing every day at ``slot_ms``'s UTC second."""
    t = datetime.fromtimestamp(slot_ms / 1000, UTC)
    return f"{t.minute} {t.hour} * * * {t.second}"


def daily_at_fields(slot_ms: int) -> dict[str, str]:
    """:func:`daily_at` as the API takes it: five fields, and the second in ``seconds``."""
    t = datetime.fromtimestamp(slot_ms / 1000, UTC)
    return {"schedule": f"{t.minute} {t.hour} * * *", "seconds": str(t.second)}


NEVER_SOON = "0 0 29 2 *"  # leap days only: a job that never fires while a benchmark runs


def http_job(i: int, url: str, **when: Any) -> dict[str, Any]:
    return {
        "job_id": f"job-{i:07d}",
        "name": f"bench job {i}",
        "target": url,
        "payload": {"n": i},
        "timeout_sec": 30,
        **when,
    }


def pull_job(i: int, pool: str, lease_sec: float, **when: Any) -> dict[str, Any]:
    return {
        "job_id": f"job-{i:07d}",
        "name": f"bench job {i}",
        "target": f"pull://{pool}",
        "payload": {"n": i},
        "lease_sec": lease_sec,
        **when,
    }


@dataclass
class Registered:
    jobs: int
    seconds: float
    statuses: Counter[int]
    via: str

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def check(self) -> None:
        bad = {s: n for s, n in self.statuses.items() if s not in (200, 201, 207)}
        if bad:
            raise RuntimeError(f"registration refused jobs: HTTP statuses {bad}")

    def figures(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            "jobs_per_s": round(self.rate),
            "via": self.via,
        }


async def _register(
    serve: Serve,
    jobs: Sequence[dict[str, Any]],
    concurrency: int,
    batch: BatchEndpoint | None,
    team: str | None = None,
) -> Registered:
    import aiohttp
    import msgspec

    statuses: Counter[int] = Counter()
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    encode = msgspec.json.encode
    token = serve.token if team is None else serve.tokens[team]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if batch is None:
        chunks: list[Any] = list(jobs)
        url = f"{serve.url}/v1/jobs"
    else:
        chunks = [
            batch.body(list(jobs[i : i + batch.max_items]))
            for i in range(0, len(jobs), batch.max_items)
        ]
        url = f"{serve.url}{batch.path}"
    items = iter(chunks)
    failures: list[str] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        for body in items:
            async with session.post(url, data=encode(body), headers=headers) as response:
                answer = await response.read()
                if batch is None:
                    statuses[response.status] += 1
                else:
                    statuses.update(_batch_statuses(response.status, answer, len(body_jobs(body))))
                if response.status >= 300 and len(failures) < 3:
                    failures.append(answer[:300].decode(errors="replace"))

    def body_jobs(body: Any) -> list[Any]:
        return body if isinstance(body, list) else next(iter(body.values()))

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        began = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - began
    registered = Registered(len(jobs), seconds, statuses, "batch" if batch else "single")
    if failures:
        log(f"registration failures, first ones: {failures}")
    return registered


def _batch_statuses(status: int, answer: bytes, count: int) -> Counter[int]:
    """Per-item statuses of a batch answer when it lists them (``status`` in each item, else
    an item with an ``error`` is a failure); otherwise the request's status for each item."""
    out: Counter[int] = Counter()
    try:
        document = json.loads(answer)
    except ValueError:
        document = None
    listed = None
    if isinstance(document, list):
        listed = document
    elif isinstance(document, dict):
        listed = next((v for v in document.values() if isinstance(v, list)), None)
    if status >= 300 or not listed or len(listed) != count:
        out[status] += count
        return out
    for item in listed:
        if isinstance(item, dict) and isinstance(item.get("status"), int):
            out[item["status"]] += 1
        elif isinstance(item, dict) and item.get("error"):
            out[422] += 1
        else:
            out[status] += 1
    return out


def register(
    serve: Serve,
    jobs: Sequence[dict[str, Any]],
    *,
    concurrency: int = API_CONCURRENCY,
    batch: BatchEndpoint | None = None,
    team: str | None = None,
) -> Registered:
    """POST every job (one a request, ``concurrency`` at once; or through ``batch``), as
    ``team`` (default: the node's first team)."""
    registered = asyncio.run(_register(serve, jobs, concurrency, batch, team))
    registered.check()
    return registered


def place_slot(
    serve: Serve,
    jobs: int,
    make: Callable[[int, dict[str, Any]], dict[str, Any]],
    batch: BatchEndpoint | None,
    *,
    margin_s: float | None = None,
) -> tuple[int, Registered]:
    """A slot far enough out that registering ``jobs`` ends before it, from the rate a warm-up
    of jobs that never fire registered at (they stay: a node holds other jobs too)."""
    warm_up = min(500, max(100, jobs // 10))
    if margin_s is None:
        margin_s = 2.0 + jobs / 20_000
    warm = register(
        serve,
        [make(1_000_000 + i, {"schedule": NEVER_SOON}) for i in range(warm_up)],
        batch=batch,
    )
    lead_s = 1.6 * jobs / max(warm.rate, 1.0) + margin_s
    slot = (now_ms() + round(lead_s * 1000)) // 1000 * 1000 + 1000
    return slot, warm


# -- results ----------------------------------------------------------------------------------


def rounds_on_kafka(
    name: str, rounds: int, one_round: Callable[[str, Recorder], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``rounds`` rounds of ``one_round(bootstrap servers, recorder)`` on one Kafka broker on
    loopback and one recorder, each round's record (with the machine's) appended to
    bench/results/<name>.jsonl."""
    import tempfile

    from tools.kafka import broker

    records = []
    with tempfile.TemporaryDirectory(prefix=f"{name}-kafka-") as kdir, Recorder() as recorder:
        kafka = broker.start(1, Path(kdir))
        try:
            for i in range(rounds):
                log(f"round {i + 1} of {rounds}")
                record = one_round(kafka.bootstrap_servers, recorder)
                record["machine"] = machine()
                log(json.dumps({k: v for k, v in record.items() if k != "machine"}))
                append_result(name, record)
                records.append(record)
        finally:
            kafka.stop()
    return records


def append_result(name: str, record: dict[str, Any]) -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with (RESULTS_DIR / f"{name}.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")


APPEND_COUNTERS = (
    "cronlog_log_append_seconds_count",
    "cronlog_log_append_seconds_sum",
    "cronlog_log_appended_events_total",
)


def append_counters(serve: Serve) -> dict[str, float]:
    """The node's append counters: appends (a fsync or a transaction each), their seconds, and
    the events they wrote (a create is one event), summed over the node's processes (a node of
    ``--workers N`` labels each sample with its worker)."""
    try:
        auth = {"Authorization": f"Bearer {serve.metrics_token}"}
        text = http_get(f"{serve.url}/metrics", headers=auth).decode()
    except OSError:
        return {}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in APPEND_COUNTERS:
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def append_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    if not all(name in before and name in after for name in APPEND_COUNTERS):
        return {}
    count, seconds, events = (after[n] - before[n] for n in APPEND_COUNTERS)
    if count <= 0:
        return {}
    return {"appends": int(count), "events_per_append": round(events / count, 2),
            "append_ms_mean": round(1000 * seconds / count, 2)}  # fmt: skip
