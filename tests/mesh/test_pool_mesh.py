"""Replica pools across real processes: a pooling gateway, two peer gateways, two simulators.

Seed 000's shape: the pooling box does not host cortex (PRIMARY_FEASIBLE=false) and pools it
from a "spark" peer (gated by its own key, inherited through an empty key slot) and a
"thor" peer (no gate). Simulators run spark-cortex and thor-cortex, time-scaled.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gateway.test_pressure_strict import wait_mode, write_proc
from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import Scrape
from tests.support.ports import dead_origin
from tests.support.sim_proc import start_sim
from tests.support.sse import stream_chat
from tests.support.wait import wait_until

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
SPARK_KEY = "spark-inbound"
REASONS = {"sole-ready", "peer-less-loaded", "earliest-completion", "pinned"}
TIME_SCALE = 5
CORTEX = {"model": "cortex", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 160}


def peer_env(sim, api_key=None):
    env = {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
           "PRIMARY_MAX_MODEL_LEN": "262144"}
    if api_key:
        env["GATEWAY_API_KEY"] = api_key
    return env


def pool_env(singular, origins, **extra):
    env = {
        "PRIMARY_FEASIBLE": "false",
        "PRIMARY_PEER_ORIGIN": singular,
        "PRIMARY_PEER_PROXY": "true",
        "PRIMARY_PEER_API_KEY": SPARK_KEY,
        "PRIMARY_PEER_ORIGINS": ",".join(origins),
        "PRIMARY_PEER_API_KEYS": "," * (len(origins) - 1),
        "PRIMARY_MAX_ACTIVE": "2",
        "GATEWAY_PROBE_INTERVAL_S": "0.1",
    }
    env.update(extra)
    return env


def burst(url, size, headers=None):
    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(lambda _: chat(url, CORTEX, headers), range(size)))


def replicas(gateway):
    return gateway.get_json("/capabilities")["roles"]["cortex"].get("replicas", [])


def all_selectable(gateway, count=2):
    def check():
        rows = replicas(gateway)
        return len(rows) == count and all(r["ready"] and r["compatible"] for r in rows)

    wait_until(check, message=f"{count} cortex replicas, all ready and compatible")


def posts(sim):
    return [r for r in sim.requests() if r["method"] == "POST"]


@pytest.fixture(scope="module")
def pair():
    """spark and thor: a simulator and a peer gateway each; spark's gateway is gated."""
    with start_sim("spark-cortex", time_scale=TIME_SCALE) as spark_sim, \
            start_sim("thor-cortex", time_scale=TIME_SCALE) as thor_sim, \
            start_gateway(peer_env(spark_sim, SPARK_KEY)) as spark, \
            start_gateway(peer_env(thor_sim)) as thor:
        yield {"spark": spark, "thor": thor, "spark_sim": spark_sim, "thor_sim": thor_sim}


def test_the_pool_advertises_ready_the_agreed_window_and_its_replicas(pair):
    spark, thor = pair["spark"], pair["thor"]
    with start_gateway(pool_env(spark.url, [spark.url, thor.url])) as orin:
        all_selectable(orin)
        cortex = orin.get_json("/capabilities")["roles"]["cortex"]
        assert (cortex["feasible"], cortex["ready"], cortex["proxied"]) == (False, True, True)
        assert cortex["context"] == 262144
        assert cortex["served_name"] == SERVED
        assert [(r["origin"], r["reason"]) for r in cortex["replicas"]] == [
            (spark.url, "fingerprint reference"), (thor.url, "")]
        # How it places and whether its streams survive a replica: the defaults here.
        assert (cortex["policy"], cortex["stream_resume"]) == ("prefix", False)
        listed = [m["id"] for m in orin.get_json("/v1/models")["data"]]
        assert "cortex" in listed
    with start_gateway(pool_env(spark.url, [spark.url, thor.url], GATEWAY_POOL_POLICY="rate",
                                PRIMARY_STREAM_RESUME="true")) as orin:
        cortex = orin.get_json("/capabilities")["roles"]["cortex"]
        assert (cortex["policy"], cortex["stream_resume"]) == ("rate", True)


def test_concurrent_placements_spread_across_replicas(pair):
    spark, thor = pair["spark"], pair["thor"]
    env = pool_env(spark.url, [spark.url, thor.url], PRIMARY_PEER_RATES="11,11")
    with start_gateway(env) as orin:
        all_selectable(orin)
        answers = burst(orin.url, 4)
    assert [reply.status for reply in answers] == [200] * 4
    split = Counter(reply.headers["x-lobes-proxied-by"] for reply in answers)
    assert split == {spark.url: 2, thor.url: 2}
    assert {reply.headers["x-lobes-route-reason"] for reply in answers} <= REASONS


def test_rate_placement_keeps_a_burst_of_4_on_the_fast_replica_where_queue_splits_it(pair):
    spark, thor = pair["spark"], pair["thor"]
    origins = [spark.url, thor.url]
    rates = {"PRIMARY_PEER_RATES": "48.9,11"}
    with start_gateway(pool_env(spark.url, origins, **rates)) as orin:
        all_selectable(orin)
        rate = burst(orin.url, 4)
    with start_gateway(pool_env(spark.url, origins, GATEWAY_POOL_POLICY="queue", **rates)) as orin:
        all_selectable(orin)
        queue = burst(orin.url, 4)
    assert Counter(r.headers["x-lobes-proxied-by"] for r in rate) == {spark.url: 4}
    assert {r.headers["x-lobes-route-reason"] for r in rate} == {"earliest-completion"}
    assert Counter(r.headers["x-lobes-proxied-by"] for r in queue) == {spark.url: 2, thor.url: 2}
    assert {r.headers["x-lobes-route-reason"] for r in queue} <= {"peer-less-loaded",
                                                                  "sole-ready"}


def test_the_inherited_key_opens_spark_and_no_gear_sees_a_key(pair):
    """Spark's gate admits only SPARK_KEY: its two answers prove orin sent the inherited key
    (a 401 would have moved them to thor). peer_headers' unit tests hold that the caller's key
    is never among what a peer receives."""
    spark, thor = pair["spark"], pair["thor"]
    pair["spark_sim"].clear_requests()
    pair["thor_sim"].clear_requests()
    env = pool_env(spark.url, [spark.url, thor.url], PRIMARY_PEER_RATES="11,11",
                   GATEWAY_API_KEY="orin-caller-key")
    with start_gateway(env) as orin:
        all_selectable(orin)
        answers = burst(orin.url, 4, {"Authorization": "Bearer orin-caller-key"})
    split = Counter(reply.headers["x-lobes-proxied-by"] for reply in answers)
    assert split == {spark.url: 2, thor.url: 2}
    spark_posts, thor_posts = posts(pair["spark_sim"]), posts(pair["thor_sim"])
    assert [r["headers"].get("authorization") for r in spark_posts + thor_posts] == [None] * 4
    assert all(json.loads(r["body"])["model"] == SERVED for r in spark_posts + thor_posts)


def test_a_stream_is_relayed_through_the_pool_with_its_markers(pair):
    spark, thor = pair["spark"], pair["thor"]
    with start_gateway(pool_env(spark.url, [spark.url, thor.url])) as orin:
        all_selectable(orin)
        reply = chat(orin.url, {**CORTEX, "stream": True})
    assert reply.status == 200
    assert reply.headers["x-lobes-proxied-by"] == spark.url
    assert reply.headers["x-lobes-route-reason"] == "earliest-completion"
    events = [line for line in reply.body.decode().split("\n") if line.startswith("data: ")]
    assert len(events) > 10 and events[-1] == "data: [DONE]"


def test_a_marked_arrival_is_refused_508_without_dialling_any_replica(pair):
    spark, thor = pair["spark"], pair["thor"]
    with start_gateway(pool_env(spark.url, [spark.url, thor.url])) as orin:
        all_selectable(orin)
        pair["spark_sim"].clear_requests()
        pair["thor_sim"].clear_requests()
        reply = chat(orin.url, CORTEX, {"X-Lobes-Proxied": "cortex"})
    assert reply.status == 508
    assert reply.error["type"] == "proxy_loop"
    assert "x-lobes-proxied-by" not in reply.headers
    assert posts(pair["spark_sim"]) == [] and posts(pair["thor_sim"]) == []


def test_the_reference_is_the_first_ready_peer_not_the_first_declared(pair):
    thor, dead = pair["thor"], dead_origin()
    with start_gateway(pool_env(thor.url, [dead, thor.url])) as orin:
        rows = wait_until(lambda: replicas(orin) if replicas(orin)[1]["ready"] else None,
                          message="thor's replica (the second) to be ready")
        assert [(r["origin"], r["ready"], r["compatible"], r["reason"]) for r in rows] == [
            (dead, False, False, "peer gateway unreachable"),
            (thor.url, True, True, "fingerprint reference")]
        reply = chat(orin.url, CORTEX)
    assert reply.status == 200
    assert (reply.headers["x-lobes-proxied-by"], reply.headers["x-lobes-route-reason"]) == (
        thor.url, "sole-ready")


def test_nothing_selectable_falls_through_to_the_singular_forward(pair):
    spark, dead = pair["spark"], dead_origin()
    with start_gateway(pool_env(spark.url, [dead])) as orin:
        wait_until(lambda: replicas(orin)[0]["reason"] == "peer gateway unreachable",
                   message="the dead replica judged unreachable")
        reply = chat(orin.url, CORTEX)
    assert reply.status == 200
    assert reply.headers["x-lobes-proxied-by"] == spark.url
    assert reply.headers["x-lobes-route-reason"] == "none"


def test_a_request_the_full_pool_cannot_place_goes_to_a_live_replica_not_a_dead_one():
    """Queue placement finds the one live replica full (one slot, a stream held there). The
    request it cannot place used to fall through to the singular forward, the first replica,
    which the prober had judged down: a 503 while a replica was up (resume-bench's lost
    stream). It now goes to the live replica, counted there, and is answered."""
    held = {"model": "cortex", "messages": [{"role": "user", "content": "go on"}],
            "max_tokens": 1000, "ignore_eos": True}
    dead = dead_origin()
    with start_sim("spark-cortex", time_scale=20) as sim, \
            start_gateway({**peer_env(sim), "PRIMARY_MAX_ACTIVE": "1"}) as live, \
            start_gateway(pool_env(dead, [dead, live.url],
                                   GATEWAY_POOL_POLICY="queue")) as orin, \
            ThreadPoolExecutor(1) as client:
        wait_until(lambda: [r["ready"] for r in replicas(orin)] == [False, True],
                   message="the first replica judged down, the second up")
        overflowing = []

        def send_once_the_stream_runs(_streamed) -> None:
            if not overflowing:
                overflowing.append(client.submit(chat, orin.url, CORTEX))

        streamed = stream_chat(orin.url, held, after_event=send_once_the_stream_runs)
        reply = overflowing[0].result()
    assert streamed.done and streamed.headers["x-lobes-proxied-by"] == live.url
    assert reply.status == 200, reply.body
    assert (reply.headers["x-lobes-proxied-by"], reply.headers["x-lobes-route-reason"]) == (
        live.url, "none")


def test_a_request_the_full_pool_cannot_place_fails_over_when_its_replica_fails():
    """Both replicas full (one slot each, a request held on each), the first still judged up
    by a slow prober but answering 503: the request the policy cannot place goes to it and,
    not yet started, fails over to the other replica like any placed request."""
    held = {"model": "cortex", "messages": [{"role": "user", "content": "go on"}],
            "max_tokens": 1000, "ignore_eos": True}
    with start_sim("spark-cortex", time_scale=20) as first_sim, \
            start_sim("spark-cortex", time_scale=20) as second_sim, \
            start_gateway({**peer_env(first_sim), "PRIMARY_MAX_ACTIVE": "1"}) as first, \
            start_gateway({**peer_env(second_sim), "PRIMARY_MAX_ACTIVE": "1"}) as second, \
            start_gateway(pool_env(first.url, [first.url, second.url], PRIMARY_PEER_API_KEY="",
                                   GATEWAY_POOL_POLICY="queue",
                                   GATEWAY_PROBE_INTERVAL_S="60")) as orin, \
            ThreadPoolExecutor(2) as client:
        all_selectable(orin)
        holding = [client.submit(chat, orin.url, held) for _each in range(2)]
        wait_until(lambda: len(posts(first_sim)) == len(posts(second_sim)) == 1,
                   message="a request held on each replica")
        first_sim.set_faults({"error_status": 503})
        reply = chat(orin.url, CORTEX)
        assert [each.result().status for each in holding] == [200, 200]
    assert reply.status == 200, reply.body
    assert (reply.headers["x-lobes-proxied-by"], reply.headers["x-lobes-route-reason"]) == (
        second.url, "failover")


def test_a_peer_that_goes_dark_is_not_compatible_and_comes_back(pair):
    spark = pair["spark"]
    with start_sim("thor-cortex", time_scale=TIME_SCALE) as thor_sim:
        thor = start_gateway(peer_env(thor_sim))
        port = thor.port
        try:
            with start_gateway(pool_env(spark.url, [spark.url, thor.url])) as orin:
                all_selectable(orin)
                thor.stop()
                rows = wait_until(lambda: [r for r in [replicas(orin)] if not r[1]["ready"]],
                                  message="thor's replica to turn unready")[0]
                assert (rows[1]["ready"], rows[1]["compatible"], rows[1]["reason"]) == (
                    False, False, "peer gateway unreachable")
                cortex = orin.get_json("/capabilities")["roles"]["cortex"]
                assert cortex["ready"] is True and cortex["context"] == 262144
                answers = burst(orin.url, 2)
                assert {r.headers["x-lobes-proxied-by"] for r in answers} == {spark.url}
                thor = start_gateway(peer_env(thor_sim), port=port)
                all_selectable(orin)
                assert replicas(orin)[1]["reason"] == ""
        finally:
            thor.stop()


def test_a_placed_replica_that_fails_moves_the_request_to_the_next(pair):
    spark = pair["spark"]
    with start_sim("thor-cortex", time_scale=TIME_SCALE) as thor_sim, \
            start_gateway(peer_env(thor_sim)) as thor:
        # Thor looks faster, so it is placed first; a slow prober keeps it selectable.
        env = pool_env(spark.url, [spark.url, thor.url], PRIMARY_PEER_RATES="10,100",
                       GATEWAY_PROBE_INTERVAL_S="60")
        with start_gateway(env) as orin:
            all_selectable(orin)
            thor_sim.set_faults({"error_status": 503})
            reply = chat(orin.url, CORTEX)
            assert (reply.status, reply.headers["x-lobes-proxied-by"]) == (200, spark.url)
            thor.stop()
            reply = chat(orin.url, CORTEX)
            assert (reply.status, reply.headers["x-lobes-proxied-by"]) == (200, spark.url)


def test_every_replica_declining_is_a_404_naming_them(pair):
    with start_sim("spark-cortex", time_scale=TIME_SCALE) as sim:
        first, second = start_gateway(peer_env(sim)), start_gateway(peer_env(sim))
        try:
            env = pool_env(first.url, [first.url, second.url], GATEWAY_PROBE_INTERVAL_S="60")
            with start_gateway(env) as orin:
                all_selectable(orin)
                declined = {"PRIMARY_FEASIBLE": "false"}
                for index, peer in enumerate((first, second)):
                    peer.stop()
                    replacement = start_gateway(declined, port=peer.port)
                    first, second = (replacement, second) if index == 0 else (first, replacement)
                reply = chat(orin.url, CORTEX)
        finally:
            first.stop()
            second.stop()
    assert reply.status == 404
    error = reply.error
    assert error["type"] == "role_infeasible"
    assert f"{first.url} (404)" in error["message"] and f"{second.url} (404)" in error["message"]


def test_a_replica_busy_with_another_boxes_work_is_not_taken_for_idle(pair):
    spark, thor = pair["spark"], pair["thor"]
    env = pool_env(spark.url, [spark.url, thor.url], PRIMARY_PEER_RATES="11,11")
    with start_gateway(env) as orin, ThreadPoolExecutor(2) as elsewhere:
        all_selectable(orin)
        # Another box's two long requests straight to spark fill its two slots (ignore_eos:
        # a natural answer ends in 0.7 s).
        held = [elsewhere.submit(chat, spark.url,
                                 {**CORTEX, "max_tokens": 600, "ignore_eos": True},
                                 {"Authorization": f"Bearer {SPARK_KEY}"}) for _ in range(2)]
        wait_until(lambda: replicas(orin)[0].get("load") == 2,
                   message="spark's replica to show a load of 2")
        reply = chat(orin.url, CORTEX)
        assert all(h.result().status == 200 for h in held)
    assert (reply.status, reply.headers["x-lobes-proxied-by"]) == (200, thor.url)


def test_a_request_held_for_another_boxes_work_starts_when_it_is_forecast_done(pair):
    """Not at the next probe: the Orin held a burst back 1.4 s for the Spark's ended work."""
    spark, thor = pair["spark"], pair["thor"]
    # The rates the Orin starts with: the Spark's 20 tok/s prices another box's request at
    # 12.8 s (6.4 s left when seen); the Thor is slow enough that a request waits for the Spark.
    env = pool_env(spark.url, [spark.url, thor.url], PRIMARY_PEER_RATES="20,2",
                   GATEWAY_POOL_POLICY="rate", GATEWAY_PROBE_INTERVAL_S="60")
    before = len(posts(pair["spark_sim"]))
    with ThreadPoolExecutor(2) as elsewhere:
        # Another box's two requests straight to spark fill its two slots for about 5 s
        # (ignore_eos: a natural answer ends in 0.7 s, which a loaded CI host once took to
        # start the Orin, whose first probe then found the Spark idle).
        held = [elsewhere.submit(chat, spark.url,
                                 {**CORTEX, "max_tokens": 1200, "ignore_eos": True},
                                 {"Authorization": f"Bearer {SPARK_KEY}"}) for _ in range(2)]
        wait_until(lambda: len(posts(pair["spark_sim"])) == before + 2,
                   message="both of another box's requests on spark")
        with start_gateway(env) as orin:
            wait_until(lambda: [r.get("load") for r in replicas(orin)] == [2, 0],
                       message="the Orin's first probe to see the Spark's two requests")
            reply = chat(orin.url, CORTEX)
            probed = [r.get("load") for r in replicas(orin)]
        assert all(h.result().status == 200 for h in held)
    assert (reply.status, reply.headers["x-lobes-proxied-by"]) == (200, spark.url)
    assert probed == [2, 0]  # no probe since: the forecast released it


def pressured_peer(sim, root, swap_used_percent):
    """A peer gateway in front of `sim` whose box reads its pressure from `root`."""
    write_proc(root, swap_used_percent)
    return start_gateway({**peer_env(sim), "LOBES_PROC_ROOT": str(root),
                          "LOBES_PRESSURE_SAMPLE_S": "0.02"})


def test_a_replica_whose_box_sheds_the_tier_moves_the_request_on(pair, tmp_path):
    (tmp_path / "busy").mkdir()
    with pressured_peer(pair["spark_sim"], tmp_path / "busy", 95) as busy, \
            start_gateway(pool_env(busy.url, [busy.url, pair["thor"].url],
                                   GATEWAY_POOL_POLICY="pinned")) as orin:
        all_selectable(orin)
        wait_mode(busy, "busy")
        reply = chat(orin.url, CORTEX)
        attempts = Scrape.of(orin.url)
    assert (reply.status, reply.headers["x-lobes-proxied-by"]) == (200, pair["thor"].url)
    assert attempts.value("lobes_gateway_upstream_failovers_total", target=busy.url,
                          outcome="busy") == 1


def test_every_replica_busy_is_a_429_naming_them(pair, tmp_path):
    roots = [tmp_path / "spark", tmp_path / "thor"]
    for root in roots:
        root.mkdir()
    with pressured_peer(pair["spark_sim"], roots[0], 95) as first, \
            pressured_peer(pair["thor_sim"], roots[1], 95) as second, \
            start_gateway(pool_env(first.url, [first.url, second.url])) as orin:
        all_selectable(orin)
        wait_mode(first, "busy")
        wait_mode(second, "busy")
        reply = chat(orin.url, CORTEX)
    error = json.loads(reply.body)["error"]
    assert (reply.status, error["code"], reply.headers["retry-after"]) == (429, "busy", "5")
    assert f"{first.url} (429)" in error["message"] and f"{second.url} (429)" in error["message"]
