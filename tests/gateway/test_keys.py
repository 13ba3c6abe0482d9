"""Keys travel no further than they open: the caller's key opens this gateway only, and a gear
sees a key only when one is declared for it (none is, today). Requests of every lane, the
realtime handshake, and the gateway's own probes of its gears carry no Authorization."""

from __future__ import annotations

import base64
import os
import socket

import pytest

from tests.support.client import call, chat, wired
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

KEY = "inbound-only"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def gated():
    with start_sim("instant") as primary, start_sim("embedder", served_name="emb") as embed, \
            start_sim("audio") as audio:
        env = {**wired(primary), "EMBED_BASE_URL": embed.url, "EMBED_SERVED_NAME": "emb",
               "AUDIO_URL": audio.url, "GATEWAY_API_KEY": KEY,
               "GATEWAY_PROBE_INTERVAL_S": "0.1"}
        with start_gateway(env) as gateway:
            yield gateway, (primary, embed, audio)


def realtime_handshake(gateway) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall((f"GET /v1/realtime?model=x HTTP/1.1\r\nHost: g\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nAuthorization: Bearer {KEY}\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
    return head


def test_no_gear_ever_sees_a_key(gated):
    gateway, sims = gated
    primary, embed, audio = sims
    assert chat(gateway.url, {"model": "main"}, AUTH).status == 200
    assert call(gateway.url, "POST", "/v1/embeddings", {"model": "emb", "input": ["a"]},
                AUTH).status == 200
    assert realtime_handshake(gateway).startswith(b"HTTP/1.1 101 ")
    # The window prober has asked the gears for /v1/models more than once by now.
    wait_until(lambda: sum(r["path"] == "/v1/models" for r in primary.requests()) >= 2,
               message="the gateway probing its primary gear's /v1/models")
    assert [r["path"] for r in embed.requests() if r["method"] == "POST"] == ["/v1/embeddings"]
    assert any(r["path"].startswith("/v1/realtime") for r in audio.requests())
    recorded = [r for sim in sims for r in sim.requests()]
    assert [r for r in recorded if "authorization" in r["headers"]] == []


def test_no_key_appears_in_an_answer_or_the_log():
    """Every key the gateway holds (inbound, fleet, pairwise peer keys) stays out of its
    endpoints, its error bodies and its log, whatever a caller sends."""
    keys = {"GATEWAY_API_KEY": "k-inbound-5d1e", "GATEWAY_FLEET_KEY": "k-fleet-9a7c",
            "MULTIMODAL_PEER_API_KEY": "k-peer-3b8f", "PRIMARY_PEER_API_KEYS": "k-pool-2c4a,"}
    with start_sim("instant") as primary:
        env = {**wired(primary), **keys, "GATEWAY_SELF_ORIGIN": "http://self:1",
               "MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_ROUTE": "proxy",
               "MULTIMODAL_PEER_ORIGIN": "http://127.0.0.1:9",
               "PRIMARY_PEER_ORIGINS": "http://127.0.0.1:9,http://self:1"}
        with start_gateway(env) as gateway:
            answers = [
                call(gateway.url, "GET", "/status"), call(gateway.url, "GET", "/capabilities"),
                call(gateway.url, "GET", "/health"),
                chat(gateway.url, {"model": "main"}, {"Authorization": "Bearer k-inbound-5d1"}),
                chat(gateway.url, {"model": "senses"},
                     {"Authorization": f"Bearer {keys['GATEWAY_API_KEY']}"}),
                call(gateway.url, "GET", "/v1/models",
                     headers={"Authorization": f"Bearer {keys['GATEWAY_FLEET_KEY']}"}),
            ]
            log = gateway.output()
    assert [a.status for a in answers[:4]] == [200, 200, 200, 401]
    seen = [f"{a.headers}{a.body.decode()}" for a in answers] + [log]
    secrets = [value.strip(",") for value in keys.values()]
    assert [s for s in secrets if any(s in text for text in seen)] == []
