"""Honest advertising of peer-served roles (advert.py probes each single proxied peer with
peers.py): /v1/models lists the role and /capabilities calls it ready only while the peer,
asked with the pairwise key, actually serves it. Complements tests/mesh/test_proxy_mesh.py
with the rejected key and the audio lane.
"""

from __future__ import annotations

import time

from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
PEER_KEY = "peer-inbound"


def proxy_env(peer_url, role_prefix="PRIMARY", key=PEER_KEY):
    return {f"{role_prefix}_FEASIBLE": "false", f"{role_prefix}_PEER_ORIGIN": peer_url,
            f"{role_prefix}_PEER_PROXY": "true", f"{role_prefix}_PEER_API_KEY": key,
            "GATEWAY_PROBE_INTERVAL_S": "0.1"}


def role(gateway, name):
    return gateway.get_json("/capabilities")["roles"][name]


def listed(gateway):
    return [m["id"] for m in gateway.get_json("/v1/models")["data"]]


def wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition never held")


def test_a_peer_that_rejects_the_pairwise_key_is_not_advertised():
    with start_sim("spark-cortex", time_scale=20) as sim, \
            start_gateway({"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
                           "GATEWAY_API_KEY": PEER_KEY}) as peer, \
            start_gateway(proxy_env(peer.url, key="not-the-peer-key")) as wrong, \
            start_gateway(proxy_env(peer.url)) as right:
        wait_for(lambda: role(right, "cortex")["ready"])
        time.sleep(0.3)  # several probe passes of both boxes
        assert "cortex" in listed(right)
        assert role(wrong, "cortex")["ready"] is False
        assert "cortex" not in listed(wrong)


def test_a_proxied_audio_lane_is_ready_from_the_peers_capabilities():
    with start_sim("audio") as audio:
        peer = start_gateway({"AUDIO_URL": audio.url})
        try:
            with start_gateway(proxy_env(peer.url, "STT", key="")) as box:
                wait_for(lambda: role(box, "stt")["ready"])
                assert role(box, "stt")["proxied"] is True
                assert "stt" not in listed(box)
                peer.stop()
                wait_for(lambda: not role(box, "stt")["ready"])
        finally:
            peer.stop()
