"""Runs answered from archive + log (``projections.history.ArchivedRuns``) are the runs the read
model folded, field for field, over a realistic partition history that is mostly archived and
pruned from the log."""

from __future__ import annotations

from pathlib import Path

import msgspec

from archive.archive import Archive
from archive.archiver import Archiver
from archive.reading import ArchivedLog
from archive.store import DirectoryStore
from eventlog.embedded import EmbeddedLog
from eventlog.port import Record
from projections.decoding import EventDecoder
from projections.history import ArchivedRuns
from projections.read_model import FORGETTABLE, ReadModel
from tests.projections.histories import Writers, busy_partition


def test_archived_runs_equal_the_read_models(tmp_path: Path) -> None:
    values = busy_partition(seed=5, steps=400, partition=0).log
    log = EmbeddedLog.open(tmp_path / "log", 1, segment_bytes=4096)
    writers = Writers(log)
    writers.append(0, values, chunk=50)
    writers.close()
    archive = Archive(DirectoryStore(tmp_path / "archive"))
    segments = log.segments("events", 0)
    keep = segments[len(segments) * 2 // 3]
    Archiver(log, archive, file_records=300).archive_until(0, keep.first)
    log.prune("events", 0, keep.first)  # two thirds of the history only in the archive
    assert log.start_offset("events", 0) > 0

    with ReadModel(tmp_path / "read_model") as model:
        model.process_records(0, [Record(0, i, v) for i, v in enumerate(values)])
        runs = [msgspec.msgpack.decode(v) for k, v in model.dump() if k.startswith(b"r/")]
        assert len(runs) > 50
        reader = ArchivedRuns(ArchivedLog(log, archive), archive, EventDecoder("history"))
        finished = [r for r in runs if r["state"] in FORGETTABLE]  # what may leave the model
        assert len(finished) > 30
        for run in finished:
            found = reader.run(run["run_id"], run["scheduled_for"])
            assert found is not None, run["run_id"]
            assert msgspec.to_builtins(found) == run, run["run_id"]
        by_job: dict[str, list[str]] = {}
        for run in sorted(runs, key=lambda r: r["scheduled_for"], reverse=True):
            by_job.setdefault(run["job_id"], []).append(run["run_id"])
        for job_id, run_ids in by_job.items():
            older = reader.older(job_id, 2**62, len(run_ids) + 1, 0, held=lambda _: False)
            assert [r.run_id for r in older] == run_ids
    log.close()
