"""The replay tools against a real data directory, laid out as ``cronlog serve`` lays it out.

The directory is filled with core-made histories (``histories.busy_partition``) appended through
the embedded log's writers; the state stores and the read model are then caught up as a node
would leave them. Backfill's ``--apply`` talks to an ``httpx.MockTransport`` standing in for a
node's API.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import msgspec
import pytest
from rocksdict import Options, Rdict

from core import events as ev
from core.clock import FakeClock
from core.commands import PutJob
from core.jobs import JobSpec, PullTarget
from core.state import JobState, evolve
from eventlog.embedded import EmbeddedLog
from eventlog.port import partition_for
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import RocksStateStore, catch_up
from tests.core.harness import Sim
from tests.projections.histories import Writers, busy_partition
from tools.replay.backfill import rfc3339
from tools.replay.cli import main

PARTITIONS = 2
HOUR = 3_600_000
T0 = int(datetime(2025, 1, 6, 0, 0, tzinfo=UTC).timestamp() * 1000)  # a Monday, midnight
HOURLY = "hourly"


@dataclass
class DataDir:
    path: Path
    logs: dict[int, list[bytes]]  # partition -> its events as appended

    def args(self, *argv: str) -> list[str]:
        return [argv[0], "--data-dir", str(self.path), *argv[1:]]

    def store_dumps(self) -> dict[int, list[tuple[bytes, bytes]]]:
        dumps = {}
        for p in range(PARTITIONS):
            with RocksStateStore.open(self.path / "node", p) as store:
                dumps[p] = store.dump()
        return dumps


def hourly_history() -> Sim:
    """One cron job, ``0 * * * *`` from T0, that ran its slots for five hours."""
    sim = Sim(T0 + 1)
    spec = JobSpec(name=HOURLY, tenant="t1", target=PullTarget(pool="p"), schedule="0 * * * *")
    sim.do(PutJob(job_id=HOURLY, spec=spec))
    sim.advance(5 * HOUR)
    return sim


def make_data_dir(path: Path) -> DataDir:
    path.mkdir()
    (path / "partitions").write_text(f"{PARTITIONS}\n")
    logs = {p: busy_partition(seed=p + 7, steps=150, partition=p).log for p in range(PARTITIONS)}
    logs[partition_for(HOURLY, PARTITIONS)] += hourly_history().log
    with EmbeddedLog.open(path / "log", PARTITIONS) as log:
        writers = Writers(log)
        for p, values in logs.items():
            writers.append(p, values, chunk=37)
        writers.close()
        for p in range(PARTITIONS):
            with RocksStateStore.open(path / "node", p) as store:
                catch_up(store, log, p, batch_size=50)
        with ReadModel.open(path / "node") as model:
            ReadModelRunner(log, model).run_once()
    return DataDir(path, logs)


@pytest.fixture
def data_dir(tmp_path: Path) -> DataDir:
    return make_data_dir(tmp_path / "data")


def run(capsys: pytest.CaptureFixture[str], argv: list[str], **kw: object) -> tuple[int, str, str]:
    code = main(argv, **kw)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    return code, out, err


# -- dump -----------------------------------------------------------------------------------------


def test_dump_prints_every_event_once_in_order(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, data_dir.args("dump"))
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    for p, values in data_dir.logs.items():
        mine = [line for line in lines if line["partition"] == p]
        assert [line["offset"] for line in mine] == list(range(len(values)))
        assert [line["event"] for line in mine] == [json.loads(v) for v in values]
    assert len(lines) == sum(len(v) for v in data_dir.logs.values())


def test_dump_filters_by_partition_offset_and_job(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    p = partition_for(HOURLY, PARTITIONS)
    code, out, _ = run(capsys, data_dir.args("dump", "--partition", str(p), "--from", "10"))
    assert code == 0
    offsets = [json.loads(line)["offset"] for line in out.splitlines()]
    assert offsets == list(range(10, len(data_dir.logs[p])))

    code, out, _ = run(capsys, data_dir.args("dump", "--job", HOURLY))
    events = [json.loads(line)["event"] for line in out.splitlines()]
    expected = [json.loads(v) for v in hourly_history().log]
    assert code == 0 and events == expected


# -- verify ---------------------------------------------------------------------------------------


def test_verify_passes_on_a_consistent_directory(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, data_dir.args("verify"))
    assert code == 0, out
    for p in range(PARTITIONS):
        assert f"partition {p}: OK ({len(data_dir.logs[p])} events" in out


def test_verify_catches_a_store_behind_the_log_up_in_memory_without_writing_it(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store behind the log (a node stopped between append and save) is not a difference."""
    target = data_dir.path / "node" / "state" / "p0"
    shutil.rmtree(target)
    with EmbeddedLog.open(data_dir.path / "log", PARTITIONS) as log:
        records = log.read_events(0, 0, 20)
    with RocksStateStore(target, 0) as store:
        state, _ = store.load()
        batch = [(r.offset, ev.decode(r.value)) for r in records]
        for _, event in batch:
            evolve(state, event)
        store.save(state, batch)
        behind = store.dump()

    code, out, _ = run(capsys, data_dir.args("verify"))
    assert code == 0, out
    assert data_dir.store_dumps()[0] == behind


def _tamper_job(store_dir: Path, job_id: str) -> None:
    db = Rdict(str(store_dir), options=Options(raw_mode=True))
    key = b"j/" + job_id.encode()
    stored = db.get(key)
    assert isinstance(stored, bytes)
    job = msgspec.msgpack.decode(stored, type=JobState)
    job.version += 1
    db[key] = msgspec.msgpack.encode(job)
    db.close()


def test_verify_fails_and_names_the_partition_and_job_when_the_store_was_tampered_with(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    p = partition_for(HOURLY, PARTITIONS)
    _tamper_job(data_dir.path / "node" / "state" / f"p{p}", HOURLY)
    code, out, _ = run(capsys, data_dir.args("verify"))
    assert code == 1
    assert f"partition {p}: DIFFERENT" in out
    assert f"jobs differ: {HOURLY}" in out
    assert f"partition {1 - p}: OK" in out
    assert f"DIFFERENT: partitions {p}" in out


def test_verify_names_a_run_missing_from_the_store(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    p = partition_for(HOURLY, PARTITIONS)
    stored = data_dir.store_dumps()[p]
    run_key = next(k for k, _ in stored if k.startswith(f"r/{HOURLY}.".encode()))
    db = Rdict(str(data_dir.path / "node" / "state" / f"p{p}"), options=Options(raw_mode=True))
    del db[run_key]
    del db[b"o" + run_key]  # the run and its order key, as a store that never saw it
    db.close()
    code, out, _ = run(capsys, data_dir.args("verify"))
    assert code == 1
    assert f"runs only in the replay: {run_key[2:].decode()}" in out


# -- refusing -------------------------------------------------------------------------------------


def test_every_command_refuses_a_directory_a_node_is_running_on(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    with EmbeddedLog.open(data_dir.path / "log", PARTITIONS):  # what a running node holds
        for command in (["dump"], ["verify"], ["rebuild"], ["stats"]):
            code, out, err = run(capsys, data_dir.args(*command))
            assert code == 2, command
            assert "a node (or another tool) is running on this data directory" in err
            assert out == ""
    assert run(capsys, data_dir.args("verify"))[0] == 0  # and nothing was harmed


def test_a_directory_that_is_not_a_data_directory_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, ["dump", "--data-dir", str(tmp_path / "typo")])
    assert code == 2
    assert "is not a cronlog data directory" in err
    assert not (tmp_path / "typo").exists()


# -- rebuild --------------------------------------------------------------------------------------


def test_rebuild_gives_byte_identical_state_stores_and_read_model(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    stores = data_dir.store_dumps()
    with ReadModel.open(data_dir.path / "node") as model:
        history = model.dump()
    code, out, _ = run(capsys, data_dir.args("rebuild"))
    assert code == 0
    assert "read model:" in out and "events/s" in out
    assert data_dir.store_dumps() == stores
    with ReadModel.open(data_dir.path / "node") as model:
        assert model.dump() == history
    assert not list((data_dir.path / "node" / "state").glob("*.rebuild"))


def test_rebuild_restores_a_deleted_store(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    stores = data_dir.store_dumps()
    _tamper_job(data_dir.path / "node" / "state" / "p0", next(iter(_jobs_of(data_dir, 0))))
    shutil.rmtree(data_dir.path / "node" / "state" / "p1")
    code, out, _ = run(capsys, data_dir.args("rebuild", "--state"))
    assert code == 0 and "read model" not in out
    assert data_dir.store_dumps() == stores
    assert run(capsys, data_dir.args("verify"))[0] == 0


def _jobs_of(data_dir: DataDir, partition: int) -> list[str]:
    return [e.job_id for e in map(ev.decode, data_dir.logs[partition])]


# -- stats ----------------------------------------------------------------------------------------


def test_stats_counts_events_per_type_and_shows_the_lag(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, data_dir.args("stats", "--json"))
    assert code == 0
    rows = {row["partition"]: row for row in map(json.loads, out.splitlines())}
    for p, values in data_dir.logs.items():
        types = Counter(json.loads(v)["type"] for v in values)
        assert rows[p]["events_by_type"] == dict(types)
        assert rows[p]["events_end"] == len(values)
        assert rows[p]["state_lag"] == 0 and rows[p]["read_model_lag"] == 0

    with EmbeddedLog.open(data_dir.path / "log", PARTITIONS) as log:  # a node appends more
        writers = Writers(log)
        writers.append(0, busy_partition(seed=99, steps=20).log[:5])
        writers.close()
    code, out, _ = run(capsys, data_dir.args("stats", "--json"))
    rows = {row["partition"]: row for row in map(json.loads, out.splitlines())}
    assert rows[0]["state_lag"] == 5 and rows[0]["read_model_lag"] == 5
    code, out, _ = run(capsys, data_dir.args("stats"))
    assert code == 0 and "read model at" in out and "RunMaterialised" in out


# -- backfill -------------------------------------------------------------------------------------


def _materialised(sim: Sim) -> set[int]:
    return {e.scheduled_for for e in sim.events() if isinstance(e, ev.RunMaterialised)}


def test_backfill_dry_run_lists_the_slots_of_a_cron_job(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = _materialised(hourly_history())
    assert ran == {T0 + h * HOUR for h in range(1, 6)}
    now = FakeClock(T0 + 7 * HOUR + 30 * 60_000)
    code, out, _ = run(
        capsys,
        data_dir.args(
            "backfill", HOURLY, "--from", rfc3339(T0 - 3 * HOUR), "--to", str(T0 + 9 * HOUR)
        ),
        clock=now,
    )
    assert code == 0, out
    listed = [
        line.split()
        for line in out.splitlines()
        if line.startswith(("trigger", "present", "future"))
    ]
    expected = []
    for h in range(-3, 10):
        slot = T0 + h * HOUR
        action = "present" if slot in ran else "future" if slot > now.now_ms() else "trigger"
        expected.append([action, rfc3339(slot), f"{HOURLY}.{slot}"])
    assert listed == expected
    assert "13 slots, 6 to trigger, 5 present, 2 in the future" in out
    assert "dry run" in out


def test_backfill_refuses_too_many_slots_a_wrong_tenant_and_apply_without_a_node(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["backfill", HOURLY, "--from", str(T0), "--to", str(T0 + 24 * HOUR)]
    code, _, err = run(capsys, data_dir.args(*base, "--max", "10"))
    assert code == 2 and "more than 10 slots" in err
    code, _, err = run(capsys, data_dir.args(*base, "--tenant", "t2"))
    assert code == 2 and "not found" in err
    code, _, err = run(capsys, data_dir.args(*base, "--apply"))
    assert code == 2 and "--apply needs --url" in err


class FakeNode:
    """The API endpoints backfill uses, over a fixed set of existing runs; records requests."""

    def __init__(self, runs: set[int], answer: int = 201) -> None:
        self.runs = sorted(runs, reverse=True)
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.headers.get("authorization") != "Bearer secret":
            return httpx.Response(401, json={"error": "unauthorized"})
        if request.method == "GET" and request.url.path == f"/v1/jobs/{HOURLY}":
            return httpx.Response(200, json=self.job())
        if request.method == "GET" and request.url.path == f"/v1/jobs/{HOURLY}/runs":
            start = int(request.url.params.get("cursor", "0"))
            page = self.runs[start : start + 2]  # tiny pages, so paging is exercised
            more = start + 2 < len(self.runs)
            return httpx.Response(
                200,
                json={
                    "runs": [
                        {"run_id": f"{HOURLY}.{s}", "scheduled_for": rfc3339(s)} for s in page
                    ],
                    "next_cursor": str(start + 2) if more else None,
                },
            )
        if request.method == "POST" and request.url.path == f"/v1/jobs/{HOURLY}/runs":
            return httpx.Response(self.answer, json={"run_id": "..."})
        return httpx.Response(404, json={"error": "not found"})

    def job(self) -> dict[str, object]:
        return {
            "job_id": HOURLY,
            "tenant": "t1",
            "name": HOURLY,
            "status": "active",
            "version": 1,
            "next_run_at": rfc3339(T0 + 6 * HOUR),
            "created_at": rfc3339(T0 + 1),
            "updated_at": rfc3339(T0 + 1),
            "schedule": "0 * * * *",
            "run_at": None,
            "interval_sec": None,
            "start_at": None,
            "timezone": "UTC",
            "payload": None,
            "target": {"type": "pull", "pool": "p"},
            "retries": 3,
        }

    def posts(self) -> list[tuple[str, dict[str, object]]]:
        return [
            (r.headers["idempotency-key"], json.loads(r.content))
            for r in self.requests
            if r.method == "POST"
        ]


def test_backfill_apply_triggers_each_missing_past_slot_through_the_api(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = FakeNode(runs={T0 + h * HOUR for h in range(1, 6)})
    argv = [
        "backfill", HOURLY, "--from", rfc3339(T0 - 2 * HOUR), "--to", rfc3339(T0 + 8 * HOUR),
        "--url", "http://node:8080", "--token", "secret", "--apply",
    ]  # fmt: skip
    now = FakeClock(T0 + 7 * HOUR)
    code, out, err = run(capsys, argv, clock=now, transport=httpx.MockTransport(node))
    assert code == 0, err
    slots = [T0 - 2 * HOUR, T0 - HOUR, T0, T0 + 6 * HOUR, T0 + 7 * HOUR]
    assert node.posts() == [
        (f"backfill:{HOURLY}:{s}", {"scheduled_for": rfc3339(s)}) for s in slots
    ]
    assert "triggered 5 runs (0 were present already)" in out
    assert "1 in the future" in out
    # every page of runs down to the range's start was read, and no further
    pages = [r for r in node.requests if r.method == "GET" and r.url.path.endswith("/runs")]
    assert len(pages) == 3

    again = FakeNode(runs=set(), answer=200)  # the node has them all now: one run per slot
    code, out, _ = run(capsys, argv, clock=now, transport=httpx.MockTransport(again))
    assert code == 0
    assert "triggered 0 runs (10 were present already)" in out


def test_backfill_dry_run_through_the_api_sends_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = FakeNode(runs=set())
    argv = [
        "backfill", HOURLY, "--from", str(T0), "--to", str(T0 + 2 * HOUR),
        "--url", "http://node:8080", "--token", "secret",
    ]  # fmt: skip
    code, out, _ = run(
        capsys, argv, clock=FakeClock(T0 + 3 * HOUR), transport=httpx.MockTransport(node)
    )
    assert code == 0 and "3 to trigger" in out and "dry run" in out
    assert node.posts() == []


def test_backfill_stops_at_a_refused_trigger(capsys: pytest.CaptureFixture[str]) -> None:
    node = FakeNode(runs=set(), answer=503)
    argv = [
        "backfill", HOURLY, "--from", str(T0), "--to", str(T0 + 2 * HOUR),
        "--url", "http://node:8080", "--token", "secret", "--apply",
    ]  # fmt: skip
    code, _, err = run(
        capsys, argv, clock=FakeClock(T0 + 3 * HOUR), transport=httpx.MockTransport(node)
    )
    assert code == 2 and "HTTP 503" in err
    assert len(node.posts()) == 1


def test_dump_follow_prints_events_appended_while_it_runs(data_dir: DataDir) -> None:
    from io import StringIO

    from tools.replay.dump import dump

    more = busy_partition(seed=5, steps=10).log[:3]
    out = StringIO()
    with EmbeddedLog.open(data_dir.path / "log", PARTITIONS) as log:
        writers = Writers(log)
        rounds = iter([True, False])

        def appending_once() -> bool:
            # called before each poll round: the first round finds what was appended here
            keep = next(rounds)
            if keep:
                writers.append(1, more)
            return keep

        printed = dump(log, [1], follow=True, out=out, keep_following=appending_once)
        writers.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert printed == len(data_dir.logs[1]) + 3
    assert [line["event"] for line in lines[-3:]] == [json.loads(v) for v in more]
    assert [line["offset"] for line in lines] == list(range(printed))


# -- records that are not events ------------------------------------------------------------------

FOREIGN = b'{"job_id": "hourly", "payload": "a kafka:// target named the events topic"}'


@dataclass
class ForeignDir:
    data: DataDir
    partition: int
    offset: int  # of the record that is not an event


@pytest.fixture
def foreign_dir(tmp_path: Path) -> ForeignDir:
    """A data directory whose hourly partition holds a foreign record between the busy history
    and the hourly job's, its stores caught up as a node leaves them."""
    path = tmp_path / "data"
    path.mkdir()
    (path / "partitions").write_text(f"{PARTITIONS}\n")
    p = partition_for(HOURLY, PARTITIONS)
    logs = {q: busy_partition(seed=q + 7, steps=150, partition=q).log for q in range(PARTITIONS)}
    with EmbeddedLog.open(path / "log", PARTITIONS) as log:
        writers = Writers(log)
        for q, values in logs.items():
            writers.append(q, values, chunk=37)
        [offset] = writers.append(p, [FOREIGN])
        writers.append(p, hourly_history().log, chunk=37)
        writers.close()
        for q in range(PARTITIONS):
            with RocksStateStore.open(path / "node", q) as store:
                catch_up(store, log, q, batch_size=50)
        with ReadModel.open(path / "node") as model:
            ReadModelRunner(log, model).run_once()
    logs[p] += hourly_history().log
    return ForeignDir(DataDir(path, logs), p, offset)


def test_verify_names_a_foreign_record_and_exits_4_when_the_stores_match(
    foreign_dir: ForeignDir, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, foreign_dir.data.args("verify"))
    assert code == 4, out
    p, offset = foreign_dir.partition, foreign_dir.offset
    assert f"partition {p}: OK (" in out and "1 FOREIGN records passed over" in out
    assert f"FOREIGN partition {p} offset {offset}: not an event ({len(FOREIGN)} bytes" in out
    assert f"partition {1 - p}: OK (" in out
    assert f"FOREIGN: 1 records that are not events in partitions {p}" in out


def test_verify_still_names_a_difference_first(
    foreign_dir: ForeignDir, capsys: pytest.CaptureFixture[str]
) -> None:
    p = foreign_dir.partition
    _tamper_job(foreign_dir.data.path / "node" / "state" / f"p{p}", HOURLY)
    code, out, _ = run(capsys, foreign_dir.data.args("verify"))
    assert code == 1 and f"jobs differ: {HOURLY}" in out
    assert f"FOREIGN partition {p} offset {foreign_dir.offset}" in out


def test_dump_shows_where_a_foreign_record_is_and_goes_on(
    foreign_dir: ForeignDir, capsys: pytest.CaptureFixture[str]
) -> None:
    p, offset = foreign_dir.partition, foreign_dir.offset
    code, out, _ = run(capsys, foreign_dir.data.args("dump", "--partition", str(p)))
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["offset"] for line in lines] == list(range(len(foreign_dir.data.logs[p]) + 1))
    foreign = lines[offset]
    assert set(foreign) == {"partition", "offset", "foreign"}  # never the record's contents
    assert foreign["foreign"]["bytes"] == len(FOREIGN) and foreign["foreign"]["reason"]
    events = [line["event"] for line in lines if "event" in line]
    assert events == [json.loads(v) for v in foreign_dir.data.logs[p]]

    code, out, _ = run(capsys, foreign_dir.data.args("dump", "--job", HOURLY))
    assert code == 0
    assert [json.loads(line)["event"] for line in out.splitlines()] == [
        json.loads(v) for v in hourly_history().log
    ]


def test_rebuild_stats_and_backfill_pass_over_a_foreign_record(
    foreign_dir: ForeignDir, capsys: pytest.CaptureFixture[str]
) -> None:
    data = foreign_dir.data
    stores = data.store_dumps()
    code, out, _ = run(capsys, data.args("rebuild"))
    assert code == 0, out
    assert "passed over 1 records that are not events" in out
    assert data.store_dumps() == stores

    code, out, _ = run(capsys, data.args("stats", "--json"))
    rows = {row["partition"]: row for row in map(json.loads, out.splitlines())}
    assert code == 0 and rows[foreign_dir.partition]["events_by_type"]["(foreign)"] == 1
    assert rows[foreign_dir.partition]["state_lag"] == 0

    now = FakeClock(T0 + 7 * HOUR)
    code, out, _ = run(
        capsys,
        data.args("backfill", HOURLY, "--from", str(T0), "--to", str(T0 + 6 * HOUR)),
        clock=now,
    )
    assert code == 0 and "7 slots, 2 to trigger, 5 present, 0 in the future" in out
