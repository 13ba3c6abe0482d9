"""Admission on a pool, with real processes: a pooling gateway with named keys in front of two
peer gateways, each fronting a one-slot simulated spark-cortex gear.

Both slots are first taken by holders: a short one on one replica, a long one on the other,
and a "next" request waits in the short holder's replica's own queue (a replica is sent one
request beyond its slots, so a freed slot starts the next at once). Requests then queued at the
pooling gateway are released one at a time as that replica frees (placement prices the other
as busy for much longer), so the order they reach that simulator is the order the pool's queue
released them. Each is queued once /status
shows the one before it waiting, so the queue's order is the test's, not the threads'.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.admission import assert_two_agents_and_one_person_queued, leave_while_queued
from tests.support.client import Reply, chat
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import Scrape
from tests.support.senders import Sender
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
KEYS = {"person": "k-person", "agents": "k-agents", "evals": "k-evals"}
CLIENT_KEYS = "person=k-person:interactive,agents=k-agents:batch,evals=k-evals:batch"
ROLE = "cortex"
TIME_SCALE = 10
# spark-cortex at time scale 10 decodes ~489 tok/s: the short holder runs ~2 s, the long ~6 s.
SHORT_HOLD, LONG_HOLD = 1000, 3000


def peer_env(sim) -> dict[str, str]:
    return {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
            "PRIMARY_MAX_MODEL_LEN": "262144", "PRIMARY_MAX_ACTIVE": "1"}


def pool_env(first, second) -> dict[str, str]:
    rate = f"{48.9 * TIME_SCALE:g}"  # the replicas' declared priors, in wall time
    return {"PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "pool",
            "PRIMARY_PEER_ORIGINS": f"{first.url},{second.url}",
            "PRIMARY_PEER_API_KEYS": ",", "PRIMARY_PEER_RATES": f"{rate},{rate}",
            "PRIMARY_MAX_ACTIVE": "1", "GATEWAY_PROBE_INTERVAL_S": "0.1",
            "GATEWAY_CLIENT_KEYS": CLIENT_KEYS, "GATEWAY_API_KEY": "box-key",
            "GATEWAY_POOL_POLICY": "prefix"}


@pytest.fixture(scope="module")
def pool():
    one_slot = ["--max-num-seqs", "1"]
    with start_sim("spark-cortex", time_scale=TIME_SCALE, extra_args=one_slot) as first_sim, \
            start_sim("spark-cortex", time_scale=TIME_SCALE, extra_args=one_slot) as second_sim, \
            start_gateway(peer_env(first_sim)) as first, \
            start_gateway(peer_env(second_sim)) as second, \
            start_gateway(pool_env(first, second)) as pooler:
        wait_until(lambda: all(row["ready"] for row in replicas(pooler)) and
                   len(replicas(pooler)) == 2, message="both replicas ready")
        yield pooler, first_sim, second_sim


@pytest.fixture
def held(pool):
    """The pool with both slots taken by holders; yields the pooler, the simulator of the
    short holder (where queued requests go) and the sender holding them."""
    pooler, first_sim, second_sim = pool
    wait_until(lambda: admission(pooler)["running"] == 0 and not queued(pooler), timeout=30,
               interval=0.05, message="the previous test's requests to end")
    first_sim.clear_requests()
    second_sim.clear_requests()
    sender = Sender(pooler.url, ask)
    # The long holder first, wherever placement puts it (learned rates, prefix affinity);
    # the short one then goes to the idle replica, where the queued requests will follow it.
    sender.send("hold-long", "agents", LONG_HOLD)
    long_sim = wait_until(lambda: next((sim for sim in (first_sim, second_sim)
                                        if reached(sim) == ["hold-long"]), None),
                          timeout=10, interval=0.02, message="the long holder to start")
    short_sim = second_sim if long_sim is first_sim else first_sim
    sender.send("hold-short", "agents", SHORT_HOLD)
    wait_until(lambda: reached(short_sim) == ["hold-short"], timeout=10, interval=0.02,
               message="the short holder to start on the other replica")
    sender.send("next", "agents")
    wait_until(lambda: reached(short_sim) == ["hold-short", "next"], timeout=10, interval=0.02,
               message="the next request to wait in that replica's own queue")
    yield pooler, short_sim, sender
    sender.join()


def replicas(gateway) -> list[dict]:
    return gateway.get_json("/capabilities")["roles"][ROLE].get("replicas", [])


def admission(gateway) -> dict:
    return gateway.get_json("/status")["admission"][ROLE]


def queued(gateway) -> int:
    return sum(admission(gateway)["queued"].values())


def ask(url: str, marker: str, name: str, tokens: int = 8, **headers: str) -> Reply:
    payload = {"model": ROLE, "max_tokens": tokens, "ignore_eos": True,
               "messages": [{"role": "user", "content": marker}]}
    return chat(url, payload, {"Authorization": f"Bearer {KEYS[name]}", **headers}, timeout=60)


def reached(sim) -> list[str]:
    """The markers of the chat requests the simulator received, in order."""
    return [json.loads(r["body"])["messages"][0]["content"] for r in sim.requests()
            if r["method"] == "POST"]


def queue_in_order(pooler, sender: Sender, requests: list[tuple[str, str]]) -> None:
    """Queue (marker, key) requests in order, each once the queue shows it waiting."""
    for count, (marker, name) in enumerate(requests, start=1):
        sender.send(marker, name)
        wait_until(lambda n=count: queued(pooler) == n, timeout=10, interval=0.02,
                   message=f"{marker} to wait in the pool's queue")


def test_a_pooled_interactive_request_goes_before_a_queued_batch_flood(held):
    pooler, first_sim, sender = held
    flood = [(f"agents-{n}", "agents") for n in range(3)]
    queue_in_order(pooler, sender, [*flood, ("person", "person")])
    replies = sender.join()
    assert all(reply.status == 200 for reply in replies.values())
    assert reached(first_sim) == ["hold-short", "next", "person", "agents-0", "agents-1",
                                  "agents-2"]


def test_keys_share_a_class_fairly_on_a_pool(held):
    pooler, first_sim, sender = held
    flood = [(f"agents-{n}", "agents") for n in range(4)]
    evals = [(f"evals-{n}", "evals") for n in range(2)]
    queue_in_order(pooler, sender, [*flood, *evals])
    sender.join()
    assert reached(first_sim) == ["hold-short", "next", "agents-0", "evals-0", "agents-1",
                                  "evals-1", "agents-2", "agents-3"]


def test_a_client_that_leaves_while_held_on_a_pool_never_reaches_a_replica(held):
    pooler, first_sim, sender = held
    before = Scrape.of(pooler.url).value("lobes_gateway_admission_total", role=ROLE,
                                         outcome="client_gone")
    leave_while_queued(pooler.port, ROLE, KEYS["evals"],
                       lambda: admission(pooler)["queued_by_client"])
    sender.join()
    after = Scrape.of(pooler.url).value("lobes_gateway_admission_total", role=ROLE,
                                        outcome="client_gone")
    assert after == before + 1
    assert "gone" not in reached(first_sim)


def test_a_deadline_the_pool_cannot_meet_is_refused_at_once(held):
    # The replicas' rates (declared by P_PEER_RATES, then learned) price the holders'
    # remaining work and the placement the request would get behind them.
    pooler, first_sim, _sender = held
    started = time.monotonic()
    refused = ask(pooler.url, "hurried", "person", **{"X-Lobes-Deadline-S": "0.05"})
    waited = time.monotonic() - started
    patient = ask(pooler.url, "patient", "person", **{"X-Lobes-Deadline-S": "60"})
    assert refused.status == 429
    assert refused.error["code"] == "deadline_unmeetable"
    assert int(refused.headers["retry-after"]) >= 1
    assert waited < 1.0  # refused on arrival, not after waiting for the short holder (~2 s)
    assert patient.status == 200
    assert reached(first_sim) == ["hold-short", "next", "patient"]
    scrape = Scrape.of(pooler.url)
    assert scrape.value("lobes_gateway_admission_total", role=ROLE,
                        outcome="deadline_unmeetable", **{"class": "interactive"}) >= 1


def test_the_pools_queue_shows_on_status_and_metrics(held):
    pooler, _first_sim, sender = held
    queue_in_order(pooler, sender, [("a", "agents"), ("b", "agents"), ("p", "person")])
    status = admission(pooler)
    scrape = Scrape.of(pooler.url)
    sender.join()
    assert status["slots"] == 2 and status["running"] == 3
    assert_two_agents_and_one_person_queued(status, scrape, ROLE)
    assert scrape.value("lobes_gateway_admission_running", role=ROLE) == 3


def test_a_burst_held_at_the_pool_spreads_as_rate_placement_spreads_it():
    """Seed 000's pair: held requests count as load where placement would send them, so the
    slow replica takes its share at once instead of idling while all wait for the fast one,
    and neither replica is sent more than its slots (the rate policy sends none to wait in a
    replica's own queue)."""
    rates = f"{48.9 * TIME_SCALE:g},{11.0 * TIME_SCALE:g}"
    with start_sim("spark-cortex", time_scale=TIME_SCALE) as spark_sim, \
            start_sim("thor-cortex", time_scale=TIME_SCALE) as thor_sim, \
            start_gateway({**peer_env(spark_sim), "PRIMARY_MAX_ACTIVE": "2"}) as spark, \
            start_gateway({**peer_env(thor_sim), "PRIMARY_MAX_ACTIVE": "2"}) as thor, \
            start_gateway({**pool_env(spark, thor), "PRIMARY_PEER_RATES": rates,
                           "PRIMARY_MAX_ACTIVE": "2", "GATEWAY_POOL_POLICY": "rate"}) as pooler:
        wait_until(lambda: all(row["ready"] for row in replicas(pooler)) and
                   len(replicas(pooler)) == 2, message="both replicas ready")
        peak = {"queued": 0, "spark": 0, "thor": 0}
        sender = Sender(pooler.url, ask)
        for n in range(16):
            sender.send(f"burst-{n}", "agents", 160)
        while any(thread.is_alive() for thread in sender.threads):
            peak["queued"] = max(peak["queued"], queued(pooler))
            for name, peer in (("spark", spark), ("thor", thor)):
                peak[name] = max(peak[name], admission(peer)["running"])
        replies = sender.join()
    assert all(reply.status == 200 for reply in replies.values())
    served = [reply.headers["x-lobes-proxied-by"] for reply in replies.values()]
    assert 1 <= served.count(thor.url) <= 3  # seed 000's burst 16: 14 on the Spark, 2 here
    assert peak["queued"] >= 6  # the Spark's later waves waited at the pooling gateway
    assert peak["spark"] <= 2 and peak["thor"] <= 2
