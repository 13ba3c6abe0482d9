"""The gateway's doors under a real front proxy and a misbehaving gear.

- Smuggling: behind nginx whose rule refuses /v1/, a request hidden in the body of a request
  nginx lets through must never reach the gear (the body of a GET /health was read as a second
  request on nginx's kept upstream connection).
- Soak: a gear that answers one request in twenty badly (each way the gear's door refuses),
  while clean callers check that every answer they get is their own: none ever gets another's.
"""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from tests.support.client import call, chat, raw_exchange
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
from tests.support.gateway_proc import start_gateway
from tests.support.nginx import NGINX_MISSING, FrontProxy, nginx_binary
from tests.support.sse import stream_chat

BODY = json.dumps({"model": "main", "messages": [{"role": "user", "content": "smuggled"}],
                   "max_tokens": 4}).encode()
SMUGGLED = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)


@pytest.mark.skipif(nginx_binary() is None, reason=NGINX_MISSING)
@pytest.mark.parametrize("path", [b"/health", b"/metrics", b"/status", b"/capabilities",
                                  b"/nowhere"])
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_request_hidden_in_a_body_never_passes_the_front_proxys_rules(path, framing):
    binary = nginx_binary()
    assert binary is not None
    with FakeGear() as gear, start_gateway(wired_to(gear)) as gateway, \
            FrontProxy(binary, gateway.port) as front:
        plain = SMUGGLED.replace(b"Host: gw", b"Host: gw\r\nConnection: close")
        direct = raw_exchange(front.url, plain)
        assert direct.startswith(b"HTTP/1.1 403 ")  # the rule holds for a plain request
        if framing == "length":
            carrier = (b"GET " + path + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(SMUGGLED) + SMUGGLED)
        else:
            carrier = (b"GET " + path + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                       % (len(SMUGGLED), SMUGGLED))
        for _attempt in range(3):  # over nginx's kept upstream connections
            raw_exchange(front.url, carrier)
            raw_exchange(front.url,
                         b"GET /health HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        assert gear.posts() == []


# One way for a gear to answer badly, each taken in turn by the soak's bad answers.
def _extra_response(request: Received):
    return [json_answer(chat_answer(_said(request))) + json_answer(chat_answer("NOT YOURS"))]


def _late_extra_response(request: Received):
    return [json_answer(chat_answer(_said(request))), 0.05,
            json_answer(chat_answer("NOT YOURS"))]


def _injected_header(request: Received):
    body = json.dumps(chat_answer(_said(request))).encode()
    return [b"HTTP/1.1 200 OK\r\nX-A: a\nX-B: b\r\ncontent-length: %d\r\n\r\n" % len(body)
            + body]


def _backwards_chunk(_request: Received):
    return [STREAM_HEAD + chunk(sse_event("x")) + b"-6\r\n" + b"data: {}\n\n", CLOSE]


def _length_and_chunked(request: Received):
    body = json.dumps(chat_answer(_said(request))).encode()
    return [b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\ntransfer-encoding: chunked\r\n\r\n"
            % len(body) + chunk(body) + b"0\r\n\r\n"]


def _short_body(request: Received):
    body = json.dumps(chat_answer(_said(request))).encode()
    return [b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (len(body) + 40) + body, HANG]


def _stall(_request: Received):
    return [STREAM_HEAD + chunk(sse_event("x")), HANG]


def _odd_status(_request: Received):
    return [b"HTTP/1.1 999 Odd\r\ncontent-length: 2\r\n\r\n{}"]


BAD_ANSWERS = [_extra_response, _late_extra_response, _injected_header, _backwards_chunk,
               _length_and_chunked, _short_body, _stall, _odd_status]


def _said(request: Received) -> str:
    return request.json()["messages"][-1]["content"]


def _one_in_twenty_bad():
    counter = iter(range(1 << 30))
    lock = threading.Lock()

    def script(request: Received):
        with lock:
            index = next(counter)
        if index % 20 == 19:
            return BAD_ANSWERS[(index // 20) % len(BAD_ANSWERS)](request)
        return echo_script(request)

    return script


@pytest.mark.slow
def test_a_soak_with_a_misbehaving_gear_never_gives_a_caller_another_callers_answer():
    seconds, callers = 20, 12
    wrong: list[str] = []
    outcomes: dict[str, int] = {}
    lock = threading.Lock()
    # The gear echoes request ids, as peer gateways do: a stray answer that lands just as its
    # connection is reused then names the request it belongs to (docs/reliability.md).
    with FakeGear(_one_in_twenty_bad(), echo_id=True) as gear, \
            start_gateway({**wired_to(gear), "GATEWAY_STREAM_STALL_S": "1",
                           "GATEWAY_UPSTREAM_TIMEOUT_S": "3"}) as gateway:
        deadline = time.monotonic() + seconds

        def caller(number: int) -> None:
            rng = random.Random(number)
            sent = 0
            while time.monotonic() < deadline:
                content = f"caller-{number}-{sent}"
                sent += 1
                outcome, got = _one_call(gateway.url, content, rng.random() < 0.4)
                with lock:
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
                    if _anothers(content, outcome, got):
                        wrong.append(f"{content} got {got!r}")

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert call(gateway.url, "GET", "/health", timeout=5).status == 200
    assert wrong == []
    assert outcomes.get("own", 0) > 200, outcomes
    assert set(outcomes) <= {"own", "error"}, outcomes  # a bad answer: a documented error


def _anothers(content: str, outcome: str, got: str | None) -> bool:
    """Whether a caller got what belongs to someone else: another caller's content, or the
    stray answer the gear wrote for nobody. An error may carry what the bad answer itself
    began with (its own text, cut off)."""
    if got is None:
        return False
    if outcome == "own":
        return got != content
    return "NOT YOURS" in got or ("caller-" in got and got != content)


def _one_call(url: str, content: str, stream: bool) -> tuple[str, str | None]:
    """("own" | "error", the content the answer carried if it carried one). A bad answer may
    be a stream to a plain request or the other way round: either is read for its content."""
    payload = {"model": "main", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    if stream:
        streamed = stream_chat(url, payload, timeout=15)
        if streamed.errors or streamed.status != 200:
            return "error", streamed.text or None
        return "own", streamed.text if streamed.events else _message(streamed.body)
    reply = chat(url, payload, timeout=15)
    if reply.status != 200:
        assert {"message", "type", "param", "code"} <= set(reply.error), reply.body
        return "error", None
    if reply.headers["content-type"].startswith("text/event-stream"):
        events = [json.loads(line[6:]) for line in reply.body.split(b"\n")
                  if line.startswith(b"data: {")]
        if any("error" in event for event in events):
            return "error", None
        return "own", "".join(c["delta"].get("content") or "" for e in events
                              for c in e.get("choices", ()))
    return "own", _message(reply.body)


def _message(body: bytes) -> str:
    return json.loads(body)["choices"][0]["message"]["content"]
