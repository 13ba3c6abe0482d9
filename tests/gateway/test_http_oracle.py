"""The gateway's request parser against h11 as the oracle, on generated requests (hypothesis):
wherever h11 refuses a request, the gateway refuses it; where both accept it, they agree on its
method, target, headers and body. The gateway may be stricter than h11, never looser.

The parser runs in process, as the gateway runs it on a connection: the head read to its blank
line within MAX_HEAD_BYTES, parsed, then the body read by its framing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import h11
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from lobes_gateway.transport.channel import Channel
from lobes_gateway.transport.http import MAX_HEAD_BYTES, HttpError, parse_head, read_body

BODY_LIMIT = 1 << 20


@dataclass(frozen=True)
class Parsed:
    method: str
    target: str
    headers: dict[str, str]  # lowered names, repeated values joined with ", "
    body: bytes


class _Transport(asyncio.Transport):
    """The socket a Channel writes to, where the test only feeds it bytes."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def is_reading(self) -> bool:
        return True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return default


async def _gateway(data: bytes) -> Parsed | None:
    channel = Channel()
    channel.connection_made(_Transport())
    channel.data_received(data)
    channel.eof_received()
    try:
        request = parse_head(await channel.readuntil(b"\r\n\r\n", MAX_HEAD_BYTES))
        body = await read_body(channel, request.headers, BODY_LIMIT)
    except (HttpError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    return Parsed(request.method, request.target, request.headers, body)


def gateway_parse(data: bytes) -> Parsed | None:
    return asyncio.run(_gateway(data))


def h11_parse(data: bytes) -> Parsed | None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    conn.receive_data(data)
    conn.receive_data(b"")
    request, body = None, b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:  # NEED_DATA at the end of the input, or a close before the message ended
                return None
    except h11.RemoteProtocolError:
        return None
    assert request is not None
    headers: dict[str, str] = {}
    for name, value in request.headers:
        text = value.decode("latin-1")
        key = name.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return Parsed(request.method.decode("latin-1"), request.target.decode("latin-1"), headers,
                  body)


def _origin_form(target: str) -> str:
    """What the gateway keeps of an absolute-form target: its path and query."""
    if target.startswith("/"):
        return target
    rest = target.split("://", 1)[1]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    path = rest[cut:]
    return path if path.startswith("/") else "/" + path


def _comparable(headers: dict[str, str]) -> dict[str, str]:
    """The gateway keeps header values as sent; h11 lowers Transfer-Encoding's."""
    return {name: value.lower() if name == "transfer-encoding" else value
            for name, value in headers.items()}


_TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LATIN = st.characters(codec="latin-1", exclude_characters="\r\n")


def _mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """Valid nine times in ten: a request with one thing wrong finds more than one with
    everything wrong, which both parsers refuse at its first byte."""
    return st.one_of(*[valid] * 9, hostile)


_METHODS = _mostly(st.sampled_from(["POST", "GET", "PUT", "M-SEARCH"]),
                   st.sampled_from(["get", "", "P T"]) | st.text(
                       alphabet=_TCHAR + " \t\x00\x7f", min_size=1, max_size=6))
_TARGETS = _mostly(st.sampled_from(["/v1/chat/completions", "/", "/a?b=c", "/%2e/x"]),
                   st.sampled_from(["*", "http://h/v1/x", "https://h:8/p?q", "http://h", "h:80",
                                    "", "/a b"]) | st.text(alphabet=_LATIN, max_size=8).map(
                       lambda text: "/" + text))
_VERSIONS = _mostly(st.sampled_from(["HTTP/1.1", "HTTP/1.0"]),
                    st.sampled_from(["HTTP/1.2", "HTTP/2.0", "HTTP/1.1x", "http/1.1",
                                     "HTTP/11", ""]))
_NAMES = _mostly(st.sampled_from(["Connection", "Authorization", "X-A", "x-a", "Expect",
                                  "Content-Type", "Host", "Content-Length",
                                  "Transfer-Encoding"]),
                 st.text(alphabet=_TCHAR + " \t\x00\x0b:", min_size=0, max_size=6))
_VALUES = _mostly(st.sampled_from(["x", "close", "keep-alive", "keep-alive, close", " padded ",
                                   "", "a b", "Bearer k", "caf\xe9"]),
                  st.sampled_from(["chunked", "Chunked", ",chunked", "chunked, gzip", "5", "05",
                                   "+5", "5, 5", "-1", "h:80", "[::1]"])
                  | st.text(alphabet=_LATIN, max_size=8))
_ENDINGS = st.sampled_from(["\r\n"] * 60 + ["\n", "\r", " \r\n"])
_OWS = st.sampled_from([" ", "", "  ", "\t", " \t"])
_CHUNKED_BODIES = _mostly(
    st.lists(st.binary(min_size=1, max_size=9), max_size=3).map(
        lambda chunks: b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"),
    st.sampled_from([b"5;x=1\r\nhello\r\n0\r\nT: 1\r\n\r\n", b"-5\r\nhello\r\n0\r\n\r\n",
                     b"5\r\nhelloX0\r\n\r\n", b"05\r\nhello\r\n0\r\n\r\n",
                     b"5 \r\nhello\r\n0\r\n\r\n", b"0x5\r\nhello\r\n0\r\n\r\n",
                     b"5\r\nhello\r\n0\r\nBad T: 1\r\n\r\n", b"5\r\nhel", b""])
    | st.binary(max_size=16))


@st.composite
def requests(draw) -> bytes:
    """A request line, headers and a body framed by Content-Length, chunked, or not at all,
    each part valid nine times in ten."""
    line = f"{draw(_METHODS)} {draw(_TARGETS)} {draw(_VERSIONS)}"
    headers = draw(st.lists(st.tuples(_NAMES, _VALUES), max_size=4))
    if draw(st.sampled_from([True] * 9 + [False])):  # a Host most often, as clients send
        headers.insert(draw(st.integers(0, len(headers))), ("Host", draw(_mostly(
            st.sampled_from(["gw", "gw:8000", "10.0.0.1:1", "[::1]:8"]),
            st.sampled_from(["", "a b", "x@y", "h/p", "h:p"])))))
    framing = draw(st.sampled_from(["length", "chunked", "none"]))
    if framing == "length":
        body = draw(st.binary(max_size=12))
        length = draw(_mostly(st.just(str(len(body))), st.sampled_from(
            [str(len(body) + 3), "+1", "1 ", "0x1", "\xb2", "1, 1"])))
        headers.insert(draw(st.integers(0, len(headers))), ("Content-Length", length))
    elif framing == "chunked":
        body = draw(_CHUNKED_BODIES)
        headers.insert(draw(st.integers(0, len(headers))), ("Transfer-Encoding", "chunked"))
    else:
        body = draw(st.sampled_from([b"", b"extra"]))
    ending = draw(_ENDINGS)
    head = line + ending + "".join(f"{name}:{draw(_OWS)}{value}{draw(_OWS)}{draw(_ENDINGS)}"
                                   for name, value in headers)
    return (head + ending).encode("latin-1") + body


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=requests())
@example(data=b"GET / HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\nhello")
@example(data=b"POST / HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"-5\r\nhello\r\n0\r\n\r\n")
@example(data=b"POST / HTTP/1.1\r\nHost: gw\r\nAuthorization\x0b: Bearer k\r\n\r\n")
@example(data=b"POST http://gw/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n")
@example(data=b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length:  \r\n\r\n")
@example(data=b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: gw\r\n"
              b"Transfer-Encoding:  \r\n\r\n0\r\n\r\n")
def test_the_gateway_never_accepts_what_h11_refuses_and_agrees_where_both_accept(data):
    oracle = h11_parse(data)
    ours = gateway_parse(data)
    if oracle is None:
        assert ours is None, f"h11 refuses, the gateway accepts {data!r}"
        return
    if ours is None:
        return  # stricter than h11: allowed
    assert ours.method == oracle.method
    assert ours.target == _origin_form(oracle.target)
    assert _comparable(ours.headers) == _comparable(oracle.headers)
    assert ours.body == oracle.body
