"""A service: background work on a thread of its own, which the node's supervisor keeps alive.

Every piece of the node's background work is a :class:`Service` with one start/stop primitive,
and one :class:`~node.supervisor.Supervisor` owns them all: it starts them in order, stops them
in reverse, and starts again one whose thread ended while it should have run. The kinds here:

- :class:`PeriodicWorker`: one pass every interval until stopped; a pass that raises is
  reported and the next comes at its time (the stall watch, the history window, history
  checkpoints, retention);
- :class:`Worker`: a function that runs until it is stopped (the node's membership and mailbox
  threads, serve's log watch);
- :class:`OneShot`: a function that runs once and completes (serve's start check of the log,
  the gc freeze); a required one holds readiness until it has completed;
- :class:`Unwatched`: a part that keeps its threads going itself (the executors' loop, the
  read model's followers), started and stopped in its place among the others.

A thread "ended while it should have run" when its work raised (``failure`` says what) or a
``BaseException`` ended it; a work that returns by itself has finished for good (a one-shot
done, a log watch that saw damage) and is not started again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class Service(Protocol):
    """What the supervisor needs of a piece of background work.

    ``start`` puts the work on its thread and returns; ``stop`` asks it to end and waits for
    it (a bounded wait), and is harmless on a service never started or already stopped.
    ``alive``: its thread runs. ``started``: started and neither stopped nor finished since,
    so its thread should run: ``started and not alive`` is a thread that died. ``required``:
    the node is not ready while this service is not ``ready`` (for most, while its thread is not
    running; for a one-shot, until it has completed). ``name`` names it in logs and in
    ``cronlog_thread_failures_total{thread}``; ``failure`` is what ended its thread, when known.
    """

    @property
    def name(self) -> str: ...

    @property
    def required(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def alive(self) -> bool: ...

    @property
    def started(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def failure(self) -> BaseException | None: ...


def backoff_s(failures: int, first_s: float, max_s: float) -> float:
    """The wait after the ``failures``-th failure in a row: ``first_s``, doubling, at most
    ``max_s``."""
    return min(max_s, first_s * 2.0 ** max(0, failures - 1))


class SupervisedWorker:
    """A :class:`Service` with one thread. A subclass names it (``_thread_name``), sets
    ``_thread`` when it starts and says with ``_stopped_flag`` whether it was asked to stop;
    ``_finished`` once its work returned by itself."""

    _thread_name = "worker"
    required = False
    failure: BaseException | None = None
    _thread: threading.Thread | None = None
    _finished = False

    @property
    def name(self) -> str:
        return self._thread_name

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        """Started and not stopped or finished since: its thread should be alive."""
        return self._thread is not None and not self._stopped_flag() and not self._finished

    @property
    def ready(self) -> bool:
        return self.alive

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end; whether it has."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return not self.alive

    def _stopped_flag(self) -> bool:
        raise NotImplementedError


class ThreadWorker(SupervisedWorker):
    """A worker whose thread runs ``_work()``. ``stop`` sets ``_stopping`` and calls
    ``_wake`` (for a thread waiting on something else than ``_stopping``), then waits for the
    thread. What ``_work`` raises ends the thread and is kept in ``failure``: the supervisor
    says so and starts the worker again (a ``BaseException`` is also raised on, to
    ``threading.excepthook``)."""

    _stop_timeout_s = 10.0

    def _work(self) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        pass

    def start(self) -> None:
        if self.alive:
            return  # one thread at a time
        self._stopping = threading.Event()
        self._finished = False
        self.failure = None
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        self._wake()
        self._thread.join(self._stop_timeout_s if timeout_s is None else timeout_s)

    def _stopped_flag(self) -> bool:
        return self._stopping.is_set()

    def _main(self) -> None:
        try:
            self._work()
        except Exception as err:
            self.failure = err
            return
        except BaseException as err:
            self.failure = err
            raise
        self._finished = True


class PeriodicWorker(ThreadWorker):
    """A worker whose thread makes one pass every ``_interval_s()`` until stopped.
    A pass that raises is handed to ``_failed`` (inside the ``except``, so ``log.exception``
    there has the traceback) and the next pass comes at its time: one failure never ends the
    thread. ``_wait_first``: wait an interval before the first pass, rather than after it."""

    _thread_name = "periodic"
    _wait_first = False

    def _pass(self) -> object:
        raise NotImplementedError

    def _interval_s(self) -> float:
        raise NotImplementedError

    def _failed(self) -> None:
        raise NotImplementedError

    def _work(self) -> None:
        if self._wait_first and self._stopping.wait(self._interval_s()):
            return
        while not self._stopping.is_set():
            try:
                self._pass()
            except Exception:
                self._failed()
            if self._stopping.wait(self._interval_s()):
                return


class Worker(ThreadWorker):
    """``work(stopping)`` on a thread of its own, until ``stopping`` is set (or it returns by
    itself: finished for good). ``opens`` runs in ``start`` before the thread (each start:
    make it idempotent), ``closes`` in ``stop`` once the thread has ended."""

    def __init__(
        self,
        name: str,
        work: Callable[[threading.Event], None],
        *,
        required: bool = False,
        opens: Callable[[], None] | None = None,
        closes: Callable[[], None] | None = None,
    ) -> None:
        self._thread_name = name
        self.required = required
        self._function = work
        self._opens = opens
        self._closes = closes
        self._opened = False

    def start(self) -> None:
        if self.alive:
            return
        if self._opens is not None:
            self._opens()
        self._opened = True
        super().start()

    def stop(self, timeout_s: float | None = None) -> None:
        super().stop(timeout_s)
        if self._opened and self._closes is not None:
            self._opened = False
            self._closes()

    def _work(self) -> None:
        self._function(self._stopping)


class OneShot(ThreadWorker):
    """``work(stopping)`` once, on a thread of its own: it returns True once done (``done`` is
    set, ``ready`` from then on), False when it ended without doing it (stopped, or given up
    for good). Raising ends the thread unfinished, and the supervisor starts it again: the work
    runs again from its beginning."""

    def __init__(
        self, name: str, work: Callable[[threading.Event], bool], *, required: bool = False
    ) -> None:
        self._thread_name = name
        self.required = required
        self._function = work
        self.done = threading.Event()

    @property
    def ready(self) -> bool:
        return self.done.is_set()

    def _work(self) -> None:
        if self._function(self._stopping):
            self.done.set()


class Unwatched:
    """A part that keeps its own threads going (they retry their work themselves) and whose
    threads the supervisor cannot see: it is started and stopped in its place among the
    services, and taken to be alive while started."""

    required = False
    failure: BaseException | None = None

    def __init__(self, name: str, start: Callable[[], None], stop: Callable[[], None]) -> None:
        self.name = name
        self._start = start
        self._stop = stop
        self._started = False

    def start(self) -> None:
        self._start()
        self._started = True

    def stop(self) -> None:
        self._started = False
        self._stop()

    @property
    def alive(self) -> bool:
        return self._started

    @property
    def started(self) -> bool:
        return self._started

    @property
    def ready(self) -> bool:
        return self._started
