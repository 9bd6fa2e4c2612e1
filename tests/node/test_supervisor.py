"""The supervisor owns every background service: it starts them in order, stops them in reverse,
and starts again, after a doubling backoff, one whose thread ended; a required one that is down
keeps the node from being ready, named. Time is a fake clock: the tests make the passes."""

from __future__ import annotations

import logging
import threading

import pytest

from node.supervisor import Supervisor
from node.worker import OneShot, ThreadWorker


class Seconds:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Doomed(ThreadWorker):
    """A service whose thread runs until it is stopped, or is killed (its work raises)."""

    def __init__(
        self, name: str, *, required: bool = False, journal: list[str] | None = None
    ) -> None:
        self._thread_name = name
        self.required = required
        self.journal = journal if journal is not None else []
        self.fail_start = False

    def start(self) -> None:
        if self.fail_start:
            raise OSError(f"{self.name} cannot start")
        self.journal.append(f"start {self.name}")
        self._woken = threading.Event()
        self._killed = False
        super().start()

    def stop(self, timeout_s: float | None = None) -> None:
        self.journal.append(f"stop {self.name}")
        super().stop(timeout_s)

    def _wake(self) -> None:
        self._woken.set()

    def _work(self) -> None:
        self._woken.wait()
        if self._killed:
            raise RuntimeError(f"{self.name} was killed")

    def kill(self) -> None:
        """End the thread as a bug would, and wait until it has ended."""
        self._killed = True
        self._woken.set()
        assert self.join(10)


@pytest.fixture
def clock() -> Seconds:
    return Seconds()


def supervisor(clock: Seconds, failed: list[str]) -> Supervisor:
    # Passes come from the tests; the supervisor's own thread waits an hour for its first.
    return Supervisor(
        on_failed=failed.append,
        clock=clock,
        every_s=3600,
        first_restart_s=1,
        max_restart_s=4,
        healthy_after_s=60,
    )


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


def test_a_service_whose_thread_dies_is_counted_said_once_and_started_again_with_backoff(
    clock: Seconds, caplog: pytest.LogCaptureFixture
) -> None:
    failed: list[str] = []
    sup = supervisor(clock, failed)
    retention = sup.add(Doomed("retention"))
    sup.start()
    try:
        for n, wait_s in enumerate((1.0, 2.0, 4.0, 4.0), 1):  # doubling, capped at 4
            retention.kill()
            sup.check()
            sup.check()  # still down: nothing more is said or counted
            assert failed == ["retention"] * n
            assert len(_errors(caplog)) == n
            clock.now += wait_s - 0.5
            sup.check()
            assert not retention.alive, "started again before its backoff was over"
            clock.now += 0.5
            sup.check()
            assert retention.alive and retention.started
        said = _errors(caplog)
        assert said[0] == (
            "the retention thread ended: RuntimeError('retention was killed');"
            " starting it again in 1 s (1 in a row)"
        )
        assert said[3].endswith("starting it again in 4 s (4 in a row)")
        assert all(r.exc_info is not None for r in caplog.records if r.levelno == logging.ERROR)
        # Alive long enough after its last start: the streak is forgotten.
        clock.now += 60
        sup.check()
        retention.kill()
        sup.check()
        assert _errors(caplog)[-1].endswith("starting it again in 1 s (1 in a row)")
    finally:
        sup.stop()


def test_a_required_service_down_or_restarting_is_named_and_others_are_not(
    clock: Seconds,
) -> None:
    failed: list[str] = []
    sup = supervisor(clock, failed)
    watch = sup.add(Doomed("log-watch", required=True))
    retention = sup.add(Doomed("retention"))
    assert sup.down() == ["log-watch (not running)"]  # before the start
    sup.start()
    try:
        assert sup.down() == []
        watch.kill()
        assert sup.down() == ["log-watch (not running)"]  # ended, not noticed yet
        sup.check()
        assert sup.down() == ["log-watch (restarting)"]
        assert not sup.wait_up(0.01)
        retention.kill()
        sup.check()
        assert sup.down() == ["log-watch (restarting)"]  # retention is not required
        clock.now += 1
        sup.check()
        assert sup.down() == [] and sup.wait_up(0)
        assert failed == ["log-watch", "retention"]
    finally:
        sup.stop()


def test_services_stop_in_the_reverse_order_of_their_start(clock: Seconds) -> None:
    journal: list[str] = []
    sup = supervisor(clock, [])
    for name in ("decision-log", "executors", "membership"):
        sup.add(Doomed(name, journal=journal))
    sup.start()
    sup.stop()
    assert journal == [
        "start decision-log",
        "start executors",
        "start membership",
        "stop membership",
        "stop executors",
        "stop decision-log",
    ]
    assert [s.name for s in sup.services] == ["decision-log", "executors", "membership"]


def test_a_service_that_cannot_start_stops_those_started_before_it(clock: Seconds) -> None:
    journal: list[str] = []
    sup = supervisor(clock, [])
    for name in ("a", "b", "c"):
        sup.add(Doomed(name, journal=journal))
    b = sup.services[1]
    assert isinstance(b, Doomed)
    b.fail_start = True
    with pytest.raises(OSError, match="b cannot start"):
        sup.start()
    assert journal == ["start a", "stop a"]
    assert not sup.watch.alive


def test_a_service_that_cannot_start_again_is_tried_again_later(
    clock: Seconds, caplog: pytest.LogCaptureFixture
) -> None:
    failed: list[str] = []
    sup = supervisor(clock, failed)
    relay = sup.add(Doomed("relay"))
    sup.start()
    try:
        relay.kill()
        sup.check()
        relay.fail_start = True
        clock.now += 1
        sup.check()
        assert _errors(caplog)[-1].startswith(
            "the relay thread could not be started again: OSError('relay cannot start');"
            " starting it again in 2 s (2 in a row)"
        )
        relay.fail_start = False
        clock.now += 2
        sup.check()
        assert relay.alive and failed == ["relay", "relay"]
    finally:
        sup.stop()


def test_a_required_one_shot_holds_readiness_until_done_and_is_not_started_again(
    clock: Seconds,
) -> None:
    go = threading.Event()
    runs: list[int] = []

    def check(stopping: threading.Event) -> bool:
        runs.append(1)
        if len(runs) == 1:
            raise OSError("a transient read error")
        return go.wait(10)

    failed: list[str] = []
    sup = supervisor(clock, failed)
    log_check = sup.add(OneShot("log-check", check, required=True))
    sup.start()
    try:
        assert log_check.join(10)  # the first run raised
        sup.check()
        assert failed == ["log-check"] and sup.down() == ["log-check (restarting)"]
        clock.now += 1
        sup.check()  # runs again from its beginning
        assert sup.down() == ["log-check (at work)"]
        go.set()
        assert log_check.done.wait(10) and log_check.join(10)
        assert sup.down() == [] and not log_check.started
        clock.now += 3600
        sup.check()
        assert len(runs) == 2 and failed == ["log-check"]  # done: never started again
    finally:
        sup.stop()


def test_the_supervisors_own_thread_makes_the_passes(clock: Seconds) -> None:
    """With a real interval the supervisor's thread notices by itself (the passes above came
    from the tests)."""
    failed: list[str] = []
    noticed = threading.Event()

    def on_failed(name: str) -> None:
        failed.append(name)
        noticed.set()

    sup = Supervisor(on_failed=on_failed, clock=clock, every_s=0.01)
    standby = sup.add(Doomed("standby"))
    sup.start()
    try:
        standby.kill()
        assert noticed.wait(10)
        assert failed == ["standby"] and sup.watch.alive
    finally:
        sup.stop()
    assert not sup.watch.alive
