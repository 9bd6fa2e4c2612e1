"""Work handed from the node's threads to an asyncio loop, with one wake-up per burst.

``loop.call_soon_threadsafe`` writes a byte to the loop's self-pipe on every call. A partition
runner answering a batch of 500 completions, or starting 500 leases, would make 500 system
calls and wake the loop as often; in a midnight herd that was a fifth of the node's busy time.
A :class:`Handoff` queues the calls and wakes the loop once, when the queue goes from empty
to not empty; the loop then runs everything queued so far, in order.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Handoff:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._queued: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._woken = False

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        """Have the loop call ``fn(*args)`` soon (from any thread; in order). Raises
        ``RuntimeError`` if the loop is closed, as ``call_soon_threadsafe`` does."""
        with self._lock:
            self._queued.append((fn, args))
            if self._woken:
                return
            self._woken = True
        try:
            self._loop.call_soon_threadsafe(self._run)
        except RuntimeError:
            with self._lock:
                self._woken = False
                self._queued.clear()
            raise

    def _run(self) -> None:
        with self._lock:
            queued, self._queued = self._queued, deque()
            self._woken = False
        for fn, args in queued:
            try:
                fn(*args)
            except Exception:
                log.exception("a call handed to the loop failed")


_handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Handoff] = (
    weakref.WeakKeyDictionary()
)
_handoffs_lock = threading.Lock()


def handoff_to(loop: asyncio.AbstractEventLoop) -> Handoff:
    """The one :class:`Handoff` of ``loop``."""
    with _handoffs_lock:
        handoff = _handoffs.get(loop)
        if handoff is None:
            handoff = _handoffs[loop] = Handoff(loop)
        return handoff
