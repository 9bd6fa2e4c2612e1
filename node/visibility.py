"""Read-your-writes without a thread per waiting request.

A write's answer waits until the read model has folded the write's last event
(:meth:`Visibility.wait`). The wait is a future in the caller's event loop, settled by the read
model's observer callback (:meth:`Visibility.folded`) through the loop's
:class:`~node.handoff.Handoff`: no worker thread blocks per request (a blocking wait in the
default executor held one of its few threads per request, so 64 concurrent creates queued
for threads, not for the log), and one fold wakes the loop once for every request it answers.

A waiter registers before it looks at the model's position: a fold between the look and the
registration is seen by the look, and a fold after it settles the future, so no wake is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from node.handoff import handoff_to
from projections.read_model import ReadModel, ReadyRun

_Waiter = tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]  # offset, loop, future


class Visibility:
    def __init__(self, history: ReadModel) -> None:
        self._history = history
        self._lock = threading.Lock()
        self._waiting: dict[int, list[_Waiter]] = {}  # by partition

    def folded(self, positions: dict[int, int], ready: list[ReadyRun]) -> None:
        """(The read model's observer, on its thread.) Settle every wait the fold satisfied."""
        settled: list[_Waiter] = []
        with self._lock:
            for partition, position in positions.items():
                waiting = self._waiting.get(partition)
                if not waiting:
                    continue
                keep: list[_Waiter] = []
                for entry in waiting:
                    (settled if entry[0] < position else keep).append(entry)
                if keep:
                    self._waiting[partition] = keep
                else:
                    del self._waiting[partition]
        for _, loop, future in settled:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits there
                handoff_to(loop).post(_settle, future)

    async def wait(self, partition: int, offset: int, timeout_s: float) -> bool:
        """Until the event at ``offset`` of ``partition`` is queryable (True), or ``timeout_s``
        passes (False)."""
        if self._history.position(partition) > offset:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry: _Waiter = (offset, loop, future)
        with self._lock:
            self._waiting.setdefault(partition, []).append(entry)
        try:
            if self._history.position(partition) > offset:
                return True
            await asyncio.wait_for(future, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                waiting = self._waiting.get(partition)
                if waiting is not None and entry in waiting:
                    waiting.remove(entry)
                    if not waiting:
                        del self._waiting[partition]

    def waiting(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiting.values())


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
