"""Every branch over target kinds is exhaustive: a kind added to ``core.jobs.Target`` and
handled nowhere fails the type check at each branch (``assert_never``, or
``core.egress.refuse_unknown_kind`` where the answer at run time must be a refusal).

The check is mypy's own, run on a copy of the tree with one kind added."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from mypy import api as mypy

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "eventlog", "archive", "projections", "node", "api")
# Where the code branches over the kinds of Target, each by its function.
BRANCHES = {
    "core/jobs.py": ["pool", "_validate_target"],
    "core/egress.py": ["check_target"],
    "node/caller.py": ["call"],
    "node/executors.py": ["_limit"],
    "api/batch.py": ["check_target"],
}
NEW_KIND = """

class CronTarget(msgspec.Struct, frozen=True, tag="cron", gc=False):
    url: str


Target = HttpTarget | KafkaTarget | PullTarget | CronTarget
"""


def test_a_new_target_kind_fails_the_type_check_at_every_branch(tmp_path: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    jobs = tmp_path / "core/jobs.py"
    text = jobs.read_text(encoding="utf-8")
    old = "\nTarget = HttpTarget | KafkaTarget | PullTarget\n"
    assert old in text
    jobs.write_text(text.replace(old, NEW_KIND), encoding="utf-8")

    files = [str(tmp_path / f) for f in BRANCHES]
    out, err, status = mypy.run(
        [
            *files,
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "--follow-imports",
            "silent",
            "--no-error-summary",
        ]
    )
    assert status == 1, out + err
    failed: dict[str, int] = {}
    for line in out.splitlines():
        found = re.match(r"(.+?\.py):(\d+): error: .*\"CronTarget\"; expected \"Never\"", line)
        if found:
            relative = Path(found[1]).resolve().relative_to(tmp_path.resolve()).as_posix()
            failed[relative] = failed.get(relative, 0) + 1
    assert failed == {f: len(functions) for f, functions in BRANCHES.items()}, out
