"""The small asyncio HTTP/1.1 layer: request heads, bodies (length or chunked), responses."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

from . import errors
from .errors import ApiError
from .watchdog import Watchdog

MAX_HEAD_BYTES = 64 * 1024
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_JSON = "application/json"


class HttpError(Exception):
    """A request that cannot be served; the connection is answered with `error` and closed."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class Request:
    """A parsed request head; the body is read separately, after the auth gate."""

    __slots__ = ("body", "headers", "method", "path", "target", "version", "watchdog")

    def __init__(self, method: str, target: str, version: str, headers: dict[str, str]) -> None:
        self.method = method
        self.target = target
        self.path = target.split("?", 1)[0]
        self.version = version
        self.headers = headers
        self.body = b""
        # The connection's deadline keeper, armed again for the body wait.
        self.watchdog: Watchdog | None = None

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


def parse_head(head: bytes) -> Request:
    """Parse a request line and header block (ending in a blank line)."""
    try:
        text = head[:-4].decode("latin-1")
        lines = text.split("\r\n")
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise HttpError(errors.bad_request("malformed request line")) from None
    if not version.startswith("HTTP/1.") or not target.startswith("/"):
        raise HttpError(errors.bad_request("malformed request line; speak HTTP/1.1"))
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name[-1] in " \t":
            raise HttpError(errors.bad_request(f"malformed header line {line[:40]!r}"))
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return Request(method, target, version, headers)


def is_chunked(headers: dict[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


def declared_length(headers: dict[str, str]) -> int:
    """The Content-Length of a request (0 when absent); a bad value is a 400."""
    raw = headers.get("content-length")
    if raw is None:
        return 0
    if not raw.isdigit():
        raise HttpError(errors.bad_request("invalid Content-Length"))
    return int(raw)


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str], limit: int) -> bytes:
    """Read a request body, by Content-Length or chunked; over `limit` bytes is a 413."""
    if is_chunked(headers):
        return await _read_chunked(reader, limit)
    length = declared_length(headers)
    if length > limit:
        raise HttpError(errors.payload_too_large(limit))
    return await reader.readexactly(length) if length else b""


async def _read_chunked(reader: asyncio.StreamReader, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise HttpError(errors.bad_request("malformed chunk size")) from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers are dropped
            return b"".join(parts)
        total += size
        if total > limit:
            raise HttpError(errors.payload_too_large(limit))
        parts.append((await reader.readexactly(size + 2))[:-2])


def status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n".encode()


def response_bytes(status: int, body: bytes, *, content_type: str = _JSON,
                   headers: tuple[tuple[str, str], ...] | list[tuple[str, str]] = (),
                   keep_alive: bool = True) -> bytes:
    """A complete response with Content-Length."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
             f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    if not keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def error_bytes(error: ApiError, extra: tuple[tuple[str, str], ...] | list[tuple[str, str]] = (),
                keep_alive: bool = True) -> bytes:
    """The OpenAI-shaped error response for `error`."""
    return response_bytes(error.status, error.body(), headers=[*error.headers, *extra],
                          keep_alive=keep_alive)
