"""The bearer gate, per-key in-flight limits, body/header limits and malformed input."""

import json
import socket
import threading

import pytest

from tests.support.client import call, chat, raw_exchange, wired
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

KEY = "s3cret-gateway-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def gated_pair():
    env = {"GATEWAY_API_KEY": KEY, "GATEWAY_FLEET_KEY": "fleet-key",
           "GATEWAY_MAX_INFLIGHT_PER_KEY": "1"}
    with start_sim("instant") as primary, start_gateway({**wired(primary), **env}) as gateway:
        yield gateway, primary


@pytest.fixture
def gated(gated_pair):
    gated_pair[1].set_faults({})
    gated_pair[1].clear_requests()
    return gated_pair


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {KEY}"},
                                     {"Authorization": "Bearer "}],
                         ids=["no-header", "wrong-key", "basic-scheme", "empty-bearer"])
def test_401_is_openai_shaped_and_never_echoes(gated, headers):
    gateway, primary = gated
    reply = chat(gateway.url, {"model": "main"}, headers)
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    assert reply.error["type"] == reply.error["code"] == "invalid_api_key"
    assert KEY not in reply.body.decode() and "wrong" not in reply.body.decode()
    assert [r for r in primary.requests() if r["method"] == "POST"] == []


def test_the_key_passes(gated):
    assert chat(gated[0].url, {"model": "main"}, AUTH).status == 200


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/supported", "/v1/nonexistent"])
def test_get_v1_namespace_is_gated_and_401_outranks_404(gated, path):
    assert call(gated[0].url, "GET", path).status == 401


@pytest.mark.parametrize("path", ["/health", "/status", "/capabilities"])
def test_control_plane_stays_keyless(gated, path):
    assert call(gated[0].url, "GET", path).status == 200


def test_gate_runs_before_the_body_is_read(gated):
    gateway, _ = gated
    # Headers promise a large body that never comes: the 401 must arrive anyway, at once.
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
            b"Content-Type: application/json\r\n\r\n")
    reply = raw_exchange(gateway.url, head, timeout=3)
    assert reply.startswith(b"HTTP/1.1 401 ")
    assert b"Connection: close" in reply


def test_per_key_inflight_limit_and_fleet_exemption(gated):
    gateway, primary = gated
    primary.set_faults({"hang_s": 1.0})
    holder = threading.Thread(target=chat, args=(gateway.url, {"model": "main"}, AUTH),
                              kwargs={"timeout": 20})
    holder.start()
    try:
        wait_until(lambda: [r for r in primary.requests() if r["method"] == "POST"],
                   timeout=5, interval=0.02, message="the held request to reach the backend")
        reply = chat(gateway.url, {"model": "main"}, AUTH)
        assert reply.status == 429
        assert reply.error["type"] == reply.error["code"] == "rate_limit_exceeded"
        primary.set_faults({})
        # The fleet key is not counted against the client limit.
        fleet = chat(gateway.url, {"model": "main"}, {"Authorization": "Bearer fleet-key"})
        assert fleet.status == 200
    finally:
        holder.join()
    assert chat(gateway.url, {"model": "main"}, AUTH).status == 200  # released


def test_unset_key_means_no_gate(gateway_factory, sim_factory):
    primary = sim_factory("instant")
    gateway = gateway_factory(wired(primary))
    assert chat(gateway.url, {"model": "main"}, {"Authorization": "Bearer anything"}).status == 200
    assert call(gateway.url, "GET", "/v1/models").status == 200


def test_culture_key_is_the_fallback_source(gateway_factory, sim_factory):
    primary = sim_factory("instant")
    gateway = gateway_factory({**wired(primary), "CULTURE_VLLM_API_KEY": "ck"})
    assert chat(gateway.url, {"model": "main"}).status == 401
    assert chat(gateway.url, {"model": "main"}, {"Authorization": "Bearer ck"}).status == 200


@pytest.fixture(scope="module")
def limited():
    env = {"GATEWAY_MAX_BODY_BYTES": "2000", "GATEWAY_HEADER_TIMEOUT_S": "0.5",
           "GATEWAY_BODY_TIMEOUT_S": "0.5"}
    with start_sim("instant") as primary, start_gateway({**wired(primary), **env}) as gateway:
        yield gateway


def test_oversized_chunked_body_is_413(limited):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", limited.port, timeout=5)
    conn.request("POST", "/v1/chat/completions", iter([b"x" * 1500, b"y" * 1500]),
                 {"Transfer-Encoding": "chunked"}, encode_chunked=True)
    assert conn.getresponse().status == 413
    conn.close()


INVALID_JSON = {"type": "invalid_request_error", "code": "invalid_json"}

# Each row: a chat request body the limited gateway refuses, the status, the error fields.
BAD_BODIES = [
    pytest.param(json.dumps({"model": "main", "max_tokens": 8,
                             "messages": [{"role": "user", "content": "x" * 3000}]}).encode(),
                 413, {"code": "payload_too_large"}, id="oversized-body"),
    pytest.param(b"{not json", 400, INVALID_JSON, id="not-json"),
    pytest.param(b"[1, 2]", 400, INVALID_JSON, id="json-not-an-object"),
    pytest.param(b"\xff\xfe", 400, INVALID_JSON, id="not-utf8"),
]


@pytest.mark.parametrize(("body", "status", "error"), BAD_BODIES)
def test_bad_bodies_are_refused(limited, body, status, error):
    reply = call(limited.url, "POST", "/v1/chat/completions", body,
                 {"Content-Type": "application/json"})
    assert reply.status == status
    assert reply.error | error == reply.error


def test_slow_headers_are_dropped(limited):
    parts = limited.url.split(":")
    with socket.create_connection(("127.0.0.1", int(parts[-1])), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        assert sock.recv(100) == b""  # closed by the header timeout, not by us
    assert call(limited.url, "GET", "/health").status == 200


# Each row: raw bytes on a fresh connection and the status line the answer starts with.
RAW_REFUSALS = [
    pytest.param(b"NONSENSE\r\n\r\n", b"HTTP/1.1 400 ", id="not-a-request-line"),
    pytest.param(b"GET / SPDY/9\r\n\r\n", b"HTTP/1.1 400 ", id="unknown-protocol"),
    pytest.param(b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n", b"HTTP/1.1 400 ",
                 id="header-without-colon"),
    pytest.param(b"GET /health HTTP/1.1\r\nBad : spacing\r\n\r\n", b"HTTP/1.1 400 ",
                 id="space-before-colon"),
    # A bare LF or CR inside a line would split it upstream (the head is forwarded verbatim).
    pytest.param(b"GET /health HTTP/1.1\r\nX-A: b\nContent-Length: 0\r\n\r\n", b"HTTP/1.1 400 ",
                 id="bare-lf-in-a-header"),
    pytest.param(b"GET /health HTTP/1.1\r\nX-A: b\rX-B: c\r\n\r\n", b"HTTP/1.1 400 ",
                 id="bare-cr-in-a-header"),
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
                 b"HTTP/1.1 431 ", id="oversized-head"),
    # The body never completes: GATEWAY_BODY_TIMEOUT_S (0.5 s) answers, before the client's 5 s.
    pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                 b"HTTP/1.1 408 ", id="slow-body"),
]


@pytest.mark.parametrize(("data", "status_line"), RAW_REFUSALS)
def test_bad_requests_are_refused_and_the_process_survives(limited, data, status_line):
    reply = raw_exchange(limited.url, data, timeout=5)
    assert reply.startswith(status_line)
    assert call(limited.url, "GET", "/health").status == 200
