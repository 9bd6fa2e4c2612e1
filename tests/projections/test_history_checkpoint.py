"""Read-model checkpoints: a restored checkpoint is the model it was taken from, folds the tail
to the model folded from zero, and a damaged one is passed over for the one before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from archive.store import DirectoryStore
from core import events as ev
from eventlog.embedded import EmbeddedLog
from projections import history_checkpoint as hc
from projections.read_model import ReadModel, ReadModelRunner
from projections.views import RUN_STATES
from tests import corruption
from tests.projections.histories import Writers, busy_partition

PARTITIONS = 2


class Counted:
    def __init__(self) -> None:
        self.written: list[hc.Taken] = []
        self.failed = 0
        self.unusable = 0

    def history_checkpoint_written(self, taken: hc.Taken) -> None:
        self.written.append(taken)

    def history_checkpoint_failed(self) -> None:
        self.failed += 1

    def history_checkpoint_unusable(self) -> None:
        self.unusable += 1


class Partly:
    """Two partitions' histories, appended to an embedded log a part at a time."""

    def __init__(self, path: Path) -> None:
        self.log = EmbeddedLog.open(path, PARTITIONS)
        self.sims = [
            busy_partition(3 + p, steps=300, partition=p, prefix=f"p{p}-") for p in range(2)
        ]
        self.appended = [0] * PARTITIONS
        self._writers = Writers(self.log)

    def append_upto(self, fraction: float) -> None:
        for p, sim in enumerate(self.sims):
            upto = int(len(sim.log) * fraction)
            if upto > self.appended[p]:
                self._writers.append(p, sim.log[self.appended[p] : upto], chunk=41)
                self.appended[p] = upto

    def close(self) -> None:
        self._writers.close()
        self.log.close()

    def job_ids(self) -> list[tuple[str, str]]:
        """(tenant, job id) of every job of the histories."""
        out = []
        for sim in self.sims:
            for raw in sim.log:
                event = ev.decode(raw)
                if isinstance(event, ev.JobRegistered):
                    out.append((event.spec.tenant, event.job_id))
        return sorted(set(out))


@pytest.fixture
def history(tmp_path: Path) -> Iterator[Partly]:
    h = Partly(tmp_path / "log")
    yield h
    h.close()


def folded(h: Partly, data_dir: Path) -> ReadModel:
    model = ReadModel.open(data_dir)
    ReadModelRunner(h.log, model).run_once()
    return model


def views(model: ReadModel, h: Partly) -> list[object]:
    """What the API shows, through several of its listings."""
    out: list[object] = []
    tenants = sorted({tenant for tenant, _ in h.job_ids()})
    for tenant in tenants:
        out.append(model.jobs(tenant, limit=1000))
        out.append(model.counts(tenant))
        out.append(model.job_count(tenant))
        for state in RUN_STATES:
            out.append(model.runs(tenant, state, limit=1000))
    for tenant, job_id in h.job_ids():
        out.append(model.job(tenant, job_id))
        out.append(model.runs_of(tenant, job_id, limit=1000))
        out.append(model.skipped(tenant, job_id, limit=1000))
        newest = model.latest_run(tenant, job_id)
        out.append(None if newest is None else model.run(tenant, newest.run_id))
    return out


def test_a_restored_checkpoint_answers_as_its_model_and_folds_the_tail_as_from_zero(
    history: Partly, tmp_path: Path
) -> None:
    store = DirectoryStore(tmp_path / "archive")
    history.append_upto(0.6)
    original = folded(history, tmp_path / "a")
    taken = hc.take(original, store, tmp_path / "a", node_id="n/1", now_ms=1000)
    assert taken.positions == {p: history.appended[p] for p in range(PARTITIONS)}
    assert taken.key == "history/checkpoints/0000000001000-n_1.json"

    restored = hc.restore(store, tmp_path / "b" / "read_model")
    assert restored is not None and restored.key == taken.key
    with ReadModel.open(tmp_path / "b") as copy:
        assert copy.positions() == taken.positions
        assert views(copy, history) == views(original, history)
        assert copy.dump() == original.dump()

        history.append_upto(1.0)
        tail = ReadModelRunner(history.log, copy).run_once()
        assert tail == sum(len(s.log) for s in history.sims) - sum(taken.positions.values())
        with folded(history, tmp_path / "c") as from_zero:
            assert views(copy, history) == views(from_zero, history)
            assert copy.dump() == from_zero.dump()
    original.close()


def test_a_damaged_checkpoint_is_refused_and_the_one_before_restored(
    history: Partly, tmp_path: Path
) -> None:
    store = DirectoryStore(tmp_path / "archive")
    history.append_upto(0.4)
    model = folded(history, tmp_path / "a")
    older = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1000)
    history.append_upto(0.8)
    ReadModelRunner(history.log, model).run_once()
    newer = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=2000)
    model.close()
    # Damage a file only the newer checkpoint has (the older one must stay whole).
    manifest = json.loads(store.get(newer.key))
    older_files = {f["sha256"] for f in json.loads(store.get(older.key))["files"]}
    victim = next(f for f in manifest["files"] if f["sha256"] not in older_files)
    path = store.root / (hc.FILES + victim["sha256"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    counted = Counted()
    restored = hc.restore(store, tmp_path / "b" / "read_model", counted)
    assert restored is not None and restored.key == older.key
    assert counted.unusable == 1
    with ReadModel.open(tmp_path / "b") as copy:
        assert copy.positions() == older.positions
    assert not (tmp_path / "b" / "read_model.restoring").exists()


def test_a_manifest_of_another_format_or_not_json_is_passed_over(
    history: Partly, tmp_path: Path
) -> None:
    store = DirectoryStore(tmp_path / "archive")
    history.append_upto(0.5)
    with folded(history, tmp_path / "a") as model:
        good = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1000)
    other = json.loads(store.get(good.key)) | {"read_model_format": hc.READ_MODEL_FORMAT + 1}
    store.put(hc.CHECKPOINTS + "0000000002000-n1.json", json.dumps(other).encode())
    store.put(hc.CHECKPOINTS + "0000000003000-n1.json", b"{not json")
    counted = Counted()
    restored = hc.restore(store, tmp_path / "b" / "read_model", counted)
    assert restored is not None and restored.key == good.key
    assert counted.unusable == 2


def test_no_checkpoint_restores_nothing_and_the_model_folds_from_zero(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "archive")
    model, restored = hc.open_model(tmp_path / "data", store)
    with model:
        assert restored is None
        assert model.positions() == {}


def test_the_newest_k_are_kept_and_only_their_files(history: Partly, tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "archive")
    model = folded(history, tmp_path / "a")
    taken = []
    for i, fraction in enumerate((0.25, 0.5, 0.75, 1.0)):
        history.append_upto(fraction)
        ReadModelRunner(history.log, model).run_once()
        taken.append(hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=i, keep=2))
    model.close()
    assert hc.manifests(store) == [t.key for t in taken[2:]]
    named = {
        hc.FILES + f["sha256"]
        for key in hc.manifests(store)
        for f in json.loads(store.get(key))["files"]
    }
    assert set(store.list(hc.FILES)) == named
    # Files are shared between checkpoints: the later ones uploaded less than their size.
    assert taken[-1].uploaded < taken[-1].size


def test_a_model_set_aside_at_open_is_replaced_by_the_checkpoint(
    history: Partly, tmp_path: Path
) -> None:
    store = DirectoryStore(tmp_path / "archive")
    history.append_upto(0.5)
    with folded(history, tmp_path / "a") as model:
        taken = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1000)
    folded(history, tmp_path / "b").close()  # a model of its own, then damaged
    [manifest] = (tmp_path / "b" / "read_model").glob("MANIFEST-*")
    corruption.flip(manifest, size=min(4096, manifest.stat().st_size // 2), at=0.25)
    model, restored = hc.open_model(tmp_path / "b", store)
    with model:
        assert restored is not None and restored.key == taken.key
        assert model.positions() == taken.positions
        assert model.set_asides == 1


def test_a_table_file_is_hashed_once_across_checkpoints(
    history: Partly, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DirectoryStore(tmp_path / "archive")
    history.append_upto(0.5)
    hashed: list[str] = []
    sha256 = hc._sha256

    def counted(path: Path) -> tuple[str, int]:
        hashed.append(path.name)
        return sha256(path)

    monkeypatch.setattr(hc, "_sha256", counted)
    digests: dict[tuple[int, int, int], str] = {}
    with folded(history, tmp_path / "a") as model:
        first = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1, digests=digests)
        tables = {n for n in hashed if n.endswith(".sst")}
        assert tables and len(digests) == len(tables)
        hashed.clear()
        history.append_upto(1.0)
        ReadModelRunner(history.log, model).run_once()
        second = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=2, digests=digests)
    assert not tables & set(hashed), "a table of the first checkpoint was hashed again"
    assert {n for n in hashed if n.endswith(".sst")}, "the new table was hashed"
    assert second.positions != first.positions
    restored = hc.restore(store, tmp_path / "b" / "read_model")  # every digest right
    assert restored is not None and restored.key == second.key


def test_a_model_far_behind_the_newest_checkpoint_is_replaced_one_close_to_it_kept(
    history: Partly, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DirectoryStore(tmp_path / "archive")
    history.append_upto(0.3)
    folded(history, tmp_path / "behind").close()  # a node that went away at 30%
    history.append_upto(0.9)
    with folded(history, tmp_path / "a") as model:
        taken = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1000)
    gap = sum(taken.positions.values()) - sum(int(0.3 * len(s.log)) for s in history.sims)

    monkeypatch.setattr(hc, "REPLACE_BEHIND_EVENTS", gap + 1)  # close enough: kept
    model, restored = hc.open_model(tmp_path / "behind", store)
    with model:
        assert restored is None
        assert sum(model.positions().values()) == sum(taken.positions.values()) - gap

    monkeypatch.setattr(hc, "REPLACE_BEHIND_EVENTS", gap - 1)  # far behind: replaced
    model, restored = hc.open_model(tmp_path / "behind", store)
    with model:
        assert restored is not None and restored.key == taken.key
        assert model.positions() == taken.positions
    assert not (tmp_path / "behind" / "read_model.replacing").exists()
