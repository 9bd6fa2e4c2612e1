"""Writes waiting to become readable are woken by the fold that passes them, in the event loop."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from projections.wakeups import Wakeups


class Positions:
    def __init__(self) -> None:
        self.at: dict[int, int] = {}

    def __call__(self, partition: int) -> int:
        return self.at.get(partition, 0)

    def fold(self, wakeups: Wakeups, partition: int, position: int) -> None:
        """As the read model does: move the position, then tell the observers."""
        self.at[partition] = position
        wakeups.folded({partition: position}, [])


def test_a_write_is_woken_by_the_fold_that_passes_it_and_not_before() -> None:
    wakeups, positions = Wakeups(lambda: 0), Positions()

    async def go() -> list[str]:
        order: list[str] = []

        async def wait(name: str, partition: int, offset: int) -> None:
            assert await wakeups.folded_past(partition, offset, positions, 10)
            order.append(name)

        tasks = [
            asyncio.create_task(wait("p0@4", 0, 4)),
            asyncio.create_task(wait("p0@9", 0, 9)),
            asyncio.create_task(wait("p1@0", 1, 0)),
        ]
        await asyncio.sleep(0)  # every task is waiting now
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, positions.fold, wakeups, 0, 5)
        await asyncio.wait(tasks, timeout=0.2)
        assert order == ["p0@4"]
        await loop.run_in_executor(None, positions.fold, wakeups, 1, 1)
        await loop.run_in_executor(None, positions.fold, wakeups, 0, 10)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return order

    assert asyncio.run(go()) == ["p0@4", "p1@0", "p0@9"]


def test_a_write_already_folded_returns_at_once_and_an_unfolded_one_times_out() -> None:
    wakeups, positions = Wakeups(lambda: 0), Positions()
    positions.at[2] = 8

    async def go() -> tuple[bool, bool]:
        return (
            await wakeups.folded_past(2, 7, positions, 0.0),
            await wakeups.folded_past(2, 8, positions, 0.05),
        )

    assert asyncio.run(go()) == (True, False)


def test_waiting_writes_hold_no_thread_of_the_pool() -> None:
    """Read-your-writes waited in ``asyncio.to_thread``: with the default pool's few threads
    busy, a write's answer waited for a thread before it could even wait for the fold."""
    wakeups, positions = Wakeups(lambda: 0), Positions()
    release = threading.Event()

    async def go() -> list[bool]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        busy = loop.run_in_executor(None, release.wait, 10)  # the pool's only thread, taken
        waits = [
            asyncio.create_task(wakeups.folded_past(p % 4, p, positions, 5)) for p in range(40)
        ]
        await asyncio.sleep(0)
        folder = threading.Thread(
            target=lambda: [positions.fold(wakeups, p, 100) for p in range(4)]
        )
        folder.start()
        done = await asyncio.wait_for(asyncio.gather(*waits), 5)
        release.set()
        await busy
        folder.join()
        return done

    assert asyncio.run(go()) == [True] * 40
