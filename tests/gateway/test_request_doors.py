"""The caller's door, on the wire: a request the gateway does not understand exactly is refused
with the status RFC 9112/9110 names, OpenAI-shaped, and its connection closed; nothing of it
reaches the gear, and no bytes after it are read as another request. What does reach the gear
is written by the gateway from what it parsed, never copied.

The gear is a raw recording server (tests/support/fake_gear.py), so the test sees exactly
which bytes the gateway forwarded."""

from __future__ import annotations

import json
import socket

import pytest

from tests.support.fake_gear import FakeGear, wired_to
from tests.support.gateway_proc import start_gateway

LIMIT = 100_000
BODY = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
SMUGGLED = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % len(BODY) + BODY)


@pytest.fixture(scope="module")
def door():
    with FakeGear() as gear, start_gateway({**wired_to(gear),
                                            "GATEWAY_MAX_BODY_BYTES": str(LIMIT),
                                            "GATEWAY_HEADER_TIMEOUT_S": "2",
                                            "GATEWAY_BODY_TIMEOUT_S": "2"}) as gateway:
        yield gateway, gear


def exchange(gateway, data: bytes, timeout: float = 4.0) -> tuple[bytes, bool]:
    """Send `data`, read what comes back: (the bytes, whether the gateway closed the
    connection), without closing our side first (a kept connection times out here)."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=timeout) as sock:
        sock.sendall(data)
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except TimeoutError:
            return reply, False
        except ConnectionResetError:
            pass
        return reply, True


def post_head(*lines: bytes, target: bytes = b"/v1/chat/completions",
              version: bytes = b"HTTP/1.1") -> bytes:
    fields = b"".join(line + b"\r\n" for line in lines)
    return b"POST " + target + b" " + version + b"\r\n" + fields + b"\r\n"


HOST = b"Host: gw.example"
CL = b"Content-Length: %d" % len(BODY)
TE = b"Transfer-Encoding: chunked"
WHOLE = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)

# (request bytes, the status it must get): every one is refused, closed, and nothing of it (or
# of a request smuggled after it) reaches the gear.
REFUSED = [
    # Chunked framing by the grammar: chunk-size = 1*HEXDIG, CRLF after the data.
    pytest.param(post_head(HOST, TE) + b"-e8d4a51000\r\n" + b"x" * 300_000, 400,
                 id="negative-chunk-size-bypasses-the-body-limit"),
    pytest.param(post_head(HOST, TE) + b"-1\r\n" + BODY + b"\r\n0\r\n\r\n", 400,
                 id="chunk-size-minus-one"),
    pytest.param(post_head(HOST, TE) + b"+%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY), 400,
                 id="chunk-size-plus-sign"),
    pytest.param(post_head(HOST, TE) + b"0x%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY), 400,
                 id="chunk-size-0x-prefix"),
    pytest.param(post_head(HOST, TE) + b" %x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY), 400,
                 id="chunk-size-leading-space"),
    pytest.param(post_head(HOST, TE) + b"4_2\r\n" + BODY + b"\r\n0\r\n\r\n", 400,
                 id="chunk-size-underscore"),
    pytest.param(post_head(HOST, TE) + b"%x\r\n%sXY0\r\n\r\n" % (len(BODY), BODY), 400,
                 id="chunk-data-not-followed-by-crlf"),
    pytest.param(post_head(HOST, TE) + b"%x;%s\r\n%s\r\n0\r\n\r\n"
                 % (len(BODY), b"e" * 70_000, BODY), 400, id="chunk-extension-over-64k"),
    pytest.param(post_head(HOST, TE) + b"%x\r\n%s\r\n0\r\nX-T: %s\r\n\r\n"
                 % (len(BODY), BODY, b"t" * 70_000), 431, id="trailer-line-over-64k"),
    pytest.param(post_head(HOST, TE) + b"%x\r\n%s\r\n0\r\nBad Trailer: 1\r\n\r\n"
                 % (len(BODY), BODY), 400, id="trailer-name-not-a-token"),
    pytest.param(post_head(HOST, TE) + b"%x\r\n%s\r\n" % (0x5000000, b"x" * 1000), 413,
                 id="chunk-larger-than-the-limit-refused-before-it-is-read"),
    # Content-Length: digits only, bounded, one value.
    pytest.param(post_head(HOST, "Content-Length: 4²".encode("latin-1")) + b"{}{}", 400,
                 id="content-length-superscript-digit"),
    pytest.param(post_head(HOST, b"Content-Length: " + b"9" * 4301) + BODY, 400,
                 id="content-length-of-4301-digits"),
    pytest.param(post_head(HOST, b"Content-Length: +%d" % len(BODY)) + BODY, 400,
                 id="content-length-plus-sign"),
    pytest.param(post_head(HOST, b"Content-Length: %d, %d" % (len(BODY), len(BODY))) + BODY,
                 400, id="content-length-list"),
    # Field names are tokens; values hold no control byte but HTAB.
    pytest.param(post_head(HOST, CL, b"X-Nul: a\x00b") + BODY, 400, id="nul-in-a-value"),
    pytest.param(post_head(HOST, CL, b"X-Del: a\x7fb") + BODY, 400, id="del-in-a-value"),
    pytest.param(post_head(HOST, CL, b"X-Vt: a\x0bb") + BODY, 400, id="vertical-tab-in-a-value"),
    pytest.param(post_head(HOST, CL, b"X Space: a") + BODY, 400, id="space-in-a-name"),
    pytest.param(post_head(HOST, CL, b"X\x00Nul: a") + BODY, 400, id="nul-in-a-name"),
    pytest.param(post_head(HOST, CL, b"Authorization\x0b: Bearer x") + BODY, 400,
                 id="authorization-with-a-vertical-tab-slips-past-the-key-strip"),
    pytest.param(post_head(HOST, CL, b"Transfer-Encoding\x0b: chunked") + BODY, 400,
                 id="transfer-encoding-with-a-vertical-tab"),
    pytest.param(post_head(HOST, CL, b"X-Bare: a\rInjected: 1") + BODY, 400,
                 id="bare-cr-in-a-value"),
    # The request line: method token SP target SP version, nothing else.
    pytest.param(post_head(HOST, CL, target=b"/v1/chat/completions\x01") + BODY, 400,
                 id="control-byte-in-the-target"),
    pytest.param(post_head(HOST, CL, target=b"/v1/chat/\tcompletions") + BODY, 400,
                 id="tab-in-the-target"),
    pytest.param(post_head(HOST, CL, version=b"HTTP/1.1 junk") + BODY, 400,
                 id="junk-after-the-version"),
    pytest.param(post_head(HOST, CL, version=b"HTTP/1.1x") + BODY, 400, id="version-http-1.1x"),
    pytest.param(b" /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + CL + b"\r\n\r\n" + BODY, 400,
                 id="empty-method"),
    pytest.param(post_head(HOST, CL, version=b"HTTP/2.0") + BODY, 505, id="http-2-on-the-wire"),
    pytest.param(post_head(HOST, CL, target=b"/" + b"a" * 70_000) + BODY, 414,
                 id="target-of-70kb"),
    # Host: exactly one, and a host.
    pytest.param(post_head(CL) + BODY, 400, id="missing-host"),
    pytest.param(post_head(HOST, HOST, CL) + BODY, 400, id="duplicated-host"),
    pytest.param(post_head(b"Host: a b/c", CL) + BODY, 400, id="invalid-host"),
    pytest.param(post_head(b"Host: x@evil", CL) + BODY, 400, id="host-with-userinfo"),
]


def gear_posts(gear: FakeGear) -> int:
    return len(gear.posts())


def status_of(reply: bytes) -> int:
    return int(reply[9:12])


def head_of(reply: bytes) -> bytes:
    return reply.split(b"\r\n\r\n", 1)[0]


@pytest.mark.parametrize(("data", "status"), REFUSED)
def test_a_request_not_understood_exactly_is_refused_closed_and_never_forwarded(
        door, data, status):
    gateway, gear = door
    before = gear_posts(gear)
    reply, closed = exchange(gateway, data + SMUGGLED)
    assert reply.startswith(b"HTTP/1.1 %d " % status), reply[:200]
    assert reply.count(b"HTTP/1.1 ") == 1, reply  # the smuggled request got no answer
    assert b"Connection: close" in head_of(reply)
    error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert closed
    assert gear_posts(gear) == before
    assert gateway.alive()


@pytest.mark.parametrize("path", [b"/health", b"/v1/models", b"/metrics", b"/status",
                                  b"/capabilities", b"/nowhere"])
def test_a_get_with_a_body_never_lets_its_body_be_read_as_a_request(door, path):
    """CL.0: the body of a GET the gateway answers without reading it must not be parsed as
    the next request (behind a front proxy it would pass the proxy's rules unseen)."""
    gateway, gear = door
    before = gear_posts(gear)
    data = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(SMUGGLED)
    reply, closed = exchange(gateway, data + SMUGGLED)
    assert reply.count(b"HTTP/1.1 ") == 1, reply
    assert closed
    assert gear_posts(gear) == before


def test_http_1_0_with_transfer_encoding_is_answered_then_closed(door):
    gateway, _gear = door
    head = post_head(HOST, TE, b"Connection: keep-alive", version=b"HTTP/1.0")
    reply, closed = exchange(gateway, head + WHOLE + SMUGGLED)
    assert status_of(reply) == 200, reply[:200]
    assert reply.count(b"HTTP/1.1 ") == 1
    assert b"Connection: close" in head_of(reply)
    assert closed


@pytest.mark.parametrize("value", [b"keep-alive, close", b"close, keep-alive", b"Close",
                                   b"upgrade,close"])
def test_close_anywhere_in_the_connection_list_closes(door, value):
    gateway, _gear = door
    reply, closed = exchange(gateway, post_head(HOST, CL, b"Connection: " + value) + BODY
                             + SMUGGLED)
    assert status_of(reply) == 200
    assert reply.count(b"HTTP/1.1 ") == 1
    assert closed


@pytest.mark.parametrize(("lines", "target", "body"), [
    pytest.param((HOST, CL), b"http://gw.example/v1/chat/completions", BODY,
                 id="absolute-form-target"),
    pytest.param((HOST, b"Transfer-Encoding: ,chunked"), b"/v1/chat/completions", WHOLE,
                 id="empty-list-element-before-chunked"),
    pytest.param((HOST, b"Transfer-Encoding: chunked, "), b"/v1/chat/completions", WHOLE,
                 id="empty-list-element-after-chunked"),
    pytest.param((HOST, TE), b"/v1/chat/completions",
                 b"%x;name=value\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n" % (len(BODY), BODY),
                 id="chunk-extension-and-trailer"),
    pytest.param((b"Host: [::1]:8000", CL), b"/v1/chat/completions", BODY, id="ipv6-host"),
    pytest.param((b"Host:", CL), b"/v1/chat/completions", BODY, id="empty-host"),
])
def test_what_the_grammar_allows_is_served_and_the_connection_kept(door, lines, target, body):
    gateway, gear = door
    before = gear_posts(gear)
    reply, closed = exchange(gateway, post_head(*lines, target=target) + body + SMUGGLED,
                             timeout=1.0)
    assert reply.count(b"HTTP/1.1 200 ") == 2, reply[:300]
    assert not closed
    forwarded = gear.posts()[before]
    assert forwarded.target == "/v1/chat/completions"
    assert json.loads(forwarded.body)["messages"] == [{"role": "user", "content": "hi"}]


def test_what_reaches_the_gear_is_written_from_what_was_parsed(door):
    gateway, gear = door
    before = gear_posts(gear)
    head = post_head(HOST, CL, b"x-custom:    padded value \t", b"Authorization: Bearer caller",
                     b"X-Lobes-Forwarded-By: http://elsewhere:1", b"Keep-Alive: timeout=5",
                     b"Connection: keep-alive, x-custom", b"X-Obs: caf\xe9")
    reply, _closed = exchange(gateway, head + BODY, timeout=1.0)
    assert status_of(reply) == 200
    forwarded = gear.posts()[before]
    lines = forwarded.raw_head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    # The caller's key, the hop's own headers and those Connection names stay on this hop.
    names = {line.split(b":", 1)[0].lower() for line in lines[1:] if line}
    assert b"authorization" not in names and b"keep-alive" not in names
    assert b"x-custom" not in names  # named in Connection: hop-by-hop
    assert b"X-Obs: caf\xe9" in lines  # obs-text is a legal value byte, carried as it came
    assert forwarded.header("content-length") == str(len(forwarded.body))
