"""Pooled keep-alive upstream connections and the request/response-head exchange."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import NamedTuple

from lobes_contract import host_port, http_origin

from .channel import Channel
from .heads import ShapeMemo, split_head
from .http import MAX_HEAD_BYTES, header_block
from .watchdog import Watchdog

MAX_IDLE_PER_ORIGIN = 512
MAX_BODY_READ = 256 * 1024
# Response headers that describe the upstream hop, never relayed as they are (the gateway sets
# its own X-Request-Id: the id it sent, which a peer gateway echoes).
_HOP_HEADERS = frozenset((b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                          b"proxy-connection", b"te", b"trailer", b"upgrade", b"x-request-id"))
# The response headers the gateway acts on itself.
_READ_HEADERS = frozenset((b"connection", b"transfer-encoding", b"content-type"))


class Origin(NamedTuple):
    """A plain-HTTP origin (scheme://host:port, no path), as dialled.

    A NamedTuple rather than a dataclass: the connection pool hashes one on every request,
    and a tuple hashes in C.
    """

    host: str
    port: int

    @property
    def url(self) -> str:
        return http_origin(self.host, self.port)

    @property
    def authority(self) -> str:
        """host:port as the Host header carries it (an IPv6 address in brackets)."""
        return host_port(self.host, self.port)


class UpstreamError(Exception):
    """No response head came back: refused, unreachable, reset or timed out."""


class Connection:
    """One upstream socket."""

    __slots__ = ("channel", "origin", "timed_out", "watchdog")

    def __init__(self, origin: Origin, channel: Channel) -> None:
        self.origin = origin
        self.channel = channel
        self.timed_out = False
        self.watchdog = Watchdog(asyncio.get_running_loop())

    def abort(self) -> None:
        self.timed_out = True
        self.close()

    def close(self) -> None:
        self.watchdog.close()
        self.channel.abort()


class _ResponseShape(NamedTuple):
    """What a response head's shape (heads.py) parses to."""

    status: int
    headers: dict[bytes, bytes]  # shared by every response of the shape: read, never written
    relayed: bytes
    keep_alive: bool
    chunked: bool


class Response:
    """A response head read from upstream; the body is still on `conn`."""

    __slots__ = ("chunked", "conn", "headers", "keep_alive", "length", "raw", "relayed", "status")

    def __init__(self, conn: Connection, raw: bytes) -> None:
        self.conn = conn
        self.raw = raw
        key, lengths, _ids = split_head(raw)  # the id is the gateway's own, set per hop
        shape = _RESPONSE_SHAPES.parsed(key)
        self.status, self.headers, self.relayed, self.keep_alive, self.chunked = shape
        self.length = _content_length(lengths) if lengths else None


def _content_length(values: tuple[bytes, ...]) -> int:
    """The length its Content-Length lines agree on; a ValueError when they do not or it is not
    a number (the body's end is then unknown)."""
    if not values[0].isdigit() or (len(values) > 1 and values.count(values[0]) != len(values)):
        raise ValueError(f"bad Content-Length {values!r}")
    return int(values[0])


def _parse_shape(raw: bytes) -> _ResponseShape:
    """One pass over the header lines (a loop of bytes methods costs less here than the two
    case-insensitive regex scans it replaced): the few headers the gateway reads itself, names
    and values lowered, and the lines a client may see, hop-by-hop ones dropped."""
    headers: dict[bytes, bytes] = {}
    relayed: list[bytes] = []
    block = raw[raw.find(b"\r\n") + 2:-4]
    for line in block.split(b"\r\n") if block else ():
        name = line.partition(b":")[0].rstrip().lower()
        if name == b"content-length":  # split_head takes every well-formed one
            raise ValueError(f"bad Content-Length line {line[:40]!r}")
        if name in _READ_HEADERS:
            headers[name] = line[line.find(b":") + 1:].strip().lower()
        if name not in _HOP_HEADERS:
            relayed.append(line)
    if relayed:
        relayed.append(b"")  # each line ends CRLF
    keep_alive = headers.get(b"connection") != b"close"
    chunked = b"chunked" in headers.get(b"transfer-encoding", b"")
    return _ResponseShape(int(raw[9:12]), headers, b"\r\n".join(relayed), keep_alive, chunked)


_RESPONSE_SHAPES: ShapeMemo[_ResponseShape] = ShapeMemo(_parse_shape)
# Each origin's Host line, as request_head writes it.
_HOST_LINES: dict[Origin, str] = {}


class Connections:
    """The upstream connection pool: idle keep-alive connections per origin; connect failures
    raise UpstreamError."""

    def __init__(self, connect_timeout_s: float) -> None:
        self._idle: dict[Origin, list[Connection]] = defaultdict(list)
        self._connect_timeout = connect_timeout_s

    async def open(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        # A timer cancels the dial: wait_for needs a current Task on Python >= 3.12, and this
        # runs in a connection's Fiber (fiber.py).
        connecting = loop.create_task(loop.create_connection(Channel, origin.host, origin.port))
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            connecting.cancel()

        timer = loop.call_later(self._connect_timeout, expire)
        try:
            _transport, channel = await connecting
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {origin.url}: {exc}") from None
        except asyncio.CancelledError:
            if not expired:
                raise  # the waiter itself was cancelled, not the dial timed out
            raise UpstreamError(f"cannot connect to {origin.url}: timeout") from None
        finally:
            timer.cancel()
        return Connection(origin, channel)

    def take_idle(self, origin: Origin) -> Connection | None:
        """An idle pooled connection that is still usable, or None."""
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.channel.reusable():
                return conn
            conn.close()
        return None

    def release(self, conn: Connection) -> None:
        idle = self._idle[conn.origin]
        # Not checked for life here: take_idle checks each one when it is wanted.
        if len(idle) < MAX_IDLE_PER_ORIGIN:
            idle.append(conn)
        else:
            conn.close()

    def close_all(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def exchange(connections: Connections, origin: Origin, head: bytes, body: bytes,
                   timeout_s: float) -> Response:
    """Send one request; its final response head (1xx other than 101 skipped) within timeout_s.

    A stale pooled socket (closed or reset before answering) is retried once on a fresh one.
    """
    for _attempt in range(2):
        conn = connections.take_idle(origin)
        reused = conn is not None
        if conn is None:
            conn = await connections.open(origin)
        channel = conn.channel
        conn.watchdog.arm(timeout_s, conn.abort)
        try:
            channel.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                channel.write(body)
                await channel.drain()
            while True:
                response = Response(conn, await channel.readuntil(b"\r\n\r\n", MAX_HEAD_BYTES))
                if response.status >= 200 or response.status == 101:
                    return response
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                ValueError) as exc:
            conn.close()
            if reused and not conn.timed_out:
                continue
            what = "timed out" if conn.timed_out else f"failed ({type(exc).__name__})"
            raise UpstreamError(f"{origin.url} {what} before a response") from None
        finally:
            conn.watchdog.disarm()
    raise UpstreamError(f"{origin.url} closed the connection twice")


async def read_body(response: Response) -> bytes:
    """Read a whole response body (length, chunked or close-delimited), then pool or close."""
    channel = response.conn.channel
    if response.chunked:
        parts = []
        while True:
            line = await channel.readuntil(b"\r\n", MAX_HEAD_BYTES)
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                while await channel.readuntil(b"\r\n", MAX_HEAD_BYTES) != b"\r\n":
                    pass
                break
            parts.append((await channel.readexactly(size + 2))[:-2])
        body = b"".join(parts)
    elif response.length is not None:
        body = await channel.readexactly(response.length) if response.length else b""
    else:
        body = await _read_to_end(channel)
        response.keep_alive = False
    return body


async def _read_to_end(channel: Channel) -> bytes:
    """A close-delimited body: everything until the upstream closes."""
    parts = []
    while data := await channel.read(MAX_BODY_READ):
        parts.append(data)
    return b"".join(parts)


def finish(connections: Connections, response: Response) -> None:
    """Return a fully read response's connection to the pool (or close it)."""
    if response.keep_alive:
        connections.release(response.conn)
    else:
        response.conn.close()


def request_head(method: str, target: str, origin: Origin, headers: str,
                 body_length: int | None) -> bytes:
    """An HTTP/1.1 request head for upstream, keep-alive, with Content-Length when given.

    `headers` is a block of header lines, each ending CRLF (http.header_block).
    """
    host = _HOST_LINES.get(origin)
    if host is None:  # once per origin: the origins are the configured few
        host = _HOST_LINES[origin] = f"Host: {origin.authority}\r\n"
    length = "" if body_length is None else f"Content-Length: {body_length}\r\n"
    return f"{method} {target} HTTP/1.1\r\n{host}{headers}{length}\r\n".encode("latin-1")


async def fetch(connections: Connections, origin: Origin, path: str, headers: list[tuple[str, str]],
                timeout_s: float) -> tuple[int, bytes]:
    """GET `path` from `origin`: (status, body); raises UpstreamError when nothing answers."""
    head = request_head("GET", path, origin, header_block(headers), None)
    response = await exchange(connections, origin, head, b"", timeout_s)
    response.conn.watchdog.arm(timeout_s, response.conn.abort)
    try:
        body = await read_body(response)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
            ValueError) as exc:
        response.conn.close()
        raise UpstreamError(f"{origin.url}{path}: {type(exc).__name__}") from None
    finally:
        response.conn.watchdog.disarm()
    finish(connections, response)
    return response.status, body
