"""What an operator sees when the disk under a node goes bad, with real processes: ``cronlog
serve`` and ``python -m tools.replay`` on a data directory whose RocksDB files were damaged on
disk (4 KiB flipped inside an SST file, as the issue did).

Before: serve started on a damaged log, said it was ready and served 200 of 226 jobs;
``dump`` stopped early and exited 0; ``rebuild`` exited 0; a damaged state store killed its
partition's runner with a KeyError and /readyz never said ready; startup failures printed
tracebacks; and what the node wrote was as open as the umask it was started with.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from archive.store import DirectoryStore
from projections import aside
from projections import history_checkpoint as hc
from tests import corruption

pytestmark = pytest.mark.slow
JOBS = 226
PARTITIONS = 4
TOKENS = "team-a=token-a"
A = {"Authorization": "Bearer token-a"}
START_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Serve:
    """One ``cronlog serve`` process; its stderr goes to a file outside the data directory."""

    def __init__(
        self,
        data_dir: Path,
        *options: str,
        umask: int | None = None,
        tokens: str | None = TOKENS,
    ) -> None:
        """``tokens=None``: none configured, so serve makes the tokens file."""
        self.data_dir = data_dir
        self.stderr_path = data_dir.parent / f"{data_dir.name}.{time.monotonic_ns()}.stderr"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "CRONLOG_TOKENS"}
        if tokens is not None:
            env["CRONLOG_TOKENS"] = tokens
        with self.stderr_path.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cli.main",
                    "serve",
                    "--data-dir",
                    str(data_dir),
                    "--port",
                    str(self.port),
                    "--partitions",
                    str(PARTITIONS),
                    "--log-level",
                    "warning",
                    *options,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                preexec_fn=None if umask is None else (lambda: os.umask(umask)),
            )
        self.ready_seen = False

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_ready(self, timeout_s: float = START_S) -> bool:
        """Poll /readyz until it says ready (True) or the process exits (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # an external process: poll its readiness endpoint
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    self.ready_seen = True
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"cronlog serve neither became ready nor exited:\n{self.stderr}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def jobs(self) -> set[str] | None:
        """Every job of team-a, paging; None if the node answered 503 on the way."""
        names: set[str] = set()
        cursor = None
        with httpx.Client(base_url=self.url, headers=A, timeout=10) as http:
            while True:
                params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
                response = http.get("/v1/jobs", params=params)
                if response.status_code == 503:
                    return None
                assert response.status_code == 200, response.text
                page = response.json()
                names |= {job["name"] for job in page["jobs"]}
                cursor = page["next_cursor"]
                if cursor is None:
                    return names


def replay(data_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.replay", *argv, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory a node left after 226 jobs were created, stopped gracefully."""
    data_dir = tmp_path_factory.mktemp("template") / "data"
    node = Serve(data_dir)
    assert node.wait_ready(), node.stderr
    with httpx.Client(base_url=node.url, headers=A, timeout=10) as http:
        for i in range(JOBS):
            body = {
                "name": f"job-{i:03d}",
                "schedule": "0 3 * * *",
                "target": "pull://reports",
                "payload": {"report": f"daily report number {i}", "recipients": ["ops"] * 8},
            }
            response = http.post("/v1/jobs", json=body)
            assert response.status_code == 201, response.text
    assert node.stop() == 0, node.stderr
    return data_dir


@pytest.fixture
def data_dir(filled: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(filled, copy)
    return copy


def everything() -> set[str]:
    return {f"job-{i:03d}" for i in range(JOBS)}


# -- the log --------------------------------------------------------------------------------------


def test_serve_refuses_a_damaged_log_in_one_message_and_the_tools_exit_3_with_it(
    data_dir: Path,
) -> None:
    sst = corruption.damage(data_dir / "log", "events")
    node = Serve(data_dir)
    assert not node.wait_ready(), "served from a damaged log"
    assert node.proc.wait(10) == 3
    assert not node.ready_seen
    err = node.stderr
    assert "Traceback" not in err, err
    # One message from serve itself; the parts that read the log meanwhile (the check runs once
    # the partitions have recovered) may each have said in a line of their own that they stopped.
    [message] = [line for line in err.splitlines() if line.startswith("cronlog: event log")]
    assert message.startswith(f"cronlog: event log {data_dir / 'log'} is damaged: events partition")
    assert " at offset " in message and f"(file {sst})" in message and "checksum" in message
    damage = message.removeprefix("cronlog: ")

    stores = _identities(data_dir / "node")
    for command in ("dump", "verify", "rebuild"):
        done = replay(data_dir, command)
        assert done.returncode == 3, (command, done.stderr)
        assert "Traceback" not in done.stderr
        assert done.stderr.strip() == f"replay: {damage}", command
    # The refused rebuild swapped nothing in (a new store has a new IDENTITY) and left no scratch.
    assert _identities(data_dir / "node") == stores
    assert not list((data_dir / "node").rglob("*.rebuild"))


def test_a_log_that_lost_acknowledged_records_is_refused_naming_what_is_missing(
    tmp_path: Path,
) -> None:
    """kill -9, then 3,000 bytes cut off the log's write-ahead log (the issue's finding): the
    log reopens whole but short, and the stores are ahead of it. Before: the node started
    without a word and served 4 of 20 acknowledged creates that the log no longer held."""
    data_dir = tmp_path / "data"
    node = Serve(data_dir)
    assert node.wait_ready(), node.stderr
    with httpx.Client(base_url=node.url, headers=A, timeout=10) as http:
        for i in range(20):
            body = {"name": f"cut-{i:02d}", "schedule": "0 3 * * *", "target": "pull://x"}
            assert http.post("/v1/jobs", json=body).status_code == 201
    node.proc.send_signal(signal.SIGKILL)
    node.proc.wait(10)
    [wal] = sorted((data_dir / "log").glob("*.log"), key=lambda f: f.stat().st_size)[-1:]
    with wal.open("r+b") as f:
        f.truncate(wal.stat().st_size - 3000)

    again = Serve(data_dir)
    assert not again.wait_ready(), "served stores ahead of the log"
    assert again.proc.wait(10) == 3
    err = again.stderr
    assert "Traceback" not in err, err
    [message] = [line for line in err.splitlines() if line.startswith("cronlog: event log")]
    assert message.startswith(
        f"cronlog: event log {data_dir / 'log'} lost records it had acknowledged: events partition "
    ), message
    assert "but the state store of partition" in message and "the read model" in message
    assert " missing" in message
    assert "see docs/operations.md, 'A damaged log'" in err
    assert replay(data_dir, "verify").returncode == 1


def _identities(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in path.rglob("IDENTITY")}


def test_a_log_damaged_after_the_start_check_stops_the_node_at_the_first_read(
    data_dir: Path,
) -> None:
    """``--skip-log-check``: the damage is found by the first read that reaches it (here the
    read model, which refolds the log from 0 once its own store is gone), and the node stops."""
    shutil.rmtree(data_dir / "node" / "read_model")
    corruption.damage(data_dir / "log", "events")
    node = Serve(data_dir, "--skip-log-check")
    assert node.proc.wait(START_S) == 3
    err = node.stderr
    assert "Traceback" not in err, err
    assert "cronlog: event log" in err and "is damaged: events partition" in err
    assert "the node will not run on a damaged log" in err


# -- derived stores -------------------------------------------------------------------------------


def test_a_damaged_state_store_is_set_aside_rebuilt_and_the_node_becomes_ready(
    data_dir: Path,
) -> None:
    stores = data_dir / "node" / "state"
    biggest = max(stores.iterdir(), key=lambda p: sum(f.stat().st_size for f in p.iterdir()))
    corruption.damage(biggest)
    node = Serve(data_dir)
    try:
        assert node.wait_ready(), node.stderr
        assert node.jobs() == everything()
    finally:
        assert node.stop() == 0
    [aside] = stores.glob(f"{biggest.name}.damaged-*")
    assert f"state store of partition {biggest.name[1:]}" in node.stderr
    assert f"set aside as {aside}, rebuilding it from the log" in node.stderr


def test_a_damaged_read_model_is_set_aside_and_rebuilt_while_the_node_serves(
    data_dir: Path,
) -> None:
    corruption.damage(data_dir / "node" / "read_model")
    node = Serve(data_dir)
    try:
        assert node.wait_ready(), node.stderr
        deadline = time.monotonic() + START_S
        listed = node.jobs()
        while listed != everything():  # 503 while it rebuilds, then every job
            assert time.monotonic() < deadline, (len(listed or ()), node.stderr)
            assert listed is None or listed < everything()
            time.sleep(0.1)
            listed = node.jobs()
    finally:
        assert node.stop() == 0
    assert list((data_dir / "node").glob("read_model.damaged-*"))
    assert "set aside as" in node.stderr and "read model" in node.stderr


def test_a_damaged_read_model_poisons_no_checkpoint_and_heals_across_restarts(
    data_dir: Path, tmp_path: Path
) -> None:
    """The finding: the checkpointer copied a flipped block into the archive, every restart
    restored it and the damage came back, a ~4 MB ``read_model.damaged-*`` a round."""
    every = ("--history-checkpoint-every", "1s")
    checkpoints = data_dir / "archive" / "history" / "checkpoints"
    node = Serve(data_dir, *every)
    try:
        assert node.wait_ready(), node.stderr
        deadline = time.monotonic() + START_S
        while not list(checkpoints.glob("*.json")):  # a good one, of the whole model
            assert time.monotonic() < deadline, node.stderr
            time.sleep(0.1)
    finally:
        assert node.stop() == 0
    created = everything()
    for round_ in range(3):
        corruption.damage(data_dir / "node" / "read_model")
        node = Serve(data_dir, *every)
        try:
            assert node.wait_ready(), node.stderr
            # Something new for the checkpointer to take, before any query meets the damage.
            body = {"name": f"new-{round_}", "schedule": "0 3 * * *", "target": "pull://x"}
            assert httpx.post(f"{node.url}/v1/jobs", json=body, headers=A).status_code == 201
            created.add(f"new-{round_}")
            time.sleep(1.5)
            deadline = time.monotonic() + START_S
            while node.jobs() != created:  # 503 while it refills, then every job
                assert time.monotonic() < deadline, (round_, node.stderr)
                time.sleep(0.1)
            time.sleep(2.5)  # two checkpoint passes of the healed model
        finally:
            assert node.stop() == 0
        assert "refused" in node.stderr or "set aside" in node.stderr, node.stderr
        # Every checkpoint left restores whole: none is of a damaged model.
        store = DirectoryStore(data_dir / "archive")
        for key in hc.manifests(store):
            manifest = hc._manifest(store, key)
            target = tmp_path / f"r{round_}" / key.rpartition("/")[2] / "read_model"
            target.parent.mkdir(parents=True)
            hc._unpack(store, manifest, target)  # CheckpointDamaged if it were
    assert len(list((data_dir / "node").glob("read_model.damaged-*"))) <= aside.KEPT


# -- starting -------------------------------------------------------------------------------------


def _one_message(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("cronlog:")]
    assert len(lines) == 1, err
    return lines[0]


def test_startup_failures_are_one_message_not_a_traceback(data_dir: Path) -> None:
    first = Serve(data_dir)
    try:
        assert first.wait_ready(), first.stderr
        second = Serve(data_dir)
        assert second.proc.wait(START_S) == 1
        line = _one_message(second.stderr)
        assert line.startswith("cronlog: cannot start: event log") and "already open" in line
    finally:
        assert first.stop() == 0

    bad_tokens = Serve(data_dir, tokens="team-a")
    assert bad_tokens.proc.wait(START_S) == 1
    assert "expected tenant=token" in _one_message(bad_tokens.stderr)

    (data_dir / "partitions").write_text("eight\n")
    garbled = Serve(data_dir)
    assert garbled.proc.wait(START_S) == 1
    assert "should hold the log's partition count" in _one_message(garbled.stderr)


# -- permissions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_what_the_node_and_the_tools_write_is_private_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    data_dir = tmp_path / "data"  # made by serve
    node = Serve(data_dir, umask=umask, tokens=None)  # serve writes the tokens file
    try:
        assert node.wait_ready(), node.stderr
        token = (data_dir / "tokens").read_text().splitlines()[-1].split("=", 1)[1]
        body = {"name": "n", "schedule": "* * * * *", "target": "pull://p"}
        response = httpx.post(
            f"{node.url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 201, response.text
    finally:
        assert node.stop() == 0
    old = os.umask(umask)
    try:  # the tools, from the same umask: what a rebuild makes is as private
        assert replay(data_dir, "rebuild").returncode == 0
    finally:
        os.umask(old)

    loose = []
    for path in [data_dir, *data_dir.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        wanted = 0o700 if path.is_dir() else 0o600
        if mode & ~wanted or (path.is_dir() and mode != wanted):
            loose.append(f"{oct(mode)} {path}")
    assert loose == [], "\n".join(loose)
    for made in ("log", "node/state/p0", "node/read_model", "tokens", "metrics_token"):
        assert (data_dir / made).exists(), made
