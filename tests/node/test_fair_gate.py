"""Calls starting one team after another, a bounded number at once (node.calls.FairGate)."""

from __future__ import annotations

import asyncio

import pytest

from node.calls import FairGate


def test_a_waiting_team_is_let_in_before_the_herd_ahead_of_it_and_cancelled_ones_pass() -> None:
    async def scenario() -> list[str]:
        gate = FairGate(2)
        order: list[str] = []

        async def start(name: str) -> None:
            await gate.enter(name[0])
            order.append(name)

        await start("a0")
        await start("a1")  # the gate is full
        waiting = {n: asyncio.ensure_future(start(n)) for n in ("a2", "a3", "a4", "b0", "c0")}
        await asyncio.sleep(0)  # each waits for its turn
        assert gate.waiting == 5
        waiting["a3"].cancel()
        await asyncio.sleep(0)
        for _ in range(4):
            gate.leave()
            await asyncio.sleep(0)
        assert gate.waiting == 0
        gate.leave()
        gate.leave()
        await gate.enter("d")  # free again: in at once
        order.append("d0")
        return order

    assert asyncio.run(scenario()) == ["a0", "a1", "a2", "b0", "c0", "a4", "d0"]


def test_a_gate_needs_room_for_one() -> None:
    with pytest.raises(ValueError):
        FairGate(0)
