"""Mailboxes for a log whose nodes all live in one process (the memory and embedded logs).

A reply there never crosses a process, so it needs no storage: one queue per node id.
"""

from __future__ import annotations

import threading
from collections import deque


class LocalMailbox:
    def __init__(self, post_office: LocalPostOffice, node_id: str) -> None:
        self._post_office = post_office
        self._node_id = node_id
        self._queue: deque[bytes] = deque()
        self._cv = threading.Condition()

    def deliver(self, value: bytes) -> None:
        with self._cv:
            self._queue.append(value)
            self._cv.notify_all()

    def poll(self, timeout_s: float) -> list[bytes]:
        with self._cv:
            if not self._queue:
                self._cv.wait(timeout_s)
            out = list(self._queue)
            self._queue.clear()
            return out

    def close(self) -> None:
        self._post_office.forget(self._node_id, self)


class LocalPostOffice:
    """node id -> its mailbox; a reply to a node with no mailbox is dropped."""

    def __init__(self) -> None:
        self._boxes: dict[str, LocalMailbox] = {}
        self._lock = threading.Lock()

    def send(self, node_id: str, value: bytes) -> None:
        with self._lock:
            box = self._boxes.get(node_id)
        if box is not None:
            box.deliver(value)

    def open(self, node_id: str) -> LocalMailbox:
        box = LocalMailbox(self, node_id)
        with self._lock:
            self._boxes[node_id] = box
        return box

    def forget(self, node_id: str, box: LocalMailbox) -> None:
        with self._lock:
            if self._boxes.get(node_id) is box:
                del self._boxes[node_id]
