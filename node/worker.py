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
