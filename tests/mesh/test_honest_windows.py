"""Boxes advertise what their backends really serve (seed 000's 1048576-vs-262144 defect).

A box whose P_MAX_MODEL_LEN mirror says 1048576 in front of a backend serving 262144 must
publish 262144; a pool built from such boxes then agrees on the window that is served. Its
/capabilities also publish slots (P_MAX_ACTIVE) and quantization (P_QUANTIZATION), which a
pooling peer reads: slots for placement, quantization for the fingerprint.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
KEY = {"Authorization": "Bearer k"}


def box_env(sim, **extra):
    env = {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
           "GATEWAY_API_KEY": "k", "GATEWAY_PROBE_INTERVAL_S": "0.1"}
    env.update(extra)
    return env


def pool_env(origins):
    return {"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGIN": origins[0],
            "PRIMARY_PEER_PROXY": "true", "PRIMARY_PEER_ORIGINS": ",".join(origins),
            "PRIMARY_PEER_API_KEYS": "k," * (len(origins) - 1) + "k",
            "GATEWAY_PROBE_INTERVAL_S": "0.1"}


def replicas_when_judged(gateway):
    def judged():
        cortex = gateway.get_json("/capabilities")["roles"]["cortex"]
        return cortex if all(r["reason"] != "not probed yet" for r in cortex["replicas"]) else None

    return wait_until(judged, message="every cortex replica of the pool probed")


def test_a_box_advertises_the_window_its_backend_serves_not_its_config_mirror():
    with start_sim("spark-cortex", time_scale=5) as sim, \
            start_gateway(box_env(sim, PRIMARY_MAX_MODEL_LEN="1048576",
                                  PRIMARY_MAX_ACTIVE="2",
                                  PRIMARY_QUANTIZATION="nvfp4")) as box:
        cortex = box.get_json("/capabilities")["roles"]["cortex"]
        models = box.get_json("/v1/models", KEY)["data"]
    assert (cortex["context"], cortex["max_active"], cortex["quantization"]) == (
        262144, 2, "nvfp4")
    assert [(m["id"], m["max_model_len"]) for m in models] == [(SERVED, 262144)]


def test_a_window_the_backend_changes_is_followed_without_a_restart():
    with start_sim("spark-cortex", time_scale=5,
                   extra_args=["--max-model-len", "131072"]) as sim, \
            start_gateway(box_env(sim, PRIMARY_MAX_MODEL_LEN="262144")) as box:
        assert box.get_json("/capabilities")["roles"]["cortex"]["context"] == 131072


def test_a_pool_agrees_on_the_served_window_of_boxes_whose_mirrors_disagree():
    with start_sim("spark-cortex", time_scale=5) as spark_sim, \
            start_sim("thor-cortex", time_scale=5) as thor_sim, \
            start_gateway(box_env(spark_sim, PRIMARY_MAX_MODEL_LEN="262144")) as spark, \
            start_gateway(box_env(thor_sim, PRIMARY_MAX_MODEL_LEN="1048576")) as thor, \
            start_gateway(pool_env([spark.url, thor.url])) as pooler:
        cortex = replicas_when_judged(pooler)
    assert [(r["origin"], r["compatible"]) for r in cortex["replicas"]] == [
        (spark.url, True), (thor.url, True)]
    assert cortex["context"] == 262144


def test_a_pool_refuses_a_replica_whose_quantization_differs():
    with start_sim("spark-cortex", time_scale=5) as spark_sim, \
            start_sim("thor-cortex", time_scale=5) as thor_sim, \
            start_gateway(box_env(spark_sim, PRIMARY_QUANTIZATION="nvfp4")) as spark, \
            start_gateway(box_env(thor_sim, PRIMARY_QUANTIZATION="fp8")) as thor, \
            start_gateway(pool_env([spark.url, thor.url])) as pooler:
        cortex = replicas_when_judged(pooler)
    assert [(r["compatible"], r["reason"]) for r in cortex["replicas"]] == [
        (True, "fingerprint reference"), (False, "runtime fp8, reference runtime nvfp4")]


def test_a_pool_places_by_the_slots_each_replica_publishes():
    """Equal rates; spark publishes 4 slots, thor 1: a burst of 4 fits in spark's one wave.

    The rate policy's waves, where published slots alone decide it: the prefix policy also
    prices the prefill each request waits for on a replica still prefilling, and at equal
    declared rates sends the second of the burst to the idle thor, a tie broken by the
    first one's 7-token prefill (13 ms at the priors)."""
    with start_sim("spark-cortex", time_scale=5, extra_args=["--max-num-seqs", "4"]) as s_sim, \
            start_sim("thor-cortex", time_scale=5) as t_sim, \
            start_gateway(box_env(s_sim, PRIMARY_MAX_ACTIVE="4")) as spark, \
            start_gateway(box_env(t_sim, PRIMARY_MAX_ACTIVE="1")) as thor, \
            start_gateway({**pool_env([spark.url, thor.url]), "PRIMARY_PEER_RATES": "11,11",
                           "PRIMARY_MAX_ACTIVE": "2", "GATEWAY_POOL_POLICY": "rate"}) as pooler:
        replicas_when_judged(pooler)
        with ThreadPoolExecutor(4) as pool:
            served = list(pool.map(lambda _: proxied_by(pooler.url), range(4)))
    assert served == [spark.url] * 4


def proxied_by(url):
    reply = chat(url, {"model": "cortex", "max_tokens": 40,
                       "messages": [{"role": "user", "content": "hi"}]}, KEY)
    assert reply.status == 200, reply.body
    return reply.headers.get("x-lobes-proxied-by")
