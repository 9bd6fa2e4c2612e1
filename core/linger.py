"""When to wait a moment for a batch to grow: a stream of small batches that runs steadily.

A loop that takes whatever is waiting (a partition's requests, the events its read model
folds) pays a fixed cost a batch: a durable write, a state save, a commit of the read model.
Under a herd that cost is shared by thousands; at a steady 1,000 runs a second each loop wakes
for one or two and pays it nearly alone. So a loop that finds a small batch soon after its last
one waits up to ``wait_s`` for more, unless what it holds is already ``enough``. A batch after a
quiet spell never waits: a lone request is answered as soon as before; only a stream of them
is grouped, each waiting a few milliseconds.

Pure: the caller passes its monotonic time, so a fake clock drives it in tests.

Worked example (``wait_s`` 5 ms, ``steady_s`` 50 ms, ``enough`` 64): a batch of 3 events at
t=0 after a quiet minute is folded at once; another of 2 at t=0.020 s waits 5 ms for more, and
one of 200 at t=0.030 s goes at once.
"""

from __future__ import annotations

from dataclasses import dataclass

LINGER_S = 0.005  # the longest a small batch waits, at steady rates
STEADY_S = 0.05  # a batch this soon after the last is part of a stream
ENOUGH = 64  # a batch this large goes at once


@dataclass
class Linger:
    """How long the next batch waits for more (see the module's docstring)."""

    wait_s: float = LINGER_S
    steady_s: float = STEADY_S
    enough: int = ENOUGH
    _last_at: float | None = None

    def wait(self, size: int, now: float) -> float:
        """How long a batch of ``size`` taken at ``now`` waits for more (0: none); ``size`` 0 is
        not a batch and leaves the stream's time alone."""
        if size <= 0 or self.wait_s <= 0:
            return 0.0
        steady = self._last_at is not None and now - self._last_at <= self.steady_s
        self._last_at = now
        return self.wait_s if steady and size < self.enough else 0.0
