"""The small asyncio HTTP/1.1 layer: request heads, bodies (length or chunked), responses."""

from __future__ import annotations

import asyncio
import re
from http import HTTPStatus
from typing import TYPE_CHECKING, NamedTuple

from lobes_contract import DEFAULT_PRIORITY_CLASS

from . import errors
from .channel import Channel
from .chunked import MAX_CHUNK_LINE, MAX_TRAILER_BYTES, chunk_size, is_field_line
from .errors import ApiError
from .heads import ShapeMemo, split_head
from .json_body import JsonBody
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

    __slots__ = ("body", "header_block", "headers", "json", "keep_alive", "method", "path",
                 "priority", "request_id", "strip_usage", "target", "trace", "version",
                 "watchdog")

    def __init__(self, shape: RequestShape, headers: dict[str, str]) -> None:
        # The header block: the lines as they came (each ending CRLF), less Content-Length and
        # X-Request-Id (parse_head), one per head shape, forwarded without rebuilding.
        (self.method, self.target, self.path, self.version, self.keep_alive, _shared,
         self.header_block) = shape
        self.headers = headers
        # The id every upstream hop is sent (the trace's choice), None until it is named.
        self.request_id: str | None = None
        self.body = b""
        # The body read as JSON (a JSON lane's), which dispatch changes member by member.
        self.json: JsonBody | None = None
        # The connection's deadline keeper, armed again for the body wait.
        self.watchdog: Watchdog | None = None
        # What metrics and the access log learn of it (set by the gateway once it is named).
        self.trace: Trace | None = None
        # The priority class it runs in (policy/admission.py), set once its key is known.
        self.priority = DEFAULT_PRIORITY_CLASS
        # A stream whose usage the gateway asks for and the caller did not (app/meter.py).
        self.strip_usage = False


def parse_head(head: bytes) -> Request:
    """Parse a request line and header block (ending in a blank line), strictly (RFC 9112): a
    head that another parser could read otherwise is refused. The block a request keeps has
    neither Content-Length nor X-Request-Id: each hop frames its own body, and the trace adds
    the id it keeps."""
    key, lengths, ids = split_head(head)
    shape = _REQUEST_SHAPES.parsed(key)
    headers = dict(shape.headers)  # the request's own: the trace sets its id there
    if lengths:
        headers["content-length"] = _content_length(lengths)
    if ids:
        headers["x-request-id"] = _request_id(ids)
    if "transfer-encoding" in headers:
        _check_chunked_framing(headers)
    return Request(shape, headers)


def _content_length(values: tuple[bytes, ...]) -> str:
    """The one Content-Length of a request: ASCII digits, bounded, on one line."""
    if len(values) > 1:
        raise HttpError(errors.bad_request("Content-Length sent more than once; send it once"))
    value = values[0]
    if not (value.isdigit() and len(value) <= _LENGTH_DIGITS):
        raise HttpError(errors.bad_request("invalid Content-Length; send a decimal number of "
                                           "bytes (at most 18 digits)"))
    return value.decode("ascii")


def _request_id(values: tuple[bytes, ...]) -> str:
    text = ", ".join(value.decode("latin-1") for value in values)
    if _BAD_VALUE.search(text):
        raise HttpError(errors.bad_request("a control byte in X-Request-Id; send printable "
                                           "characters"))
    return text


def _add_value(headers: dict[str, str], name: str, value: str) -> None:
    """Add a header's value as repeated lines join: comma-separated, in order."""
    headers[name] = f"{headers[name]}, {value}" if name in headers else value


# RFC 9110 5.6.2: a token; 5.5: a field value is visible bytes (and obs-text) with SP or HTAB
# between them; 9112 3.2: a target is visible ASCII. Anything else is refused, never passed on.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TARGET = re.compile(r"[\x21-\x7e]+")
# A length is 1 to 18 ASCII digits (bytes.isdigit is ASCII only: cheaper than a regex match).
_LENGTH_DIGITS = 18
_VERSION = re.compile(r"HTTP/([0-9])\.([0-9])")
# uri-host [":" port]: a bracketed IP literal or a reg-name / IPv4 address (RFC 3986 3.2.2).
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::[0-9]*)?")
_ABSOLUTE = re.compile(r"https?://[^/?#]*", re.I)
# Request headers never forwarded upstream as they came: the hop's own, the framing each hop
# writes itself, and the caller's key.
_NOT_FORWARDED = frozenset(("connection", "keep-alive", "proxy-connection", "te", "trailer",
                            "transfer-encoding", "upgrade", "host", "content-length", "expect",
                            "authorization"))
# A request target longer than this is a 414 (as nginx's default buffers answer).
MAX_TARGET_BYTES = 8 * 1024


def _parse_shape(head: str | bytes) -> RequestShape:
    text = head.decode("latin-1") if isinstance(head, bytes) else head
    lines = text.count("\r\n")
    if text.count("\n") != lines or text.count("\r") != lines:
        # A bare CR or LF would end a line early upstream.
        raise HttpError(errors.bad_request("bare CR or LF in the request head; end lines with "
                                           "CRLF"))
    line_end = text.find("\r\n")
    method, target, path, version = _request_line(text[:line_end])
    headers: dict[str, str] = {}
    fields: list[tuple[str, str]] = []
    for line in text[line_end + 2:-4].split("\r\n") if line_end + 2 < len(text) - 4 else ():
        name, value = _field(line)
        lowered = name.lower()
        if lowered == "content-length":  # a well-formed one is split off with the head's shape
            raise HttpError(errors.bad_request("invalid Content-Length; send a decimal number "
                                               "of bytes"))
        if lowered == "transfer-encoding" and not _list(value):
            raise HttpError(errors.bad_request("a Transfer-Encoding line that names no coding; "
                                               "send chunked"))
        _add_value(headers, lowered, value)
        fields.append((name, value))
    hosts = sum(name.lower() == "host" for name, _value in fields)
    if hosts > 1 or (hosts == 0 and version == "HTTP/1.1"):
        raise HttpError(errors.bad_request("send exactly one Host header (RFC 9112 3.2)"))
    if hosts and not _HOST.fullmatch(headers["host"]):
        raise HttpError(errors.bad_request("invalid Host header; send host[:port]"))
    return RequestShape(method, target, path, version, _keeps_alive(version, headers), headers,
                        _end_to_end(fields, headers))


def _end_to_end(fields: list[tuple[str, str]], headers: dict[str, str]) -> str:
    """The header lines a hop upstream is sent, written from the parsed fields: not the ones
    that describe this hop (RFC 9110 7.6.1, those named in Connection too), nor the caller's
    key, which opens this gateway only."""
    skipped = _NOT_FORWARDED.union(_list(headers.get("connection", "")))
    return "".join(f"{name}: {value}\r\n" for name, value in fields
                   if name.lower() not in skipped)


def _request_line(line: str) -> tuple[str, str, str, str]:
    """method, origin-form target, path and version of a request line, strictly."""
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise HttpError(errors.bad_request("malformed request line; send METHOD /path HTTP/1.1"))
    method, target, version = parts
    if len(target) > MAX_TARGET_BYTES:
        raise HttpError(errors.uri_too_long(MAX_TARGET_BYTES))
    version_match = _VERSION.fullmatch(version)
    if not _TARGET.fullmatch(target) or version_match is None:
        raise HttpError(errors.bad_request("malformed request line; send METHOD /path HTTP/1.1"))
    if version_match.group(1) != "1":
        raise HttpError(errors.version_not_supported(version))
    if version != "HTTP/1.0":
        version = "HTTP/1.1"  # a later 1.x minor is answered as 1.1 (RFC 9110 6.2)
    absolute = _ABSOLUTE.match(target)
    if absolute is not None:  # absolute-form (RFC 9112 3.2.2): what follows the authority
        target = target[absolute.end():] or "/"
    if not target.startswith("/"):
        raise HttpError(errors.bad_request("the request target must be a path (/...) or an "
                                           "absolute http URL"))
    return method, target, target.split("?", 1)[0], version


def _field(line: str) -> tuple[str, str]:
    """A header line's name and value (optional whitespace around it stripped), strictly."""
    name, sep, value = line.partition(":")
    if not sep or not _TOKEN.fullmatch(name):
        # A leading space is obs-fold (RFC 9112 5.2): a continuation a backend may join.
        raise HttpError(errors.bad_request(f"malformed header line {line[:40]!r}; send "
                                           "Name: value"))
    value = value.strip(" \t")
    if _BAD_VALUE.search(value):
        raise HttpError(errors.bad_request(f"a control byte in the {name} header; send "
                                           "printable characters"))
    return name, value


def _keeps_alive(version: str, headers: dict[str, str]) -> bool:
    """Whether the connection may serve another request (RFC 9112 9.3): `close` anywhere in
    Connection ends it; HTTP/1.0 keeps it only when asked, and never after a
    Transfer-Encoding, whose framing it cannot trust (RFC 9112 6.1)."""
    options = _list(headers.get("connection", ""))
    if "close" in options:
        return False
    if version == "HTTP/1.0":
        return "keep-alive" in options and "transfer-encoding" not in headers
    return True


def _list(value: str) -> list[str]:
    """A comma-separated header list, lowered, its empty elements dropped (RFC 9110 5.6.1)."""
    return [item for item in (part.strip(" \t").lower() for part in value.split(",")) if item]


_REQUEST_SHAPES: ShapeMemo[RequestShape] = ShapeMemo(_parse_shape)


def _check_chunked_framing(headers: dict[str, str]) -> None:
    """One unambiguous framing (RFC 9112 6.1, 6.3): a request that a proxy in front could frame
    otherwise is refused, never answered, so no bytes after it are read as another request."""
    if "content-length" in headers:
        raise HttpError(errors.bad_request("both Transfer-Encoding and Content-Length frame this "
                                           "request; send one of them"))
    codings = _list(headers["transfer-encoding"])
    if not codings or codings[-1] != "chunked" or codings.count("chunked") != 1:
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
    """The Content-Length of a request (0 when absent); parse_head has checked its digits."""
    raw = headers.get("content-length")
    return 0 if raw is None else int(raw)


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
        line = await _read_line(client, MAX_CHUNK_LINE, "chunk-size line")
        try:
            size = chunk_size(line)
        except ValueError:
            raise HttpError(errors.bad_request("malformed chunk size; send 1*HEXDIG then CRLF "
                                               "(RFC 9112 7.1)")) from None
        if size == 0:
            await _read_trailers(client)
            return b"".join(parts)
        total += size
        if total > limit:
            raise HttpError(errors.payload_too_large(limit))
        data = await client.readexactly(size + 2)
        if data[-2:] != b"\r\n":
            raise HttpError(errors.bad_request("chunk data not followed by CRLF; frame each "
                                               "chunk as its size says"))
        parts.append(data[:-2])


async def _read_line(client: Channel, limit: int, what: str) -> bytes:
    try:
        return await client.readuntil(b"\r\n", limit)
    except asyncio.LimitOverrunError:
        raise HttpError(errors.bad_request(f"{what} longer than {limit} bytes")) from None


async def _read_trailers(client: Channel) -> None:
    """Read and drop the trailer section after the last chunk, each line a valid field."""
    left = MAX_TRAILER_BYTES
    while (line := await _trailer_line(client, left)) != b"\r\n":
        left -= len(line)
        if not is_field_line(line[:-2]):
            raise HttpError(errors.bad_request("malformed trailer field; send Name: value"))


async def _trailer_line(client: Channel, left: int) -> bytes:
    try:
        return await client.readuntil(b"\r\n", left)
    except asyncio.LimitOverrunError:
        raise HttpError(errors.head_too_large(MAX_TRAILER_BYTES, "trailer fields")) from None


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
