"""serve's start check of the embedded log, run after the partitions recover: a check that
fails for another reason than damage is tried again until it passes, never left dead with the
node not ready for good."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cli import serve
from eventlog.embedded import EmbeddedLog


class _Recovered:
    def wait_recovered(self, timeout_s: float) -> bool:
        return True


def test_a_check_that_failed_runs_again_and_readiness_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = EmbeddedLog.open(tmp_path / "log", 1)
    real = log.verify
    calls: list[int] = []

    def flaky(*, since_last: bool = False) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("a transient read error")
        return real(since_last=since_last)

    log.verify = flaky  # type: ignore[method-assign]
    monkeypatch.setattr(serve, "LOG_CHECK_RETRY_S", 0.01)
    checked = threading.Event()
    try:
        serve._check_log_after_recovery(log, _Recovered(), False, checked)  # type: ignore[arg-type]
        assert checked.is_set()
        assert len(calls) == 2
    finally:
        log.close()
