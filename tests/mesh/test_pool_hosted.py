"""A hosted pool across real processes (seed 000's Thor): this box serves cortex on its own
backend and pools it with a faster peer, the Spark, placing each request on one of them.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.gateway_proc import free_port, start_gateway
from tests.support.sim_proc import start_sim

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
TIME_SCALE = 5


def chat(url, headers=None):
    payload = {"model": "cortex", "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 160}
    request = urllib.request.Request(f"{url}/v1/chat/completions",
                                     data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.headers


def served_by(headers):
    return headers["X-Lobes-Proxied-By"] or headers["X-Lobes-Served-By"]


def burst(url, size):
    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(lambda _: chat(url), range(size)))


def replicas(gateway):
    return gateway.get_json("/capabilities")["roles"]["cortex"]["replicas"]


def wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition never held")


def all_selectable(gateway):
    wait_for(lambda: all(r["ready"] and r["compatible"] for r in replicas(gateway)))


@pytest.fixture(scope="module")
def spark():
    with start_sim("spark-cortex", time_scale=TIME_SCALE) as sim, \
            start_gateway({"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
                           "PRIMARY_MAX_MODEL_LEN": "262144"}) as gateway:
        yield gateway


@pytest.fixture
def thor_sim():
    with start_sim("thor-cortex", time_scale=TIME_SCALE) as sim:
        yield sim


def thor_box(thor_sim, spark, rates):
    port = free_port()
    me = f"http://127.0.0.1:{port}"
    env = {"PRIMARY_BASE_URL": thor_sim.url, "PRIMARY_SERVED_NAME": SERVED,
           "PRIMARY_MAX_MODEL_LEN": "262144", "PRIMARY_MAX_ACTIVE": "2",
           "GATEWAY_SELF_ORIGIN": me, "PRIMARY_PEER_ORIGINS": f"{me},{spark.url}",
           "PRIMARY_PEER_RATES": rates, "GATEWAY_PROBE_INTERVAL_S": "0.1"}
    return me, start_gateway(env, port=port)


def test_the_local_backend_is_a_replica_and_the_role_stays_hosted(thor_sim, spark):
    me, box = thor_box(thor_sim, spark, "11,48.9")
    with box:
        all_selectable(box)
        cortex = box.get_json("/capabilities")["roles"]["cortex"]
        listed = [m["id"] for m in box.get_json("/v1/models")["data"]]
    assert listed == [SERVED]  # listed once, as this box's own backend
    assert (cortex["feasible"], cortex["ready"], cortex["proxied"]) == (True, True, False)
    assert cortex["context"] == 262144
    assert [(r["origin"], r["reason"]) for r in cortex["replicas"]] == [
        (me, "fingerprint reference"), (spark.url, "")]


def test_a_burst_goes_to_the_faster_peer_and_equal_rates_share_it_with_the_local(thor_sim,
                                                                                  spark):
    me, box = thor_box(thor_sim, spark, "11,48.9")
    with box:
        all_selectable(box)
        fast = burst(box.url, 4)
    me, box = thor_box(thor_sim, spark, "11,11")
    with box:
        all_selectable(box)
        equal = burst(box.url, 4)
    assert Counter(served_by(h) for _, h in fast) == {spark.url: 4}
    assert Counter(served_by(h) for _, h in equal) == {me: 2, spark.url: 2}
    local = [h for _, h in equal if h["X-Lobes-Served-By"] == me]
    assert all(h["X-Lobes-Proxied-By"] is None and h["X-Lobes-Tier"] == "main" for h in local)


def test_a_marked_arrival_is_served_locally_never_sent_on(thor_sim, spark):
    me, box = thor_box(thor_sim, spark, "11,48.9")
    with box:
        all_selectable(box)
        status, headers = chat(box.url, {"X-Lobes-Proxied": "cortex"})
    assert status == 200
    assert headers["X-Lobes-Served-By"] == me and headers["X-Lobes-Proxied-By"] is None


def test_a_dark_local_backend_leaves_the_pool_to_the_peer(thor_sim, spark):
    me, box = thor_box(thor_sim, spark, "100,11")
    with box:
        all_selectable(box)
        thor_sim.set_faults({"refuse": True})
        wait_for(lambda: not replicas(box)[0]["ready"])
        assert replicas(box)[0] == {"origin": me, "ready": False, "compatible": False,
                                    "reason": "local backend unreachable"}
        status, headers = chat(box.url)
    assert (status, headers["X-Lobes-Proxied-By"]) == (200, spark.url)
