"""/metrics of a pooling gateway across real processes: pooled requests counted by route reason
and replica, exactly as their answers' headers say, and each replica's state and rate."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.mesh.test_pool_mesh import CORTEX, SERVED, all_selectable, peer_env, pool_env
from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import Scrape
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

RATES = (48.9, 11.0)


@pytest.fixture(scope="module")
def pool():
    with start_sim("instant", served_name=SERVED) as fast_sim, \
            start_sim("instant", served_name=SERVED) as slow_sim, \
            start_gateway(peer_env(fast_sim)) as fast, start_gateway(peer_env(slow_sim)) as slow:
        origins = [fast.url, slow.url]
        # Probe passes far apart: what /capabilities shows of a pool must not wait for one.
        env = pool_env(fast.url, origins, PRIMARY_PEER_API_KEY="",
                       PRIMARY_PEER_RATES=",".join(map(str, RATES)),
                       GATEWAY_PROBE_INTERVAL_S="60")
        with start_gateway(env) as pooling:
            all_selectable(pooling)
            yield pooling, origins


def test_pooled_requests_are_counted_by_reason_and_replica(pool):
    gateway, origins = pool
    before = Scrape.of(gateway.url)
    replies = [chat(gateway.url, CORTEX) for _ in range(6)]
    after = Scrape.of(gateway.url)
    assert [r.status for r in replies] == [200] * 6

    def grew(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    reasons = Counter(r.headers["x-lobes-route-reason"] for r in replies)
    for reason, count in reasons.items():
        assert grew("lobes_gateway_requests_total", role="cortex", lane="chat",
                    route_reason=reason, code="200") == count
    served = Counter(r.headers["x-lobes-proxied-by"] for r in replies)
    tokens = Counter()
    for reply in replies:
        tokens[reply.headers["x-lobes-proxied-by"]] += reply.json()["usage"]["completion_tokens"]
    for origin in origins:
        assert grew("lobes_gateway_upstream_attempts_total", target=origin,
                    outcome="answered") == served[origin]
        assert grew("lobes_gateway_completion_tokens_total", role="cortex",
                    replica=origin) == tokens[origin]
        replica = {"role": "cortex", "replica": origin}
        assert after.value("lobes_gateway_pool_replica_ready", **replica) == 1
        assert after.value("lobes_gateway_pool_replica_compatible", **replica) == 1
        assert after.value("lobes_gateway_pool_replica_in_flight", **replica) == 0


def test_each_replica_rate_is_the_one_placement_uses_from_the_answer_that_taught_it(pool):
    """/capabilities shows the rate placement uses now, as /metrics does: learned from the
    answer just served, not as of the last probe pass (a minute apart here)."""
    gateway, origins = pool
    served = Scrape.of(gateway.url).value("lobes_gateway_requests_total", role="cortex")
    chat(gateway.url, CORTEX)  # at least one replica learns a rate besides its prior
    wait_until(lambda: Scrape.of(gateway.url).value("lobes_gateway_requests_total",
                                                    role="cortex") > served,
               message="the gateway counting the chat")
    scrape = Scrape.of(gateway.url)
    exported = {origin: round(scrape.value(
        "lobes_gateway_pool_replica_service_rate_tokens_per_second", role="cortex",
        replica=origin), 2) for origin in origins}
    published = {row["origin"]: row["rate"]
                 for row in gateway.get_json("/capabilities")["roles"]["cortex"]["replicas"]}
    assert published == exported
    assert set(exported.values()) != set(RATES)


def test_a_conversations_second_turn_binds_its_session_to_the_replica_that_served_it(pool):
    """Placement's sessions are published where an operator looks: /metrics and
    /capabilities count one session, on the replica its second turn went to."""
    gateway, origins = pool
    messages = [{"role": "system", "content": "You are the fleet's agent. " * 40},
                {"role": "user", "content": "Which replica serves this session, and why? " * 3}]
    first = chat(gateway.url, {**CORTEX, "messages": messages, "max_tokens": 8})
    assert first.status == 200
    messages += [{"role": "assistant",
                  "content": first.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And the next call's tool output. " * 3}]
    second = chat(gateway.url, {**CORTEX, "messages": messages, "max_tokens": 8})
    assert second.status == 200
    bound_to = second.headers["x-lobes-proxied-by"]
    scrape = Scrape.of(gateway.url)
    exported = {origin: scrape.value("lobes_gateway_pool_replica_sessions", role="cortex",
                                     replica=origin) for origin in origins}
    published = {row["origin"]: row["sessions"]
                 for row in gateway.get_json("/capabilities")["roles"]["cortex"]["replicas"]}
    expected = {origin: int(origin == bound_to) for origin in origins}
    assert exported == published == expected
