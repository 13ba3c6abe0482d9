"""A replica's gateway stopped in the middle of a burst, then started again: every request ends
in a 2xx or a documented error (none hangs or is reset), nothing not yet started on the dead
replica is lost, and the replica rejoins the pool once it answers its probes again."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from tests.support.client import Reply, chat
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
CORTEX = {"model": "cortex", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
BURST = 32


def peer_env(sim) -> dict[str, str]:
    return {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
            "PRIMARY_MAX_MODEL_LEN": "262144", "PRIMARY_MAX_ACTIVE": "2"}


def pool_env(origins: list[str]) -> dict[str, str]:
    return {"PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "pool",
            "PRIMARY_PEER_ORIGINS": ",".join(origins), "GATEWAY_POOL_POLICY": "queue",
            "GATEWAY_PROBE_INTERVAL_S": "0.1", "GATEWAY_PROBE_TIMEOUT_S": "0.5"}


def outcome(reply: Reply | None) -> str:
    """2xx, documented (an OpenAI-shaped 502/503, a 503 with Retry-After), or lost."""
    if reply is None:
        return "lost"
    if 200 <= reply.status < 300:
        return "2xx"
    error = json.loads(reply.body).get("error", {}) if reply.body else {}
    documented = reply.status in (502, 503) and {"type", "code", "message"} <= set(error)
    if reply.status == 503:
        documented = documented and "retry-after" in reply.headers
    return "documented" if documented else "lost"


def send(url: str) -> Reply | None:
    try:
        return chat(url, CORTEX, timeout=20)
    except (OSError, http.client.HTTPException):  # reset, refused, garbled or timed out
        return None


def ready_origins(gateway) -> set[str]:
    rows = gateway.get_json("/capabilities")["roles"]["cortex"].get("replicas", [])
    return {row["origin"] for row in rows if row["ready"] and row["compatible"]}


def test_a_replica_stopped_mid_burst_loses_nothing_and_rejoins_when_back():
    with start_sim("spark-cortex", time_scale=20) as spark_sim, \
            start_sim("spark-cortex", time_scale=20) as thor_sim, \
            start_gateway(peer_env(spark_sim)) as spark:
        thor = start_gateway(peer_env(thor_sim))
        thor_port = thor.port
        with thor, start_gateway(pool_env([spark.url, thor.url])) as orin:
            wait_until(lambda: ready_origins(orin) == {spark.url, thor.url},
                       message="both replicas ready")
            served_by_thor = threading.Event()

            def watched(_index: int) -> Reply | None:
                reply = send(orin.url)
                if reply is not None and reply.headers.get("x-lobes-proxied-by") == thor.url:
                    served_by_thor.set()
                return reply

            with ThreadPoolExecutor(8) as pool:
                replies = [pool.submit(watched, i) for i in range(BURST)]
                served_by_thor.wait(20)  # thor is in the middle of the burst: stop it now
                thor.stop()
                results = [future.result() for future in replies]
            counts = Counter(outcome(reply) for reply in results)
            assert counts["lost"] == 0, [r and (r.status, r.body[:120]) for r in results]
            assert counts["2xx"] + counts["documented"] == BURST
            # Requests placed after the stop found thor gone and went to spark.
            wait_until(lambda: ready_origins(orin) == {spark.url},
                       message="thor judged not ready after it stopped")
            after = [send(orin.url) for _request in range(4)]
            assert [r.headers["x-lobes-proxied-by"] for r in after] == [spark.url] * 4

            with start_gateway(peer_env(thor_sim), port=thor_port):
                wait_until(lambda: ready_origins(orin) == {spark.url, thor.url},
                           message="thor back in the pool once it answers its probes")
                with ThreadPoolExecutor(8) as pool:
                    back = list(pool.map(lambda _i: send(orin.url), range(8)))
                assert {outcome(reply) for reply in back} == {"2xx"}
                assert thor.url in {r.headers["x-lobes-proxied-by"] for r in back}


def test_a_hanging_replica_loses_nothing_and_leaves_then_rejoins_the_pool():
    """thor's gear accepts and never answers: requests placed there time out before a head
    and move on to spark; the prober then judges thor not ready, and ready again once the
    fault clears."""
    with start_sim("spark-cortex", time_scale=20) as spark_sim, \
            start_sim("spark-cortex", time_scale=20) as thor_sim, \
            start_gateway(peer_env(spark_sim)) as spark, \
            start_gateway({**peer_env(thor_sim), "GATEWAY_PROBE_TIMEOUT_S": "0.3"}) as thor, \
            start_gateway({**pool_env([spark.url, thor.url]),
                           "GATEWAY_UPSTREAM_TIMEOUT_S": "1"}) as orin:
        wait_until(lambda: ready_origins(orin) == {spark.url, thor.url},
                   message="both replicas ready")
        thor_sim.set_faults({"hang": True})
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _i: send(orin.url), range(16)))
        counts = Counter(outcome(reply) for reply in results)
        assert counts == {"2xx": 16}, [r.body for r in results if r and r.status != 200]
        assert {r.headers["x-lobes-proxied-by"] for r in results} == {spark.url}
        wait_until(lambda: ready_origins(orin) == {spark.url},
                   message="thor judged not ready while its gear hangs")
        thor_sim.set_faults({})
        wait_until(lambda: ready_origins(orin) == {spark.url, thor.url},
                   message="thor ready again once its gear answers")


def test_a_refusing_replica_under_a_burst_loses_nothing_and_rejoins_once_it_answers():
    """thor's gear stops listening (connection refused) while a burst arrives: thor's gateway
    answers a documented error at once, the pool moves each request on to spark, and thor is
    judged not ready; it rejoins once its gear listens again."""
    with start_sim("spark-cortex", time_scale=20) as spark_sim, \
            start_sim("spark-cortex", time_scale=20) as thor_sim, \
            start_gateway(peer_env(spark_sim)) as spark, \
            start_gateway({**peer_env(thor_sim), "GATEWAY_PROBE_INTERVAL_S": "0.1"}) as thor, \
            start_gateway(pool_env([spark.url, thor.url])) as orin:
        wait_until(lambda: ready_origins(orin) == {spark.url, thor.url},
                   message="both replicas ready")
        thor_sim.set_faults({"refuse": True})
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _i: send(orin.url), range(BURST)))
        counts = Counter(outcome(reply) for reply in results)
        assert counts == {"2xx": BURST}, [r and (r.status, r.body[:120]) for r in results]
        assert {r.headers["x-lobes-proxied-by"] for r in results} == {spark.url}
        wait_until(lambda: ready_origins(orin) == {spark.url},
                   message="thor judged not ready while its gear refuses")
        thor_sim.set_faults({})
        wait_until(lambda: ready_origins(orin) == {spark.url, thor.url},
                   message="thor ready again once its gear listens")
        with ThreadPoolExecutor(8) as pool:
            back = list(pool.map(lambda _i: send(orin.url), range(8)))
        assert Counter(outcome(reply) for reply in back) == {"2xx": 8}
        assert thor.url in {r.headers["x-lobes-proxied-by"] for r in back}


def served_by(replies: list[Reply | None]) -> Counter:
    return Counter(reply.headers.get("x-lobes-proxied-by") for reply in replies if reply)


def learned_rates(gateway) -> dict[str, float]:
    rows = gateway.get_json("/capabilities")["roles"]["cortex"]["replicas"]
    return {row["origin"]: row["rate"] for row in rows if "rate" in row}


def test_a_replica_going_4x_slower_keeps_every_request_and_gets_less_of_the_load():
    """Two equal replicas under rate placement; thor's gear becomes 4x slower. Every request
    is still answered, placement learns thor's lower rate from what it sent there, and thor's
    share of the following waves drops below spark's."""
    with start_sim("spark-cortex", time_scale=20) as spark_sim, \
            start_sim("spark-cortex", time_scale=20) as thor_sim, \
            start_gateway(peer_env(spark_sim)) as spark, \
            start_gateway(peer_env(thor_sim)) as thor, \
            start_gateway({**pool_env([spark.url, thor.url]), "GATEWAY_POOL_POLICY": "rate",
                           "PRIMARY_PEER_RATES": "48.9,48.9"}) as orin:
        wait_until(lambda: ready_origins(orin) == {spark.url, thor.url},
                   message="both replicas ready")
        thor_sim.set_faults({"slow_factor": 4.0})
        replies = []
        for _wave in range(4):
            with ThreadPoolExecutor(6) as pool:
                replies.extend(pool.map(lambda _i: send(orin.url), range(6)))
        assert Counter(outcome(reply) for reply in replies) == {"2xx": len(replies)}
        rates = learned_rates(orin)
        assert rates[thor.url] < rates[spark.url] / 2, rates
        later = served_by(replies[12:])
        assert later[thor.url] < later[spark.url], later
