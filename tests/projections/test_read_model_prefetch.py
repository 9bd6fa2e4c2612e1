"""A batch of records reads the run and job records it names in one lookup of the store before
it folds them (``ModelFold._prefetch``): one lookup of many lets the node's other threads run
while the store searches. It must fold exactly what reading each record as it is folded does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.bench_fold import TENANT, histories
from core import events as ev
from eventlog.port import Record
from projections import model_fold
from projections.model_keys import job_key, run_record_key
from projections.read_model import ReadModel
from tests.projections.histories import busy_partition


def _fold_records(model: ReadModel, records: list[Record], batch: int) -> None:
    for start in range(0, len(records), batch):
        model.process_records(0, records[start : start + batch])


@pytest.mark.parametrize("seed", [3, 7])
def test_a_batch_read_ahead_folds_as_records_read_one_by_one(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy partition in batches of 20, keeping 8 records of each kind (so most are read from
    the store), with the reading ahead and without it: every key and value the same."""
    sim = busy_partition(seed, steps=400)
    records = [Record(0, offset, raw) for offset, raw in enumerate(sim.log)]
    with ReadModel.open(tmp_path / "ahead") as ahead, ReadModel.open(tmp_path / "one") as one:
        ahead.kept_records = one.kept_records = 8
        _fold_records(ahead, records, batch=20)
        monkeypatch.setattr(model_fold, "PREFETCH_FROM", 10**9)
        _fold_records(one, records, batch=20)
        assert ahead.dump() == one.dump()


class _Counting:
    """The model's store, its lookups counted."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.lookups: list[object] = []

    def get(self, key: object, *args: Any, **kwargs: Any) -> Any:
        self.lookups.append(key)
        return self.db.get(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def test_a_batch_reads_the_records_it_names_in_one_lookup(tmp_path: Path) -> None:
    registered, runs = histories(50, "herd")  # 50 jobs: made, then leased, then completed
    with ReadModel.open(tmp_path / "data") as model:
        model.kept_records = 0  # nothing kept: every record is read from the store
        model.process_records(0, registered)
        counting = _Counting(model._db)
        model._db = counting  # type: ignore[assignment]
        try:
            model.process_records(0, runs[:50])  # the 50 runs made
            [lookup] = [key for key in counting.lookups if isinstance(key, list)]
            made = [ev.decode(record.value) for record in runs[:50]]
            records = {run_record_key(e.run_id) for e in made if isinstance(e, ev.RunEvent)}
            records |= {job_key(e.job_id) for e in made if isinstance(e, ev.RunEvent)}
            assert len(records) == 100  # the 50 runs (none there yet) and their 50 jobs
            assert set(lookup) == records
            assert not records & {key for key in counting.lookups if isinstance(key, bytes)}
        finally:
            model._db = counting.db
        first = made[0]
        assert isinstance(first, ev.RunMaterialised)
        run = model.run(TENANT, first.run_id)
        assert run is not None and run.state == "pending"
