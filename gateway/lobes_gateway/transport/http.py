"""The small asyncio HTTP/1.1 layer: request heads, bodies (length or chunked), responses."""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import TYPE_CHECKING, NamedTuple

from lobes_contract import DEFAULT_PRIORITY_CLASS

from . import errors
from .channel import Channel
from .errors import ApiError
from .heads import ShapeMemo, split_head
from .watchdog import Watchdog

if TYPE_CHECKING:
    from .trace import Trace

MAX_HEAD_BYTES = 64 * 1024
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_STATUS_LINES = {code: f"HTTP/1.1 {code} {phrase}\r\n".encode()
                 for code, phrase in _REASONS.items()}
_JSON = "application/json"


class HttpError(Exception):
    """A request that cannot be served; the connection is answered with `error` and closed."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class RequestShape(NamedTuple):
    """What a request head's shape (heads.py) parses to: all of a Request but its own
    headers (the shape's plus its per-message lines)."""

    method: str
    target: str
    path: str
    version: str
    keep_alive: bool
    headers: dict[str, str]
    block: str


class Request:
    """A parsed request head; the body is read separately, after the auth gate."""

    __slots__ = ("body", "header_block", "headers", "keep_alive", "method", "path", "priority",
                 "request_id", "target", "trace", "version", "watchdog")

    def __init__(self, shape: RequestShape, headers: dict[str, str]) -> None:
        # The header block: the lines as they came (each ending CRLF), less Content-Length and
        # X-Request-Id (parse_head), one per head shape, forwarded without rebuilding.
        (self.method, self.target, self.path, self.version, self.keep_alive, _shared,
         self.header_block) = shape
        self.headers = headers
        # The id every upstream hop is sent (the trace's choice), None until it is named.
        self.request_id: str | None = None
        self.body = b""
        # The connection's deadline keeper, armed again for the body wait.
        self.watchdog: Watchdog | None = None
        # What metrics and the access log learn of it (set by the gateway once it is named).
        self.trace: Trace | None = None
        # The priority class it runs in (policy/admission.py), set once its key is known.
        self.priority = DEFAULT_PRIORITY_CLASS


def parse_head(head: bytes) -> Request:
    """Parse a request line and header block (ending in a blank line). The block a request keeps
    has neither Content-Length nor X-Request-Id: each hop frames its own body, and the trace
    adds the id it keeps."""
    key, lengths, ids = split_head(head)
    shape = _REQUEST_SHAPES.parsed(key)
    headers = dict(shape.headers)  # the request's own: the trace sets its id there
    if lengths:
        _add_value(headers, "content-length", b", ".join(lengths).decode("latin-1"))
    if ids:
        _add_value(headers, "x-request-id", b", ".join(ids).decode("latin-1"))
    if "transfer-encoding" in headers:
        _check_chunked_framing(headers)
    return Request(shape, headers)


def _add_value(headers: dict[str, str], name: str, value: str) -> None:
    """Add a header's value as repeated lines join: comma-separated, in order."""
    headers[name] = f"{headers[name]}, {value}" if name in headers else value


def _parse_shape(head: bytes) -> RequestShape:
    text = head.decode("latin-1")
    lines = text.count("\r\n")
    if text.count("\n") != lines or text.count("\r") != lines:
        # A bare CR or LF would end a line early upstream: the head is forwarded as it came.
        raise HttpError(errors.bad_request("bare CR or LF in the request head; end lines with "
                                           "CRLF"))
    line_end = text.find("\r\n")
    try:
        method, target, version = text[:line_end].split(" ", 2)
    except ValueError:
        raise HttpError(errors.bad_request("malformed request line")) from None
    if not version.startswith("HTTP/1.") or not target.startswith("/"):
        raise HttpError(errors.bad_request("malformed request line; speak HTTP/1.1"))
    block = text[line_end + 2:-2]
    headers: dict[str, str] = {}
    for line in block.split("\r\n")[:-1]:
        name, sep, value = line.partition(":")
        if not sep or not name or name[-1] in " \t" or name[0] in " \t":
            # A leading space is obs-fold (RFC 9112 5.2): a continuation a backend may join.
            raise HttpError(errors.bad_request(f"malformed header line {line[:40]!r}"))
        _add_value(headers, name.lower(), value.strip())
    connection = headers.get("connection", "").lower()
    keep_alive = connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
    return RequestShape(method, target, target.split("?", 1)[0], version, keep_alive, headers,
                        block)


_REQUEST_SHAPES: ShapeMemo[RequestShape] = ShapeMemo(_parse_shape)


def _check_chunked_framing(headers: dict[str, str]) -> None:
    """One unambiguous framing (RFC 9112 6.1, 6.3): a request that a proxy in front could frame
    otherwise is refused, never answered, so no bytes after it are read as another request."""
    if "content-length" in headers:
        raise HttpError(errors.bad_request("both Transfer-Encoding and Content-Length frame this "
                                           "request; send one of them"))
    codings = [c.strip().lower() for c in headers["transfer-encoding"].split(",")]
    if codings[-1] != "chunked" or codings.count("chunked") != 1:
        raise HttpError(errors.bad_request("Transfer-Encoding must end in chunked, once; send "
                                           "chunked or Content-Length"))
    if codings != ["chunked"]:
        raise HttpError(errors.not_implemented(f"transfer coding {codings[0]!r}; send the body "
                                               "chunked or with Content-Length"))


def header_block(headers: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """Header lines, each ending CRLF, from (name, value) pairs."""
    return "".join(f"{name}: {value}\r\n" for name, value in headers)


def header_names(*names: str, prefixes: tuple[str, ...] = ()) -> re.Pattern[str]:
    """A pattern matching whole header lines by name (any case), or by name prefix."""
    choices = [re.escape(name) + r"[ \t]*:" for name in names]
    choices += [re.escape(prefix) + r"[^:\r\n]*:" for prefix in prefixes]
    return re.compile(r"^(?:" + "|".join(choices) + r")[^\r\n]*\r\n", re.I | re.M)


def is_chunked(headers: dict[str, str]) -> bool:
    """Whether the body is chunked (parse_head admits no other transfer coding)."""
    return "transfer-encoding" in headers


def declared_length(headers: dict[str, str]) -> int:
    """The Content-Length of a request (0 when absent); a bad value is a 400."""
    raw = headers.get("content-length")
    if raw is None:
        return 0
    if not raw.isdigit():
        raise HttpError(errors.bad_request("invalid Content-Length"))
    return int(raw)


def buffered_body(client: Channel, headers: dict[str, str], limit: int) -> bytes | None:
    """The body when Content-Length sizes it and it is here already, else None (read_body)."""
    if "transfer-encoding" in headers:
        return None
    length = declared_length(headers)
    if length > limit:
        raise HttpError(errors.payload_too_large(limit))
    return client.take(length)


async def read_body(client: Channel, headers: dict[str, str], limit: int) -> bytes:
    """Read a request body, by Content-Length or chunked; over `limit` bytes is a 413."""
    if is_chunked(headers):
        return await _read_chunked(client, limit)
    length = declared_length(headers)
    if length > limit:
        raise HttpError(errors.payload_too_large(limit))
    return await client.readexactly(length) if length else b""


async def _read_chunked(client: Channel, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        line = await client.readuntil(b"\r\n", MAX_HEAD_BYTES)
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise HttpError(errors.bad_request("malformed chunk size")) from None
        if size == 0:
            while await client.readuntil(b"\r\n", MAX_HEAD_BYTES) != b"\r\n":
                pass  # trailers are dropped
            return b"".join(parts)
        total += size
        if total > limit:
            raise HttpError(errors.payload_too_large(limit))
        parts.append((await client.readexactly(size + 2))[:-2])


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else f"HTTP/1.1 {status} Status\r\n".encode()


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
