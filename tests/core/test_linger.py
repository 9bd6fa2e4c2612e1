"""The linger policy on a fake clock: a steady stream's small batches wait, nothing else does."""

from __future__ import annotations

from core.linger import Linger


def test_the_worked_example() -> None:
    linger = Linger(wait_s=0.005, steady_s=0.05, enough=64)
    assert linger.wait(3, 100.0) == 0.0  # after a quiet spell: at once
    assert linger.wait(2, 100.020) == 0.005  # soon after: part of a stream, waits
    assert linger.wait(200, 100.030) == 0.0  # enough already: at once


def test_a_quiet_spell_ends_the_stream_and_nothing_is_not_a_batch() -> None:
    linger = Linger(wait_s=0.005, steady_s=0.05, enough=64)
    linger.wait(1, 10.0)
    assert linger.wait(0, 10.01) == 0.0  # an empty read
    assert linger.wait(1, 10.04) == 0.005  # still within 50 ms of the last batch
    assert linger.wait(1, 10.2) == 0.0  # 160 ms later: a new stream begins
    assert Linger(wait_s=0.0).wait(1, 1.0) == 0.0 and Linger(wait_s=0.0).wait(1, 1.001) == 0.0
