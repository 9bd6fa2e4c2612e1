"""``rebuild``: throw away the state stores and/or the read model and fold them again from the log.

Everything but the log is derived, so this is always safe with the node stopped. Every store is
built beside the old one (``<name>.rebuild``), and they are swapped in only once all are
complete, so a rebuild that dies half-way leaves the old stores in place. A state store rebuilt
from offset 0 is byte-identical to one the node saved along the way
(``projections/state_store.py``, invariant 4).
Records that are not events are passed over, as the node passes over them, and counted in the
summary. A damaged log stops the rebuild (exit status 3) and leaves the old stores in place.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from eventlog.port import EventLog
from projections.decoding import EventDecoder, ForeignRecord
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import RocksStateStore, catch_up
from tools.replay.progress import Meter, Quiet
from tools.replay.records import events, tool_decoder
from tools.replay.source import Layout, check_unused


@dataclass(frozen=True, slots=True)
class Rebuilt:
    what: str
    events: int
    seconds: float

    def describe(self) -> str:
        rate = self.events / self.seconds if self.seconds > 0 else 0.0
        return f"{self.what}: {self.events} events in {self.seconds:.2f} s ({rate:,.0f} events/s)"


def _swap(fresh: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    fresh.rename(target)


def _scratch(target: Path) -> Path:
    fresh = target.with_name(target.name + ".rebuild")
    if fresh.exists():  # left by a rebuild that did not finish
        shutil.rmtree(fresh)
    fresh.parent.mkdir(parents=True, exist_ok=True)
    return fresh


@dataclass(frozen=True, slots=True)
class _Built:
    """A store folded beside its target, not swapped in yet."""

    fresh: Path
    target: Path
    rebuilt: Rebuilt


def build_state(
    log: EventLog,
    layout: Layout,
    partition: int,
    decoder: EventDecoder | None = None,
    meter: Meter | None = None,
) -> _Built:
    target = layout.state_dir(partition)
    check_unused(target, "state store")
    fresh = _scratch(target)
    started = time.perf_counter()
    with RocksStateStore(fresh, partition) as store:
        catch_up(store, log, partition, decoder=decoder, on_batch=(meter or Quiet()).advance)
        _, offset = store.load()
    elapsed = time.perf_counter() - started
    # Offsets need not be contiguous, so the count is read back rather than taken from offset.
    what = f"state p{partition} (next offset {offset})"
    return _Built(fresh, target, Rebuilt(what, _count(log, partition), elapsed))


def build_read_model(
    log: EventLog, layout: Layout, decoder: EventDecoder | None = None, meter: Meter | None = None
) -> _Built:
    target = layout.read_model_dir
    check_unused(target, "read model")
    fresh = _scratch(target)
    started = time.perf_counter()
    with ReadModel(fresh) as model:
        count = ReadModelRunner(log, model, decoder=decoder).run_once((meter or Quiet()).advance)
    return _Built(fresh, target, Rebuilt("read model", count, time.perf_counter() - started))


def _count(log: EventLog, partition: int) -> int:
    return sum(1 for _ in events(log, partition))


def rebuild(
    log: EventLog,
    layout: Layout,
    *,
    state: bool,
    read_model: bool,
    out: TextIO | None = None,
    meter: Meter | None = None,
) -> list[Rebuilt]:
    """Fold every store asked for beside the old one, then swap them all in: a rebuild that
    fails (a damaged log) leaves every old store as it was and no half-built one."""
    out = out or sys.stdout
    built: list[_Built] = []
    foreign: list[ForeignRecord] = []
    decoder = tool_decoder(foreign)  # one for both folds: each foreign record reported once
    meter = meter or Quiet()
    records = sum(log.end_offset("events", p) for p in range(log.num_partitions))
    try:
        if state:
            meter.start("state stores", records)
            for partition in range(log.num_partitions):
                built.append(build_state(log, layout, partition, decoder, meter))
        if read_model:
            meter.start("read model", records)
            built.append(build_read_model(log, layout, decoder, meter))
    except BaseException:
        for scratch in _scratches(layout, log.num_partitions):
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        meter.stop()
    for store in built:
        _swap(store.fresh, store.target)
    done = [store.rebuilt for store in built]
    for rebuilt in done:
        out.write(rebuilt.describe() + "\n")
    total = sum(r.events for r in done)
    seconds = sum(r.seconds for r in done)
    if done:
        out.write(Rebuilt("total", total, seconds).describe() + "\n")
    if foreign:
        out.write(f"passed over {len(foreign)} records that are not events (see stderr)\n")
    return done


def _scratches(layout: Layout, partitions: int) -> list[Path]:
    targets = [layout.state_dir(p) for p in range(partitions)] + [layout.read_model_dir]
    return [t.with_name(t.name + ".rebuild") for t in targets]
