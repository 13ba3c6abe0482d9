"""Pooled keep-alive upstream connections and the request/response-head exchange."""

from __future__ import annotations

import asyncio
import re
import time
from collections import defaultdict
from typing import NamedTuple

from lobes_contract import host_port, http_origin

from .channel import Channel
from .chunked import ChunkDecoder, is_field_line
from .heads import ShapeMemo, split_head
from .http import MAX_HEAD_BYTES, header_block
from .watchdog import Watchdog

MAX_IDLE_PER_ORIGIN = 512
MAX_BODY_READ = 256 * 1024
# A non-streamed answer held whole (a chunked or close-delimited one, a probe's) larger than this
# is a broken answer, not a reason to grow the gateway without bound.
MAX_BUFFERED_ANSWER = 64 * 1024 * 1024
# How long an origin that sent bytes nobody asked for gets no pooled connection.
UNPOOLED_S = 60.0
# 1xx heads before the final one: more is a broken answer.
_MAX_INTERIM = 8
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [\t \x21-\x7e\x80-\xff]*)?")
# A length is 1 to 18 ASCII digits (bytes.isdigit is ASCII only: cheaper than a regex match).
_LENGTH_DIGITS = 18
# The response headers a client is relayed, from a gear or a peer (the gateway writes framing,
# the request id and its own X-Lobes-* itself): each with the values it may carry. Anything else
# (Set-Cookie, CORS headers, another box's X-Lobes-Served-By, ...) stays on the upstream hop.
_TIER_VALUE = re.compile(rb"[a-z_]{1,32}")
_RELAYED: dict[bytes, re.Pattern[bytes] | None] = {
    b"content-type": None,
    b"content-encoding": None,
    b"retry-after": re.compile(rb"[0-9]{1,9}"),
    b"x-lobes-tier": _TIER_VALUE,
    b"x-lobes-tier-reason": _TIER_VALUE,
}
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
    """No usable response head came back: refused, unreachable, reset, timed out, or a head
    the gateway does not understand exactly."""


class BodyTimeouts(NamedTuple):
    """How long a read after the head may wait: for any next byte, and for a whole answer."""

    idle_s: float
    total_s: float


# As GatewayConfig's defaults: GATEWAY_STREAM_STALL_S, GATEWAY_UPSTREAM_TIMEOUT_S.
DEFAULT_BODY_TIMEOUTS = BodyTimeouts(30.0, 600.0)


class Connection:
    """One upstream socket."""

    __slots__ = ("channel", "origin", "timed_out", "watchdog")

    def __init__(self, origin: Origin, channel: Channel, watchdog: Watchdog | None = None) -> None:
        self.origin = origin
        self.channel = channel
        self.timed_out = False
        self.watchdog = watchdog or Watchdog(asyncio.get_running_loop())

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

    __slots__ = ("chunked", "conn", "headers", "ids", "keep_alive", "length", "raw", "relayed",
                 "status")

    def __init__(self, conn: Connection, raw: bytes) -> None:
        self.conn = conn
        self.raw = raw
        # The X-Request-Id the answer echoes, if any: never relayed (the gateway writes the
        # request's own), but an answer that names another request is not this one's.
        key, lengths, self.ids = split_head(raw)
        shape = _RESPONSE_SHAPES.parsed(key)
        self.status, self.headers, self.relayed, self.keep_alive, self.chunked = shape
        self.length = _content_length(lengths) if lengths else None
        if self.chunked and self.length is not None:
            raise ValueError("both Transfer-Encoding and Content-Length frame the answer")
        if self.status in (204, 304):  # never a body (RFC 9110 15.3.5, 15.4.5)
            self.length, self.chunked = 0, False


def _content_length(values: tuple[bytes, ...]) -> int:
    """The length its Content-Length lines agree on; a ValueError when they do not or it is not
    a number (the body's end is then unknown)."""
    first = values[0]
    if not (first.isdigit() and len(first) <= _LENGTH_DIGITS) or values.count(first) != len(values):
        raise ValueError(f"bad Content-Length {values[:2]!r}")
    return int(values[0])


def _parse_shape(raw: bytes) -> _ResponseShape:
    """A response head's shape, strictly: its status line and each field by the grammar (a bare
    CR or LF, a control byte, a name that is not a token is a ValueError); the few headers the
    gateway reads itself, lowered; and the lines a client may see: allow-listed ones only,
    written from what was parsed."""
    line_end = raw.find(b"\r\n")
    status_line = _STATUS_LINE.fullmatch(raw, 0, line_end)
    if status_line is None:
        raise ValueError(f"malformed status line {raw[:40]!r}")
    headers: dict[bytes, bytes] = {}
    fields: list[tuple[bytes, bytes]] = []
    block = raw[line_end + 2:-4]
    for line in block.split(b"\r\n") if block else ():
        if not is_field_line(line):
            raise ValueError(f"malformed header line {line[:40]!r}")
        name, _colon, value = line.partition(b":")
        name, value = name.lower(), value.strip(b" \t")
        if name == b"content-length":  # split_head takes every well-formed one
            raise ValueError(f"bad Content-Length line {line[:40]!r}")
        if name in _READ_HEADERS:
            headers[name] = value.lower() if name not in headers else headers[name] + b"," + \
                value.lower()
        fields.append((line.partition(b":")[0], value))
    http_1_0 = status_line.group(1) == b"0"
    return _ResponseShape(int(status_line.group(2)), headers, _relayed(fields, headers),
                          _keeps_alive(headers, http_1_0), _is_chunked(headers, http_1_0))


def _relayed(fields: list[tuple[bytes, bytes]], headers: dict[bytes, bytes]) -> bytes:
    """The lines a client is relayed: allow-listed names with allowed values, none named in
    Connection, each ending CRLF."""
    named = set(_tokens(headers.get(b"connection", b"")))
    lines = []
    for name, value in fields:
        lowered = name.lower()
        if lowered in named or lowered not in _RELAYED:
            continue
        allowed = _RELAYED[lowered]
        if allowed is None or allowed.fullmatch(value):
            lines.append(name + b": " + value + b"\r\n")
    return b"".join(lines)


def _tokens(value: bytes) -> list[bytes]:
    """A comma-separated list, its empty elements dropped (values are lowered already)."""
    return [item for item in (part.strip(b" \t") for part in value.split(b",")) if item]


def _keeps_alive(headers: dict[bytes, bytes], http_1_0: bool) -> bool:
    options = _tokens(headers.get(b"connection", b""))
    return b"close" not in options and (not http_1_0 or b"keep-alive" in options)


def _is_chunked(headers: dict[bytes, bytes], http_1_0: bool) -> bool:
    """Whether the answer is chunked: Transfer-Encoding may say chunked and nothing else (the
    gateway decodes no other coding), and never on HTTP/1.0, whose framing it cannot trust."""
    codings = headers.get(b"transfer-encoding")
    if codings is None:
        return False
    if http_1_0 or _tokens(codings) != [b"chunked"]:
        raise ValueError(f"unsupported Transfer-Encoding {codings[:40]!r}")
    return True


_RESPONSE_SHAPES: ShapeMemo[_ResponseShape] = ShapeMemo(_parse_shape)
# Each origin's Host line, as request_head writes it.
_HOST_LINES: dict[Origin, str] = {}


class Connections:
    """The upstream connection pool: idle keep-alive connections per origin; connect failures
    raise UpstreamError. `body_timeouts` bound every read of an answer after its head.

    An origin that sends bytes nobody asked for (an answer longer than its framing, a response
    on an idle connection, an answer that names another request) gets no pooled connection for
    UNPOOLED_S: each request then has a connection of its own, so a stray answer written later
    meets a closed socket instead of the next request.
    """

    def __init__(self, connect_timeout_s: float,
                 body_timeouts: BodyTimeouts = DEFAULT_BODY_TIMEOUTS) -> None:
        self._idle: dict[Origin, list[Connection]] = defaultdict(list)
        self._connect_timeout = connect_timeout_s
        self.body_timeouts = body_timeouts
        self._unpooled: dict[Origin, float] = {}  # until when (monotonic)
        self.distrusted: defaultdict[str, int] = defaultdict(int)  # by origin URL

    async def open(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        # A timer cancels the dial: wait_for needs a current Task on Python >= 3.12, and this
        # runs in a connection's Fiber (fiber.py).
        connecting = loop.create_task(loop.create_connection(Channel, origin.host, origin.port))
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            connecting.cancel()

        # The connection's own watchdog times the dial: its timer, due soon, serves the later
        # (longer) deadlines too, where a timer of the dial's own would be cancelled at once
        # and linger in the loop's heap until it was due.
        watchdog = Watchdog(loop)
        watchdog.arm(self._connect_timeout, expire)
        try:
            _transport, channel = await connecting
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {origin.url}: {exc}") from None
        except asyncio.CancelledError:
            if not expired:
                raise  # the waiter itself was cancelled, not the dial timed out
            raise UpstreamError(f"cannot connect to {origin.url}: timeout") from None
        finally:
            # Nothing to do when its timer fires: a failed dial's ends there, as a cancelled
            # timer would have; a connection's serves its next deadline.
            watchdog.disarm()
        return Connection(origin, channel, watchdog)

    def take_idle(self, origin: Origin) -> Connection | None:
        """An idle pooled connection that is still usable, or None."""
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.channel.reusable():
                return conn
            self._discard(conn)
        return None

    def release(self, conn: Connection) -> None:
        """Pool a connection whose answer ended exactly where its framing said: one with bytes
        nobody asked for, or closing, is closed (take_idle checks again when it is wanted,
        for bytes that came while it was idle)."""
        origin = conn.origin
        idle = self._idle[origin]
        if (len(idle) < MAX_IDLE_PER_ORIGIN and conn.channel.reusable()
                and not (self._unpooled and self._is_unpooled(origin))):
            idle.append(conn)
        else:
            self._discard(conn)

    def distrust(self, origin: Origin) -> None:
        """`origin` sent bytes nobody asked for: pool none of its connections for UNPOOLED_S."""
        self._unpooled[origin] = time.monotonic() + UNPOOLED_S
        self.distrusted[origin.url] += 1
        for conn in self._idle.pop(origin, ()):
            conn.close()

    def _discard(self, conn: Connection) -> None:
        if conn.channel.pending():
            self.distrust(conn.origin)
        conn.close()

    def _is_unpooled(self, origin: Origin) -> bool:
        until = self._unpooled.get(origin)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._unpooled[origin]
        return False

    def close_all(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def exchange(connections: Connections, origin: Origin, head: bytes, body: bytes,
                   timeout_s: float, upgrade: bool = False,
                   request_id: str | None = None, client: Channel | None = None) -> Response:
    """Send one request; its final response head within timeout_s (1xx heads skipped; a 101 is
    an answer only when `upgrade` asked for one). An answer that echoes an X-Request-Id other
    than `request_id` (the one sent) answers another request: it is refused, and its origin
    distrusted.

    A stale pooled socket (closed or reset before any byte of an answer) is retried once on a
    fresh one; a head the gateway cannot read is never asked again. A `client` that leaves
    while the answer is awaited aborts the exchange at once (its upstream work is given back).
    """
    for _attempt in range(2):
        conn = connections.take_idle(origin)
        reused = conn is not None
        if conn is None:
            conn = await connections.open(origin)
        conn.watchdog.arm(timeout_s, conn.abort)
        if client is not None and not client.watch_gone(conn.abort):
            conn.abort()
        channel = conn.channel
        try:
            # Inline, not a helper coroutine: every request's answer waits here.
            channel.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                channel.write(body)
                await channel.drain()
            response = Response(conn, await channel.readuntil(b"\r\n\r\n", MAX_HEAD_BYTES))
            if response.status < 200 and not _final(response, upgrade):
                response = await _past_interim(conn, upgrade)
            if request_id is not None and response.ids and \
                    response.ids[-1] != request_id.encode("latin-1"):
                connections.distrust(origin)
                raise ValueError("an answer that names another request's X-Request-Id")
            return response
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            conn.close()
            if reused and not conn.timed_out and not getattr(exc, "partial", b""):
                continue
            what = "timed out" if conn.timed_out else f"failed ({type(exc).__name__})"
            raise UpstreamError(f"{origin.url} {what} before a response") from None
        except (asyncio.LimitOverrunError, ValueError) as exc:
            conn.close()
            raise UpstreamError(f"{origin.url} answered with a broken head: {exc}") from None
        finally:
            conn.watchdog.disarm()
            if client is not None:
                client.watch_gone(None)
    raise UpstreamError(f"{origin.url} closed the connection twice")


def _final(response: Response, upgrade: bool) -> bool:
    """Whether `response` is the answer, not an interim (1xx) head: a 101 only when `upgrade`
    asked for one (otherwise a ValueError)."""
    if response.status == 101:
        if not upgrade:
            raise ValueError("101 Switching Protocols to a request that asked for none")
        return True
    return response.status >= 200


async def _past_interim(conn: Connection, upgrade: bool) -> Response:
    """The final head after an interim one: _MAX_INTERIM heads in all, at most."""
    for _interim in range(1, _MAX_INTERIM):
        response = Response(conn, await conn.channel.readuntil(b"\r\n\r\n", MAX_HEAD_BYTES))
        if _final(response, upgrade):
            return response
    raise ValueError(f"more than {_MAX_INTERIM} interim responses")


class BodyReader:
    """The reads of one answer's body after its head, each under the connection's watchdog:
    the next bytes within idle_s (the first ones within `first_s` when given: a stream's first
    token waits for its prompt), all of them within total_s of the first read."""

    __slots__ = ("_conn", "_deadline", "_first", "_idle")

    def __init__(self, conn: Connection, timeouts: BodyTimeouts,
                 first_s: float | None = None) -> None:
        self._conn = conn
        self._idle = timeouts.idle_s
        self._first = first_s
        self._deadline = time.monotonic() + timeouts.total_s

    async def read(self, most: int) -> bytes:
        """Up to `most` bytes; b"" at the end of the stream. A wait past either timeout aborts
        the connection (conn.timed_out), which raises here as a lost connection."""
        conn = self._conn
        wait, self._first = self._first or self._idle, None
        conn.watchdog.arm(min(wait, self._deadline - time.monotonic()), conn.abort)
        try:
            data = await conn.channel.read(most)
        finally:
            conn.watchdog.disarm()
        if not data and conn.timed_out:  # the watchdog's abort, not the upstream's own end
            raise ConnectionResetError("upstream sent nothing in time")
        return data


async def read_body(response: Response, timeouts: BodyTimeouts,
                    limit: int = MAX_BUFFERED_ANSWER) -> bytes:
    """Read a whole response body (length, chunked or close-delimited) of at most `limit`
    bytes, each read bounded by `timeouts`; a body past the limit or broken framing is a
    ValueError. The connection is then pooled or closed by finish()."""
    length = response.length
    if length is not None and length > limit:
        raise ValueError(f"an answer of {length} bytes (the gateway holds at most {limit})")
    reader = BodyReader(response.conn, timeouts)
    decoder = ChunkDecoder() if response.chunked else None
    parts: list[bytes] = []
    held = 0
    while decoder is None or not decoder.done:
        wanted = MAX_BODY_READ if length is None else min(MAX_BODY_READ, length - held)
        if length is not None and not wanted:
            break
        data = await reader.read(wanted)
        if not data:
            if decoder is None and length is None:  # close-delimited: the close ends it
                response.keep_alive = False
                break
            raise ConnectionResetError("upstream closed mid-answer")
        if decoder is not None:
            data = decoder.feed(data)
        parts.append(data)
        held += len(data)
        if held > limit:
            raise ValueError(f"an answer over {limit} bytes (the gateway holds at most that)")
    if decoder is not None and not decoder.clean:
        response.keep_alive = False
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
                timeout_s: float, limit: int = MAX_BUFFERED_ANSWER) -> tuple[int, bytes]:
    """GET `path` from `origin`: (status, body of at most `limit` bytes), all within timeout_s;
    raises UpstreamError when nothing (or nothing readable) answers."""
    head = request_head("GET", path, origin, header_block(headers), None)
    response = await exchange(connections, origin, head, b"", timeout_s)
    try:
        body = await read_body(response, BodyTimeouts(timeout_s, timeout_s), limit)
    except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
        response.conn.close()
        raise UpstreamError(f"{origin.url}{path}: {type(exc).__name__}") from None
    finish(connections, response)
    return response.status, body
