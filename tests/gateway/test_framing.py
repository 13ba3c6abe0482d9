"""Request smuggling: a request whose body a proxy in front could frame otherwise is refused
and its connection closed, so the bytes after it are never read as a second request
(RFC 9112 sections 5.2, 6.1 and 6.3)."""

from __future__ import annotations

import json

import pytest

from tests.support.client import raw_exchange, wired
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

KEY = "framing-key"
BODY = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
# What a front proxy framing by Content-Length would pass on as the next request.
SMUGGLED = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)


def post(framing: bytes, body: bytes) -> bytes:
    """An authenticated chat request with the given framing header lines, then the smuggled one."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + KEY.encode() + b"\r\nContent-Type: application/json\r\n" + framing + b"\r\n")
    return head + body + SMUGGLED


@pytest.fixture(scope="module")
def box():
    with start_sim("instant") as sim, \
            start_gateway({**wired(sim), "GATEWAY_API_KEY": KEY}) as gateway:
        yield gateway, sim


AMBIGUOUS = [
    pytest.param(b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", CHUNKED, b"400",
                 id="te-then-cl"),
    pytest.param(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", CHUNKED, b"400",
                 id="cl-then-te"),
    pytest.param(b"Content-Length: %d\r\nContent-Length: 4\r\n" % len(BODY), BODY, b"400",
                 id="differing-content-lengths"),
    pytest.param(b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(BODY), len(BODY)), BODY,
                 b"400", id="duplicate-content-length"),
    pytest.param(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", CHUNKED, b"400",
                 id="chunked-twice"),
    pytest.param(b"Transfer-Encoding: chunked, identity\r\n", CHUNKED, b"400",
                 id="chunked-not-last"),
    pytest.param(b"Transfer-Encoding: xchunked\r\n", CHUNKED, b"400", id="unknown-te"),
    pytest.param(b"Transfer-Encoding: gzip, chunked\r\n", CHUNKED, b"501",
                 id="te-other-than-chunked"),
    pytest.param(b"Content-Length: %d\r\nX-Folded: a\r\n chunked\r\n" % len(BODY), BODY, b"400",
                 id="obs-fold"),
    pytest.param(b"Content-Length: %d\r\nTransfer-Encoding:\r\n chunked\r\n" % len(BODY), BODY,
                 b"400", id="te-hidden-in-obs-fold"),
]


@pytest.mark.parametrize(("framing", "body", "status"), AMBIGUOUS)
def test_ambiguous_framing_is_refused_and_nothing_after_it_is_served(
        box, framing, body, status):
    gateway, sim = box
    before = len([r for r in sim.requests() if r["method"] == "POST"])
    reply = raw_exchange(gateway.url, post(framing, body), timeout=5)
    assert reply.startswith(b"HTTP/1.1 " + status + b" ")
    assert reply.count(b"HTTP/1.1 ") == 1, reply  # the smuggled request got no answer
    assert b"Connection: close" in reply.split(b"\r\n\r\n", 1)[0]
    assert len([r for r in sim.requests() if r["method"] == "POST"]) == before


@pytest.mark.parametrize(("framing", "body"), [
    pytest.param(b"Content-Length: %d\r\n" % len(BODY), BODY, id="content-length"),
    pytest.param(b"Transfer-Encoding: chunked\r\n", CHUNKED, id="chunked"),
    pytest.param(b"transfer-encoding: CHUNKED\r\n", CHUNKED, id="chunked-any-case"),
])
def test_one_clear_framing_serves_both_requests_on_the_connection(box, framing, body):
    reply = raw_exchange(box[0].url, post(framing, body), timeout=2)
    assert reply.count(b"HTTP/1.1 200 ") == 2, reply


def test_requests_of_one_shape_with_other_lengths_are_each_read_whole(box):
    """The gateway parses a head's shape once (transport/heads.py): a keep-alive client's next
    request differs only in its Content-Length, and each body must still be read to its own."""
    gateway, sim = box
    sim.clear_requests()
    contents = ["hi", "x" * 3000, "yo"]
    data = b""
    for content in contents:
        body = json.dumps({"messages": [{"role": "user", "content": content}],
                           "max_tokens": 4}).encode()
        data += (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    reply = raw_exchange(gateway.url, data, timeout=2)
    assert reply.count(b"HTTP/1.1 200 ") == 3, reply
    posted = [r for r in sim.requests() if r["method"] == "POST"]
    assert [json.loads(r["body"])["messages"][0]["content"] for r in posted] == contents
