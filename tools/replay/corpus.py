"""The log corpus: logs recorded by earlier builds, and what those builds made of them, kept
under ``tests/corpus/`` and replayed by every build (``tests/corpus/test_corpus.py``).

    python -m tools.replay corpus record tests/corpus/<name>     # this build's corpus
    python -m tools.replay corpus check tests/corpus/<name> ...  # replay one with this build

**Recording** drives the node's own parts (:mod:`tools.replay.corpus_scenario`: every
partition decided by ``core.partition.Partition``, its events appended to a real embedded log
by the partition's writer, on a fake clock) through a scenario that makes every kind of event,
and refuses to write a corpus that lacks one. It then writes, beside the log, what this build
makes of it, each by the code that makes it in a node::

    manifest.json        the build (git commit), the formats, the settings, the event kinds
    events.jsonl         the log as ``dump`` prints it: {"partition", "offset", "event"} lines
    states.json          each partition's state as the owner held it at the end
                         (``tools.replay.canonical.state_form``)
    trace.jsonl.gz       after each event, the job and the run it names and the state's counts:
                         what lets a check name the first event whose fold differs
    snapshots/p<N>/      two snapshots (``projections.snapshot``, written by ``FileSnapshots``):
                         one half-way (its tail folds in), one at the end (of the RocksDB state
                         store that ``catch_up`` filled)
    partitions/p<N>.bin  the core partition's snapshot (``Partition.snapshot``) at the end
    archive/             the log archived (``archive.archiver``), a few files per partition
    history/             a read-model checkpoint (``projections.history_checkpoint.take``)
    read_model.json      the read model's answers (``tools.replay.canonical.answers``)

**Checking** reads only those files. It folds each partition's events with this build's
``evolve`` and compares, event by event, with the trace and, at the end, with the recorded
state; restores each snapshot and compares it with the fold at its offset, and with its tail
folded in, with the end; restores the core partition's snapshot; reads the archive back; folds
a read model from the events and restores the recorded checkpoint, and compares the answers of
both with the recorded ones. A recorded form is read through this build's types first
(:mod:`tools.replay.canonical`), so a field added with a default is not a difference. Every
problem names the corpus, the partition, the offset and the event kind.

A corpus recorded by an older build may hold fewer files (one written before the read model
existed has no ``read_model.json``): a check looks at the files there are, and says which it
looked at.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from archive import files as archive_files
from archive.archive import Archive
from archive.archiver import Archiver
from archive.store import DirectoryStore
from core import events as ev
from core.clock import FakeClock
from core.events_schema import SCHEMA_VERSION
from core.partition import SNAPSHOT_FORMAT, Partition
from core.state import PartitionState, evolve
from eventlog.embedded import EmbeddedLog
from eventlog.port import EventLog, Record
from eventlog.snapshots import FileSnapshots, StoredSnapshot
from projections import history_checkpoint, snapshot, time_travel
from projections.read_model import ReadModel, ReadModelRunner
from projections.state_store import MemoryStateStore, RocksStateStore, catch_up
from tools.replay import corpus_scenario as scenario
from tools.replay import dump
from tools.replay.canonical import (
    Form,
    answers,
    first_difference,
    job_form,
    read_answers,
    read_job,
    read_run,
    read_state,
    run_form,
    state_form,
)
from tools.replay.records import events as events_of
from tools.replay.source import Layout

_REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 2
TENANTS = ["t1", "t2"]
ARCHIVE_FILE_RECORDS = 64
SETTINGS = {
    "lead_ms": scenario.LEAD.get("lead_ms", 0),
    "retention_ms": scenario.RETENTION_MS,
    "tick_ms": 10,
    "wheel_size": 64,
}


def formats() -> dict[str, int]:
    """The version of every format a corpus holds, as this build writes them."""
    return {
        "events_schema": SCHEMA_VERSION,
        "state_snapshot": SNAPSHOT_FORMAT,
        "snapshot_blob": snapshot.FORMAT,
        "archive": archive_files.FORMAT,
        "history_checkpoint": history_checkpoint.HISTORY_FORMAT,
        "read_model": history_checkpoint.READ_MODEL_FORMAT,
    }


def _build() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=False, cwd=_REPO
        ).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "subject": git("log", "-1", "--format=%s")[:120] or None,
        "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


# -- recording ---------------------------------------------------------------------------------


class CorpusError(Exception):
    """A corpus could not be recorded; the message says why."""


def record(out: Path, build: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record this build's corpus into ``out`` (which must not exist); its manifest.
    ``build``: what the manifest says recorded it, when the code is not a git checkout (an
    earlier build's, ``tests/corpus/record_older.sh``); by default the git commit it is."""
    if out.exists():
        raise CorpusError(f"{out} exists: a corpus is recorded once, into a new directory")
    with tempfile.TemporaryDirectory(prefix="corpus-record-") as tmp:
        staging = Path(tmp) / "corpus"
        staging.mkdir()
        manifest = _record(staging, Layout(Path(tmp) / "data"), build or _build())
        shutil.copytree(staging, out)
    return manifest


def _record(out: Path, layout: Layout, build: dict[str, Any]) -> dict[str, Any]:
    layout.data_dir.mkdir()
    layout.partitions_file.write_text(f"{PARTITIONS}\n")
    log = EmbeddedLog.open(layout.log_dir, PARTITIONS)
    clock = FakeClock(scenario.START)
    owner = scenario.Owner(log, clock)
    try:
        scenario.play(owner)
        missing = scenario.missing_kinds(owner.seen)
        if missing:
            raise CorpusError(
                f"the scenario made no {', '.join(missing)} event: add a request that makes it"
                " to tools/replay/corpus_scenario.py"
            )
        ends = {p: log.end_offset("events", p) for p in range(PARTITIONS)}
        records = {p: list(events_of(log, p, 0, ends[p])) for p in range(PARTITIONS)}
        with (out / "events.jsonl").open("w") as lines:  # as ``dump`` prints them
            lines.writelines(dump.line(r) + "\n" for rs in records.values() for r in rs)
        decoded = {p: [(r.offset, ev.decode(r.value)) for r in rs] for p, rs in records.items()}
        folded = _write_trace(out / "trace.jsonl.gz", decoded)
        states: dict[str, Form] = {}
        (out / "partitions").mkdir()
        for p, part in enumerate(owner.partitions):
            if folded[p].snapshot() != part.state.snapshot():
                raise CorpusError(f"partition {p}: the log folded is not the state decided")
            states[str(p)] = {"offset": ends[p], **state_form(part.state)}
            (out / "partitions" / f"p{p}.bin").write_bytes(part.snapshot())
        _write_json(out / "states.json", states)
        _write_snapshots(out / "snapshots", log, layout, decoded, clock.now_ms())
        archive = Archive(DirectoryStore(out / "archive"))
        archiver = Archiver(log, archive, file_records=ARCHIVE_FILE_RECORDS)
        for p in range(PARTITIONS):
            archiver.archive_until(p, ends[p])
        with ReadModel(layout.read_model_dir) as model:
            ReadModelRunner(log, model).run_once()
            _write_json(out / "read_model.json", answers(model, TENANTS))
            history_checkpoint.take(
                model,
                DirectoryStore(out),  # its keys begin with history/
                layout.node_dir,
                node_id="corpus-recorder",
                now_ms=clock.now_ms(),
            )
        kinds = Counter(type(e).__name__ for es in decoded.values() for _, e in es)
        manifest = {
            "recorded_by": build,
            "recorded_on": datetime.now(UTC).date().isoformat(),
            "recorder": "python -m tools.replay corpus record (tools/replay/corpus.py)",
            "log": "embedded",
            "partitions": PARTITIONS,
            "ends": {str(p): end for p, end in ends.items()},
            "now": clock.now_ms(),
            "settings": SETTINGS,
            "tenants": TENANTS,
            "formats": formats(),
            "kinds": dict(sorted(kinds.items())),
        }
        _write_json(out / "manifest.json", manifest)
        return manifest
    finally:
        owner.close()
        log.close()


_Numbered = list[tuple[int, ev.AnyEvent]]  # a partition's events, each with its offset


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=False) + "\n")


def _trace_entry(state: PartitionState, record_offset: int, event: ev.AnyEvent) -> Form:
    job = state.jobs.get(event.job_id)
    run_id = getattr(event, "run_id", None)
    run = None if run_id is None else state.runs.get(run_id)
    job_facts = None
    if job is not None:
        job_facts = job_form(job)
        job_facts.pop("spec")
    return {
        "offset": record_offset,
        "type": type(event).__name__,
        "job": job_facts,
        "run": None if run is None else run_form(run),
        "jobs": len(state.jobs),
        "runs": len(state.runs),
        "last_token": state.last_token,
    }


def _write_trace(path: Path, decoded: dict[int, _Numbered]) -> dict[int, PartitionState]:
    """Writes the trace of each partition's events folded in order; the states they fold to."""
    lines = []
    states: dict[int, PartitionState] = {}
    for p, events in decoded.items():
        state = states[p] = PartitionState(p)
        for offset, event in events:
            evolve(state, event)
            entry = {"partition": p, **_trace_entry(state, offset, event)}
            lines.append(json.dumps(entry, separators=(",", ":")) + "\n")
    path.write_bytes(gzip.compress("".join(lines).encode(), compresslevel=9, mtime=0))
    return states


def _write_snapshots(
    folder: Path, log: EventLog, layout: Layout, decoded: dict[int, _Numbered], now: int
) -> None:
    """Per partition a snapshot half-way, of a store saved batch by batch as a runner saves it,
    and one at the end, of the RocksDB store ``catch_up`` filled from the log."""
    snapshots = FileSnapshots(folder)
    for p, events in decoded.items():
        half = events[len(events) // 2][0]
        store = MemoryStateStore(p)
        state = PartitionState(p)
        numbered = [(offset, event) for offset, event in events if offset < half]
        for start in range(0, len(numbered), 16):
            batch = numbered[start : start + 16]
            for _, event in batch:
                evolve(state, event)
            store.save(state, batch)
        taken_at = numbered[-1][1].at
        snapshots.write(p, half, snapshot.encode(p, half, taken_at, store.dump()))
        with RocksStateStore.open(layout.node_dir, p) as rocks:
            catch_up(rocks, log, p)
            end = rocks.offset()
            snapshots.write(p, end, snapshot.encode(p, end, now, rocks.dump()))


# -- checking ----------------------------------------------------------------------------------


@dataclass
class Check:
    """What replaying one corpus found: ``problems`` (each names where), ``checked`` (what
    was compared)."""

    corpus: str
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        self.problems.append(f"corpus {self.corpus}: {text}")

    def describe(self) -> str:
        head = f"{self.corpus}: {'OK' if self.ok else 'DIFFERENT'} ({', '.join(self.checked)})"
        return "\n".join([head, *(f"  {p}" for p in self.problems)])


class _Line(msgspec.Struct):
    partition: int
    offset: int
    event: msgspec.Raw


@dataclass
class _Recorded:
    offset: int
    value: bytes
    kind: str  # the "type" the record names, whether or not this build decodes it


class _Kind(msgspec.Struct):
    type: str = "?"


_line_decoder = msgspec.json.Decoder(_Line)
_kind_decoder = msgspec.json.Decoder(_Kind)


def read_events(corpus: Path) -> dict[int, list[_Recorded]]:
    out: dict[int, list[_Recorded]] = {}
    for text in (corpus / "events.jsonl").read_bytes().splitlines():
        if not text.strip():
            continue
        line = _line_decoder.decode(text)
        value = bytes(line.event)
        try:
            kind = _kind_decoder.decode(value).type
        except (msgspec.DecodeError, msgspec.ValidationError):
            kind = "?"
        out.setdefault(line.partition, []).append(_Recorded(line.offset, value, kind))
    return out


def check(corpus: Path, work_dir: Path | None = None) -> Check:
    """Replay ``corpus`` with this build (see the module docstring)."""
    result = Check(corpus.name)
    manifest = json.loads((corpus / "manifest.json").read_text())
    events = read_events(corpus)
    unknown = sorted({r.kind for rs in events.values() for r in rs} - set(scenario.kinds()))
    if unknown:
        result.problem(f"event kinds this build does not know: {', '.join(unknown)}")
    stored = {p: _snapshots(corpus, p) for p in range(manifest["partitions"])}
    with tempfile.TemporaryDirectory(prefix="corpus-check-", dir=work_dir) as tmp:
        folds = _check_folds(corpus, events, manifest, stored, result)
        if folds is None:
            return result
        _check_snapshots(corpus, folds, stored, result)
        _check_partitions(corpus, manifest, folds, result)
        _check_archive(corpus, events, result)
        _check_read_model(corpus, events, manifest, Path(tmp), result)
    return result


@dataclass
class _Fold:
    """One partition folded by this build: its records decoded, the end state, and the state
    at each offset a snapshot was taken at (its form)."""

    events: list[tuple[_Recorded, ev.AnyEvent]]
    state: PartitionState
    at: dict[int, Form]


def _where(p: int, record: _Recorded) -> str:
    return f"partition {p} offset {record.offset} ({record.kind})"


def _check_folds(
    corpus: Path,
    events: dict[int, list[_Recorded]],
    manifest: dict[str, Any],
    stored: dict[int, list[StoredSnapshot]],
    result: Check,
) -> dict[int, _Fold] | None:
    states = json.loads((corpus / "states.json").read_text())
    trace = _read_trace(corpus)
    wanted = {p: {s.offset for s in snapshots} for p, snapshots in stored.items()}
    folds: dict[int, _Fold] = {}
    for p in range(manifest["partitions"]):
        records = events.get(p, [])
        state = PartitionState(p)
        decoded: list[tuple[_Recorded, ev.AnyEvent]] = []
        at: dict[int, Form] = {}
        steps = trace.get(p)
        differs = False
        for i, record in enumerate(records):
            if record.offset in wanted.get(p, ()):
                at[record.offset] = state_form(state)
            try:
                event = ev.decode(record.value)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                result.problem(f"{_where(p, record)} does not decode: {exc}")
                return None
            decoded.append((record, event))
            try:
                evolve(state, event)
            except Exception as exc:
                result.problem(f"{_where(p, record)} does not fold: {exc!r}")
                return None
            if steps is not None and not differs:
                said = _trace_difference(state, event, steps[i], record)
                if said is not None:
                    result.problem(f"the fold first differs at {_where(p, record)}: {said}")
                    differs = True
        for offset in wanted.get(p, ()):  # a snapshot at the end
            at.setdefault(offset, state_form(state))
        folds[p] = _Fold(decoded, state, at)
        recorded = states[str(p)]
        if recorded["offset"] != (records[-1].offset + 1 if records else 0):
            result.problem(
                f"partition {p}: states.json is at offset {recorded['offset']}, the events end"
                f" at {records[-1].offset + 1 if records else 0}"
            )
        found = first_difference(read_state(recorded), state_form(state))
        if found is not None and not differs:
            result.problem(f"partition {p}: the state folded to the end differs: {found}")
    result.checked.append(
        f"{sum(len(rs) for rs in events.values())} events folded" + (", traced" if trace else "")
    )
    return folds


def _read_trace(corpus: Path) -> dict[int, list[Form]]:
    path = corpus / "trace.jsonl.gz"
    if not path.exists():
        return {}
    out: dict[int, list[Form]] = {}
    for line in gzip.decompress(path.read_bytes()).splitlines():
        entry = json.loads(line)
        out.setdefault(entry["partition"], []).append(entry)
    return out


def _trace_difference(
    state: PartitionState, event: ev.AnyEvent, step: Form, record: _Recorded
) -> str | None:
    if step["offset"] != record.offset:
        return f"the trace is at offset {step['offset']}"
    job = state.jobs.get(event.job_id)
    if (step["job"] is None) != (job is None):
        return f"job {event.job_id}: {'absent' if job is None else 'present'} in the fold only"
    if job is not None:
        folded = job_form(job)
        spec = folded.pop("spec")
        found = first_difference(read_job(step["job"], spec), folded)
        if found is not None:
            return f"job {event.job_id}: {found}"
    run_id = getattr(event, "run_id", None)
    run = None if run_id is None else state.runs.get(run_id)
    if (step["run"] is None) != (run is None):
        return f"run {run_id}: {'absent' if run is None else 'present'} in the fold only"
    if run is not None:
        found = first_difference(read_run(step["run"]), run_form(run))
        if found is not None:
            return f"run {run_id}: {found}"
    for name, value in (
        ("jobs", len(state.jobs)),
        ("runs", len(state.runs)),
        ("last_token", state.last_token),
    ):
        if step[name] != value:
            return f"{name}: recorded {step[name]}, folded {value}"
    return None


def _snapshots(corpus: Path, p: int) -> list[StoredSnapshot]:
    """Every snapshot the corpus holds of ``p``, oldest first."""
    store = FileSnapshots(corpus / "snapshots")
    out: list[StoredSnapshot] = []
    found = store.latest(p)
    while found is not None:
        out.insert(0, found)
        found = store.older(p, found.offset)
    return out


def _check_snapshots(
    corpus: Path,
    folds: dict[int, _Fold],
    snapshots: dict[int, list[StoredSnapshot]],
    result: Check,
) -> None:
    if not (corpus / "snapshots").is_dir():
        return
    count = 0
    for p, fold in folds.items():
        for stored in snapshots[p]:
            count += 1
            where = f"partition {p}: the snapshot at offset {stored.offset}"
            try:
                restored = time_travel.restore(stored, p)
            except Exception as exc:
                result.problem(f"{where} cannot be restored: {exc}")
                continue
            found = first_difference(fold.at[stored.offset], state_form(restored))
            if found is not None:
                result.problem(f"{where} is not the fold to its offset: {found}")
                continue
            for record, event in fold.events:
                if record.offset < stored.offset:
                    continue
                try:
                    evolve(restored, event)
                except Exception as exc:
                    result.problem(
                        f"{where}: its tail does not fold in at {_where(p, record)}: {exc!r}"
                    )
                    break
            else:
                found = first_difference(state_form(fold.state), state_form(restored))
                if found is not None:
                    result.problem(f"{where} with its tail is not the fold to the end: {found}")
    result.checked.append(f"{count} snapshots restored")


def _check_partitions(
    corpus: Path, manifest: dict[str, Any], folds: dict[int, _Fold], result: Check
) -> None:
    folder = corpus / "partitions"
    if not folder.is_dir():
        return
    settings = manifest.get("settings", {})
    now = manifest["now"]
    for p, fold in folds.items():
        path = folder / f"p{p}.bin"
        if not path.exists():
            continue
        where = f"partition {p}: the core partition's snapshot"
        try:
            restored = Partition.restore(path.read_bytes(), now, **settings)
        except Exception as exc:
            result.problem(f"{where} cannot be restored: {exc}")
            continue
        found = first_difference(state_form(fold.state), state_form(restored.state))
        if found is not None:
            result.problem(f"{where} is not the fold to the end: {found}")
            continue
        rebuilt = Partition(p, now, fold.state, **settings)
        if (restored.next_deadline(), restored.parked()) != (
            rebuilt.next_deadline(),
            rebuilt.parked(),
        ):
            result.problem(f"{where} arms other timers than the fold's state does")
    result.checked.append("core partition snapshots restored")


def _check_archive(corpus: Path, events: dict[int, list[_Recorded]], result: Check) -> None:
    if not (corpus / "archive").is_dir():
        return
    archive = Archive(DirectoryStore(corpus / "archive"))
    files = 0
    for p, records in events.items():
        try:
            files += len(archive.files(p))
            through = archive.archived_through(p)
            read: list[tuple[int, bytes]] = []
            offset = 0
            while offset < through:
                batch = archive.read(p, offset, 1000)
                if not batch:
                    break
                read += [(r.offset, r.value) for r in batch]
                offset = batch[-1].offset + 1
        except Exception as exc:
            result.problem(f"partition {p}: the archive cannot be read: {exc}")
            continue
        expected = [(r.offset, r.value) for r in records if r.offset < through]
        if read != expected:
            first = next(
                (i for i, (a, b) in enumerate(zip(read, expected, strict=False)) if a != b),
                min(len(read), len(expected)),
            )
            at = expected[first][0] if first < len(expected) else read[first][0]
            result.problem(f"partition {p}: the archive differs from the log at offset {at}")
    result.checked.append(f"{files} archive files read")


def _check_read_model(
    corpus: Path,
    events: dict[int, list[_Recorded]],
    manifest: dict[str, Any],
    tmp: Path,
    result: Check,
) -> None:
    path = corpus / "read_model.json"
    if not path.exists():
        return
    recorded = read_answers(json.loads(path.read_text()))
    tenants = [t for t in recorded if t != "positions"]
    with ReadModel(tmp / "folded" / "read_model") as model:
        for p, records in sorted(events.items()):
            model.process_records(p, [Record(p, r.offset, r.value, None) for r in records])
        found = first_difference(recorded, answers(model, tenants))
    if found is not None:
        result.problem(f"the read model folded from the events answers otherwise: {found}")
    result.checked.append("read model folded")
    if not (corpus / "history").is_dir():
        return
    store_dir = tmp / "store"  # a copy: a restore drops a checkpoint it finds damaged
    shutil.copytree(corpus / "history", store_dir / "history")
    recorded_format = manifest.get("formats", {}).get("read_model")
    restored_at = tmp / "restored" / "read_model"
    restored_at.parent.mkdir()
    restored = history_checkpoint.restore(DirectoryStore(store_dir), restored_at)
    if recorded_format != history_checkpoint.READ_MODEL_FORMAT:
        # Another layout's checkpoint is passed over: the model is folded from zero instead.
        if restored is not None:
            result.problem(
                f"a read-model checkpoint of format {recorded_format} was restored by a build"
                f" of format {history_checkpoint.READ_MODEL_FORMAT}"
            )
        result.checked.append(f"read-model checkpoint of format {recorded_format} passed over")
        return
    if restored is None:
        result.problem("the read-model checkpoint cannot be restored")
        return
    with ReadModel(restored_at) as model:
        found = first_difference(recorded, answers(model, tenants))
    if found is not None:
        result.problem(f"the read-model checkpoint restored answers otherwise: {found}")
    result.checked.append("read-model checkpoint restored")


def corpora(root: Path) -> list[Path]:
    """The corpus directories under ``root``, oldest recording first (by name)."""
    return sorted(p.parent for p in root.glob("*/manifest.json"))
