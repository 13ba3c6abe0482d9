"""The gear's door: what a gear (or a peer) answers is read as strictly as what callers send.

A misbehaving gear (tests/support/fake_gear.py) answers badly on purpose. A bad answer is an
upstream error (the request moves on, or gets the route's error, before any byte reached the
caller; a stream it breaks is ended with an error event), never passed on, and never read as
another caller's answer. Every read after the head has a deadline."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.client import call, chat
from tests.support.fake_gear import (
    CLOSE,
    HANG,
    STREAM_HEAD,
    FakeGear,
    Received,
    chat_answer,
    chunk,
    echo_script,
    json_answer,
    sse_event,
    wired_to,
)
from tests.support.gateway_proc import GatewayProcess, start_gateway
from tests.support.metrics import Scrape
from tests.support.sse import stream_chat

TIMEOUTS = {"GATEWAY_STREAM_STALL_S": "1", "GATEWAY_UPSTREAM_TIMEOUT_S": "3"}


@pytest.fixture
def box() -> Iterator:
    """A gateway in front of a fake gear whose script the test sets (echo until then)."""
    gear = FakeGear()
    gateway = start_gateway({**wired_to(gear), **TIMEOUTS})
    try:
        yield gateway, gear
    finally:
        gateway.stop()
        gear.close()


def ask(gateway: GatewayProcess, content: str, stream: bool = False):
    payload = {"model": "main", "messages": [{"role": "user", "content": content}],
               "max_tokens": 4}
    if stream:
        return stream_chat(gateway.url, payload, timeout=20)
    return chat(gateway.url, payload, timeout=20)


def content_of(reply) -> str:
    return reply.json()["choices"][0]["message"]["content"]


def once(bad, then=echo_script):
    """A script that answers the first POST with `bad` and every later one with `then`."""
    calls: list[int] = []

    def script(request: Received):
        calls.append(1)
        return bad(request) if len(calls) == 1 else then(request)

    return script


def assert_each_caller_gets_its_own_answer(gateway: GatewayProcess, count: int = 6) -> None:
    for index in range(count):
        content = f"caller-{index}"
        reply = ask(gateway, content)
        assert reply.status == 200, reply.body[:200]
        assert content_of(reply) == content


EVIL = json_answer(chat_answer("someone else's answer"))


def test_an_answer_longer_than_its_length_never_reaches_the_next_caller(box):
    gateway, gear = box
    gear.script = once(lambda r: [json_answer(chat_answer(r.json()["messages"][-1]["content"]))
                                  + EVIL])
    assert content_of(ask(gateway, "first")) == "first"
    assert_each_caller_gets_its_own_answer(gateway)


def test_a_response_written_on_an_idle_connection_is_never_read_as_an_answer(box):
    gateway, gear = box
    gear.script = once(lambda r: [json_answer(chat_answer(r.json()["messages"][-1]["content"])),
                                  0.3, EVIL])
    assert content_of(ask(gateway, "first")) == "first"
    time.sleep(0.6)  # the extra answer arrives while the connection idles in the pool
    assert_each_caller_gets_its_own_answer(gateway)


def test_the_gateways_own_probe_is_not_desynced_either(box):
    gateway, gear = box
    gear.script = once(lambda r: [json_answer(chat_answer("x")) + EVIL])
    ask(gateway, "first")
    capabilities = gateway.get_json("/capabilities")
    assert capabilities["object"] == "lobes.capabilities"
    assert_each_caller_gets_its_own_answer(gateway, 3)


def test_a_gear_that_sent_stray_bytes_gets_a_connection_per_request_for_a_while(box):
    gateway, gear = box
    gear.script = once(lambda r: [json_answer(chat_answer(r.json()["messages"][-1]["content"]))
                                  + EVIL])
    ask(gateway, "first")
    assert_each_caller_gets_its_own_answer(gateway, 3)
    connections = [r.connection for r in gear.posts()[1:]]
    assert len(set(connections)) == len(connections) == 3  # none reused
    assert Scrape.of(gateway.url).value("lobes_gateway_upstream_unpooled_total",
                                        origin=gear.url) >= 1


def test_an_answer_that_names_another_request_is_never_relayed():
    """A gear (echoing request ids, as a peer gateway does) whose stray answer to one request
    arrives just as the next request takes the connection: the stray names the earlier
    request, so it is refused rather than handed to the later caller."""
    stray: list[bytes] = []

    def script(request: Received):
        said = request.json()["messages"][-1]["content"]
        answer = json_answer(chat_answer(said), extra=b"X-Request-Id: %s\r\n"
                             % request.header("x-request-id").encode())
        if said == "first":
            stray.append(answer)
            return [answer]
        earlier, stray[:] = list(reversed(stray)), []
        return [*earlier, json_answer(chat_answer(said))]

    with FakeGear(script) as gear, start_gateway({**wired_to(gear), **TIMEOUTS}) as gateway:
        assert content_of(ask(gateway, "first")) == "first"
        second = ask(gateway, "second")
        assert second.status == 503  # refused, never "first"'s answer
        assert_each_caller_gets_its_own_answer(gateway, 3)


def test_a_negative_chunk_size_ends_that_stream_and_freezes_nothing(box):
    """-6 after "-6\r\n" points the scan back at its own start: the old scan looped there
    forever, at 100% CPU, and every caller of the gateway waited."""
    gateway, gear = box
    gear.script = once(lambda r: [STREAM_HEAD + chunk(sse_event("a")) + b"-6\r\n"
                                  + b"data: {}\n\n" * 4, HANG])
    streamed = ask(gateway, "first", stream=True)
    assert streamed.errors and streamed.errors[0]["code"] == "stream_interrupted"
    assert call(gateway.url, "GET", "/health", timeout=5).status == 200
    assert_each_caller_gets_its_own_answer(gateway, 3)


@pytest.mark.parametrize("line", [b"X-Foo: a\nInjected: 1", b"X-Foo: a\rInjected: 1",
                                  b"X-Foo: a\x00b", b"X Foo: a", b"X-Foo\x0b: a"])
def test_a_header_the_grammar_does_not_allow_is_an_upstream_error_never_relayed(box, line):
    gateway, gear = box
    body = json.dumps(chat_answer("x")).encode()
    gear.script = once(lambda r: [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                  + line + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body])
    reply = ask(gateway, "first")
    assert reply.status == 503 and reply.error["code"] == "backend_unavailable"
    assert "injected" not in reply.headers
    assert_each_caller_gets_its_own_answer(gateway, 2)


def test_only_allow_listed_headers_reach_the_caller(box):
    gateway, gear = box
    extra = (b"Set-Cookie: session=1\r\n" * 300 + b"Access-Control-Allow-Origin: *\r\n"
             b"X-Lobes-Served-By: http://evil.example\r\nX-Lobes-Proxied-By: http://evil\r\n"
             b"Connection: x-secret\r\nX-Secret: s\r\nRetry-After: 7\r\nX-Lobes-Tier: main\r\n"
             b"X-Lobes-Tier-Reason: a\r\nb\r\n" + b"Server: gear\r\n")
    gear.script = lambda r: [json_answer(chat_answer("x"), extra=extra.replace(b"a\r\nb", b"ab"))]
    reply = ask(gateway, "first")
    assert reply.status == 200
    assert set(reply.headers) <= {"content-type", "content-length", "x-request-id",
                                  "retry-after", "x-lobes-tier", "x-lobes-tier-reason"}
    assert reply.headers["x-lobes-tier"] == "main"  # this gateway's own, not the gear's


@pytest.mark.parametrize(("head", "why"), [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n", "length-and-chunked"),
    (b"HTTP/1.1 999 Weird\r\ncontent-length: 2\r\n\r\n{}", "status-999"),
    (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
     "unrequested-101"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
     "a-coding-the-gateway-cannot-read"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
     "lengths-that-disagree"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello", "signed-length"),
    (b"HTTP/1.1 200\x00 OK\r\ncontent-length: 2\r\n\r\n{}", "nul-in-the-status-line"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_an_answer_the_gateway_cannot_frame_exactly_is_an_upstream_error(box, head, why):
    gateway, gear = box
    gear.script = once(lambda r: [head, CLOSE])
    reply = ask(gateway, "first")
    assert reply.status == 503 and reply.error["code"] == "backend_unavailable", (why, reply)
    assert b"hello" not in reply.body
    assert_each_caller_gets_its_own_answer(gateway, 2)


@pytest.mark.parametrize(("interim", "answered"), [(1, True), (7, True), (8, False)])
def test_interim_heads_before_the_answer_are_read_past_up_to_a_bound(box, interim, answered):
    """Eight heads in all: up to seven 1xx ones are skipped; an eighth is a broken answer."""
    gateway, gear = box
    heads = b"HTTP/1.1 100 Continue\r\n\r\n" + b"HTTP/1.1 102 Processing\r\n\r\n" * (interim - 1)
    gear.script = once(lambda r: [heads + json_answer(chat_answer("past")), CLOSE])
    reply = ask(gateway, "first")
    if answered:
        assert reply.status == 200 and content_of(reply) == "past"
    else:
        assert reply.status == 503 and reply.error["code"] == "backend_unavailable", reply
    assert_each_caller_gets_its_own_answer(gateway, 2)


@pytest.mark.parametrize(("framing", "why"), [
    (b"0x5\r\nhello\r\n", "size-with-0x"),
    (b"5\r\nhelloXY", "data-not-followed-by-crlf"),
    (b" 5\r\nhello\r\n", "padded-size"),
])
def test_lenient_chunk_framing_in_a_stream_is_never_relayed(box, framing, why):
    gateway, gear = box
    gear.script = once(lambda r: [STREAM_HEAD + chunk(sse_event("a")) + framing, HANG])
    streamed = ask(gateway, "first", stream=True)
    assert streamed.errors and streamed.errors[0]["code"] == "stream_interrupted", why
    assert "hello" not in streamed.text


def test_chunk_extensions_reach_the_caller_without_their_extension(box):
    gateway, gear = box
    events = [sse_event("a"), sse_event("", finish="stop"), b"data: [DONE]\n\n"]
    framed = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events)
    gear.script = lambda r: [STREAM_HEAD + framed + b"0\r\n\r\n"]
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        body = json.dumps({"model": "main", "stream": True, "messages": [
            {"role": "user", "content": "x"}]}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        raw = b""
        while data := sock.recv(65536):
            raw += data
    assert raw.startswith(b"HTTP/1.1 200 ")
    assert b"ext=" not in raw and b"data: [DONE]" in raw


def test_a_stream_that_stalls_after_its_first_events_is_cut_with_an_error_event(box):
    gateway, gear = box
    gear.script = once(lambda r: [STREAM_HEAD + chunk(sse_event("a")) + chunk(sse_event("b")),
                                  HANG])
    streamed = ask(gateway, "first", stream=True)
    assert streamed.text == "ab"
    assert streamed.errors and streamed.errors[-1]["code"] == "stream_stalled"
    cut = Scrape.of(gateway.url).value("lobes_gateway_streams_cut_total",
                                       role="cortex", reason="stalled")
    assert cut == 1
    assert_each_caller_gets_its_own_answer(gateway, 2)


@pytest.mark.parametrize(("steps", "why"), [
    ([b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"a\"",
      HANG], "length-larger-than-what-comes"),
    ([b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n",
      *[b" ", 0.25] * 100], "a-byte-every-quarter-second"),
    ([b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
      b"\r\n4\r\n{\"a\"\r\n", HANG], "chunked-json-that-stops"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_non_streamed_answer_that_never_ends_is_cut_not_waited_for(box, steps, why):
    gateway, gear = box
    gear.script = once(lambda r: steps)
    reply = ask(gateway, "first")  # the test's own 20 s timeout would raise on a hang
    assert reply.status == 502 and reply.error["code"] == "upstream_interrupted", why
    assert_each_caller_gets_its_own_answer(gateway, 2)


def test_a_body_without_length_on_a_kept_connection_is_cut_by_its_silence(box):
    gateway, gear = box
    gear.script = once(lambda r: [b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npartial",
                                  HANG])
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=15) as sock:
        body = json.dumps({"model": "main", "messages": [{"role": "user", "content": "x"}]})
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                     b"\r\n%s" % (len(body), body.encode()))
        raw = b""
        while data := sock.recv(65536):  # a TimeoutError here is the hang under test
            raw += data
    assert b"partial" in raw


def test_a_chunked_answer_too_large_to_hold_is_refused_not_buffered(box):
    """A chunked (not event-stream) answer is held whole before it is relayed with a length:
    past the bound it is a broken answer, and the gateway's memory does not follow it."""
    gateway, gear = box
    piece = b"x" * (1 << 20)
    huge = [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked"
            b"\r\n\r\n", *[chunk(piece)] * 100, b"0\r\n\r\n"]
    gear.script = once(lambda r: huge)
    peak_before = _peak_rss_kib(gateway.pid)
    reply = ask(gateway, "first")
    assert reply.status == 502
    assert _peak_rss_kib(gateway.pid) - peak_before < 120 * 1024  # KiB, for 100 MiB sent


def test_a_huge_chunk_reaches_the_caller_as_it_comes(box):
    """One 16 MiB chunk in a stream: its first bytes reach the caller before the gear sends the
    rest (the old relay waited for the whole chunk, copying its buffer on every read)."""
    gateway, gear = box
    size = 16 << 20
    first_bytes_seen = threading.Event()

    def script(_request: Received):
        yield STREAM_HEAD + b"%x\r\n" % size + b"d" * (1 << 20)
        if not first_bytes_seen.wait(10):
            return
        yield b"d" * (size - (1 << 20)) + b"\r\n0\r\n\r\n"

    gear.script = script
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as sock:
        body = json.dumps({"model": "main", "stream": True, "messages": [
            {"role": "user", "content": "x"}]}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        received = 0
        while data := sock.recv(1 << 20):
            received += data.count(b"d")
            if received >= 512 * 1024:
                first_bytes_seen.set()
    assert first_bytes_seen.is_set()
    assert received >= size


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
