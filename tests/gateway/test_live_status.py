"""What /status adds for the live page, against real gateways and simulators: gear readiness
and engine version, token rates and prefix-cache hits between two calls, time since a gear's
last error, recent TTFT per role, peer link states, the box; GATEWAY_PRIVATE_STATUS."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lobes_gateway.app.live import INCOMPATIBLE, READY, REFUSED, UNREACHABLE, link_state, quantile
from lobes_gateway.app.metrics import BUCKETS
from lobes_gateway.mesh.replicas import (
    NOT_PROBED_REASON,
    ReplicaSpec,
    ReplicaState,
    peer_hardware,
)
from lobes_gateway.mesh.windows import MAX_VERSION_CHARS, engine_version

from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.ports import dead_origin
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

KEY = "live-status-key"
PROMPT = "the same long prompt, asked twice, so the second is a prefix-cache hit " * 8


@pytest.fixture(scope="module")
def box():
    with start_sim("instant", served_name="c") as gear, \
            start_sim("instant", served_name="p") as peer_gear, \
            start_gateway({"PRIMARY_BASE_URL": peer_gear.url, "PRIMARY_SERVED_NAME": "p",
                           "MULTIMODAL_BASE_URL": peer_gear.url,
                           "MULTIMODAL_SERVED_NAME": "p"}) as peer:
        env = {"PRIMARY_BASE_URL": gear.url, "PRIMARY_SERVED_NAME": "c",
               "MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_ROUTE": "proxy",
               "MULTIMODAL_PEER_ORIGIN": peer.url,
               "EMBED_BASE_URL": dead_origin(), "EMBED_SERVED_NAME": "e",
               "GATEWAY_PROBE_INTERVAL_S": "0.3", "GATEWAY_API_KEY": KEY}
        with start_gateway(env) as gateway:
            yield gateway, gear, peer


def _chat(gateway, content: str = PROMPT) -> None:
    reply = chat(gateway.url, {"model": "c", "max_tokens": 16,
                               "messages": [{"role": "user", "content": content}]},
                 headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status == 200, reply.body


def _gears(gateway) -> dict[str, dict]:
    return {row["name"]: row for row in gateway.get_json("/status")["backends"]}


def test_rates_hits_and_ttft_come_from_the_traffic_between_two_calls(box):
    gateway = box[0]
    first = _gears(gateway)["cortex"]
    assert first["ready"] is True and first["reason"] is None
    assert first["engine_version"]  # the simulator's /version, as vLLM answers it
    _chat(gateway)
    _chat(gateway)
    status = gateway.get_json("/status")
    cortex = {row["name"]: row for row in status["backends"]}["cortex"]
    assert cortex["generation_tokens_per_s"] > 0 and cortex["prompt_tokens_per_s"] > 0
    assert 0 < cortex["prefix_cache_hit_rate"] <= 1
    assert cortex["running"] == 0 and cortex["kv_cache_usage_perc"] is not None
    ttft = status["ttft"]["cortex"]
    assert ttft["requests"] >= 2 and 0 < ttft["p50_s"] <= ttft["p95_s"]
    # No traffic since: the next call's rates are zero, not the last ones repeated.
    idle = _gears(gateway)["cortex"]
    assert idle["generation_tokens_per_s"] == 0 and idle["prompt_tokens_per_s"] == 0


def test_a_gear_that_does_not_answer_is_not_ready_says_why_and_when(box):
    gateway = box[0]
    embed = _gears(gateway)["embedder"]
    assert embed["ready"] is False and embed["reason"] == "/health: down"
    assert embed["engine_version"] is None and embed["last_error_s_ago"] is not None


def test_peer_links_follow_the_probe(box):
    gateway, peer = box[0], box[2]

    def link() -> dict | None:
        rows = [row for row in gateway.get_json("/status")["links"] if row["role"] == "senses"]
        return rows[0] if rows else None
    found = wait_until(lambda: (row := link()) and row["state"] == READY and row,
                       message="the senses link ready")
    assert found["kind"] == "proxy" and found["origin"] == peer.url


def test_the_box_block_names_the_host_and_its_memory(box):
    block = box[0].get_json("/status")["box"]
    # The test gateways read a /proc stand-in with half of 100000 kB free.
    assert block["mem_total_kb"] == 100000 and block["mem_available_kb"] == 50000
    assert block["name"] and block["cpus"] >= 1


def test_private_status_asks_for_a_key_and_peers_still_probe_with_theirs():
    with start_sim("instant", served_name="p") as peer_gear, \
            start_gateway({"PRIMARY_BASE_URL": peer_gear.url, "PRIMARY_SERVED_NAME": "p",
                           "MULTIMODAL_BASE_URL": peer_gear.url, "MULTIMODAL_SERVED_NAME": "p",
                           "GATEWAY_API_KEY": KEY, "GATEWAY_PRIVATE_STATUS": "true"}) as peer, \
            start_sim("instant", served_name="c") as gear:
        for path in ("/status", "/capabilities"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(peer.url + path, timeout=10)
            assert refused.value.code == 401
        assert peer.get_json("/health")["status"] == "ok"  # liveness stays keyless
        with urllib.request.urlopen(peer.url + "/ui", timeout=10) as page:  # the page loads
            assert page.status == 200
        env = {"PRIMARY_BASE_URL": gear.url, "PRIMARY_SERVED_NAME": "c",
               "MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_ROUTE": "proxy",
               "MULTIMODAL_PEER_ORIGIN": peer.url, "MULTIMODAL_PEER_API_KEY": KEY,
               "GATEWAY_PROBE_INTERVAL_S": "0.3"}
        with start_gateway(env) as gateway:
            wait_until(lambda: any(row["state"] == READY
                                   for row in gateway.get_json("/status")["links"]),
                       message="the prober's key to open the private peer's status")


def _state(ready: bool, compatible: bool, reason: str) -> ReplicaState:
    return ReplicaState(ReplicaSpec("http://peer:8000"), ready, compatible, reason)


def test_link_states_from_the_probe_verdicts():
    assert link_state(_state(True, True, "fingerprint reference")) == READY
    assert link_state(_state(True, False, "serves a, plan serves b")) == INCOMPATIBLE
    assert link_state(_state(False, False, "peer gateway unreachable")) == UNREACHABLE
    assert link_state(_state(False, False, NOT_PROBED_REASON)) == UNREACHABLE
    assert link_state(_state(False, False, "peer rejected the pairwise key (HTTP 401)")) == REFUSED


@given(st.lists(st.integers(0, 1000), min_size=len(BUCKETS) + 1, max_size=len(BUCKETS) + 1),
       st.floats(0.01, 1.0))
def test_a_quantile_lies_within_the_buckets_and_grows_with_q(counts, q):
    value = quantile(counts, q)
    if sum(counts) == 0:
        assert value is None
        return
    assert 0 <= value <= BUCKETS[-1]
    assert quantile(counts, min(1.0, q + 0.1)) >= value


@given(st.binary(max_size=512))
def test_an_engine_version_from_any_answer_is_a_short_string_or_none(body):
    version = engine_version(body)
    assert version is None or (isinstance(version, str) and len(version) <= MAX_VERSION_CHARS)


def test_an_engine_version_is_read_from_vllm_s_answer():
    assert engine_version(b'{"version": "0.11.0"}') == "0.11.0"
    assert engine_version(b'{"version": 11}') is None
    assert engine_version(b'["0.11.0"]') is None


SPARK = "NVIDIA DGX Spark (GB10, 128 GB unified)"


def test_the_plans_word_on_the_box_and_a_peers_hardware_reach_status():
    """The plan renders the box's hardware, its gears' shares and the headroom it keeps; /status
    repeats them, /capabilities names the hardware, and a box that probes it shows it per link."""
    with start_sim("instant", served_name="p") as peer_gear, \
            start_gateway({"PRIMARY_BASE_URL": peer_gear.url, "PRIMARY_SERVED_NAME": "p",
                           "MULTIMODAL_BASE_URL": peer_gear.url, "MULTIMODAL_SERVED_NAME": "p",
                           "GATEWAY_BOX_HARDWARE": SPARK, "GATEWAY_GEAR_SHARES_GIB": "71.68",
                           "GATEWAY_MEMORY_HEADROOM_GIB": "20"}) as peer, \
            start_sim("instant", served_name="c") as gear:
        block = peer.get_json("/status")["box"]
        assert (block["hardware"], block["gear_shares_gib"], block["memory_headroom_gib"]) == (
            SPARK, 71.68, 20.0)
        assert peer.get_json("/capabilities")["box"] == {"hardware": SPARK}
        env = {"PRIMARY_BASE_URL": gear.url, "PRIMARY_SERVED_NAME": "c",
               "MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_ROUTE": "proxy",
               "MULTIMODAL_PEER_ORIGIN": peer.url, "GATEWAY_PROBE_INTERVAL_S": "0.3"}
        with start_gateway(env) as gateway:
            wait_until(lambda: [link["hardware"] for link in gateway.get_json("/status")["links"]]
                       == [SPARK], message="the peer's hardware on its link")
            # Not rendered: nothing is made up.
            assert gateway.get_json("/status")["box"]["hardware"] is None
            assert "box" not in gateway.get_json("/capabilities")


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=200),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["box", "hardware", "roles"]), inner,
                                      max_size=3)))
def test_a_peers_hardware_is_repeated_only_as_a_short_printable_line(capabilities):
    hardware = peer_hardware(capabilities)
    assert hardware is None or (isinstance(hardware, str) and 0 < len(hardware) <= 120
                                and hardware.isascii() and hardware.isprintable())


def test_a_peers_hardware_with_markup_is_kept_as_text_and_control_bytes_are_not():
    markup = "<img src=x onerror=alert(1)>"
    assert peer_hardware({"box": {"hardware": markup}}) == markup  # the page shows it as text
    assert peer_hardware({"box": {"hardware": "Spark\r\nX-Injected: 1"}}) is None
    assert peer_hardware({"box": {"hardware": "x" * 121}}) is None
    assert peer_hardware({"box": "Spark"}) is None
