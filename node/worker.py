"""A worker with a thread of its own that the node keeps alive."""

from __future__ import annotations

import threading


class SupervisedWorker:
    """``Node._supervise`` starts the worker again when its thread ended while it was still
    meant to run: ``started`` and not ``alive``. A subclass sets ``_thread`` when it starts and
    says with ``_stopped_flag`` whether it was asked to stop."""

    _thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        """Started and not stopped since: its thread should be alive."""
        return self._thread is not None and not self._stopped_flag()

    def _stopped_flag(self) -> bool:
        raise NotImplementedError


class PeriodicWorker(SupervisedWorker):
    """A supervised worker whose thread makes one pass every ``_interval_s()`` until stopped.
    A pass that raises is handed to ``_failed`` (inside the ``except``, so ``log.exception``
    there has the traceback) and the next pass comes at its time: one failure never ends the
    thread. ``_wait_first``: wait an interval before the first pass, rather than after it."""

    _thread_name = "periodic"
    _wait_first = False
    _stop_timeout_s = 10.0

    def _pass(self) -> object:
        raise NotImplementedError

    def _interval_s(self) -> float:
        raise NotImplementedError

    def _failed(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join(self._stop_timeout_s if timeout_s is None else timeout_s)

    def _stopped_flag(self) -> bool:
        return self._stopping.is_set()

    def _run(self) -> None:
        if self._wait_first and self._stopping.wait(self._interval_s()):
            return
        while not self._stopping.is_set():
            try:
                self._pass()
            except Exception:
                self._failed()
            if self._stopping.wait(self._interval_s()):
                return
