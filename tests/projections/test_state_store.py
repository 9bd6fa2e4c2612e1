"""The state store: a partition's state and its offset on disk, saved incrementally.

Histories come from the real core (``histories.busy_partition``). The contract tests run
against both adapters through the ``store_factory`` fixture; the RocksDB-only tests cover what
only a disk has (reopening, wiping, catching up from an event log).
"""

from __future__ import annotations

import logging
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from core import events as ev
from core.commands import PutJob
from core.errors import StoreDamaged
from core.state import PartitionState, evolve
from eventlog.embedded import EmbeddedLog
from eventlog.memory import MemoryLog
from eventlog.port import Record
from projections.decoding import EventDecoder, ForeignRecord
from projections.state_store import (
    MemoryStateStore,
    RocksStateStore,
    StateStore,
    build,
    catch_up,
)
from tests import corruption
from tests.projections.histories import Writers, _spec, busy_partition

StoreFactory = Callable[[int], StateStore]


@pytest.fixture(params=["memory", "rocksdb"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    opened: list[StateStore] = []

    def make(partition: int) -> StateStore:
        store: StateStore
        if request.param == "memory":
            store = MemoryStateStore(partition)
        else:
            store = RocksStateStore.open(tmp_path / f"data{len(opened)}", partition)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def save_in_batches(
    store: StateStore, events: list[ev.AnyEvent], rng: random.Random, max_batch: int = 7
) -> PartitionState:
    """What a live owner does: evolve each decision's events, then save them with offsets.

    Offsets leave gaps (as Kafka's transaction markers do) to show nothing assumes offset + 1.
    """
    state, offset = store.load()
    i = 0
    while i < len(events):
        batch = []
        for event in events[i : i + rng.randint(1, max_batch)]:
            evolve(state, event)
            batch.append((offset, event))
            offset += rng.choice((1, 1, 2))
        store.save(state, batch)
        i += len(batch)
    return state


def ready_entries(state: PartitionState) -> dict[str, list[tuple[int, int, str, int]]]:
    """The ready index without stale entries, in claim order."""
    heaps: dict[str, list[tuple[int, int, str, int]]] = {}
    for pool, heap in state.ready.items():
        heaps.setdefault(pool, []).extend(heap)
    for pool, later in state.later.items():  # not due when indexed: claims move them to ready
        heaps.setdefault(pool, []).extend(e[1:] for e in later)
    return {
        pool: sorted({e for e in heap if state.is_ready_entry_live(e, pool)})
        for pool, heap in heaps.items()
        if any(state.is_ready_entry_live(e, pool) for e in heap)
    }


# -- the contract, against both adapters ------------------------------------------------------


def test_a_fresh_store_is_empty_at_offset_zero(store_factory: StoreFactory) -> None:
    state, offset = store_factory(3).load()
    assert offset == 0
    assert state.snapshot() == PartitionState(3).snapshot()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_loaded_state_is_the_live_state(store_factory: StoreFactory, seed: int) -> None:
    sim = busy_partition(seed, steps=250, partition=2)
    store = store_factory(2)
    save_in_batches(store, sim.events(), random.Random(seed))
    loaded, _ = store.load()
    assert loaded.snapshot() == sim.state.snapshot()
    assert list(loaded.runs) == list(sim.state.runs)  # the dict order decide iterates in
    assert ready_entries(loaded) == ready_entries(sim.state)


def test_offset_is_the_last_saved_offset_plus_one(store_factory: StoreFactory) -> None:
    sim = busy_partition(5, steps=40)
    store = store_factory(0)
    events = sim.events()
    state = PartitionState(0)
    for event in events:
        evolve(state, event)
    store.save(state, [(10 + 3 * i, e) for i, e in enumerate(events)])
    assert store.load()[1] == 10 + 3 * (len(events) - 1) + 1
    store.save(state, [])  # nothing to record changes nothing
    assert store.load()[1] == 10 + 3 * (len(events) - 1) + 1


def test_saves_are_incremental(store_factory: StoreFactory) -> None:
    """A batch rewrites only what its events name: a heartbeat touches one job and one run."""
    sim = busy_partition(1, steps=150)
    store = store_factory(0)
    state = save_in_batches(store, sim.events(), random.Random(1))
    before = dict(store.dump())
    run = next(r for r in state.runs.values() if r.worker_id is not None)
    beat = ev.Heartbeat(
        at=sim.now,
        job_id=run.job_id,
        tenant=run.tenant,
        run_id=run.run_id,
        scheduled_for=run.scheduled_for,
        attempt=run.attempt,
        fencing_token=run.fencing_token,
        lease_expires_at=sim.now + 123_456,
    )
    evolve(state, beat)
    store.save(state, [(10_000, beat)])
    after = dict(store.dump())
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed == {f"r/{run.run_id}".encode(), b"m/offset"}


def test_runs_that_leave_the_state_leave_the_store(store_factory: StoreFactory) -> None:
    sim = busy_partition(2, steps=200)
    store = store_factory(0)
    save_in_batches(store, sim.events(), random.Random(2))
    stored_runs = {k[2:].decode() for k, _ in store.dump() if k.startswith(b"r/")}
    completed = {e.run_id for e in sim.events() if isinstance(e, ev.RunCompleted)}
    assert completed, "the history has completed runs"
    assert stored_runs == set(sim.state.runs)
    assert not completed & stored_runs


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), batching=st.integers(0, 10_000), max_batch=st.integers(1, 60))
def test_how_events_are_batched_never_shows(seed: int, batching: int, max_batch: int) -> None:
    """Any batching of one history stores the same bytes and loads the live state."""
    sim = busy_partition(seed, steps=120)
    events = sim.events()
    one_by_one, batched = MemoryStateStore(0), MemoryStateStore(0)
    save_in_batches(one_by_one, events, random.Random(batching), max_batch=1)
    save_in_batches(batched, events, random.Random(batching), max_batch=max_batch)
    # Offsets differ with the batching RNG draws only through the gaps: compare without them.
    assert _without_offset(one_by_one.dump()) == _without_offset(batched.dump())
    assert batched.load()[0].snapshot() == sim.state.snapshot()


def _without_offset(items: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in items if k != b"m/offset" and not k.startswith(b"o")]


# -- RocksDB and the log: catch-up, wiping, reopening -----------------------------------------


def _log_with(tmp_path: Path, events: list[bytes], partition: int = 1) -> EmbeddedLog:
    log = EmbeddedLog.open(tmp_path / "log", 2)
    writers = Writers(log)
    writers.append(partition, events, chunk=37)
    writers.close()
    return log


def test_wipe_and_replay_from_zero_gives_the_same_bytes(tmp_path: Path) -> None:
    sim = busy_partition(7, steps=300, partition=1)
    log = _log_with(tmp_path, sim.log)
    try:
        # Live: the owner saves each small batch as it decides it.
        live = RocksStateStore.open(tmp_path / "node", 1)
        state, _ = live.load()
        for record_batch in _chunks(log.read_events(1, 0, 100_000), random.Random(7)):
            batch = [(r.offset, ev.decode(r.value)) for r in record_batch]
            for _, event in batch:
                evolve(state, event)
            live.save(state, batch)
        live_bytes = live.dump()
        live.close()
        assert state.snapshot() == sim.state.snapshot()

        shutil.rmtree(tmp_path / "node" / "state" / "p1")
        rebuilt = RocksStateStore.open(tmp_path / "node", 1)
        caught_up = catch_up(rebuilt, log, 1, batch_size=1000)
        assert rebuilt.dump() == live_bytes
        assert caught_up.snapshot() == sim.state.snapshot()
        rebuilt.close()
    finally:
        log.close()


def _chunks(records: list[Record], rng: random.Random) -> Iterator[list[Record]]:
    i = 0
    while i < len(records):
        n = rng.randint(1, 9)
        yield records[i : i + n]
        i += n


class CountingLog:
    """An event log that remembers where each read started."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.reads: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.log, name)

    def read_events(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        self.reads.append(from_offset)
        return self.log.read_events(partition, from_offset, max_records, timeout_s)


def test_reopening_resumes_from_the_stored_offset(tmp_path: Path) -> None:
    sim = busy_partition(11, steps=300)
    half = len(sim.log) // 2
    log = MemoryLog(1, gaps=True)
    counting = CountingLog(log)
    writers = Writers(log)
    writers.append(0, sim.log[:half], chunk=50)

    store = RocksStateStore.open(tmp_path / "a", 0)
    catch_up(store, counting, 0, batch_size=64)  # type: ignore[arg-type]
    _, stored = store.load()
    store.close()

    writers.append(0, sim.log[half:], chunk=50)
    counting.reads.clear()
    store = RocksStateStore.open(tmp_path / "a", 0)
    state = catch_up(store, counting, 0, batch_size=64)  # type: ignore[arg-type]
    assert counting.reads[0] == stored  # nothing before the stored offset was read again
    resumed = store.dump()
    store.close()

    at_once = RocksStateStore.open(tmp_path / "b", 0)
    catch_up(at_once, log, 0, batch_size=1000)
    assert at_once.dump() == resumed
    assert state.snapshot() == sim.state.snapshot()
    at_once.close()
    writers.close()
    log.close()


def test_a_batch_lost_with_its_offset_is_read_again(tmp_path: Path) -> None:
    """The offset is in the batch: a store missing its newest batch simply re-reads it."""
    sim = busy_partition(3, steps=200)
    log = MemoryLog(1)
    Writers(log).append(0, sim.log)
    records = log.read_events(0, 0, 100_000)
    cut = len(records) // 3
    store = MemoryStateStore(0)
    state = PartitionState(0)
    for r in records[:cut]:
        evolve(state, ev.decode(r.value))
    store.save(state, [(r.offset, ev.decode(r.value)) for r in records[:cut]])
    # The next batch "never reached disk": the state moved on, the store did not.
    assert catch_up(store, log, 0).snapshot() == sim.state.snapshot()
    log.close()


# -- records that are not events ------------------------------------------------------------------


def test_catch_up_passes_over_foreign_records_reports_each_and_moves_past_them() -> None:
    """A record another producer put in the events stream (issue: a kafka:// target named the
    topic) neither stops recovery nor is skipped unnoticed."""
    sim = busy_partition(5, steps=150)
    half = len(sim.log) // 2
    log = MemoryLog(1, gaps=True)
    writers = Writers(log)
    writers.append(0, sim.log[:half], chunk=40)
    [middle] = writers.append(0, [b'{"job_id": "x", "payload": {"a": 1}}'])
    writers.append(0, sim.log[half:], chunk=40)
    [tail] = writers.append(0, [b"\x00not json at all"])
    seen: list[ForeignRecord] = []
    store = MemoryStateStore(0)

    state = catch_up(store, log, 0, batch_size=64, decoder=EventDecoder("recovery", seen.append))

    assert state.snapshot() == sim.state.snapshot()
    assert [(f.partition, f.offset) for f in seen] == [(0, middle), (0, tail)]
    assert store.load()[1] == tail + 1  # the next recovery starts after the foreign tail
    again: list[ForeignRecord] = []
    catch_up(store, log, 0, decoder=EventDecoder("recovery", again.append))
    assert again == []
    writers.close()
    log.close()


# -- damage ---------------------------------------------------------------------------------------


def _store_on_disk(tmp_path: Path, seed: int = 9) -> tuple[MemoryLog, PartitionState]:
    """A partition's log and its state store, caught up and closed: a busy history and a few
    hundred more jobs, enough for SST files of several blocks."""
    sim = busy_partition(seed, steps=400, cancel_jobs=False)
    for i in range(300):
        spec = _spec(f"bulk-{i}", "t1", schedule="0 3 * * *", payload={"note": f"job {i} " * 20})
        sim.do(PutJob(job_id=f"bulk-{i}", spec=spec))
    log = MemoryLog(1)
    Writers(log).append(0, sim.log)
    with RocksStateStore.open(tmp_path / "node", 0) as store:
        catch_up(store, log, 0)
    return log, sim.state


def _aside(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "node" / "state").glob("p0.damaged-*"))


def test_a_flipped_block_in_a_state_store_is_found_set_aside_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged store killed the partition's runner with a KeyError, and readiness never came."""
    log, expected = _store_on_disk(tmp_path)
    path = tmp_path / "node" / "state" / "p0"
    damaged = corruption.damage(path)
    with RocksStateStore.open(tmp_path / "node", 0) as store:
        with pytest.raises(StoreDamaged, match="checksum"):
            store.load()
        with caplog.at_level(logging.ERROR, logger="projections.state_store"):
            state = catch_up(store, log, 0)
        assert state.snapshot() == expected.snapshot()
        assert store.load()[0].snapshot() == expected.snapshot()
    [aside] = _aside(tmp_path)
    assert (aside / damaged.name).exists()  # kept for whoever looks into why, not deleted
    [line] = [r.getMessage() for r in caplog.records]
    assert "state store of partition 0" in line and f"set aside as {aside}" in line
    assert "rebuilding it from the log" in line


class _ScanStoppingAt:
    """A store's database whose pairs (``items``) stop before the first key with ``prefix``,
    as rocksdict's stop, without a word, at a block that fails its checksum."""

    def __init__(self, db: Rdict, prefix: bytes) -> None:
        self._db, self._prefix = db, prefix

    def items(self, **options: object) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._db.items(**options):
            if key.startswith(self._prefix):
                return
            yield key, value

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)


def test_a_scan_that_stopped_early_is_damage_even_where_what_it_read_holds_together(
    tmp_path: Path,
) -> None:
    """The runs' keys ("or/", "r/") come last: a scan stopped before them reads a consistent
    state without its runs. The load reads rocksdict's pairs straight; it checks after that
    they ended at the end of the data."""
    _, expected = _store_on_disk(tmp_path)
    assert expected.runs
    with RocksStateStore.open(tmp_path / "node", 0) as store:
        db = store._db
        store._db = _ScanStoppingAt(db, b"or/")  # type: ignore[assignment]
        try:
            with pytest.raises(StoreDamaged, match="the scan stopped before b'or/"):
                store.load()
        finally:
            store._db = db
        assert store.load()[0].snapshot() == expected.snapshot()


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda db, k: db.__delitem__(b"o" + k), id="a job without its order key"),
        pytest.param(lambda db, k: db.__delitem__(k), id="an order key without its job"),
        pytest.param(lambda db, k: db.__setitem__(k, b"\xc1not msgpack"), id="undecodable job"),
        pytest.param(lambda db, k: db.__delitem__(b"m/offset"), id="no offset"),
        pytest.param(lambda db, k: db.__setitem__(b"m/token", b"\x01"), id="short token"),
        pytest.param(lambda db, k: db.__setitem__(b"x/odd", b""), id="a key it never writes"),
    ],
)
def test_a_store_that_does_not_read_back_as_written_is_damaged(
    tmp_path: Path, tamper: Callable[[Rdict, bytes], None]
) -> None:
    log, expected = _store_on_disk(tmp_path)
    db = Rdict(str(tmp_path / "node" / "state" / "p0"), options=Options(raw_mode=True))
    job_key = next(bytes(k) for k, _ in db.items() if bytes(k).startswith(b"j/"))
    tamper(db, job_key)
    db.close()
    with RocksStateStore.open(tmp_path / "node", 0) as store:
        with pytest.raises(StoreDamaged, match="state store of partition 0"):
            store.load()
        assert catch_up(store, log, 0).snapshot() == expected.snapshot()
    assert len(_aside(tmp_path)) == 1


def test_a_store_rocksdb_will_not_open_is_set_aside_on_open(tmp_path: Path) -> None:
    log, expected = _store_on_disk(tmp_path)
    path = tmp_path / "node" / "state" / "p0"
    [manifest] = path.glob("MANIFEST-*")
    corruption.flip(manifest, size=min(4096, manifest.stat().st_size // 2), at=0.25)
    with pytest.raises(StoreDamaged):
        RocksStateStore(path, 0)  # the tools' way in: it says so, and moves nothing
    assert _aside(tmp_path) == []
    with RocksStateStore.open(tmp_path / "node", 0) as store:  # the node's way in
        assert store.load()[1] == 0 and not store.load()[0].jobs
        assert catch_up(store, log, 0).snapshot() == expected.snapshot()
    assert len(_aside(tmp_path)) == 1


def test_key_values_out_of_key_order_are_refused_never_misread(tmp_path: Path) -> None:
    """Jobs are paired with their order keys by position, which key order guarantees: items in
    another order (a snapshot written wrong) are damage."""
    _, expected = _store_on_disk(tmp_path)
    with RocksStateStore.open(tmp_path / "node", 0) as store:
        items = store.dump()
    assert sum(k.startswith(b"j/") for k, _ in items) > 1
    assert build(0, items)[0].snapshot() == expected.snapshot()
    with pytest.raises(StoreDamaged, match="state store of partition 0"):
        build(0, list(reversed(items)))
    # one job moved after the meta keys, before the order keys: still out of key order
    job = next(i for i, (k, _) in enumerate(items) if k.startswith(b"j/"))
    meta = max(i for i, (k, _) in enumerate(items) if k.startswith(b"m/"))
    moved = [*items[:job], *items[job + 1 : meta + 1], items[job], *items[meta + 1 :]]
    with pytest.raises(StoreDamaged, match="out of key order"):
        build(0, moved)


def test_a_store_closed_while_another_thread_asks_its_durable_offset_waits_for_the_answer(
    tmp_path: Path,
) -> None:
    """Retention asks a partition's durable offset from its own thread. A runner that stopped
    (a damaged log) closed its store during that question's WAL sync: rocksdict refused the
    close ("Already borrowed"), its traceback went to the log and the store stayed open."""
    store = RocksStateStore(tmp_path / "p0", 0)
    store.save(PartitionState(), [], through=7)
    real = store._db
    syncing, release = threading.Event(), threading.Event()

    class SlowSync:
        def flush_wal(self, sync: bool) -> None:
            syncing.set()
            assert release.wait(10)
            real.flush_wal(sync)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    class Watched:
        """The store's lock, telling when a second thread comes to it."""

        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.comers = 0
            self.second = threading.Event()

        def __enter__(self) -> None:
            self.comers += 1
            if self.comers == 2:
                self.second.set()
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    store._db = SlowSync()  # type: ignore[assignment]
    watched = Watched()
    store._closing = watched  # type: ignore[assignment]
    answers: list[int | BaseException] = []

    def ask() -> None:
        try:
            answers.append(store.durable_offset())
        except BaseException as err:
            answers.append(err)

    asker = threading.Thread(target=ask)
    asker.start()
    assert syncing.wait(10)
    closer = threading.Thread(target=store.close)
    closer.start()
    assert watched.second.wait(10)  # the close waits for the question's answer
    release.set()
    closer.join(10)
    asker.join(10)
    assert answers == [7]  # the question was answered, then the store closed
    with pytest.raises(Exception):  # noqa: B017  # a closed store answers nothing
        real.get(b"anything")
