"""The per-connection Watchdog: one timer handle serving many deadline waits."""

from __future__ import annotations

import asyncio

from lobes_gateway.transport.watchdog import Watchdog


def _run(coro):
    return asyncio.run(coro)


def test_armed_wait_that_outlives_its_delay_runs_the_action():
    async def scenario() -> list[str]:
        fired: list[str] = []
        dog = Watchdog(asyncio.get_running_loop())
        dog.arm(0.01, lambda: fired.append("timeout"))
        await asyncio.sleep(0.05)
        return fired

    assert _run(scenario()) == ["timeout"]


def test_disarmed_wait_never_runs_the_action():
    async def scenario() -> list[str]:
        fired: list[str] = []
        dog = Watchdog(asyncio.get_running_loop())
        dog.arm(0.01, lambda: fired.append("timeout"))
        dog.disarm()
        await asyncio.sleep(0.05)
        return fired

    assert _run(scenario()) == []


def test_rearming_moves_the_deadline_on_instead_of_firing_at_the_old_one():
    async def scenario() -> tuple[list[str], list[str]]:
        fired: list[str] = []
        dog = Watchdog(asyncio.get_running_loop())
        dog.arm(0.02, lambda: fired.append("first"))
        await asyncio.sleep(0.01)
        dog.arm(1.0, lambda: fired.append("second"))
        await asyncio.sleep(0.05)  # past the first deadline, long before the second
        before = list(fired)
        await asyncio.sleep(1.2)
        return before, fired

    before, after = _run(scenario())
    assert before == []
    assert after == ["second"]


def test_a_shorter_delay_than_the_pending_timer_still_fires_on_time():
    async def scenario() -> list[str]:
        fired: list[str] = []
        dog = Watchdog(asyncio.get_running_loop())
        dog.arm(30.0, lambda: fired.append("header"))
        dog.disarm()
        dog.arm(0.01, lambda: fired.append("body"))
        await asyncio.sleep(0.1)  # far short of the 30 s timer already pending
        return fired

    assert _run(scenario()) == ["body"]


def test_close_drops_the_pending_timer():
    async def scenario() -> tuple[list[str], int]:
        fired: list[str] = []
        loop = asyncio.get_running_loop()
        dog = Watchdog(loop)
        dog.arm(0.01, lambda: fired.append("timeout"))
        dog.close()
        await asyncio.sleep(0.05)
        return fired, sum(1 for handle in loop._scheduled if not handle.cancelled())

    fired, live_timers = _run(scenario())
    assert fired == []
    assert live_timers == 0
