"""Run a connection's coroutine straight from socket callbacks, without a Task's hop per wait.

An asyncio Task resumes its coroutine through the loop: the awaited future's result schedules
a callback (a Handle, a queue entry, a turn of the loop) that then steps the coroutine. A
client connection waits twice per request (its next request head, the upstream's response
head), and those hops were a visible share of the gateway's CPU per request. A Fiber steps
its coroutine directly: when the coroutine waits on a Channel read, the Channel claims the
wait and steps the fiber from `data_received` itself. Any other awaited future (a connect, a
sleep, a task) resumes the fiber through an ordinary done-callback, as a Task would.

What a Fiber is not: a Task. `asyncio.current_task()` is None inside it, so code run in a
fiber must not use `asyncio.timeout()` (or `wait_for` on Python >= 3.12, built on it); it
cannot be cancelled, so a fiber ends when its sockets close.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine


class _Running:
    """The fiber stepping right now, and the future a Channel claimed during that step."""

    fiber: Fiber | None = None
    claimed: asyncio.Future | None = None


class Fiber:
    """Drives one coroutine to its end; its Channel waits are resumed in place."""

    __slots__ = ("_coro",)

    def __init__(self, coro: Coroutine[object, object, object]) -> None:
        self._coro = coro

    def step(self, _done: asyncio.Future | None = None) -> None:
        """Run the coroutine until it waits again (or ends)."""
        outer = _Running.fiber
        _Running.fiber, _Running.claimed = self, None
        try:
            waited = self._coro.send(None)
        except (StopIteration, asyncio.CancelledError):
            return
        finally:
            _Running.fiber = outer
        if waited is None:  # a bare yield (asyncio.sleep(0)): step again next turn
            asyncio.get_running_loop().call_soon(self.step)
        elif waited is _Running.claimed:
            _Running.claimed = None  # a Channel holds this fiber and steps it on data
        else:
            waited.add_done_callback(self.step)


def claim(waiter: asyncio.Future) -> Fiber | None:
    """Called by a Channel about to be awaited: the running fiber, which it will step itself.

    Returns None outside a fiber (in a Task), where the future's result resumes the waiter.
    """
    fiber = _Running.fiber
    if fiber is not None:
        _Running.claimed = waiter
    return fiber
