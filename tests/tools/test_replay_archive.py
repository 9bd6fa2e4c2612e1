"""The replay tools over a data directory whose log retention has pruned: archive + log read as
the unpruned log would, so dump, verify and rebuild give what they give on a twin directory
that was never pruned."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from archive.archive import Archive
from archive.archiver import Archiver
from archive.store import DirectoryStore
from eventlog.embedded import EmbeddedLog
from eventlog.port import partition_for
from eventlog.retention import Retention
from node.retention import EmbeddedRetention, RetentionMetrics
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import RocksStateStore, catch_up
from tests.projections.histories import Writers, busy_partition
from tests.tools.test_replay import HOURLY, PARTITIONS, DataDir, hourly_history, run

DAY = 86_400_000


def _make(path: Path, *, prune: bool) -> DataDir:
    """``test_replay.make_data_dir``'s history, in a log cut into 4 KiB segments; with
    ``prune``, archived and pruned as ``cronlog serve`` would once it is a year old."""
    path.mkdir()
    (path / "partitions").write_text(f"{PARTITIONS}\n")
    logs = {p: busy_partition(seed=p + 7, steps=150, partition=p).log for p in range(PARTITIONS)}
    logs[partition_for(HOURLY, PARTITIONS)] += hourly_history().log
    with EmbeddedLog.open(path / "log", PARTITIONS, segment_bytes=4096) as log:
        writers = Writers(log)
        for p, values in logs.items():
            writers.append(p, values, chunk=37)
        writers.close()
        for p in range(PARTITIONS):
            with RocksStateStore.open(path / "node", p) as store:
                catch_up(store, log, p, batch_size=50)
        with ReadModel.open(path / "node") as model:
            ReadModelRunner(log, model).run_once()
        if prune:
            archive = Archive(DirectoryStore(path / "archive"))
            loop = EmbeddedRetention(
                log,
                Retention(retention_ms=30 * DAY),
                lambda p: log.end_offset("events", p),  # the stores are caught up
                RetentionMetrics(CollectorRegistry()),
                archiver=Archiver(log, archive),
            )
            loop.run_once(now_ms=log.segments("events", 0)[-1].last_ms + 365 * DAY)
            for p in range(PARTITIONS):
                assert log.start_offset("events", p) > 0, "nothing was pruned"
                assert log.start_offset("events", p) == log.segments("events", p)[-1].first
    return DataDir(path, logs)


@pytest.fixture
def twins(tmp_path: Path) -> tuple[DataDir, DataDir]:
    return _make(tmp_path / "pruned", prune=True), _make(tmp_path / "whole", prune=False)


def test_dump_verify_and_rebuild_read_archive_and_log_as_the_whole_log(
    twins: tuple[DataDir, DataDir], capsys: pytest.CaptureFixture[str]
) -> None:
    pruned, whole = twins
    assert run(capsys, pruned.args("dump"))[1] == run(capsys, whole.args("dump"))[1]
    code, out, _ = run(capsys, pruned.args("verify"))
    assert code == 0 and "OK" in out
    code, out, _ = run(capsys, pruned.args("stats", "--json"))
    for line, other in zip(
        out.splitlines(), run(capsys, whole.args("stats", "--json"))[1].splitlines(), strict=True
    ):
        mine, theirs = json.loads(line), json.loads(other)
        assert 0 < mine["log_start"] <= mine["archived_through"] <= mine["events_end"]
        assert mine["events_by_type"] == theirs["events_by_type"]  # counted from offset 0
    for p in range(PARTITIONS):
        shutil.rmtree(pruned.path / "node" / "state" / f"p{p}")
    shutil.rmtree(pruned.path / "node" / "read_model")
    assert run(capsys, pruned.args("rebuild"))[0] == 0
    assert pruned.store_dumps() == whole.store_dumps()
    with ReadModel.open(pruned.path / "node") as a, ReadModel.open(whole.path / "node") as b:
        assert a.dump() == b.dump()


def test_without_its_archive_a_pruned_directory_says_what_is_missing(
    twins: tuple[DataDir, DataDir], capsys: pytest.CaptureFixture[str]
) -> None:
    pruned, _ = twins
    shutil.move(pruned.path / "archive", pruned.path.parent / "elsewhere")
    code, _, err = run(capsys, pruned.args("verify"))
    assert code == 2 and "Pruned" in err and "starts at offset" in err
    code, out, _ = run(
        capsys, pruned.args("dump", "--archive-dir", str(pruned.path.parent / "elsewhere"))
    )
    assert code == 0 and out == run(capsys, twins[1].args("dump"))[1]
