"""A hosted pool across real processes (seed 000's Thor): this box serves cortex on its own
backend and pools it with a faster peer, the Spark, placing each request on one of them.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gateway.test_pressure_strict import wait_mode, write_proc
from tests.support.client import Reply, chat
from tests.support.gateway_proc import start_gateway
from tests.support.ports import dead_origin, free_port
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
TIME_SCALE = 5
CORTEX = {"model": "cortex", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 160}
MARKED = {"X-Lobes-Proxied": "cortex"}


def served_by(reply: Reply) -> str:
    return reply.headers.get("x-lobes-proxied-by") or reply.headers["x-lobes-served-by"]


def burst(url, size):
    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(lambda _: chat(url, CORTEX, timeout=60), range(size)))


def replicas(gateway):
    return gateway.get_json("/capabilities")["roles"]["cortex"]["replicas"]


def all_selectable(gateway):
    wait_until(lambda: all(r["ready"] and r["compatible"] for r in replicas(gateway)),
               message="every cortex replica ready and compatible")


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


def thor_box(thor_sim, spark, rates, peer=None, **extra):
    """The Thor's box, pooling its own backend with `peer` (the Spark's gateway unless
    given an origin)."""
    port = free_port()
    me = f"http://127.0.0.1:{port}"
    env = {"PRIMARY_BASE_URL": thor_sim.url, "PRIMARY_SERVED_NAME": SERVED,
           "PRIMARY_MAX_MODEL_LEN": "262144", "PRIMARY_MAX_ACTIVE": "2",
           "GATEWAY_SELF_ORIGIN": me, "PRIMARY_PEER_ORIGINS": f"{me},{peer or spark.url}",
           "PRIMARY_PEER_RATES": rates, "GATEWAY_PROBE_INTERVAL_S": "0.1", **extra}
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
        (me, ""), (spark.url, "")]  # both serve the plan's model: the plan is the reference


def test_a_burst_goes_to_the_faster_peer_and_equal_rates_share_it_with_the_local(
        thor_sim, spark):
    me, box = thor_box(thor_sim, spark, "11,48.9")
    with box:
        all_selectable(box)
        fast = burst(box.url, 4)
    me, box = thor_box(thor_sim, spark, "11,11")
    with box:
        all_selectable(box)
        equal = burst(box.url, 4)
    assert Counter(served_by(r) for r in fast) == {spark.url: 4}
    assert Counter(served_by(r) for r in equal) == {me: 2, spark.url: 2}
    local = [r.headers for r in equal if r.headers.get("x-lobes-served-by") == me]
    assert all("x-lobes-proxied-by" not in h and h["x-lobes-tier"] == "main" for h in local)


@pytest.mark.parametrize("marker", [MARKED, {"X-Lobes-Forwarded-By": "http://entry.test:8000"}],
                         ids=["placed-by-a-pool", "forwarded-to-an-owner"])
def test_a_marked_arrival_is_served_locally_never_sent_on(thor_sim, spark, marker):
    me, box = thor_box(thor_sim, spark, "11,48.9")
    with box:
        all_selectable(box)
        reply = chat(box.url, CORTEX, marker, timeout=60)
    assert reply.status == 200
    assert reply.headers["x-lobes-served-by"] == me
    assert "x-lobes-proxied-by" not in reply.headers


def test_a_dark_local_backend_leaves_the_pool_to_the_peer(thor_sim, spark):
    me, box = thor_box(thor_sim, spark, "100,11")
    with box:
        all_selectable(box)
        thor_sim.set_faults({"refuse": True})
        wait_until(lambda: not replicas(box)[0]["ready"],
                   message="the local replica to turn unready")
        assert replicas(box)[0] == {"origin": me, "ready": False, "compatible": False,
                                    "reason": "local backend unreachable", "rate": 100,
                                    "sessions": 0}
        reply = chat(box.url, CORTEX, timeout=60)
    assert (reply.status, reply.headers["x-lobes-proxied-by"]) == (200, spark.url)


def local_rate(box):
    return replicas(box)[0]["rate"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_from_the_local_replica_carries_its_reason_and_teaches_its_rate(
        thor_sim, spark, stream):
    me, box = thor_box(thor_sim, spark, "1000,48.9")  # a prior far above what thor serves
    with box:
        all_selectable(box)
        reply = chat(box.url, {**CORTEX, "stream": stream}, timeout=60)
        # thor-cortex at time-scale 5 serves ~55 tok/s: one answer pulls the estimate well
        # down (published with the next probe pass).
        wait_until(lambda: 0 < local_rate(box) < 1000 * 0.9,
                   message="the local rate estimate to fall below 90% of its prior")
    assert (reply.status, reply.headers["x-lobes-served-by"]) == (200, me)
    assert reply.headers["x-lobes-route-reason"] == "earliest-completion"


def test_a_marked_arrival_counts_on_the_local_replica_while_it_is_served(thor_sim, spark):
    """Another box's request on the local replica is load this box's placement sees."""
    box = thor_box(thor_sim, spark, "11,11")[1]
    with box:
        all_selectable(box)
        with ThreadPoolExecutor(3) as pool:
            marked = [pool.submit(chat, box.url, {**CORTEX, "max_tokens": 400, "ignore_eos": True},
                                  MARKED, timeout=60) for _ in range(2)]
            wait_until(lambda: thor_sim_running(thor_sim) == 2,
                       message="both marked arrivals running on thor's simulator")
            own = pool.submit(chat, box.url, CORTEX, timeout=60).result()
            assert all(m.result().status == 200 for m in marked)
    # Equal rates, the local replica's 2 slots held by marked arrivals: spark is sooner.
    assert own.headers["x-lobes-proxied-by"] == spark.url


def thor_sim_running(sim):
    with urllib.request.urlopen(f"{sim.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def test_a_box_shedding_the_tier_leaves_its_pooled_requests_to_the_peer(
        thor_sim, spark, tmp_path):
    """Pressure on this box sheds its own replica only: the peer serves the request."""
    write_proc(tmp_path, 95)  # swap past every threshold: the box sheds main
    me, box = thor_box(thor_sim, spark, "11,11", GATEWAY_POOL_POLICY="pinned",
                       LOBES_PROC_ROOT=str(tmp_path), LOBES_PRESSURE_SAMPLE_S="0.02")
    with box:
        all_selectable(box)
        wait_mode(box, "busy")
        shed_away = chat(box.url, CORTEX, timeout=60)
        overridden = chat(box.url, CORTEX, {"X-Lobes-Override": "true"}, timeout=60)
    assert (shed_away.status, shed_away.headers["x-lobes-proxied-by"]) == (200, spark.url)
    assert (overridden.status, overridden.headers["x-lobes-served-by"]) == (200, me)


def test_a_box_shedding_the_tier_with_no_peer_to_take_it_answers_busy(thor_sim, spark, tmp_path):
    write_proc(tmp_path, 95)
    _me, box = thor_box(thor_sim, spark, "11,11", peer=dead_origin(),
                        GATEWAY_POOL_POLICY="pinned", LOBES_PROC_ROOT=str(tmp_path),
                        LOBES_PRESSURE_SAMPLE_S="0.02")
    with box:
        wait_until(lambda: replicas(box)[0]["ready"], message="the local replica ready")
        wait_mode(box, "busy")
        reply = chat(box.url, CORTEX, timeout=60)
    assert (reply.status, reply.headers["x-lobes-tier"]) == (429, "main")
    assert json.loads(reply.body)["error"]["code"] == "busy"
