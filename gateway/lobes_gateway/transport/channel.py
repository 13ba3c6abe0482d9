"""One socket as the gateway uses it, client side and upstream side alike.

asyncio's StreamReader/StreamWriter pair costs a protocol-to-reader hop, a second object and
a generic read loop on every segment; the gateway's hot path reads a request head, a body of
known length and a response head, so one small protocol object does both halves. It also
offers a supported way (`divert`) to hand the socket's later bytes straight to another
protocol, with no reader left waiting under it, which the SSE pass-through uses.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

from .fiber import CHANNEL_WAIT, Fiber, running_fiber

# Unread bytes above this pause the socket until the reader asks for more.
READ_HIGH_WATER = 256 * 1024
# The most one read of a socket asks recv() for. asyncio asks 256 KiB, over glibc malloc's
# initial mmap threshold (128 KiB): until a block over the threshold is freed whole (which
# raises it), every read maps fresh pages, shrinks them to what came and unmaps them, three
# system calls and a page fault (a 200-byte segment read on a socket pair: 17.7 us against
# 2.9 us). A gateway that had served only streams since it started paid them on most reads
# (0.3 of each call a streamed chunk, strace); one whose earlier reads had raised it did not.
READ_SIZE = 64 * 1024


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Disable Nagle: small responses and SSE chunks must leave at once."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def set_read_size(transport: asyncio.BaseTransport) -> None:
    """Read at most READ_SIZE a recv(): the stdlib socket transports read `max_size` bytes a
    call (a class attribute this overrides for the one transport); a transport without it is
    left as it is."""
    if hasattr(transport, "max_size"):
        transport.max_size = READ_SIZE


class Channel(asyncio.Protocol):
    """A socket's unread bytes and its transport, with the reads and writes the gateway uses.

    Reads raise asyncio.IncompleteReadError at end of stream and asyncio.LimitOverrunError
    past a limit, as StreamReader does, so callers handle one family of errors.
    """

    __slots__ = ("_buffer", "_drain_waiter", "_eof", "_fiber", "_loop", "_lost", "_on_connect",
                 "_on_gone", "_read_paused", "_waiter", "transport", "write",
                 "write_paused")

    def __init__(self, on_connect: Callable[[Channel], object] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_connect = on_connect
        self._buffer = bytearray()
        self._eof = False
        self._lost = False
        # Who waits for more bytes: a fiber, stepped here when they come (see fiber.py), or
        # else a Task, through a future's result.
        self._fiber: Fiber | None = None
        self._waiter: asyncio.Future | None = None
        self._drain_waiter: asyncio.Future | None = None
        self._read_paused = False
        # The transport holds more unsent bytes than its high-water mark: drain() waits.
        self.write_paused = False
        self._on_gone: Callable[[], None] | None = None
        self.transport: asyncio.Transport
        # transport.write itself, bound once: a write costs no frame of ours (set on connect).
        self.write: Callable[[bytes], None]

    # --- protocol callbacks (the event loop calls these) ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.write = transport.write
        set_nodelay(transport)
        set_read_size(transport)
        # Called once: not kept for the connection's life.
        on_connect, self._on_connect = self._on_connect, None
        if on_connect is not None:
            on_connect(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._fiber is not None or self._waiter is not None:
            self._wake()
        elif len(self._buffer) > READ_HIGH_WATER and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        self._gone()
        return True  # keep the socket open for writing: an answer may still be owed

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = self._lost = True
        self._wake()
        self._gone()
        drain_waiter = self._drain_waiter
        if drain_waiter is not None and not drain_waiter.done():
            drain_waiter.set_exception(ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drain_waiter = self._drain_waiter
        if drain_waiter is not None and not drain_waiter.done():
            drain_waiter.set_result(None)

    # --- reads ---

    async def readuntil(self, separator: bytes, limit: int) -> bytes:
        """The bytes up to and including `separator`, which must come within `limit` bytes."""
        buffer = self._buffer
        if not buffer and not self._eof:
            # The usual head (a request's, an answer's) is not here yet when it is asked for:
            # wait before searching, not after a search of nothing.
            await self._more()
        start = 0
        while (end := buffer.find(separator, start)) < 0:
            if len(buffer) > limit:
                raise asyncio.LimitOverrunError("separator not found within the limit", 0)
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(buffer), None)
            if buffer:  # a trickled head is searched once, not again from its start per segment
                start = max(0, len(buffer) - len(separator) + 1)
            await self._more()
        end += len(separator)
        if end > limit:
            raise asyncio.LimitOverrunError("separator found past the limit", end)
        return self._take(end)

    async def readexactly(self, size: int) -> bytes:
        buffer = self._buffer
        while len(buffer) < size:
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(buffer), size)
            await self._more()
        return self._take(size)

    def pending(self) -> int:
        """How many received bytes nobody has read yet."""
        return len(self._buffer)

    def peek(self, size: int) -> bytes:
        """Up to `size` buffered bytes, left in the buffer."""
        return bytes(self._buffer[:size])

    async def peek_until(self, marker: bytes, at_least: int, limit: int) -> bytes:
        """The buffered bytes, left unread, once they hold `at_least` bytes and then `marker`
        after the first `at_least` (or `limit` bytes, or the end of the stream came first)."""
        buffer = self._buffer
        while (len(buffer) < at_least or buffer.find(marker, at_least) < 0) \
                and len(buffer) < limit and not self._eof:
            await self._more()
        return bytes(buffer[:limit])

    def take(self, size: int) -> bytes | None:
        """`size` bytes if they are here already (no wait), else None."""
        return self._take(size) if len(self._buffer) >= size else None

    def _take(self, size: int) -> bytes:
        buffer = self._buffer
        if size == len(buffer):
            data = bytes(buffer)
            buffer.clear()
        else:
            # A slice of a bytearray is a copy of its own: a large one is copied once, through
            # a view.
            data = bytes(buffer[:size]) if size < 65536 else bytes(memoryview(buffer)[:size])
            del buffer[:size]
        return data

    async def read(self, most: int) -> bytes:
        """Up to `most` bytes as soon as any are here; b"" at end of stream."""
        buffer = self._buffer
        if not buffer and not self._eof:
            await self._more()
        data = bytes(buffer[:most])
        del buffer[:most]
        return data

    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    def reusable(self) -> bool:
        """Whether another exchange may use this socket: not ended, not closing, and holding
        no bytes (bytes nobody asked for would be read as the next request's answer)."""
        return not (self._eof or self._buffer or self.transport.is_closing())

    def _more(self) -> Awaitable[None]:
        """What to await until more bytes (or the end) arrive; the socket reads meanwhile."""
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        fiber = running_fiber()
        if fiber is not None:
            self._fiber = fiber
            return CHANNEL_WAIT
        # asyncio.Future itself, as the stdlib loops' create_future makes it, one frame less.
        waiter = self._waiter = asyncio.Future(loop=self._loop)
        return waiter

    def gone(self) -> bool:
        """Whether the peer ended its side or the socket is closing."""
        return self._eof or self.transport.is_closing()

    def watch_gone(self, callback: Callable[[], None] | None) -> bool:
        """Call `callback` once when the client ends its side or the socket is lost, while
        nothing reads (a request waiting its turn); None stops watching. False when it is
        already gone (the callback is not kept)."""
        if callback is not None and (self._eof or self.transport.is_closing()):
            return False
        self._on_gone = callback
        return True

    def _gone(self) -> None:
        callback, self._on_gone = self._on_gone, None
        if callback is not None:
            callback()

    def _wake(self) -> None:
        fiber = self._fiber
        if fiber is not None:
            self._fiber = None
            fiber.step()
            return
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def divert(self, receiver: asyncio.Protocol | None) -> bytes:
        """Make `receiver` the socket's protocol: its later bytes, its end and its loss go to
        the receiver with no call of this channel's between (None: to this channel again).

        Returns the bytes already buffered, which the receiver has not seen. The receiver may
        pause and resume the transport itself; taking the socket back resumes it, and a socket
        that closed meanwhile (its loss told to the receiver) reads as ended here.
        """
        held = bytes(self._buffer)
        self._buffer.clear()
        transport = self.transport
        transport.set_protocol(self if receiver is None else receiver)
        if receiver is None and transport.is_closing():
            self._eof = self._lost = True
        paused = self._read_paused or (receiver is None and not transport.is_reading())
        if paused and not self._lost:
            self._read_paused = False
            transport.resume_reading()
        return held

    # --- writes ---

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its low-water mark."""
        if self._lost:
            raise ConnectionResetError("connection lost")
        if self.write_paused:
            self._drain_waiter = self._loop.create_future()
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None

    def close(self) -> None:
        self.transport.close()

    def abort(self) -> None:
        self.transport.abort()
