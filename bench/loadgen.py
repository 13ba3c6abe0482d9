"""An asyncio HTTP/1.1 load generator: closed-loop keep-alive requests and held SSE streams.

Built on asyncio.Protocol with pre-encoded requests and an incremental response parser so
that one core of client drives a proxy on the other core; the same client measures every
target of a run.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

HEADER_END = b"\r\n\r\n"
# Connect errors that come from the load generator's own limits (its descriptors, the host's
# ephemeral ports, its memory), whatever the proxy does: counted as the client's failures.
CLIENT_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.EADDRNOTAVAIL, errno.ENOBUFS, errno.ENOMEM}
)
# The prefix of a failure the client caused itself.
CLIENT_FAILURE = "client: "


def connect_failure(error: BaseException) -> str:
    """How a stream's connect failed, prefixed with CLIENT_FAILURE when the client's own
    limits caused it rather than the proxy."""
    code = getattr(error, "errno", None)
    name = errno.errorcode.get(code, type(error).__name__) if code else type(error).__name__
    return f"{CLIENT_FAILURE if code in CLIENT_ERRNOS else ''}connect: {name}"


def encode_post(path: str, body: bytes, host: str, api_key: str | None) -> bytes:
    """Return one complete keep-alive POST request as bytes."""
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"{auth}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class ResponseReader(asyncio.Protocol):
    """A keep-alive connection that sends a request and parses its response incrementally.

    For SSE bodies it counts events (blank-line terminated) and stamps the first one.
    Subclasses decide what happens when a response completes (``response_done``).
    """

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.lost = asyncio.get_running_loop().create_future()
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.in_head = True
        self.chunked = False
        self.body_left = 0
        self.chunk_left = -1  # -1: a chunk-size line is next; -2: a chunk's CRLF is next
        self.events = 0
        self.ended_with_newline = False
        self.done_event = False
        self.sent_ns = 0
        self.response_sent_ns = 0
        self.first_event_ns = 0
        self.last_event_ns = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if self.sent_ns:  # a response was still due
            self.response_failed()

    def send(self) -> None:
        self._reset()
        self.sent_ns = time.perf_counter_ns()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.sent_ns and self._advance():
            self.response_sent_ns = self.sent_ns
            self.sent_ns = 0
            self.response_done(time.perf_counter_ns() - self.response_sent_ns)

    def _advance(self) -> bool:
        """Consume what the buffer holds; True when a whole response has arrived."""
        if self.in_head and not self._read_head():
            return False
        if not self.chunked:
            if len(self.buffer) < self.body_left:
                return False
            del self.buffer[: self.body_left]
            return True
        return self._read_chunks()

    def _read_head(self) -> bool:
        end = self.buffer.find(HEADER_END)
        if end < 0:
            return False
        head = bytes(self.buffer[:end]).lower()
        del self.buffer[: end + 4]
        self.status = int(head[9:12])
        self.in_head = False
        marker = head.find(b"content-length:")
        if marker >= 0:
            line_end = head.find(b"\r\n", marker)
            self.body_left = int(head[marker + 15 : line_end if line_end >= 0 else None])
        else:
            self.chunked = b"transfer-encoding: chunked" in head
        return True

    def _read_chunks(self) -> bool:
        while True:
            if self.chunk_left == -2:
                if len(self.buffer) < 2:
                    return False
                del self.buffer[:2]
                self.chunk_left = -1
            if self.chunk_left == -1:
                line_end = self.buffer.find(b"\r\n")
                if line_end < 0:
                    return False
                size = int(bytes(self.buffer[:line_end]).split(b";")[0], 16)
                if size == 0:
                    if len(self.buffer) < line_end + 4:
                        return False
                    del self.buffer[: line_end + 4]
                    return True
                del self.buffer[: line_end + 2]
                self.chunk_left = size
            if not self.buffer:
                return False
            take = min(self.chunk_left, len(self.buffer))
            self._count_events(bytes(self.buffer[:take]))
            del self.buffer[:take]
            self.chunk_left -= take
            if self.chunk_left:
                return False
            self.chunk_left = -2  # chunk data read; its CRLF comes next

    def _count_events(self, payload: bytes) -> None:
        found = payload.count(b"\n\n")
        if self.ended_with_newline and payload[:1] == b"\n":
            found += 1
        self.ended_with_newline = payload[-1:] == b"\n"
        if found:
            self.last_event_ns = time.perf_counter_ns()
            if not self.events:
                self.first_event_ns = self.last_event_ns
            self.events += found
            if b"[DONE]" in payload:
                self.done_event = True

    def response_done(self, latency_ns: int) -> None:
        raise NotImplementedError

    def response_failed(self) -> None:
        raise NotImplementedError


@dataclass
class LoadResult:
    """What a closed-loop run saw: per-request latencies and first-event times (ns)."""

    latencies_ns: list[int] = field(default_factory=list)
    first_event_ns: list[int] = field(default_factory=list)
    events: int = 0
    errors: int = 0
    elapsed_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies_ns)


class _LoopConnection(ResponseReader):
    """Sends the next request as soon as the previous response completes, until the deadline."""

    def __init__(self, request: bytes, result: LoadResult, deadline_ns: list[int]) -> None:
        super().__init__(request)
        self.result = result
        self.deadline_ns = deadline_ns
        self.finished = asyncio.get_running_loop().create_future()

    def response_done(self, latency_ns: int) -> None:
        result = self.result
        if self.status != 200:
            result.errors += 1
        result.latencies_ns.append(latency_ns)
        if self.events:
            result.events += self.events
            result.first_event_ns.append(self.first_event_ns - self.response_sent_ns)
        if time.perf_counter_ns() < self.deadline_ns[0]:
            self.send()
        elif not self.finished.done():
            self.finished.set_result(None)

    def response_failed(self) -> None:
        self.result.errors += 1
        if not self.finished.done():
            self.finished.set_result(None)


async def _connect(factory: Callable[[], asyncio.Protocol], host: str, port: int):
    loop = asyncio.get_running_loop()
    _transport, protocol = await loop.create_connection(factory, host, port)
    return protocol


async def closed_loop(
    host: str, port: int, request: bytes, concurrency: int, duration_s: float
) -> LoadResult:
    """Keep `concurrency` keep-alive connections busy for `duration_s`; every response counts."""
    result = LoadResult()
    deadline = [0]
    conns = [
        await _connect(lambda: _LoopConnection(request, result, deadline), host, port)
        for _conn in range(concurrency)
    ]
    start = time.perf_counter_ns()
    deadline[0] = start + int(duration_s * 1e9)
    for conn in conns:
        conn.send()
    await asyncio.gather(*(conn.finished for conn in conns))
    result.elapsed_s = (time.perf_counter_ns() - start) / 1e9
    for conn in conns:
        conn.transport.close()
    return result


class _StreamConnection(ResponseReader):
    """One held SSE stream: records how it ended, or that it never did."""

    def __init__(self, request: bytes) -> None:
        super().__init__(request)
        self.finished = asyncio.get_running_loop().create_future()
        self.failure: str | None = "never ended"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.send()

    def response_done(self, latency_ns: int) -> None:
        if self.failure == "never ended":
            if self.status != 200:
                self.failure = f"status {self.status}"
            elif not self.done_event:
                self.failure = "ended without data: [DONE]"
            else:
                self.failure = None
        self._finish()
        self.transport.close()

    def response_failed(self) -> None:
        if self.failure == "never ended":
            self.failure = "connection closed mid-stream"
        self._finish()

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def live(self, now_ns: int, stall_ns: int) -> bool:
        """Open, and its last event came within `stall_ns`."""
        return (
            self.events > 0 and not self.finished.done() and now_ns - self.last_event_ns < stall_ns
        )


@dataclass
class StreamsResult:
    """Outcome of holding many streams at once; `failures` counts each way a stream failed;
    `lag_s` is how late the client's own event loop ran at worst while they were held."""

    opened: int
    live_at_sample: int
    open_s: float
    failures: Counter[str]
    sample: object
    lag_s: float = 0.0

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def client_failed(self) -> int:
        """The failures the load generator's own limits caused."""
        return sum(n for why, n in self.failures.items() if why.startswith(CLIENT_FAILURE))


class LoopLag:
    """Measures how late this event loop wakes a sleeper: a busy client answers late."""

    def __init__(self, tick_s: float = 0.05) -> None:
        self.tick_s = tick_s
        self.worst_s = 0.0
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            self.worst_s = max(self.worst_s, time.perf_counter() - before - self.tick_s)

    def stop(self) -> float:
        self._task.cancel()
        return self.worst_s


async def _open_batch(
    host: str, port: int, request: bytes, size: int, timeout_s: float
) -> tuple[list[_StreamConnection], Counter[str]]:
    """Open `size` streams at once and wait until each has its first event (or ended)."""
    failures: Counter[str] = Counter()
    conns: list[_StreamConnection] = []
    outcomes = await asyncio.gather(
        *(_connect(lambda: _StreamConnection(request), host, port) for _conn in range(size)),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            failures[connect_failure(outcome)] += 1
        else:
            conns.append(outcome)
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up and any(not c.events and not c.finished.done() for c in conns):
        await asyncio.sleep(0.02)
    return conns, failures


async def hold_streams(
    host: str,
    port: int,
    request: bytes,
    count: int,
    interval_s: float,
    while_open: Callable[[], Awaitable[object]],
    finish: Callable[[], Awaitable[object]],
    batch: int = 200,
) -> StreamsResult:
    """Hold `count` streams open at once, sample while they are, then have them all end.

    Streams open in batches, each waiting for its first events, so the figure is about
    holding streams rather than surviving one connect storm. Once all are open the streams
    run for a few chunk intervals; `while_open` is sampled; a stream that is not live then
    (ended, or silent for 5 intervals) fails as stalled. `finish` makes the backend end
    every stream, and each must then close cleanly with ``data: [DONE]``.
    """
    start = time.monotonic()
    lag = LoopLag()
    conns: list[_StreamConnection] = []
    failures: Counter[str] = Counter()
    for first in range(0, count, batch):
        opened, failed = await _open_batch(
            host, port, request, min(batch, count - first), timeout_s=30 + 5 * interval_s
        )
        conns += opened
        failures += failed
    open_s = time.monotonic() - start
    await asyncio.sleep(3 * interval_s)
    now, stall_ns = time.perf_counter_ns(), int(5 * interval_s * 1e9)
    live = [c.live(now, stall_ns) for c in conns]
    sample = await while_open()
    lag_s = lag.stop()
    for conn, is_live in zip(conns, live, strict=True):
        if not is_live and conn.failure == "never ended":
            conn.failure = "stalled or ended before the sample"
    await finish()
    if conns:
        await asyncio.wait([c.finished for c in conns], timeout=30)
    failures.update(c.failure for c in conns if c.failure is not None)
    for conn in conns:
        if not conn.finished.done():
            conn.transport.abort()
    return StreamsResult(
        opened=len(conns),
        live_at_sample=sum(live),
        open_s=open_s,
        failures=failures,
        sample=sample,
        lag_s=lag_s,
    )
