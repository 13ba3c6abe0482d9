"""Honest advertising of peer-served roles (advert.py probes each single proxied peer with
peers.py): /v1/models lists the role and /capabilities calls it ready only while the peer,
asked with the pairwise key, actually serves it. Complements tests/mesh/test_proxy_mesh.py
with the rejected key and the audio lane.
"""

from __future__ import annotations

from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

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


def test_a_peer_that_rejects_the_pairwise_key_is_not_advertised():
    with start_sim("spark-cortex", time_scale=20) as sim, \
            start_gateway({"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
                           "GATEWAY_API_KEY": PEER_KEY}) as peer, \
            start_gateway(proxy_env(peer.url, key="not-the-peer-key")) as wrong, \
            start_gateway(proxy_env(peer.url)) as right:
        wait_until(lambda: role(right, "cortex")["ready"],
                   message="the box with the right key to call cortex ready")
        wait_until(lambda: role(wrong, "cortex")["peer"]["reason"] != "not probed yet",
                   message="the box with the wrong key to have probed its peer")
        assert "cortex" in listed(right)
        assert role(wrong, "cortex")["ready"] is False
        assert "cortex" not in listed(wrong)


def test_a_proxied_audio_lane_is_ready_from_the_peers_capabilities():
    with start_sim("audio") as audio:
        peer = start_gateway({"AUDIO_URL": audio.url})
        try:
            with start_gateway(proxy_env(peer.url, "STT", key="")) as box:
                wait_until(lambda: role(box, "stt")["ready"], message="stt ready")
                assert role(box, "stt")["proxied"] is True
                assert "stt" not in listed(box)
                peer.stop()
                wait_until(lambda: not role(box, "stt")["ready"],
                           message="stt unready once the peer stopped")
        finally:
            peer.stop()


def test_an_unwired_tier_answered_by_a_peer_served_role_is_ready_with_it():
    """minor, declared nowhere, is answered upward by cortex: where cortex is a peer's, minor is
    ready exactly when cortex is, and says who answers it."""
    with start_sim("spark-cortex", time_scale=20) as sim, \
            start_gateway({"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
                           "GATEWAY_API_KEY": PEER_KEY}) as peer, \
            start_gateway(proxy_env(peer.url)) as box:
        wait_until(lambda: role(box, "cortex")["ready"], message="cortex ready through the peer")
        minor = role(box, "minor")
        assert (minor["ready"], minor["proxied"], minor["served_by"]) == (True, True, "cortex")
        # Routed as cortex is, not "serve"; a lane nothing answers is off, and not feasible.
        assert minor["route"] == "proxy"
        embedder = role(box, "embedder")
        assert (embedder["feasible"], embedder["route"], embedder["reason"]) == (
            False, "off", "backend_not_wired")
        peer.stop()
        wait_until(lambda: not role(box, "cortex")["ready"], message="cortex unready")
        assert role(box, "minor")["ready"] is False
