"""Every log ever written still replays: each corpus under ``tests/corpus/`` (a log recorded by
an earlier build, with what that build made of it) is replayed by this build, and must give
the same states, snapshots, archive and read-model answers (``tools/replay/corpus.py``). A
change that breaks an old log fails here, naming the corpus, the partition, the offset and
the kind of the event where the fold first differs.

To record this build's corpus (when an event kind or a format version is added, two
tests below ask for one)::

    python -m tools.replay corpus record tests/corpus/<date>-v<events schema version>
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core import events as ev
from core.state import PartitionState, evolve
from tools.replay import corpus
from tools.replay.corpus_scenario import kinds

HERE = Path(__file__).parent
CORPORA = corpus.corpora(HERE)
NEWEST = CORPORA[-1]


@pytest.mark.parametrize("recorded", CORPORA, ids=[c.name for c in CORPORA])
def test_every_corpus_replays(recorded: Path, tmp_path: Path) -> None:
    result = corpus.check(recorded, tmp_path)
    assert result.ok, result.describe()


def test_this_builds_recorder_makes_every_kind_and_its_corpus_replays(tmp_path: Path) -> None:
    manifest = corpus.record(tmp_path / "now")
    assert sorted(manifest["kinds"]) == kinds()
    assert manifest["formats"] == corpus.formats()
    result = corpus.check(tmp_path / "now", tmp_path)
    assert result.ok, result.describe()


def test_a_corpus_holds_every_event_kind_of_this_build() -> None:
    held = {kind for c in CORPORA for kind in _manifest(c)["kinds"]}
    missing = [k for k in kinds() if k not in held]
    assert not missing, f"record a corpus with {missing}: see this module's docstring"


def test_a_corpus_holds_every_format_version_of_this_build() -> None:
    held = {(name, version) for c in CORPORA for name, version in _manifest(c)["formats"].items()}
    missing = [f"{n} {v}" for n, v in corpus.formats().items() if (n, v) not in held]
    assert not missing, f"record a corpus of {missing}: see this module's docstring"


def test_a_fold_that_changed_names_the_first_event_it_differs_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def changed(state: PartitionState, event: ev.AnyEvent) -> PartitionState:
        evolve(state, event)
        if isinstance(event, ev.RunFailed):  # a build that forgot the error
            state.runs[event.run_id].last_error = ""
        return state

    monkeypatch.setattr(corpus, "evolve", changed)
    result = corpus.check(NEWEST, tmp_path)
    assert not result.ok
    first = _first_failure(NEWEST)
    assert result.problems[0] == (
        f"corpus {NEWEST.name}: the fold first differs at partition {first[0]} offset"
        f" {first[1]} (RunFailed): run {first[2]}: last_error: recorded 'exit 1', folded ''"
    )


def test_an_event_this_build_cannot_read_is_named(tmp_path: Path) -> None:
    broken = tmp_path / NEWEST.name
    shutil.copytree(NEWEST, broken)
    lines = (broken / "events.jsonl").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"type":"LeaseGranted"' in line)
    line = json.loads(lines[at])
    line["event"]["fencing_token"] = "seven"  # a field retyped
    lines[at] = json.dumps(line)
    (broken / "events.jsonl").write_text("\n".join(lines) + "\n")
    result = corpus.check(broken, tmp_path)
    assert not result.ok
    assert result.problems[0].startswith(
        f"corpus {NEWEST.name}: partition {line['partition']} offset {line['offset']}"
        " (LeaseGranted) does not decode:"
    )


def test_a_snapshot_archive_or_checkpoint_that_changed_is_named(tmp_path: Path) -> None:
    broken = tmp_path / NEWEST.name
    shutil.copytree(NEWEST, broken)
    snap = sorted((broken / "snapshots" / "p0").glob("*.snap"))[0]
    snap.write_bytes(snap.read_bytes()[:-8])
    segment = sorted((broken / "archive" / "events" / "p00001").glob("*.jsonl.gz"))[0]
    segment.write_bytes(segment.read_bytes()[:-4] + b"\0\0\0\0")
    answers = json.loads((broken / "read_model.json").read_text())
    answers["t1"]["job_count"] += 1
    (broken / "read_model.json").write_text(json.dumps(answers))
    problems = "\n".join(corpus.check(broken, tmp_path).problems)
    assert f"partition 0: the snapshot at offset {int(snap.stem)} cannot be restored" in problems
    assert "partition 1: the archive cannot be read" in problems
    assert "the read model folded from the events answers otherwise: t1.job_count" in problems
    assert "the read-model checkpoint restored answers otherwise: t1.job_count" in problems


def _manifest(recorded: Path) -> dict[str, dict[str, int]]:
    data: dict[str, dict[str, int]] = json.loads((recorded / "manifest.json").read_text())
    return data


def _first_failure(recorded: Path) -> tuple[int, int, str]:
    """The partition, offset and run of the first RunFailed in partition order."""
    for text in (recorded / "events.jsonl").read_text().splitlines():
        line = json.loads(text)
        if line["event"]["type"] == "RunFailed":
            return line["partition"], line["offset"], line["event"]["run_id"]
    raise AssertionError("the corpus holds no RunFailed")
