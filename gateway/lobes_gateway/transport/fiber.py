"""Run a connection's coroutine straight from socket callbacks, without a Task's hop per wait.

An asyncio Task resumes its coroutine through the loop: the awaited future's result schedules
a callback (a Handle, a queue entry, a turn of the loop) that then steps the coroutine. A
client connection waits twice per request (its next request head, the upstream's response
head), and those hops were a visible share of the gateway's CPU per request. A Fiber steps
its coroutine directly: when the coroutine waits on a Channel read, the Channel keeps the
running fiber and steps it from `data_received` itself. Such a wait needs no future at all:
the coroutine awaits CHANNEL_WAIT, which hands the fiber one marker and ends when the fiber is
stepped again (a future, its claim and its result cost three times as much a wait). Any other
awaited future (a connect, a sleep, a task) resumes the fiber through an ordinary
done-callback, as a Task would.

What a Fiber is not: a Task. `asyncio.current_task()` is None inside it, so code run in a
fiber must not use `asyncio.timeout()` (or `wait_for` on Python >= 3.12, built on it); it
cannot be cancelled, so a fiber ends when its sockets close.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine


class _Running:
    """The fiber stepping right now."""

    fiber: Fiber | None = None


class _HeldWait(tuple):
    """An awaitable whose iterator yields its one item (the marker) and then ends: the tuple's
    own iterator, so a wait runs no Python frame of its own."""

    __slots__ = ()
    __await__ = tuple.__iter__


# What a coroutine waiting on a Channel yields to its fiber: the Channel holds the fiber and
# steps it when bytes come, so the fiber has nothing more to arrange.
_HELD = object()
CHANNEL_WAIT = _HeldWait((_HELD,))


class Fiber:
    """Drives one coroutine to its end; its Channel waits are resumed in place."""

    __slots__ = ("_coro",)

    def __init__(self, coro: Coroutine[object, object, object]) -> None:
        self._coro = coro

    def step(self, _done: asyncio.Future | None = None) -> None:
        """Run the coroutine until it waits again (or ends)."""
        outer = _Running.fiber
        _Running.fiber = self
        try:
            waited = self._coro.send(None)
        except (StopIteration, asyncio.CancelledError):
            return
        finally:
            _Running.fiber = outer
        if waited is _HELD:
            return  # a Channel holds this fiber and steps it on data
        if waited is None:  # a bare yield (asyncio.sleep(0)): step again next turn
            asyncio.get_running_loop().call_soon(self.step)
        else:
            waited.add_done_callback(self.step)


def running_fiber() -> Fiber | None:
    """The fiber stepping now, which a Channel about to be awaited steps itself (awaited with
    CHANNEL_WAIT); None outside a fiber (in a Task, which needs a future to wake it)."""
    return _Running.fiber
