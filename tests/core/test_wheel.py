"""The timing wheel, checked against a heap-based reference timer."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.wheel import TimingWheel

START = 1_700_000_000_003  # deliberately not aligned to any tick
SECOND = 1_000
HOUR = 3_600 * SECOND
DAY = 24 * HOUR
YEAR = 365 * DAY


class HeapTimer:
    """The reference: one heap of (deadline, arming order, key), lazily cancelled.

    Same contract as the wheel, none of its structure: ``add`` refuses a due deadline,
    ``advance`` fires every deadline <= now in (deadline, arming order), time never goes back.
    """

    def __init__(self, start_ms: int) -> None:
        self.now = start_ms
        self._heap: list[tuple[int, int, str]] = []
        self._live: dict[str, tuple[int, int]] = {}
        self._seq = 0

    def add(self, key: str, deadline: int) -> bool:
        self._live.pop(key, None)
        if deadline <= self.now:
            return False
        self._seq += 1
        self._live[key] = (deadline, self._seq)
        heapq.heappush(self._heap, (deadline, self._seq, key))
        return True

    def cancel(self, key: str) -> bool:
        return self._live.pop(key, None) is not None

    def advance(self, now: int) -> list[tuple[int, str]]:
        if now <= self.now:
            return []
        self.now = now
        fired = []
        while self._heap and self._heap[0][0] <= now:
            deadline, seq, key = heapq.heappop(self._heap)
            if self._live.get(key) == (deadline, seq):
                del self._live[key]
                fired.append((deadline, key))
        return fired

    def earliest(self) -> int | None:
        return min((deadline for deadline, _ in self._live.values()), default=None)

    def deadline_of(self, key: str) -> int | None:
        entry = self._live.get(key)
        return None if entry is None else entry[0]

    def __len__(self) -> int:
        return len(self._live)


KEYS = [f"job-{i}" for i in range(12)]

# Offsets from the current time: the past, this tick, the first wheel, overflow wheels.
offsets = st.one_of(
    st.integers(-50, 0),
    st.integers(1, 40),
    st.integers(1, 2_000),
    st.integers(1, 10 * HOUR),
    st.integers(DAY, 2 * YEAR),
)
steps = st.one_of(
    st.integers(-20, 0),
    st.integers(1, 50),
    st.integers(1, 5_000),
    st.integers(HOUR, 3 * DAY),
    st.integers(30 * DAY, 2 * YEAR),
)


class WheelAgainstHeap(RuleBasedStateMachine):
    wheel: TimingWheel[str]
    ref: HeapTimer

    @initialize(
        tick=st.sampled_from([1, 3, 10, 1_000]),
        size=st.sampled_from([2, 3, 8, 512]),
        misalign=st.integers(0, 999),
    )
    def start(self, tick: int, size: int, misalign: int) -> None:
        self.wheel = TimingWheel(START + misalign, tick_ms=tick, wheel_size=size)
        self.ref = HeapTimer(START + misalign)

    @rule(key=st.sampled_from(KEYS), offset=offsets)
    def add(self, key: str, offset: int) -> None:
        deadline = self.ref.now + offset
        assert self.wheel.add(key, deadline) == self.ref.add(key, deadline)

    @precondition(lambda self: len(self.ref) > 0)
    @rule(data=st.data())
    def re_arm_to_same_deadline_as_another(self, data: st.DataObject) -> None:
        # Equal deadlines armed at different times, possibly in different levels.
        other = data.draw(st.sampled_from([k for k in KEYS if self.ref.deadline_of(k)]))
        key = data.draw(st.sampled_from(KEYS))
        deadline = self.ref.deadline_of(other)
        assert deadline is not None
        assert self.wheel.add(key, deadline) == self.ref.add(key, deadline)

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        assert self.wheel.cancel(key) == self.ref.cancel(key)

    @rule(step=steps)
    def advance(self, step: int) -> None:
        now = self.ref.now + step
        assert self.wheel.advance(now) == self.ref.advance(now)

    @precondition(lambda self: len(self.ref) > 0)
    @rule()
    def advance_to_next_deadline(self) -> None:
        # What a sleeping scheduler does: wake at next_deadline, advance, repeat.
        wake = self.wheel.next_deadline()
        assert wake is not None
        assert self.wheel.advance(wake) == self.ref.advance(wake)

    @invariant()
    def agrees(self) -> None:
        if not hasattr(self, "wheel"):
            return
        assert len(self.wheel) == len(self.ref)
        for key in KEYS:
            assert self.wheel.deadline_of(key) == self.ref.deadline_of(key)
            assert (key in self.wheel) == (self.ref.deadline_of(key) is not None)
        earliest = self.ref.earliest()
        wake = self.wheel.next_deadline()
        if earliest is None:
            assert wake is None
        else:
            assert wake is not None
            assert self.ref.now < wake <= earliest


WheelAgainstHeap.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
test_wheel_matches_heap = WheelAgainstHeap.TestCase


# --- examples ---------------------------------------------------------------------------


def test_add_refuses_a_due_deadline_and_stores_nothing() -> None:
    wheel: TimingWheel[str] = TimingWheel(START)
    assert wheel.add("past", START - 1) is False
    assert wheel.add("now", START) is False
    assert len(wheel) == 0
    assert "now" not in wheel
    assert wheel.next_deadline() is None


def test_a_deadline_inside_the_current_tick_is_armed_and_fires_exactly() -> None:
    # START is 3 ms into a 10 ms tick; 1 ms later is not due yet, so it is not refused.
    wheel: TimingWheel[str] = TimingWheel(START, tick_ms=10)
    assert wheel.add("soon", START + 1) is True
    assert wheel.add("end-of-tick", START + 6) is True
    assert wheel.next_deadline() == START + 1
    assert wheel.advance(START + 1) == [(START + 1, "soon")]
    assert wheel.next_deadline() == START + 6
    assert wheel.advance(START + 5) == []
    assert wheel.advance(START + 6) == [(START + 6, "end-of-tick")]


def test_re_arm_replaces_the_previous_timer() -> None:
    wheel: TimingWheel[str] = TimingWheel(START)
    assert wheel.add("lease", START + 30 * SECOND)
    assert wheel.add("lease", START + 60 * SECOND)
    assert len(wheel) == 1
    assert wheel.deadline_of("lease") == START + 60 * SECOND
    assert wheel.advance(START + 59 * SECOND) == []
    assert wheel.advance(START + 60 * SECOND) == [(START + 60 * SECOND, "lease")]


def test_re_arm_to_a_due_deadline_removes_the_timer() -> None:
    wheel: TimingWheel[str] = TimingWheel(START)
    wheel.add("backoff", START + SECOND)
    assert wheel.add("backoff", START) is False
    assert "backoff" not in wheel
    assert wheel.advance(START + DAY) == []


def test_cancel() -> None:
    wheel: TimingWheel[str] = TimingWheel(START)
    wheel.add("a", START + 100)
    assert wheel.cancel("a") is True
    assert wheel.cancel("a") is False
    assert wheel.cancel("never-armed") is False
    assert wheel.advance(START + 1_000) == []


def test_cancel_after_cascade() -> None:
    wheel: TimingWheel[str] = TimingWheel(START, tick_ms=10, wheel_size=8)
    deadline = START + 10 * SECOND  # beyond level 0 (80 ms) and level 1 (640 ms)
    wheel.add("job", deadline)
    # Step through the overflow buckets' starts: the timer moves down on each.
    while (wake := wheel.next_deadline()) is not None and wake < deadline:
        assert wheel.advance(wake) == []
    assert wheel.next_deadline() == deadline  # it has reached level 0
    assert wheel.cancel("job") is True
    assert len(wheel) == 0
    assert wheel.advance(deadline + 1_000) == []


def test_a_deadline_a_year_away() -> None:
    wheel: TimingWheel[str] = TimingWheel(START)  # 10 ms ticks, 512 buckets
    deadline = START + YEAR + 7
    assert wheel.add("yearly", deadline)
    wake = wheel.next_deadline()
    assert wake is not None and START < wake <= deadline
    assert wheel.advance(deadline - 1) == []
    assert wheel.deadline_of("yearly") == deadline
    assert wheel.advance(deadline) == [(deadline, "yearly")]
    assert len(wheel) == 0


def test_a_long_jump_does_not_walk_the_ticks() -> None:
    # A year at 1 ms ticks is 3e10 ticks; walking them would never finish.
    wheel: TimingWheel[int] = TimingWheel(START, tick_ms=1, wheel_size=2)
    wheel.add(1, START + YEAR)
    wheel.add(2, START + 2 * YEAR)
    assert wheel.advance(START + YEAR + DAY) == [(START + YEAR, 1)]
    assert wheel.advance(START + 3 * YEAR) == [(START + 2 * YEAR, 2)]


def test_fired_in_deadline_then_arming_order() -> None:
    wheel: TimingWheel[str] = TimingWheel(START, tick_ms=10, wheel_size=4)
    at = START + 500  # far enough to start in an overflow wheel
    wheel.add("first", at)
    wheel.add("late", at + 1)
    wheel.advance(at - 5)  # "first" has cascaded into level 0 by now
    wheel.add("second", at)  # armed straight into level 0, after "first"
    wheel.add("early", at - 1)
    assert wheel.advance(at + 1) == [
        (at - 1, "early"),
        (at, "first"),
        (at, "second"),
        (at + 1, "late"),
    ]


def test_re_arm_counts_as_a_new_arming_for_ties() -> None:
    wheel: TimingWheel[str] = TimingWheel(START)
    wheel.add("a", START + 50)
    wheel.add("b", START + 50)
    wheel.add("a", START + 50)
    assert wheel.advance(START + 50) == [(START + 50, "b"), (START + 50, "a")]


def test_time_never_goes_backwards() -> None:
    wheel: TimingWheel[str] = TimingWheel(START)
    wheel.add("a", START + 100)
    assert wheel.advance(START + 50) == []
    assert wheel.advance(START + 10) == []  # ignored: the wheel stays at START + 50
    assert wheel.now_ms == START + 50
    assert wheel.add("b", START + 20) is False  # due by the wheel's time
    assert wheel.advance(START + 100) == [(START + 100, "a")]


def test_the_midnight_herd_fires_in_arming_order() -> None:
    wheel: TimingWheel[int] = TimingWheel(START)
    midnight = START + DAY
    for job in range(1_000):
        wheel.add(job, midnight)
    assert wheel.advance(midnight - 1) == []
    assert wheel.advance(midnight) == [(midnight, job) for job in range(1_000)]


def test_next_deadline_is_exact_in_the_finest_wheel() -> None:
    wheel: TimingWheel[str] = TimingWheel(START)
    assert wheel.next_deadline() is None
    wheel.add("b", START + 2_000)
    wheel.add("a", START + 1_234)
    assert wheel.next_deadline() == START + 1_234


@pytest.mark.parametrize(("tick", "size"), [(0, 512), (10, 1)])
def test_rejects_a_degenerate_wheel(tick: int, size: int) -> None:
    with pytest.raises(ValueError):
        TimingWheel(START, tick_ms=tick, wheel_size=size)
