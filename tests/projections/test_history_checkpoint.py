"""Read-model checkpoints: a restored checkpoint is the model it was taken from, folds the tail
to the model folded from zero, and a damaged one is passed over for the one before."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from archive.store import DirectoryStore
from core import events as ev
from core.errors import StoreDamaged
from eventlog.embedded import EmbeddedLog
from eventlog.port import EventLog, Record
from node.history_checkpointer import HistoryCheckpointer
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
    # The dropped ones' files stay for the grace period (a reader may be fetching them).
    assert set(store.list(hc.FILES)) > named
    assert len(store.list(hc.DROPPED)) == 2
    hc.collect(store, now_ms=3 + hc.DEFAULT_GRACE_MS + 1)
    assert set(store.list(hc.FILES)) == named
    assert store.list(hc.DROPPED) == [] and store.list(hc.LEASES) == []
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


# -- collecting files -------------------------------------------------------------------------

GRACE = hc.DEFAULT_GRACE_MS


class Crashed(Exception):
    """The writer's process died: nothing it would do afterwards happens."""


class Hooked(DirectoryStore):
    """A directory store that runs ``hook(op, key)`` before each call, and fails every call
    once ``crash_at(op, key)`` says so (a writer that died there)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hook: Callable[[str, str], None] = lambda op, key: None
        self.crash_at: Callable[[str, str], bool] = lambda op, key: False
        self.crashed = False
        self.deleted: list[str] = []

    def _before(self, op: str, key: str) -> None:
        if self.crashed or self.crash_at(op, key):
            self.crashed = True
            raise Crashed(f"{op} {key}")
        self.hook(op, key)

    def put(self, key: str, data: bytes) -> None:
        self._before("put", key)
        super().put(key, data)

    def get(self, key: str) -> bytes:
        self._before("get", key)
        return super().get(key)

    def list(self, prefix: str) -> list[str]:
        self._before("list", prefix)
        return super().list(prefix)

    def delete(self, key: str) -> None:
        self._before("delete", key)
        self.deleted.append(key)
        super().delete(key)


def named_files(store: DirectoryStore, key: str) -> set[str]:
    return {hc.FILES + f["sha256"] for f in json.loads(store.get(key))["files"]}


def test_the_files_of_a_writer_that_died_before_its_manifest_go_after_the_grace(
    history: Partly, tmp_path: Path
) -> None:
    history.append_upto(0.5)
    model = folded(history, tmp_path / "a")
    store = Hooked(tmp_path / "archive")
    good = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1000)
    history.append_upto(1.0)
    ReadModelRunner(history.log, model).run_once()
    store.crash_at = lambda op, key: op == "put" and key.startswith(hc.CHECKPOINTS)
    with pytest.raises(Crashed):
        hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=5000)
    model.close()
    survivor = DirectoryStore(store.root)  # the store, as the next writer finds it
    orphans = set(survivor.list(hc.FILES)) - named_files(survivor, good.key)
    assert orphans, "the dead writer uploaded files no manifest names"
    assert len(survivor.list(hc.LEASES)) == 1

    # Within the grace it may be a live writer still uploading: nothing goes.
    early = hc.collect(survivor, now_ms=5000 + GRACE - 1)
    assert early.files == 0 and early.kept_for_grace == len(orphans)
    assert orphans <= set(survivor.list(hc.FILES))

    late = hc.collect(survivor, now_ms=5000 + GRACE + 1)
    assert late.files == len(orphans) and late.leases == 1
    assert set(survivor.list(hc.FILES)) == named_files(survivor, good.key)
    assert survivor.list(hc.LEASES) == []
    restored = hc.restore(survivor, tmp_path / "b" / "read_model")
    assert restored is not None and restored.key == good.key


def test_a_writer_mid_upload_keeps_its_files_while_another_writer_collects(
    history: Partly, tmp_path: Path
) -> None:
    """Two nodes both own partition 0 for a moment (a rebalance in Kafka mode) and write to
    the shared archive directory: one's pruning and collecting, in the middle of the other's
    upload, takes none of the other's files."""
    history.append_upto(0.5)
    store = Hooked(tmp_path / "archive")
    a, b = folded(history, tmp_path / "a"), folded(history, tmp_path / "b")
    hc.take(a, store, tmp_path / "a", node_id="a", now_ms=1000, keep=1)
    history.append_upto(1.0)
    ReadModelRunner(history.log, a).run_once()
    ReadModelRunner(history.log, b).run_once()
    puts: list[str] = []
    others: list[hc.Taken] = []

    def a_writes_meanwhile(op: str, key: str) -> None:
        if op == "put" and key.startswith(hc.FILES):
            puts.append(key)
            if len(puts) == 2:  # b has uploaded one file of its checkpoint, not its manifest
                store.hook = lambda op, key: None
                others.append(hc.take(a, store, tmp_path / "a", node_id="a", now_ms=3000, keep=1))

    store.hook = a_writes_meanwhile
    taken_b = hc.take(b, store, tmp_path / "b", node_id="b", now_ms=2000, keep=2)
    a.close()
    b.close()
    [taken_a] = others
    assert hc.manifests(store) == [taken_b.key, taken_a.key]
    assert taken_a.collected is not None and taken_a.collected.kept_for_grace >= 1
    assert not set(store.deleted) & named_files(store, taken_b.key)
    assert taken_b.reuploaded == 0
    for taken in (taken_a, taken_b):  # each restores, the newer one set aside for the older
        restored = hc.restore(store, tmp_path / taken.key[-6:] / "read_model")
        assert restored is not None and restored.key == taken.key
        store.delete(taken.key)


def test_a_long_upload_renews_its_lease_so_a_collector_past_the_grace_spares_it(
    history: Partly, tmp_path: Path
) -> None:
    history.append_upto(1.0)
    store = Hooked(tmp_path / "archive")
    now = [1000]
    collections: list[hc.Collected] = []

    def slow_upload_and_a_collector(op: str, key: str) -> None:
        if op == "put" and key.startswith(hc.FILES):
            now[0] += GRACE // 3  # each file takes a third of the grace period
            store.hook = lambda op, key: None
            collections.append(hc.collect(store, now_ms=now[0]))
            store.hook = slow_upload_and_a_collector

    store.hook = slow_upload_and_a_collector
    with folded(history, tmp_path / "a") as model:
        taken = hc.take(
            model, store, tmp_path / "a", node_id="n1", now_ms=1000, clock=lambda: now[0]
        )
    assert now[0] - 1000 > GRACE  # the upload outlasted the grace period
    assert len(collections) == taken.files
    assert not any(c.files for c in collections), "a collector took a file being uploaded"
    assert taken.reuploaded == 0
    restored = hc.restore(store, tmp_path / "b" / "read_model")
    assert restored is not None and restored.key == taken.key


def test_a_reader_restoring_a_checkpoint_dropped_meanwhile_still_finds_its_files(
    history: Partly, tmp_path: Path
) -> None:
    history.append_upto(0.5)
    store = Hooked(tmp_path / "archive")
    model = folded(history, tmp_path / "a")
    first = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1000, keep=1)
    history.append_upto(1.0)
    ReadModelRunner(history.log, model).run_once()
    later: list[hc.Taken] = []

    def writer_drops_it(op: str, key: str) -> None:
        if op == "get" and key.startswith(hc.FILES):  # the reader has begun fetching files
            store.hook = lambda op, key: None
            later.append(hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=2000, keep=1))

    store.hook = writer_drops_it
    restored = hc.restore(store, tmp_path / "b" / "read_model")
    model.close()
    assert later and hc.manifests(store) == [later[0].key]  # it was dropped mid-restore
    assert restored is not None and restored.key == first.key
    with ReadModel.open(tmp_path / "b") as copy:
        assert copy.positions() == first.positions

    only_first = named_files(store, later[0].key)
    hc.collect(store, now_ms=2000 + GRACE + 1)  # the grace over: its own files go
    assert set(store.list(hc.FILES)) == only_first
    assert store.list(hc.DROPPED) == []


def test_a_file_deleted_after_the_writer_saw_it_stored_is_put_back(
    history: Partly, tmp_path: Path
) -> None:
    """A collector that stalled past its last look at the leases deletes a file the writer
    saw stored and so did not upload: the writer's check after its manifest puts it back."""
    history.append_upto(0.5)
    store = Hooked(tmp_path / "archive")
    model = folded(history, tmp_path / "a")
    hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1000)
    history.append_upto(1.0)
    ReadModelRunner(history.log, model).run_once()
    deleted: list[str] = []

    def late_delete(op: str, key: str) -> None:
        if op == "put" and key.startswith(hc.FILES):  # the writer has looked what is stored
            store.hook = lambda op, key: None
            direct = DirectoryStore(store.root)
            [lease] = direct.list(hc.LEASES)
            wanted = {hc.FILES + d for d in json.loads(direct.get(lease))["files"]}
            adopted = sorted(wanted & set(direct.list(hc.FILES)) - {key})
            assert adopted, "the new checkpoint shares files with the first"
            direct.delete(adopted[0])  # just after that look, before the manifest
            deleted.append(adopted[0])

    store.hook = late_delete
    second = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=2000)
    model.close()
    assert deleted and deleted[0] in named_files(store, second.key)
    assert second.reuploaded == 1
    assert set(store.list(hc.FILES)) >= named_files(store, second.key)
    restored = hc.restore(store, tmp_path / "b" / "read_model")
    assert restored is not None and restored.key == second.key


def test_collection_keeps_what_a_manifest_of_another_format_names(
    history: Partly, tmp_path: Path
) -> None:
    history.append_upto(0.5)
    store = DirectoryStore(tmp_path / "archive")
    with folded(history, tmp_path / "a") as model:
        good = hc.take(model, store, tmp_path / "a", node_id="n1", now_ms=1000)
    newer = json.loads(store.get(good.key)) | {"format": hc.HISTORY_FORMAT + 1}
    newer["files"] = newer["files"] + [{"name": "x.sst", "size": 1, "sha256": "ab" * 32}]
    store.put(hc.CHECKPOINTS + "0000000002000-n2.json", json.dumps(newer).encode())
    store.put(hc.FILES + "ab" * 32, b"x")
    store.put(hc.FILES + "cd" * 32, b"y")  # named by nothing, no lease: garbage
    collected = hc.collect(store, now_ms=1000 + GRACE + 1)
    assert collected.files == 1
    assert hc.FILES + "ab" * 32 in store.list(hc.FILES)
    assert hc.FILES + "cd" * 32 not in store.list(hc.FILES)


def test_a_lease_put_while_the_collector_looks_spares_the_files_it_names(
    tmp_path: Path,
) -> None:
    """A writer that begins after the collector's first look at the leases, and finds an old
    orphan it will name, keeps it: the collector looks again just before it deletes."""
    store = Hooked(tmp_path / "archive")
    orphan, other = "ab" * 32, "cd" * 32
    store.put(hc.FILES + orphan, b"x")
    store.put(hc.FILES + other, b"y")
    now = 10 * GRACE

    def writer_begins(op: str, key: str) -> None:
        if op == "list" and key == hc.FILES:
            store.hook = lambda op, key: None
            lease = hc.Lease(node_id="w", started_at_ms=now, renewed_at_ms=now, files=[orphan])
            store.put(f"{hc.LEASES}{now:013d}-w-0.json", msgspec.json.encode(lease))

    store.hook = writer_begins
    collected = hc.collect(store, now_ms=now)
    assert collected.files == 1
    assert store.list(hc.FILES) == [hc.FILES + orphan]


# -- damage found while running ------------------------------------------------------------


class HeldBelow:
    """The log, recording where the read model's threads start each read; once ``held`` is
    set, a read below ``floor`` waits (up to 10 s, once per partition) until the model has
    been swapped for a checkpoint: the fold from 0 does not race the restore."""

    def __init__(self, log: EventLog, model: ReadModel) -> None:
        self._log = log
        self._model = model
        self.floor: dict[int, int] = {}
        self.held = threading.Event()
        self.generation = 0
        self.reads: list[tuple[int, int]] = []
        self._waited: set[int] = set()

    def read_events(self, partition: int, from_offset: int, *args: Any, **kw: Any) -> list[Record]:
        if threading.current_thread().name.startswith("read-model:"):
            if (
                self.held.is_set()
                and partition not in self._waited
                and from_offset < self.floor.get(partition, 0)
            ):
                self._waited.add(partition)
                self._model.wait_until(lambda: self._model.generation >= self.generation + 2, 10)
            self.reads.append((partition, from_offset))
        return self._log.read_events(partition, from_offset, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


def damage_at_the_next_event(model: ReadModel, log: HeldBelow) -> None:
    """The next event the model folds finds it damaged (a block whose checksum fails)."""
    apply = model._apply

    def damaged(p: Any, event: Any, partition: int, offset: int) -> None:
        if not log.held.is_set():
            log.generation = model.generation
            log.held.set()
            raise StoreDamaged(f"read model: block checksum mismatch at {partition}/{offset}")
        apply(p, event, partition, offset)

    model._apply = damaged  # type: ignore[method-assign]


def test_damage_a_fold_finds_is_repaired_from_the_newest_checkpoint_and_the_tail(
    history: Partly, tmp_path: Path
) -> None:
    store = DirectoryStore(tmp_path / "archive")
    history.append_upto(0.4)
    writer = folded(history, tmp_path / "w")
    hc.take(writer, store, tmp_path / "w", node_id="w", now_ms=1000)
    history.append_upto(0.6)
    ReadModelRunner(history.log, writer).run_once()
    newest = hc.take(writer, store, tmp_path / "w", node_id="w", now_ms=2000)
    writer.close()
    history.append_upto(0.8)
    folded(history, tmp_path / "n").close()  # this node's own model, further on
    model, restored = hc.open_model(tmp_path / "n", store)
    assert restored is None  # its own model is kept: it is not far behind
    log = HeldBelow(history.log, model)
    log.floor = dict(newest.positions)
    damage_at_the_next_event(model, log)
    history.append_upto(1.0)
    ends = {p: history.appended[p] for p in range(PARTITIONS)}
    with model, ReadModelRunner(log, model):  # type: ignore[arg-type]
        for p, end in ends.items():
            assert model.wait_for(p, end - 1, timeout_s=30)
        assert model.set_asides == 1
        after = log.reads[next(i for i, r in enumerate(log.reads) if r[1] == 0) :]
        for p, at in newest.positions.items():
            assert (p, at) in after, f"partition {p} did not fold on from the checkpoint"
        with folded(history, tmp_path / "z") as from_zero:
            assert views(model, history) == views(from_zero, history)
            assert model.dump() == from_zero.dump()
    assert not list((tmp_path / "n").glob("read_model.refill*"))
    assert len(list((tmp_path / "n").glob("read_model.damaged-*"))) == 1


def test_damage_a_fold_finds_with_no_checkpoint_folds_again_from_offset_0(
    history: Partly, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = DirectoryStore(tmp_path / "archive")  # no checkpoint in it
    history.append_upto(0.5)
    folded(history, tmp_path / "n").close()
    model, _ = hc.open_model(tmp_path / "n", store)
    log = HeldBelow(history.log, model)
    damage_at_the_next_event(model, log)
    history.append_upto(1.0)
    with model, ReadModelRunner(log, model):  # type: ignore[arg-type]
        for p in range(PARTITIONS):
            assert model.wait_for(p, history.appended[p] - 1, timeout_s=30)
        with folded(history, tmp_path / "z") as from_zero:
            assert model.dump() == from_zero.dump()
    assert "no usable history checkpoint" in caplog.text


def test_a_stale_lease_renewed_while_the_collector_looks_keeps_its_files(tmp_path: Path) -> None:
    """A writer that was only slow renews its lease after the collector first found it stale:
    the second look, just before deleting, sees the renewal."""
    store = Hooked(tmp_path / "archive")
    mine = "ab" * 32
    store.put(hc.FILES + mine, b"x")
    key = f"{hc.LEASES}{1000:013d}-slow-0.json"
    lease = hc.Lease(node_id="slow", started_at_ms=1000, renewed_at_ms=1000, files=[mine])
    store.put(key, msgspec.json.encode(lease))
    now = 1000 + 2 * GRACE

    def writer_wakes(op: str, prefix: str) -> None:
        if op == "list" and prefix == hc.FILES:
            store.hook = lambda op, key: None
            renewed = msgspec.structs.replace(lease, renewed_at_ms=now)
            store.put(key, msgspec.json.encode(renewed))

    store.hook = writer_wakes
    collected = hc.collect(store, now_ms=now)
    assert collected.files == 0 and collected.leases == 0
    assert store.list(hc.FILES) == [hc.FILES + mine] and store.list(hc.LEASES) == [key]


# -- a damaged model poisons no checkpoint ----------------------------------------------------


class Refusals(Counted):
    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def history_checkpoint_refused(self) -> None:
        self.refused += 1

    def history_checkpoint_collected(self, collected: hc.Collected) -> None:
        pass


class At:
    def now_ms(self) -> int:
        return 5_000


def damaged_model(history: Partly, data_dir: Path, store: DirectoryStore) -> hc.Taken:
    """A model at ``data_dir`` with a good checkpoint of it at 40%, then folded to 80% and a
    block of its largest table file flipped (closed); the good checkpoint."""
    history.append_upto(0.4)
    model = folded(history, data_dir)
    good = hc.take(model, store, data_dir, node_id="n", now_ms=1000)
    history.append_upto(0.8)
    ReadModelRunner(history.log, model).run_once()
    model.close()
    corruption.damage(data_dir / "read_model")
    return good


def test_a_damaged_model_is_not_checkpointed_but_set_aside_and_refilled_from_a_good_one(
    history: Partly, tmp_path: Path
) -> None:
    """The finding: the checkpointer copied a flipped block into the archive (its hashes
    matched what it copied), the node restored it after every restart, and the good
    checkpoints rotated out."""
    store = DirectoryStore(tmp_path / "archive")
    good = damaged_model(history, tmp_path / "n", store)
    model, restored = hc.open_model(tmp_path / "n", store)
    assert restored is None  # RocksDB opens it: the damage is in a data block
    counted = Refusals()
    checkpointer = HistoryCheckpointer(
        model,
        store,
        tmp_path / "n",
        node_id="n",
        clock=At(),  # type: ignore[arg-type]
        writes=lambda: True,
        lag=lambda: 0,
        metrics=counted,
    )
    with model:
        assert checkpointer.tick() is None
        assert counted.refused == 1 and hc.manifests(store) == [good.key]
        assert model.set_asides == 1  # and refilled from the good one, then the tail
        history.append_upto(1.0)
        with ReadModelRunner(history.log, model):
            for p in range(PARTITIONS):
                assert model.wait_for(p, history.appended[p] - 1, timeout_s=30)
            with folded(history, tmp_path / "z") as from_zero:
                assert views(model, history) == views(from_zero, history)
                assert model.dump() == from_zero.dump()
        taken = checkpointer.tick()  # whole again: checkpointed
        assert taken is not None and taken.positions == model.positions()
    assert not list((tmp_path / "n").glob("read_model.refill*"))


def test_a_checkpoint_of_a_damaged_model_is_dropped_and_the_good_one_restored(
    history: Partly, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint an earlier build took of a damaged model: every file matches its SHA-256,
    but its tables fail RocksDB's checksums. A restore passes over it and drops it, so no
    later start (nor a refill) fetches it again."""
    store = DirectoryStore(tmp_path / "archive")
    good = damaged_model(history, tmp_path / "w", store)
    with monkeypatch.context() as unchecked:  # as taken before checkpoints were checked
        unchecked.setattr(hc, "unreadable_tables", lambda tables, scratch: {})
        with ReadModel(tmp_path / "w" / "read_model") as model:
            poisoned = hc.take(model, store, tmp_path / "w", node_id="n", now_ms=2000)
    assert hc.manifests(store) == [good.key, poisoned.key]

    counted = Counted()
    model, restored = hc.open_model(tmp_path / "n", store, counted)
    assert restored is not None and restored.key == good.key
    assert counted.unusable == 1 and hc.manifests(store) == [good.key]
    assert store.list(hc.DROPPED)  # its files go after the grace period, as a pruned one's
    with model:
        history.append_upto(1.0)
        ReadModelRunner(history.log, model).run_once()
        with folded(history, tmp_path / "z") as from_zero:
            assert views(model, history) == views(from_zero, history)
    again = Counted()
    assert hc.restore(store, tmp_path / "m" / "read_model", again) is not None
    assert again.unusable == 0
    assert not (tmp_path / "n" / "read_model.restoring").exists()
