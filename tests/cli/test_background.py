"""serve's background services (cli.background) under a supervisor: the start's check of the
log runs again after a failure and readiness follows it; damage leaves it undone for good; and
on a real node, serve's services start after the node's and one that dies is started again."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli import background, serve
from cli.retention_args import retention_from
from core.errors import LogCorrupted
from eventlog.embedded import EmbeddedLog
from node.node import Node
from node.supervisor import Supervisor
from node.worker import OneShot
from tests.node.test_snapshot_supervision import thread_deaths
from tests.projections.histories import Writers

__all__ = ["thread_deaths"]  # a fixture


class Seconds:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Recovered:
    def wait_recovered(self, timeout_s: float) -> bool:
        return True


def _supervised(service: OneShot, clock: Seconds, failed: list[str]) -> Supervisor:
    sup = Supervisor(on_failed=failed.append, clock=clock, every_s=3600)  # passes: the test's
    sup.add(service)
    return sup


def test_a_start_check_that_failed_runs_again_after_its_backoff_and_readiness_follows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
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
    clock = Seconds()
    failed: list[str] = []
    check = background.log_check(log, _Recovered(), full=False)  # type: ignore[arg-type]
    sup = _supervised(check, clock, failed)
    sup.start()
    try:
        assert check.join(10)  # the first check failed: its thread ended
        sup.check()
        assert failed == ["log-check"] and sup.down() == ["log-check (restarting)"]
        assert "the log-check thread ended: OSError('a transient read error')" in caplog.text
        clock.now += 1
        sup.check()
        assert check.done.wait(10)
        assert sup.down() == [] and len(calls) == 2
    finally:
        sup.stop()
        log.close()


def test_a_start_check_that_found_damage_is_never_done_nor_run_again(tmp_path: Path) -> None:
    log = EmbeddedLog.open(tmp_path / "log", 1)
    calls: list[int] = []

    def damaged(*, since_last: bool = False) -> int:
        calls.append(1)
        raise LogCorrupted("events of partition 0: checksum mismatch at offset 3")

    log.verify = damaged  # type: ignore[method-assign]
    clock = Seconds()
    failed: list[str] = []
    check = background.log_check(log, _Recovered(), full=False)  # type: ignore[arg-type]
    sup = _supervised(check, clock, failed)
    sup.start()
    try:
        assert check.join(10)
        clock.now += 3600
        sup.check()
        # The log has failed (the log watch stops the node): no restart, never ready.
        assert failed == [] and calls == [1]
        assert sup.down() == ["log-check (not running)"] and not check.done.is_set()
    finally:
        sup.stop()
        log.close()


def _checked_by(log: EmbeddedLog, checked: threading.Event, calls: list[int]) -> None:
    """Count the log's checks; ``checked`` is set once one ran after the start's."""
    real = log.verify

    def counted(*, since_last: bool = False) -> int:
        calls.append(real(since_last=since_last))
        if len(calls) >= 2:
            checked.set()
        return calls[-1]

    log.verify = counted  # type: ignore[method-assign]


def test_what_is_appended_while_serving_is_checked_so_a_start_checks_only_what_is_new(
    tmp_path: Path,
) -> None:
    log = EmbeddedLog.open(tmp_path / "log", 1)
    writers = Writers(log)
    checked = threading.Event()
    calls: list[int] = []
    _checked_by(log, checked, calls)
    start_check = background.log_check(log, _Recovered(), full=False)  # type: ignore[arg-type]
    serving = background.log_check_serving(log, start_check, every_s=0.01)
    try:
        serving.start()  # waits for the start's check
        writers.append(0, [b"{}"] * 30)
        start_check.start()
        assert start_check.join(10) and start_check.done.is_set()
        writers.append(0, [b"{}"] * 20)  # appended while serving
        assert checked.wait(10)
        assert sum(calls) == 50  # every record checked once: 30 at the start, 20 since
        serving.stop()
        assert serving.failure is None
        assert log.verify(since_last=True) == 0  # the next start's check: nothing new
    finally:
        serving.stop()
        writers.close()
        log.close()


def test_damage_found_while_serving_ends_the_checks_for_good(tmp_path: Path) -> None:
    log = EmbeddedLog.open(tmp_path / "log", 1)
    found = threading.Event()

    def damaged(*, since_last: bool = False) -> int:
        found.set()
        raise LogCorrupted("events of partition 0: checksum mismatch at offset 3")

    start_check = OneShot("log-check", lambda stopping: True)
    start_check.start()
    assert start_check.join(10)
    log.verify = damaged  # type: ignore[method-assign]
    serving = background.log_check_serving(log, start_check, every_s=0.01)
    try:
        serving.start()
        assert found.wait(10)
        assert serving.join(10)
        # The log has failed (the log watch stops the node): the thread ended by itself.
        assert not serving.alive and serving.failure is None
    finally:
        serving.stop()
        log.close()


def _args(data_dir: Path, *more: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", "--data-dir", str(data_dir), *more])


def test_serves_services_follow_the_nodes_and_one_that_dies_is_started_again(
    tmp_path: Path, thread_deaths: list[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen = threading.Event()
    monkeypatch.setattr(background.gc, "freeze", frozen.set)  # not this test process's heap
    args = _args(tmp_path, "--no-archive")
    log = EmbeddedLog.open(tmp_path / "log", 2)
    real_wait = log.wait_damaged
    waits: list[int] = []

    def wait_damaged(timeout_s: float | None = None) -> LogCorrupted | None:
        waits.append(1)
        if len(waits) == 1:
            raise SystemExit("the log watch was killed")  # the thread ends (a BaseException)
        return real_wait(timeout_s)

    log.wait_damaged = wait_damaged  # type: ignore[method-assign]
    clock = Seconds()
    node = Node(log, tmp_path / "node", monotonic=clock)
    server = SimpleNamespace(should_exit=False)
    damage: list[BaseException] = []
    added = background.services(args, log, None, retention_from(args), node, server, damage)
    assert [s.name for s in added] == [
        "log-watch", "log-check", "log-check-serving", "retention", "gc-freeze",
    ]  # fmt: skip
    assert [s.name for s in added if s.required] == ["log-watch", "log-check"]
    for service in added:
        node.services.add(service)
    assert [s.name for s in node.services.services][-6:] == [
        "standby",
        "log-watch",
        "log-check",
        "log-check-serving",
        "retention",
        "gc-freeze",
    ]
    node.start()
    try:
        watch = added[0]
        assert watch.join(10) and [type(e) for e in thread_deaths] == [SystemExit]
        assert node.wait_recovered(30)
        node.services.check()
        assert any("log-watch (restarting)" in reason for reason in node.not_ready())
        assert node.metrics.thread_failures.labels("log-watch")._value.get() == 1
        clock.now += 1
        node.services.check()
        assert watch.alive and node.wait_ready(30)
        assert frozen.wait(30)  # once ready, the gc freeze ran (and completed)
        assert not server.should_exit and damage == []
    finally:
        node.stop()
        log.close()
    assert not any(s.alive for s in added)
