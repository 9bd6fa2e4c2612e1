"""The supervisor: one owner for every background service of a node.

A node's background work is a list of services (:class:`~node.worker.Service`), given to one
:class:`Supervisor` in the order they depend on each other (the node's own in
``Node.__init__``, then what ``cronlog serve`` adds). ``start`` starts them in that order and
then its own thread; ``stop`` stops that thread, then the services in the reverse order, so
nothing is stopped under a service still using it.

Between the two, the supervisor's thread makes a pass every second (:meth:`Supervisor.check`).
A service whose thread ended while it should have run (``started and not alive``) is logged at
ERROR once, with its name and what ended it, counted (``on_failed(name)``: the node counts
``cronlog_thread_failures_total{thread=<name>}``) and started again after a backoff that
doubles with each failure in a row, so a thread that dies at once does not spin. Alive for
``healthy_after_s`` after a restart, its failures are forgotten. A required service that is
down, waiting to be started again or (a one-shot) not done yet is named by :meth:`down`, and
the node is not ready meanwhile (``/readyz`` answers 503 naming it). With the defaults (first
wait 1 s, at most 60 s)::

    t=0.0   retention's thread ends (a pass raised SystemExit): ERROR, counted, due at t=1
    t=1.0   started again
    t=1.4   ends again (2 in a row): ERROR, counted, due at t=3
    t=3.0   started again; ... 4, 8, 16, 32, then every 60 s while it keeps dying
    t=63.0  alive 60 s since its last start: the streak is forgotten (the next waits 1 s)

The supervisor's own thread is a :class:`~node.worker.PeriodicWorker` (``watch``): a pass
that raises is logged and counted (``supervisor``) and the next comes at its time; the node's
membership thread, itself a supervised service, starts the watch again should it end.

(River's ``internal/maintenance`` has the same shape: one start/stop primitive per service and
one maintainer that owns them all.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from node.worker import PeriodicWorker, Service, backoff_s

log = logging.getLogger(__name__)

PASS_EVERY_S = 1.0
FIRST_RESTART_S = 1.0
MAX_RESTART_S = 60.0
HEALTHY_AFTER_S = 60.0

S = TypeVar("S", bound=Service)


@dataclass
class _Watched:
    service: Service
    failures: int = 0  # its thread's ends in a row
    restart_at: float | None = None  # down, started again at this instant
    restarted_at: float = 0.0


class Supervisor:
    def __init__(
        self,
        *,
        on_failed: Callable[[str], None] = lambda name: None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = PASS_EVERY_S,
        first_restart_s: float = FIRST_RESTART_S,
        max_restart_s: float = MAX_RESTART_S,
        healthy_after_s: float = HEALTHY_AFTER_S,
    ) -> None:
        """``clock``: seconds, monotonic (tests drive a fake one; the passes still come every
        ``every_s`` of real time)."""
        self._on_failed = on_failed
        self._clock = clock
        self._first_restart_s = first_restart_s
        self._max_restart_s = max_restart_s
        self._healthy_after_s = healthy_after_s
        self._watched: list[_Watched] = []
        self._pass_lock = threading.Lock()  # one pass at a time, never beside start or stop
        self._changed = threading.Condition()  # told after each pass, and at stop
        self._running = False
        self._stopping = False
        self.watch = _Watch(self.check, every_s, on_failed)

    def add(self, service: S) -> S:
        """Put ``service`` after those added before it (it starts after them and stops before
        them). Before :meth:`start` only; names are unique (they label the metrics)."""
        with self._pass_lock:
            if self._running:
                raise RuntimeError(f"{service.name}: services are added before the start")
            if any(w.service.name == service.name for w in self._watched):
                raise ValueError(f"a service named {service.name} is already supervised")
            self._watched.append(_Watched(service))
        return service

    @property
    def services(self) -> list[Service]:
        """In the order they start."""
        return [w.service for w in self._watched]

    def start(self) -> None:
        """Start every service in order, then the supervisor's thread. A service that fails to
        start stops those started before it (in reverse) and the error is raised."""
        with self._pass_lock:
            started: list[Service] = []
            try:
                for w in self._watched:
                    w.service.start()
                    started.append(w.service)
            except BaseException:
                for service in reversed(started):
                    _stop(service)
                raise
            self._running = True
        self.watch.start()

    def stop(self) -> None:
        """Stop the supervisor's thread (nothing is started again from now on), then every
        service in the reverse order of their start."""
        self.watch.stop()
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        with self._pass_lock:
            self._running = False
            for w in reversed(self._watched):
                _stop(w.service)

    def check(self) -> None:
        """One pass: note the threads that ended, start again those whose wait is over."""
        with self._pass_lock:
            if not self._running:
                return
            now = self._clock()
            for w in self._watched:
                self._look_at(w, now)
        with self._changed:
            self._changed.notify_all()

    def _look_at(self, w: _Watched, now: float) -> None:
        service = w.service
        if w.restart_at is not None:
            if now < w.restart_at:
                return
            w.restart_at = None
            w.restarted_at = now
            try:
                service.start()
            except Exception as err:
                self._failed(w, now, "could not be started again", err)
                return
            log.warning("the %s thread was started again", service.name)
        elif service.started and not service.alive:
            self._failed(w, now, "ended", service.failure)
        elif w.failures and service.alive and now - w.restarted_at >= self._healthy_after_s:
            w.failures = 0

    def _failed(self, w: _Watched, now: float, what: str, cause: BaseException | None) -> None:
        w.failures += 1
        delay = backoff_s(w.failures, self._first_restart_s, self._max_restart_s)
        w.restart_at = now + delay
        self._on_failed(w.service.name)
        log.error(
            "the %s thread %s%s; starting it again in %.0f s (%d in a row)",
            w.service.name,
            what,
            "" if cause is None else f": {cause!r}",
            delay,
            w.failures,
            exc_info=cause,
        )

    def down(self) -> list[str]:
        """The required services that keep the node from being ready, each with why:
        ``restarting`` (its thread ended, it is started again after its backoff), ``at work``
        (a one-shot not done yet), ``not running``."""
        down = []
        for w in list(self._watched):
            service = w.service
            if not service.required:
                continue
            if w.restart_at is not None:
                down.append(f"{service.name} (restarting)")
            elif not service.ready:
                down.append(f"{service.name} ({'at work' if service.alive else 'not running'})")
        return down

    def wait_up(self, timeout_s: float) -> bool:
        """Wait until no required service is down (seen at the end of a pass), or the
        supervisor stops; whether none is."""
        with self._changed:
            self._changed.wait_for(lambda: self._stopping or not self.down(), timeout_s)
        return not self.down()


class _Watch(PeriodicWorker):
    """The supervisor's own thread: a pass every ``every_s``, the first one ``every_s`` after
    the services started."""

    _thread_name = "supervisor"
    _wait_first = True

    def __init__(
        self, check: Callable[[], None], every_s: float, on_failed: Callable[[str], None]
    ) -> None:
        self._check = check
        self._every_s = every_s
        self._on_failed = on_failed

    def _pass(self) -> None:
        self._check()

    def _interval_s(self) -> float:
        return self._every_s

    def _failed(self) -> None:
        log.exception("the supervisor's pass failed; the next comes at its time")
        self._on_failed(self.name)


def _stop(service: Service) -> None:
    """Stop ``service``; a failure is logged, and the other services are stopped all the
    same."""
    try:
        service.stop()
    except Exception:
        log.exception("stopping the %s service failed", service.name)
