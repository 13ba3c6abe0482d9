"""Hostile input against a gated gateway: path and method tricks against the gate, header
injection through model names, and generated requests (hypothesis) over the request line,
headers, framing and bodies. None may crash the process, bypass the gate, or reach a backend
without the key."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.client import call, chat, raw_exchange, wired
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

KEY = "hostile-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def gated():
    with start_sim("instant") as sim, \
            start_gateway({**wired(sim), "GATEWAY_API_KEY": KEY,
                           "GATEWAY_HEADER_TIMEOUT_S": "1", "GATEWAY_BODY_TIMEOUT_S": "1"}) as gw:
        yield gw, sim


def backend_posts(sim) -> int:
    return sum(r["method"] == "POST" for r in sim.requests())


# (method, path, status without a key): nothing here may reach the backend or list models.
GATE_TRICKS = [
    ("GET", "//v1/models", 404),
    ("GET", "/v1/../v1/models", 401),
    ("GET", "/v1/%2e%2e/v1/models", 401),
    ("GET", "/%761/models", 404),
    ("GET", "/V1/models", 404),
    ("HEAD", "/v1/models", 401),
    ("OPTIONS", "/v1/models", 401),
    ("get", "/v1/models", 401),
    ("POST", "//v1/chat/completions", 401),
    ("POST", "/v1/chat/completions/", 401),
    ("POST", "/v1/chat/completions?x=1", 401),
    ("post", "/v1/chat/completions", 401),
    ("POST", "/V1/CHAT/COMPLETIONS", 401),
    ("POST", "/v1/chat/completions#frag", 401),
]


@pytest.mark.parametrize(("method", "path", "status"), GATE_TRICKS,
                         ids=[f"{m} {p}" for m, p, _status in GATE_TRICKS])
def test_path_and_method_tricks_do_not_pass_the_gate(gated, method, path, status):
    gateway, sim = gated
    before = backend_posts(sim)
    reply = raw_exchange(gateway.url, (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}").encode(), timeout=5)
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()), reply[:80]
    assert backend_posts(sim) == before


@pytest.mark.parametrize("model", ["main\r\nX-Injected: 1", "main\nX-Injected: 1",
                                   "x\u2028X-Injected: 1", "%0d%0aX-Injected: 1"])
def test_a_model_name_cannot_inject_a_header(gated, model):
    reply = chat(gated[0].url, {"model": model}, AUTH)
    assert reply.status == 200
    assert "x-injected" not in reply.headers


_TOKEN = st.text(alphabet=st.characters(codec="latin-1", exclude_characters="\r\n"),
                 max_size=12)
_HEADER_NAMES = st.sampled_from(["Content-Length", "Transfer-Encoding", "Authorization",
                                 "Connection", "Expect", "Host", "X-Lobes-Proxied",
                                 "X-Lobes-Forwarded-By", "Content-Type", "Upgrade"])
_HEADER_LINE = st.one_of(
    st.tuples(_HEADER_NAMES, _TOKEN).map(lambda pair: f"{pair[0]}: {pair[1]}"),
    _TOKEN,  # anything at all in a header position
)
_REQUEST = st.builds(
    lambda method, path, version, lines, body, ending: (
        f"{method} {path} {version}\r\n" + "".join(f"{line}{ending}" for line in lines)
        + "\r\n").encode("latin-1") + body,
    st.sampled_from(["GET", "POST", "PUT", "HEAD", "get", "POST ", "P\x00ST"]),
    st.sampled_from(["/v1/chat/completions", "/v1/embeddings", "/v1/models", "/health",
                     "/status", "//v1/chat/completions", "/v1/../v1/models", "*", ""]),
    st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "http/1.1", ""]),
    st.lists(_HEADER_LINE, max_size=6),
    st.binary(max_size=64) | st.sampled_from([b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n",
                                              b"ffffffffffffffff\r\n", b"{\"model\": 1}"]),
    st.sampled_from(["\r\n", "\r\n", "\n", "\r"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_REQUEST)
def test_generated_requests_never_crash_pass_the_gate_or_reach_the_backend(gated, data):
    gateway, sim = gated
    before = backend_posts(sim)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=3) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    # An answer, if any, is HTTP and never a success without the key.
    if reply:
        assert reply.startswith(b"HTTP/1.1 ")
        assert not reply.startswith(b"HTTP/1.1 2") or b"/health" in data or b"/status" in data
    assert backend_posts(sim) == before
    assert gateway.alive()
    assert call(gateway.url, "GET", "/health").status == 200
