"""Pooled keep-alive upstream connections and the request/response-head exchange."""

from __future__ import annotations

import asyncio
import socket
from collections import defaultdict

from .config import Origin
from .watchdog import Watchdog

MAX_IDLE_PER_ORIGIN = 512
# Response headers that describe the upstream hop, never relayed as they are.
HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                         b"proxy-connection", b"te", b"trailer", b"upgrade"})


class UpstreamError(Exception):
    """No response head came back: refused, unreachable, reset or timed out."""


def set_nodelay(writer: asyncio.StreamWriter) -> None:
    """Disable Nagle: small responses and SSE chunks must leave at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Connection:
    """One upstream socket."""

    __slots__ = ("origin", "reader", "timed_out", "watchdog", "writer")

    def __init__(self, origin: Origin, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.origin = origin
        self.reader = reader
        self.writer = writer
        self.timed_out = False
        self.watchdog = Watchdog(asyncio.get_running_loop())

    def usable(self) -> bool:
        return not (self.writer.is_closing() or self.reader.at_eof())

    def abort(self) -> None:
        self.timed_out = True
        self.close()

    def close(self) -> None:
        self.watchdog.close()
        self.writer.transport.abort()


class Response:
    """A response head read from upstream; the body is still on `conn`."""

    __slots__ = ("conn", "header_lines", "headers", "keep_alive", "length", "relayed", "status")

    def __init__(self, conn: Connection, status: int, header_lines: list[bytes],
                 headers: dict[bytes, bytes], relayed: list[bytes]) -> None:
        self.conn = conn
        self.status = status
        self.header_lines = header_lines
        self.headers = headers
        self.relayed = relayed
        self.keep_alive = headers.get(b"connection", b"").lower() != b"close"
        raw_length = headers.get(b"content-length")
        self.length = int(raw_length) if raw_length is not None else None

    @property
    def chunked(self) -> bool:
        return b"chunked" in self.headers.get(b"transfer-encoding", b"").lower()

    def relayed_headers(self) -> list[bytes]:
        """The upstream header lines a client may see (hop-by-hop headers dropped)."""
        return self.relayed


class Pool:
    """Idle keep-alive connections per origin; connect failures raise UpstreamError."""

    def __init__(self, connect_timeout_s: float) -> None:
        self._idle: dict[Origin, list[Connection]] = defaultdict(list)
        self._connect_timeout = connect_timeout_s

    async def open(self, origin: Origin) -> Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(origin.host, origin.port), self._connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {origin.url}: {exc or 'timeout'}") from None
        set_nodelay(writer)
        return Connection(origin, reader, writer)

    async def acquire(self, origin: Origin) -> tuple[Connection, bool]:
        """An idle pooled connection (reused=True) or a fresh one."""
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn, True
            conn.close()
        return await self.open(origin), False

    def release(self, conn: Connection) -> None:
        idle = self._idle[conn.origin]
        if conn.usable() and len(idle) < MAX_IDLE_PER_ORIGIN:
            idle.append(conn)
        else:
            conn.close()

    def close_all(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def read_head(conn: Connection, timeout_s: float) -> Response:
    """Read the next final response head (1xx other than 101 skipped) within `timeout_s`."""
    conn.watchdog.arm(timeout_s, conn.abort)
    try:
        while True:
            raw = await conn.reader.readuntil(b"\r\n\r\n")
            response = _parse_head(conn, raw)
            if response.status >= 200 or response.status == 101:
                return response
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
            ValueError) as exc:
        conn.close()
        what = "timed out" if conn.timed_out else f"failed ({type(exc).__name__})"
        raise UpstreamError(f"{conn.origin.url} {what} before a response") from None
    finally:
        conn.watchdog.disarm()


def _parse_head(conn: Connection, raw: bytes) -> Response:
    lines = raw[:-4].split(b"\r\n")
    status = int(lines[0][9:12])
    headers: dict[bytes, bytes] = {}
    relayed: list[bytes] = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        headers[key] = value.strip()
        if key not in HOP_HEADERS:
            relayed.append(line)
    return Response(conn, status, lines[1:], headers, relayed)


async def exchange(pool: Pool, origin: Origin, head: bytes, body: bytes,
                   timeout_s: float) -> Response:
    """Send one request and return its response head; a stale pooled socket is retried once."""
    for _ in range(2):
        conn, reused = await pool.acquire(origin)
        try:
            conn.writer.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                conn.writer.write(body)
                await conn.writer.drain()
            return await read_head(conn, timeout_s)
        except (UpstreamError, ConnectionError):
            conn.close()
            if not reused or conn.timed_out:
                raise
    raise UpstreamError(f"{origin.url} closed the connection twice")


async def read_body(response: Response) -> bytes:
    """Read a whole response body (length, chunked or close-delimited), then pool or close."""
    reader = response.conn.reader
    if response.chunked:
        parts = []
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                break
            parts.append((await reader.readexactly(size + 2))[:-2])
        body = b"".join(parts)
    elif response.length is not None:
        body = await reader.readexactly(response.length) if response.length else b""
    else:
        body = await reader.read()
        response.keep_alive = False
    return body


def finish(pool: Pool, response: Response) -> None:
    """Return a fully read response's connection to the pool (or close it)."""
    if response.keep_alive:
        pool.release(response.conn)
    else:
        response.conn.close()


def request_head(method: str, target: str, origin: Origin, headers: list[tuple[str, str]],
                 body_length: int | None) -> bytes:
    """An HTTP/1.1 request head for upstream, keep-alive, with Content-Length when given."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {origin.host_header}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    if body_length is not None:
        lines.append(f"Content-Length: {body_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def fetch(pool: Pool, origin: Origin, path: str, headers: list[tuple[str, str]],
                timeout_s: float) -> tuple[int, bytes]:
    """GET `path` from `origin`: (status, body); raises UpstreamError when nothing answers."""
    head = request_head("GET", path, origin, headers, None)
    response = await exchange(pool, origin, head, b"", timeout_s)
    response.conn.watchdog.arm(timeout_s, response.conn.abort)
    try:
        body = await read_body(response)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
            ValueError) as exc:
        response.conn.close()
        raise UpstreamError(f"{origin.url}{path}: {type(exc).__name__}") from None
    finally:
        response.conn.watchdog.disarm()
    finish(pool, response)
    return response.status, body
