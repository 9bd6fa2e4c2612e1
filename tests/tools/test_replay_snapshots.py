"""``verify --from-snapshot`` and ``state`` (time travel) on a data directory laid out as
``cronlog serve`` lays it out, its snapshots written as the node writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core import events as ev
from core.state import PartitionState, evolve
from eventlog.embedded import EmbeddedLog
from eventlog.port import partition_for
from eventlog.snapshots import FileSnapshots
from projections import snapshot
from projections.state_store import RocksStateStore
from tests.tools.test_replay import HOURLY, PARTITIONS, DataDir, make_data_dir, run


def leave_snapshot(data: DataDir, partition: int, upto: int, taken_at: int = 0) -> int:
    """What an owner caught up to ``upto`` events writes: its store's view, encoded."""
    scratch = data.path.parent / f"owner-{partition}-{upto}"
    with (
        EmbeddedLog.open(data.path / "log", PARTITIONS) as log,
        RocksStateStore.open(scratch, partition) as store,
    ):
        state = PartitionState(partition)
        batch = [(r.offset, ev.decode(r.value)) for r in log.read_events(partition, 0, upto)]
        for _, event in batch:
            evolve(state, event)
        store.save(state, batch)
        view = store.view()
        items = view.items()
        view.close()
    blob = snapshot.encode(partition, view.offset, taken_at, items)
    assert FileSnapshots(data.path / "snapshots").write(partition, view.offset, blob)
    return view.offset


def fold(values: list[bytes], partition: int, upto: int | None = None) -> PartitionState:
    state = PartitionState(partition)
    for raw in values[:upto]:
        evolve(state, ev.decode(raw))
    return state


@pytest.fixture
def data_dir(tmp_path: Path) -> DataDir:
    return make_data_dir(tmp_path / "data")


def test_verify_from_snapshot_passes_on_snapshots_the_owner_wrote(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    at = leave_snapshot(data_dir, 0, len(data_dir.logs[0]) // 2)
    code, out, _ = run(capsys, data_dir.args("verify", "--from-snapshot"))
    assert code == 0, out
    assert f"partition 0: OK (snapshot at offset {at}" in out
    assert "partition 1: NO SNAPSHOT" in out
    assert "OK: 1 of 2 partitions have a snapshot" in out


def test_verify_from_snapshot_names_a_snapshot_that_differs_from_the_log(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A snapshot of partition 0's state written under another offset: it does not hold what
    # the log folded to that offset says.
    real = leave_snapshot(data_dir, 0, 40)
    stored = FileSnapshots(data_dir.path / "snapshots").latest(0)
    assert stored is not None
    items = [
        (k, (60).to_bytes(8, "big")) if k == b"m/offset" else (k, v)
        for k, v in snapshot.decode(stored.data).items
    ]
    FileSnapshots(data_dir.path / "snapshots").write(0, 60, snapshot.encode(0, 60, 0, items))
    code, out, _ = run(capsys, data_dir.args("verify", "--from-snapshot"))
    assert code == 1 and real == 40
    assert "partition 0: DIFFERENT" in out and "at the snapshot's offset" in out
    assert "DIFFERENT: partitions 0" in out


def test_verify_from_snapshot_names_a_damaged_snapshot(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    at = leave_snapshot(data_dir, 1, 30)
    path = data_dir.path / "snapshots" / "p1" / f"{at:020d}.snap"
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0x55
    path.write_bytes(bytes(blob))
    code, out, _ = run(capsys, data_dir.args("verify", "--from-snapshot"))
    assert code == 1
    assert "partition 1: DIFFERENT" in out and "cannot be restored" in out


def test_state_at_an_offset_starts_from_the_nearest_snapshot_before_it(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    values = data_dir.logs[0]
    early = leave_snapshot(data_dir, 0, 30)
    late = leave_snapshot(data_dir, 0, 90)
    for target, base in ((50, early), (len(values), late), (10, None)):
        code, out, _ = run(
            capsys, data_dir.args("state", "--partition", "0", "--offset", str(target))
        )
        assert code == 0
        report = json.loads(out)
        assert report["from_snapshot"] == base
        assert report["as_of"]["offset"] == target
        expected = fold(values, 0, target)
        assert {j["job_id"]: j["status"] for j in report["jobs"]} == {
            j.job_id: j.status.value for j in expected.jobs.values()
        }
        assert {
            r["run_id"]: (r["status"], r["attempt"], r["worker_id"]) for r in report["runs"]
        } == {r.run_id: (r.status.value, r.attempt, r.worker_id) for r in expected.runs.values()}


def test_state_at_an_instant_holds_the_events_decided_by_then(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    p = 1 - partition_for(HOURLY, PARTITIONS)  # one history, its instants in order
    values = data_dir.logs[p]
    events = [ev.decode(v) for v in values]
    instant = events[len(events) // 2].at
    upto = next(i for i, e in enumerate(events) if e.at > instant)
    early = leave_snapshot(data_dir, p, upto - 10, taken_at=events[upto - 11].at)
    late = leave_snapshot(data_dir, p, len(values) - 5, taken_at=events[-1].at)
    argv = data_dir.args("state", "--partition", str(p), "--at", str(instant))
    code, out, _ = run(capsys, argv)
    assert code == 0
    report = json.loads(out)
    # The newest snapshot was taken after the instant: the one before it is the base.
    assert report["from_snapshot"] == early and report["events_folded"] == 10
    assert sorted(r["run_id"] for r in report["runs"]) == sorted(fold(values, p, upto).runs)
    # Without a snapshot taken by then, the fold starts from zero.
    (data_dir.path / "snapshots" / f"p{p}" / f"{early:020d}.snap").unlink()
    code, out, _ = run(capsys, argv)
    report = json.loads(out)
    assert report["from_snapshot"] is None and report["events_folded"] == upto
    assert sorted(r["run_id"] for r in report["runs"]) == sorted(fold(values, p, upto).runs)
    assert late > early


def test_state_of_one_job_finds_its_partition(
    data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, data_dir.args("state", "--job", "hourly"))
    assert code == 0
    report = json.loads(out)
    assert [j["job_id"] for j in report["jobs"]] == ["hourly"]
    assert all(r["job_id"] == "hourly" for r in report["runs"])
