"""A peer that went down since the last probe: the first request that finds it so takes it out
of placement and off /capabilities' ready at once, not one probe interval later.

A pool over two peer gateways, probed once at start and then only every minute: whatever the
pool says of a replica after a request is what that request found.
"""

from __future__ import annotations

import pytest

from tests.mesh.test_pool_mesh import CORTEX, SERVED, pool_env, replicas
from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import Scrape
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

# Long enough that no probe pass comes during the test.
SLOW_PROBES = {"GATEWAY_PROBE_INTERVAL_S": "60"}


def peer_env(sim) -> dict[str, str]:
    return {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
            "PRIMARY_MAX_MODEL_LEN": "262144"}


def row(gateway, origin: str) -> dict:
    return next(r for r in replicas(gateway) if r["origin"] == origin)


def attempts(gateway, origin: str) -> float:
    return Scrape.of(gateway.url).value("lobes_gateway_upstream_attempts_total", target=origin)


# What went down, and what the request that found it says: the peer's gateway (it restarts),
# or only its gear (the gateway is back and its gear still loading: the peer answers 503).
DOWN = {"gateway": "a request found it unreachable", "gear": "a request found it answering 503"}


@pytest.mark.parametrize("what", list(DOWN))
def test_a_replica_a_request_found_down_is_not_ready_until_probed_again(what: str):
    with start_sim("spark-cortex", time_scale=5) as spark_sim, \
            start_sim("thor-cortex", time_scale=5) as thor_sim, \
            start_gateway(peer_env(thor_sim)) as thor, \
            start_gateway(peer_env(spark_sim)) as spark:
        origins = [spark.url, thor.url]
        env = pool_env(spark.url, origins, PRIMARY_PEER_RATES="48.9,11", **SLOW_PROBES)
        with start_gateway(env) as orin:
            wait_until(lambda: all(r["ready"] for r in replicas(orin)) and len(replicas(orin)) == 2,
                       message="both replicas ready after the first probe")
            (spark if what == "gateway" else spark_sim).stop()
            # No request has found it down yet: the pool still holds the probe's verdict.
            assert row(orin, spark.url)["ready"] is True
            first = chat(orin.url, CORTEX)
            assert first.status == 200 and first.headers["x-lobes-proxied-by"] == thor.url
            down = row(orin, spark.url)
            assert (down["ready"], down["reason"]) == (False, DOWN[what])
            tried = attempts(orin, spark.url)
            assert tried == 1
            second = chat(orin.url, CORTEX)
            assert second.status == 200 and second.headers["x-lobes-proxied-by"] == thor.url
            # Placed on thor at once: the faster replica that is down was not tried again.
            assert attempts(orin, spark.url) == tried
            assert orin.get_json("/capabilities")["roles"]["cortex"]["ready"] is True
