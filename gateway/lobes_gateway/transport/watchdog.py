"""Deadlines for socket waits at the cost of two attribute writes, not a timer per wait."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from time import monotonic


class Watchdog:
    """Runs the armed action when a wait outlives its delay; `disarm` ends the wait.

    One timer handle serves many waits on one connection: a fire that finds the deadline
    moved on re-arms itself for the new one. Per request that replaces a call_later (a
    handle, a heap push, a cancel, a lazily purged heap entry) with two attribute writes.
    """

    __slots__ = ("_action", "_handle", "_handle_at", "_loop", "deadline")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._action: Callable[[], object] | None = None
        # When the armed action runs (monotonic). While armed it may be moved later in place,
        # without a call: the pending timer, due no later, re-arms for it when it fires.
        self.deadline = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at = math.inf  # when the pending handle fires (inf: none pending)

    def arm(self, delay_s: float, action: Callable[[], object]) -> None:
        """Run `action` unless `disarm` (or another `arm`) comes within `delay_s`."""
        # asyncio's loops keep time with time.monotonic: read it without a Python-level call.
        self.deadline = deadline = monotonic() + delay_s
        self._action = action
        if self._handle_at > deadline:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_at(deadline, self._fire)
            self._handle_at = deadline

    def disarm(self) -> None:
        self._action = None

    def close(self) -> None:
        """Disarm for good and drop the timer, so nothing outlives the connection."""
        self._action = None
        self._handle_at = math.inf
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._handle_at = math.inf
        action = self._action
        if action is None:
            return
        deadline = self.deadline
        if monotonic() < deadline:
            self._handle = self._loop.call_at(deadline, self._fire)
            self._handle_at = deadline
            return
        self._action = None
        action()
