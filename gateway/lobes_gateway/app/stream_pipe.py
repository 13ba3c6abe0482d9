"""The one owner of a relayed stream's wait and backpressure: an upstream socket's protocol
while a stream passes through it to a client.

Bytes are relayed from the socket's own callback (data_received), with no future or task
wake-up per read; the relaying task waits only for the stream's end, or for the client to
drain when it has more than HIGH_WATER bytes unsent (upstream reads pause meanwhile). relay.py's
chunk pipe (streams passed through verbatim) and resume.py's event pipe (resumable pooled
streams) are the two kinds; each decides what its outcome means.
"""

from __future__ import annotations

import asyncio

from ..transport.channel import Channel

# Above this many unsent bytes the relay waits for the client (backpressure): asyncio's own
# high-water mark for a socket transport, at which it tells the client Channel write_paused.
HIGH_WATER = 64 * 1024


class StreamPipe(asyncio.Protocol):
    """Waiting, pausing and resuming for a stream relayed from the upstream's callback."""

    __slots__ = ("_channel", "_client", "_error", "_upstream", "_waiter", "outcome", "paused")

    def __init__(self, client: Channel, upstream: asyncio.Transport) -> None:
        self._channel = client  # its write_paused says when to hold for it, without a call
        self._client = client.transport
        self._upstream = upstream
        self._waiter: asyncio.Future | None = None
        self._error: Exception | None = None
        self.outcome: bool | None = None  # set once the stream ended; its meaning is the kind's
        self.paused = False  # upstream reads wait for the client to drain

    def wait(self) -> asyncio.Future:
        """What to await for the outcome once the stream ended, or None when paused for the
        client to drain; raises what broke the stream (the upstream closing before its end, for
        one). A future, not a coroutine: a held stream keeps no frame of this wait."""
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        if self.outcome is not None or self.paused:
            ready = loop.create_future()
            ready.set_result(self.outcome)
            return ready
        if self._upstream.is_closing():
            # Its loss may have reached the socket before this pipe took it: none would wake it.
            raise ConnectionResetError("upstream closed mid-stream")
        self._waiter = waiter = loop.create_future()
        return waiter

    def resume(self) -> None:
        """The client drained: read the upstream again."""
        self.paused = False
        self._upstream.resume_reading()

    def _hold_if_full(self) -> None:
        """Pause upstream reads, and wake the relaying task to drain, while the client has
        more than HIGH_WATER bytes unsent."""
        if self._channel.write_paused:
            self._hold()

    def _hold(self) -> None:
        """Pause upstream reads and wake the relaying task to drain the client."""
        self._upstream.pause_reading()
        self.paused = True
        self._wake(None)

    def _end(self, outcome: bool) -> None:
        self.outcome = outcome
        self._wake(outcome)

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _wake(self, outcome: bool | None) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)
