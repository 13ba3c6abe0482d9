"""The event loop the gateway serves on: asyncio's selector loop with a leaner turn.

A turn of asyncio's loop walks each ready socket through three layers of Python: the
selector's select() builds (key, mask) pairs from epoll's (fd, event) ones, _process_events
hands each handle to _add_callback, and each handle runs through its own _run frame. For a
streamed chunk, one socket ready a turn, the event loop (those, and the socket transport's read
and write) was 379 of the 668 bytecode steps bench/hot_path_profile.py counts (2026-12-06).
LeanLoop's turn does the same work in one frame, in the same order, with the same timers and
the same report of a callback's exception: 265 of 554.

It reads asyncio's and selectors' internals as CPython 3.11 has them, so it is used only there
and on epoll (`run`); elsewhere, and in debug mode, the stock loop's turn runs.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import select
import selectors
import sys
import time
from asyncio import base_events, events, format_helpers
from collections.abc import Coroutine
from typing import Any, TypeVar

Result = TypeVar("Result")

# Where this turn is asyncio's own, line for line in what it does.
FITS = sys.version_info[:2] == (3, 11) and hasattr(select, "epoll")

_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
# What epoll reports as readable and as writable: selectors.EpollSelector's reading, where an
# error or hang-up (neither IN nor OUT) wakes both the reader and the writer.
_NOT_OUT = ~getattr(select, "EPOLLOUT", 4)
_NOT_IN = ~getattr(select, "EPOLLIN", 1)
_MAX_WAIT = base_events.MAXIMUM_SELECT_TIMEOUT
# BaseEventLoop.time() itself, without its frame.
_monotonic = time.monotonic


class LeanLoop(asyncio.SelectorEventLoop):
    """asyncio's selector event loop on epoll, each turn in one frame (see the module)."""

    def __init__(self) -> None:
        selector = selectors.EpollSelector()
        super().__init__(selector)
        # The epoll object and the fd -> key map EpollSelector.select reads.
        self._epoll = selector._selector  # type: ignore[attr-defined]
        self._fd_to_key = selector._fd_to_key  # type: ignore[attr-defined]

    def _run_once(self) -> None:
        """Poll, queue the ready sockets' handles and the timers due, run what was ready.

        One frame for the whole turn: at a socket ready a turn (a streamed chunk), a call
        into a helper costs as much as the work it would hold."""
        if self._debug:  # the stock turn times each callback and warns of slow ones
            super()._run_once()
            return
        if self._timer_cancelled_count:  # no cancelled timer is in the heap while it is 0
            self._drop_cancelled_timers()
        ready, scheduled, fd_to_key = self._ready, self._scheduled, self._fd_to_key
        # epoll's wait: none when work is ready, -1 for no limit, else up to the first timer,
        # rounded up to epoll's millisecond so that it never wakes early and spins.
        if ready or self._stopping:
            timeout = 0.0
        elif scheduled:
            timeout = scheduled[0]._when - _monotonic()
            timeout = 0.0 if timeout <= 0 else math.ceil(min(timeout, _MAX_WAIT) * 1e3) * 1e-3
        else:
            timeout = -1.0
        try:
            ready_fds = self._epoll.poll(timeout, max(len(fd_to_key), 1))
        except InterruptedError:
            ready_fds = []
        for fd, event in ready_fds:
            key = fd_to_key.get(fd)
            if key is None:
                continue
            reader, writer = key.data
            # A cancelled handle's registration is dropped, as _process_events does.
            if event & _NOT_OUT and key.events & _READ and reader is not None:
                if reader._cancelled:
                    self._remove_reader(key.fileobj)
                else:
                    ready.append(reader)
            if event & _NOT_IN and key.events & _WRITE and writer is not None:
                if writer._cancelled:
                    self._remove_writer(key.fileobj)
                else:
                    ready.append(writer)
        if scheduled:
            due = _monotonic() + self._clock_resolution
            while scheduled and scheduled[0]._when < due:
                handle = heapq.heappop(scheduled)
                handle._scheduled = False
                ready.append(handle)
        # What is ready now runs; what those callbacks schedule waits for the next poll.
        for _queued in range(len(ready)):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            try:
                handle._context.run(handle._callback, *handle._args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._report(handle, exc)
        handle = None  # no cycle through a traceback's frame

    def _drop_cancelled_timers(self) -> None:
        """Cancelled timers leave the heap: all at once when they are most of a large heap,
        else those at its head (asyncio's own rule)."""
        scheduled = self._scheduled
        if (len(scheduled) > base_events._MIN_SCHEDULED_TIMER_HANDLES
                and self._timer_cancelled_count / len(scheduled)
                > base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            kept = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    kept.append(handle)
            heapq.heapify(kept)
            self._scheduled = kept
            self._timer_cancelled_count = 0
            return
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False

    def _report(self, handle: events.Handle, exc: BaseException) -> None:
        """A callback's exception, told to the loop's exception handler as Handle._run does."""
        source = format_helpers._format_callback_source(handle._callback, handle._args)
        context: dict[str, Any] = {"message": f"Exception in callback {source}",
                                   "exception": exc, "handle": handle}
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        self.call_exception_handler(context)


class LeanLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """asyncio's default policy, whose new loops are LeanLoops."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return LeanLoop()


def run(main: Coroutine[Any, Any, Result]) -> Result:
    """asyncio.run(main), on a LeanLoop where it fits (CPython 3.11 on epoll); the policy in
    place before is put back after. (asyncio.Runner's loop_factory would say it in one call, but
    the boxes' oldest Python, 3.10, has no Runner.)"""
    if not FITS:
        return asyncio.run(main)
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(LeanLoopPolicy())
    try:
        return asyncio.run(main)
    finally:
        asyncio.set_event_loop_policy(previous)
