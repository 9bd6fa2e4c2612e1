"""Work kept per team and taken one team after another.

Wherever a node queues work of many teams and takes it a piece at a time (timers that came
due, leases to dispatch, calls to start), a FIFO lets one team's herd hold back another team's
single piece for as long as the herd takes. :class:`Turns` keeps each team's pieces in the
order they came and hands them out one team after another, so a piece waits behind at most
one piece of each other team with work queued, whatever their sizes::

    turns = Turns()
    for i in range(3):
        turns.append("a", f"a{i}")
    turns.append("b", "b0")
    [turns.popleft() for _ in range(4)]   # ["a0", "b0", "a1", "a2"]

Not thread-safe: its owner guards it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Turns(Generic[T]):
    __slots__ = ("_count", "_queues", "_turns")

    def __init__(self) -> None:
        self._queues: dict[str, deque[T]] = {}
        self._turns: deque[str] = deque()  # the keys with work queued, next first
        self._count = 0

    def append(self, key: str, item: T) -> None:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            self._turns.append(key)
        queue.append(item)
        self._count += 1

    def popleft(self) -> T:
        """The next key's oldest item (IndexError when there is none)."""
        key = self._turns[0]
        queue = self._queues[key]
        item = queue.popleft()
        self._count -= 1
        if queue:
            self._turns.rotate(-1)
        else:
            del self._queues[key]
            self._turns.popleft()
        return item

    def heads(self) -> Iterator[T]:
        """Each key's oldest item."""
        return (queue[0] for queue in self._queues.values())

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0
