"""The fold keeps the job and run records its batches wrote, decoded, for the batches after
(``projections.model_fold._Kept``): folding with them kept must write what folding with each
record read from the store writes, whatever else changed the store in between."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.bench_fold import TENANT as TEAM
from bench.bench_fold import histories
from core import events as ev
from core.errors import StoreDamaged
from projections.read_model import ReadModel
from tests.core.harness import Sim
from tests.projections.histories import busy_partition


def _fold(model: ReadModel, sim: Sim, batch: int) -> None:
    events = [ev.decode(raw) for raw in sim.log]
    for start in range(0, len(events), batch):
        with model.batch():
            for offset in range(start, min(start + batch, len(events))):
                model.process(events[offset], 0, offset)


@pytest.mark.parametrize("seed", [3, 7])
def test_records_kept_between_batches_fold_as_records_read_from_the_store(
    tmp_path: Path, seed: int
) -> None:
    """A busy partition folded in batches of three, keeping at most eight records of each
    kind (fewer than it has jobs and runs: some are dropped and read again), against the
    same history folded keeping none: every key and value the same."""
    sim = busy_partition(seed, steps=400)
    with ReadModel.open(tmp_path / "kept") as kept, ReadModel.open(tmp_path / "read") as read:
        kept.kept_records, read.kept_records = 8, 0
        _fold(kept, sim, batch=3)
        _fold(read, sim, batch=3)
        assert kept.dump() == read.dump()
        assert kept._kept is not None and len(kept._kept.runs) == 8  # it did keep records


def _events() -> list[ev.AnyEvent]:
    """One HTTP job's registration and one run of it: materialised, leased, completed."""
    registered, runs = histories(1, "interleaved")
    return [ev.decode(record.value) for record in registered + runs]


EVENTS = _events()
JOB, RUN, SLOT = EVENTS[1].job_id, EVENTS[1].run_id, EVENTS[1].scheduled_for  # type: ignore[union-attr]


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ReadModel]:
    with ReadModel.open(tmp_path / "data") as m:
        yield m


def test_a_batch_that_is_not_written_leaves_no_record_it_changed(model: ReadModel) -> None:
    registered, made, leased, _ = EVENTS
    model.process(registered, 0, 0)
    model.process(made, 0, 1)
    with pytest.raises(RuntimeError), model.batch():
        model.process(leased, 0, 2)  # the run changed in memory: running, one attempt
        raise RuntimeError("the batch's write failed")
    model.process(leased, 0, 2)  # folded again from the position, as the runner does
    run = model.run(TEAM, RUN)
    assert run is not None and run.state == "running"
    assert [a.fencing_token for a in run.attempts] == [1]
    counts = model.counts(TEAM)
    assert (counts["pending"], counts["running"]) == (0, 1)


def test_a_run_the_hot_window_forgot_is_not_written_back_from_a_kept_copy(
    model: ReadModel,
) -> None:
    registered, made, leased, done = EVENTS
    for offset, event in enumerate((registered, made, leased, done)):
        model.process(event, 0, offset)
    assert model.forget_runs(cutoff=SLOT + 1, max_runs=10).runs == 1
    late = ev.LeaseExpired(
        at=SLOT + 60_000, job_id=JOB, tenant=TEAM, run_id=RUN, scheduled_for=SLOT,
        fencing_token=1, lease_expires_at=SLOT + 60_000,
    )  # fmt: skip
    model.process(late, 0, 4)
    assert model.run(TEAM, RUN) is None
    assert sum(model.counts(TEAM).values()) == 0


def test_records_kept_for_a_model_set_aside_are_not_written_into_its_successor(
    model: ReadModel,
) -> None:
    registered, made, leased, done = EVENTS
    for offset, event in enumerate((registered, made, leased)):
        model.process(event, 0, offset)
    model.set_aside(StoreDamaged("read model: a block checksum mismatch"))
    model.process(done, 0, 3)  # the new model has neither the job nor the run yet
    assert model.run(TEAM, RUN) is None
    assert model.job(TEAM, JOB) is None
