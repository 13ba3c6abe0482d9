"""Proxy-lobes across real processes: an "orin" gateway proxies senses and audio to "spark".

spark hosts senses (a simulator) and the audio bridge behind its own inbound key; orin
declares senses and stt infeasible, with spark as the peer, P_PEER_PROXY=true and spark's key.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.conftest import ansible_module
from tests.support import gateway_proc, sim_proc
from tests.support.client import call, chat, sse_events
from tests.support.gateway_proc import start_gateway
from tests.support.ports import dead_origin, free_port
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

gateway_factory = gateway_proc.gateway_factory
sim_factory = sim_proc.sim_factory

SPARK_KEY = "spark-inbound"
ORIN_KEY = "orin-inbound"
ORIN_AUTH = {"Authorization": f"Bearer {ORIN_KEY}"}


def proxy_env(peer: str, **extra: str) -> dict[str, str]:
    env = {"MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_PEER_ORIGIN": peer,
           "MULTIMODAL_PEER_PROXY": "true", "MULTIMODAL_PEER_API_KEY": SPARK_KEY,
           "STT_FEASIBLE": "false", "STT_PEER_ORIGIN": peer, "STT_PEER_PROXY": "true",
           "STT_PEER_API_KEY": SPARK_KEY, "GATEWAY_API_KEY": ORIN_KEY,
           "GATEWAY_PROBE_INTERVAL_S": "0.1", "GATEWAY_PROBE_TIMEOUT_S": "1"}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    proc = tmp_path_factory.mktemp("proc")
    (proc / "meminfo").write_text("SwapTotal: 1000 kB\nSwapFree: 10 kB\n")  # 99 % swap
    (proc / "stat").write_text("cpu  1 0 0 0 0 0 0 0 0 0\n")
    with start_sim("spark-senses", served_name="gemma", time_scale=50) as senses, \
            start_sim("audio") as audio, start_sim("instant") as orin_primary:
        spark_env = {"MULTIMODAL_BASE_URL": senses.url, "MULTIMODAL_SERVED_NAME": "gemma",
                     "MULTIMODAL_MAX_MODEL_LEN": "32768", "AUDIO_URL": audio.url,
                     "GATEWAY_API_KEY": SPARK_KEY}
        with start_gateway(spark_env) as spark, \
                start_gateway(proxy_env(spark.url, LOBES_PROC_ROOT=str(proc),
                                        PRIMARY_BASE_URL=orin_primary.url,
                                        PRIMARY_SERVED_NAME="sim-instant")) as orin:
            wait_until(lambda: "senses" in model_ids(orin), timeout=5,
                       message="orin to list senses")
            yield orin, spark, senses, audio


@pytest.fixture
def box(mesh):
    for sim in mesh[2:]:
        sim.set_faults({})
        sim.clear_requests()
    return mesh


def model_ids(gateway) -> list[str]:
    return [m["id"] for m in gateway.get_json("/v1/models", ORIN_AUTH)["data"]]


def posts(sim) -> list[dict]:
    return [r for r in sim.requests() if r["method"] == "POST"]


def test_proxied_chat_carries_the_pairwise_key_and_markers(box):
    orin, spark, senses, _ = box
    reply = chat(orin.url, {"model": "multimodal"}, ORIN_AUTH)
    assert reply.status == 200, reply.body
    assert reply.headers["x-lobes-proxied-by"] == spark.url
    assert reply.headers["x-lobes-tier"] == "multimodal"  # spark's own served-path header
    recorded = posts(senses)[-1]
    # Spark's gate admits only SPARK_KEY, so the 200 says orin sent it; spark's gear sees none.
    assert "authorization" not in recorded["headers"]
    assert recorded["headers"]["x-lobes-proxied"] == "senses"
    assert json.loads(recorded["body"])["model"] == "gemma"


def test_proxied_stream_is_relayed(box):
    orin, spark, _, _ = box
    reply = chat(orin.url, {"model": "senses", "stream": True, "max_tokens": 10}, ORIN_AUTH)
    assert reply.status == 200 and reply.headers["x-lobes-proxied-by"] == spark.url
    assert sse_events(reply.body)[-1] == "[DONE]"


def senses_in_flight(gateway) -> int:
    return gateway.get_json("/capabilities")["roles"]["senses"]["in_flight"]


@pytest.mark.parametrize("stream", [False, True])
def test_capabilities_count_the_requests_out_at_the_peer_until_answered(box, stream):
    orin, _, senses, _ = box
    # Slowed until counted (a step every ~0.4 s), then let go: the count must fall to 0.
    senses.set_faults({"slow_factor": 1000.0})
    with ThreadPoolExecutor(2) as pool:
        replies = [pool.submit(chat, orin.url, {"model": "senses", "stream": stream,
                                                "max_tokens": 20}, ORIN_AUTH)
                   for _ in range(2)]
        wait_until(lambda: senses_in_flight(orin) == 2, timeout=5,
                   message="orin to count 2 senses requests out at spark")
        senses.set_faults({})
        assert all(reply.result().status == 200 for reply in replies)
    assert senses_in_flight(orin) == 0


def test_proxied_requests_bypass_this_boxs_pressure(box):
    orin = box[0]
    assert orin.get_json("/status")["pressure"]["mode"] == "busy"
    assert chat(orin.url, {"model": "senses"}, ORIN_AUTH).status == 200
    assert chat(orin.url, {"model": "main"}, ORIN_AUTH).status == 429  # local tiers still shed


def test_peer_4xx_is_relayed_verbatim_with_attribution(box):
    orin, spark, _, _ = box
    reply = chat(orin.url, {"model": "senses", "messages": []}, ORIN_AUTH)
    assert reply.status == 400 and reply.error["type"] == "BadRequestError"
    assert reply.headers["x-lobes-proxied-by"] == spark.url


def test_marked_arrival_is_refused_508_with_zero_outbound_attempts(box):
    orin, _, senses, _ = box
    reply = chat(orin.url, {"model": "senses"},
                 {**ORIN_AUTH, "X-Lobes-Proxied": "senses"})
    assert reply.status == 508
    assert reply.error["type"] == reply.error["code"] == "proxy_loop"
    assert "x-lobes-proxied-by" not in reply.headers
    assert posts(senses) == []


def test_marked_arrival_served_locally_is_unaffected(box):
    _, spark, senses, _ = box
    reply = chat(spark.url, {"model": "senses"},
                 {"Authorization": f"Bearer {SPARK_KEY}", "X-Lobes-Proxied": "senses"})
    assert reply.status == 200 and len(posts(senses)) == 1


def test_audio_stt_proxied_verbatim_and_realtime_never(box):
    orin, spark, _, audio = box
    boundary = "b0undary"
    upload = os.urandom(20_000)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"a.wav\"\r\n\r\n").encode() + upload + f"\r\n--{boundary}--\r\n".encode()
    reply = call(orin.url, "POST", "/v1/audio/transcriptions", body,
                 {**ORIN_AUTH, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert reply.status == 200 and reply.json()["text"]
    assert reply.headers["x-lobes-proxied-by"] == spark.url
    assert posts(audio)[-1]["body_sha256"] == hashlib.sha256(body).hexdigest()
    realtime = call(orin.url, "GET", "/v1/realtime",
                    headers={**ORIN_AUTH, "Upgrade": "websocket", "Connection": "Upgrade"})
    assert realtime.status == 404 and realtime.error["type"] == "role_infeasible"
    assert "x-lobes-proxied-by" not in realtime.headers


def test_advertising_follows_the_peer(box):
    orin, spark, senses, _ = box
    caps = orin.get_json("/capabilities")["roles"]["senses"]
    assert caps["proxied"] is True and caps["hosted_by"] == spark.url
    assert caps["ready"] is True and caps["context"] == 32768 and caps["feasible"] is False
    assert caps["served_name"] == "gemma"
    senses.set_faults({"refuse": True})
    try:
        wait_until(lambda: "senses" not in model_ids(orin), timeout=5,
                   message="orin to stop listing senses")
        assert orin.get_json("/capabilities")["roles"]["senses"]["ready"] is False
    finally:
        senses.set_faults({})
    wait_until(lambda: "senses" in model_ids(orin), timeout=5,
               message="orin to list senses again")


def test_peer_down_is_503_with_retry_after(gateway_factory):
    orin = gateway_factory(proxy_env(dead_origin()))
    reply = chat(orin.url, {"model": "senses"}, ORIN_AUTH)
    assert reply.status == 503
    assert reply.error["type"] == "backend_unavailable"
    assert reply.headers["retry-after"] == "5"
    assert reply.headers["x-lobes-proxied-by"].startswith("http://127.0.0.1:")
    assert "senses" not in model_ids(orin)


def test_peer_5xx_is_503(gateway_factory, sim_factory):
    senses = sim_factory("instant")
    spark = gateway_factory({"MULTIMODAL_BASE_URL": senses.url,
                             "MULTIMODAL_SERVED_NAME": "sim-instant",
                             "GATEWAY_API_KEY": SPARK_KEY})
    orin = gateway_factory(proxy_env(spark.url))
    senses.set_faults({"error_status": 500})
    reply = chat(orin.url, {"model": "senses"}, ORIN_AUTH)
    assert reply.status == 503 and reply.headers["x-lobes-proxied-by"] == spark.url


def test_peer_declining_is_a_terminal_404_naming_it(gateway_factory):
    spark = gateway_factory({"MULTIMODAL_FEASIBLE": "false", "GATEWAY_API_KEY": SPARK_KEY})
    orin = gateway_factory(proxy_env(spark.url))
    reply = chat(orin.url, {"model": "senses"}, ORIN_AUTH)
    assert reply.status == 404 and reply.error["type"] == "role_infeasible"
    assert spark.url in reply.error["message"]
    assert reply.headers["x-lobes-proxied-by"] == spark.url


def test_two_boxes_proxying_to_each_other_fail_fast(gateway_factory):
    port_a, port_b = free_port(), free_port()
    env = {"MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_PEER_PROXY": "true"}
    gateway_factory({**env, "MULTIMODAL_PEER_ORIGIN": f"http://127.0.0.1:{port_b}"},
                    port=port_a)
    gateway_factory({**env, "MULTIMODAL_PEER_ORIGIN": f"http://127.0.0.1:{port_a}"},
                    port=port_b)
    reply = chat(f"http://127.0.0.1:{port_a}", {"model": "senses"})
    assert reply.status == 508 and reply.error["code"] == "proxy_loop"


def test_mesh_status_shows_the_requests_a_box_has_out_at_its_peer(box):
    orin, spark, senses, _ = box
    plan = {"boxes": {
        "orin": {"origin": orin.url, "roles": {
            "senses": {"mode": "proxy", "peers": [{"host": "spark"}]}}},
        "spark": {"origin": spark.url, "roles": {
            "senses": {"mode": "serve", "peers": []}}},
    }}
    # Slowed (a step every ~0.4 s) so it outlasts the ansible run that reads it; then let go.
    senses.set_faults({"slow_factor": 1000.0})
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(chat, orin.url, {"model": "senses", "max_tokens": 400,
                                             "ignore_eos": True}, ORIN_AUTH, timeout=120)
        wait_until(lambda: senses_in_flight(orin) == 1, timeout=5,
                   message="orin to count 1 senses request out at spark")
        rows = ansible_module("lobes.fleet.mesh_status", json.dumps({"plan": plan}))["rows"]
        senses.set_faults({})
        assert reply.result().status == 200
    by_box = {row["box"]: row for row in rows}
    assert by_box["orin"]["where"] == "proxied to spark"
    assert by_box["orin"]["in_flight"] == 1
    assert by_box["spark"]["in_flight"] == 1  # the same request, running on spark's gear
