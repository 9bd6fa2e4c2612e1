"""The SDK is what teams install beside their code: its own distribution, holding its own
package only, importable without anything of the service's."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[2] / "sdk" / "python"
SERVICE_PACKAGES = {"core", "api", "node", "tools", "eventlog", "projections", "cli"}

pytestmark = pytest.mark.slow


def test_the_wheel_holds_cronlog_client_only(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(SDK)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("cronlog_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"cronlog_client"}
    assert "cronlog_client/py.typed" in names
    requires = sorted(
        line.split(":", 1)[1].strip().split(">")[0].split("<")[0]
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    )
    assert requires == ["httpx", "httpx-sse", "msgspec"]


def test_importing_it_loads_nothing_of_the_service(tmp_path: Path) -> None:
    check = (
        "import sys, cronlog_client, cronlog_client.worker, cronlog_client.target\n"
        f"service = {sorted(SERVICE_PACKAGES)!r}\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & set(service))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
