"""Owner forwarding (seed 003) across real processes: an entry gateway that does not host
cortex forwards it, under the fleet key, to the gateways that do, in routing order.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.ports import dead_origin
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

FLEET = "fleet-secret"
ENTRY = "http://entry.test:8000"
OWNER_KEY = "owner-inbound"
ENTRY_AUTH = {"Authorization": "Bearer entry-client-key"}
DECIDE = {"messages": [{"role": "user", "content": "decide"}], "max_tokens": 16}


def owner_env(sim, served="sim-instant", **extra):
    env = {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": served,
           "GATEWAY_FLEET_KEY": FLEET, "GATEWAY_API_KEY": OWNER_KEY}
    env.update(extra)
    return env


def entry_env(*owners, **extra):
    env = {"PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "owners",
           "PRIMARY_PEER_ORIGINS": ",".join(owners),
           "GATEWAY_FLEET_KEY": FLEET, "GATEWAY_API_KEY": "entry-client-key",
           "GATEWAY_SELF_ORIGIN": ENTRY}
    env.update(extra)
    return env


def posts(sim):
    return [r for r in sim.requests() if r["method"] == "POST"]


@pytest.fixture(scope="module")
def sims():
    with start_sim("instant") as first, start_sim("instant") as second:
        yield first, second


@pytest.fixture(autouse=True)
def clean_recorders(sims):
    for sim in sims:
        sim.clear_requests()
        sim.set_faults({})


def test_the_owner_answers_under_the_fleet_key_marked_with_this_box(sims):
    sim, _ = sims
    with start_gateway(owner_env(sim)) as owner, \
            start_gateway(entry_env(owner.url)) as entry:
        reply = chat(entry.url, DECIDE, ENTRY_AUTH)
    assert reply.status == 200 and reply.json()["model"] == "sim-instant"
    assert reply.headers["x-lobes-proxied-by"] == owner.url
    # The owner's gate (inbound key OWNER_KEY, which the entry lacks) let the fleet key in;
    # its gear sees no key at all.
    (received,) = posts(sim)
    assert "authorization" not in received["headers"]
    assert received["headers"]["x-lobes-forwarded-by"] == ENTRY


def test_a_request_without_a_model_is_forwarded_for_the_role_this_box_resolved(sims):
    # The bare simulator stands as the owner and records what arrives (it 404s the unknown
    # model "cortex": every owner declined). An owner the prober judges is no gateway is asked
    # last, so it is the only owner here.
    recorder, _sim = sims
    with start_gateway(entry_env(recorder.url)) as entry:
        reply = chat(entry.url, DECIDE, ENTRY_AUTH)
    assert (reply.status, reply.error["code"]) == (404, "role_infeasible")
    (arrived,) = posts(recorder)
    assert json.loads(arrived["body"])["model"] == "cortex"
    assert arrived["headers"]["authorization"] == f"Bearer {FLEET}"


def test_an_owners_own_4xx_answer_comes_back_as_it_is(sims):
    first_sim, second_sim = sims
    with start_gateway(owner_env(first_sim)) as first, \
            start_gateway(owner_env(second_sim)) as second, \
            start_gateway(entry_env(first.url, second.url)) as entry:
        reply = chat(entry.url, {**DECIDE, "max_tokens": 10**7}, ENTRY_AUTH)
    assert reply.status == 400
    assert reply.headers["x-lobes-proxied-by"] == first.url
    assert "max_tokens" in reply.body.decode() or "context" in reply.body.decode()
    assert posts(second_sim) == []


def test_a_dead_owner_then_a_503_owner_fail_over_to_the_healthy_one(sims):
    failing_sim, healthy_sim = sims
    failing_sim.set_faults({"error_status": 503})
    with start_gateway(owner_env(failing_sim)) as failing, \
            start_gateway(owner_env(healthy_sim)) as healthy, \
            start_gateway(entry_env(dead_origin(), failing.url, healthy.url)) as entry:
        reply = chat(entry.url, DECIDE, ENTRY_AUTH)
    assert (reply.status, reply.headers["x-lobes-proxied-by"]) == (200, healthy.url)
    (received,) = posts(healthy_sim)
    assert "authorization" not in received["headers"]
    assert received["headers"]["x-lobes-forwarded-by"] == ENTRY


def test_an_owner_without_the_role_404s_and_the_next_one_answers(sims):
    sim, _ = sims
    with start_gateway({"PRIMARY_FEASIBLE": "false", "GATEWAY_FLEET_KEY": FLEET}) as declining, \
            start_gateway(owner_env(sim)) as owner, \
            start_gateway(entry_env(declining.url, owner.url)) as entry:
        reply = chat(entry.url, DECIDE, ENTRY_AUTH)
    assert (reply.status, reply.headers["x-lobes-proxied-by"]) == (200, owner.url)


def test_a_forwarded_request_is_never_forwarded_again(sims):
    sim, _ = sims
    with start_gateway(owner_env(sim)) as far_owner, \
            start_gateway(entry_env(far_owner.url, GATEWAY_SELF_ORIGIN="http://middle.test:1")
                          ) as middle, \
            start_gateway(entry_env(middle.url)) as entry:
        reply = chat(entry.url, DECIDE, ENTRY_AUTH)
    assert reply.status == 404
    message = reply.error["message"]
    assert "every owner of cortex declined" in message and f"{middle.url} (404)" in message
    assert posts(sim) == []


def test_a_marked_arrival_is_answered_where_it_lands(sims):
    sim, _ = sims
    with start_gateway(owner_env(sim)) as owner, \
            start_gateway(entry_env(owner.url, PRIMARY_PEER_ORIGIN=owner.url)) as entry:
        reply = chat(entry.url, DECIDE, {**ENTRY_AUTH, "X-Lobes-Forwarded-By": "http://x:1"})
    assert reply.status == 404
    assert reply.error["type"] == "role_infeasible"
    assert owner.url in reply.error["message"]  # the referral names hosted_by
    assert "x-lobes-proxied-by" not in reply.headers
    assert posts(sim) == []


def test_a_box_declared_twice_is_asked_once(sims):
    sim, _ = sims
    sim.set_faults({"error_status": 503})
    with start_gateway(owner_env(sim)) as owner, \
            start_gateway(entry_env(owner.url, owner.url)) as entry:
        reply = chat(entry.url, DECIDE, ENTRY_AUTH)
    assert reply.status == 503 and reply.headers["retry-after"]
    error = reply.error
    assert error["type"] == "backend_unavailable"
    assert f"{owner.url} (503)" in error["message"]
    assert len(posts(sim)) == 1


def test_no_owner_reachable_is_a_retryable_503_naming_them():
    dead = dead_origin()
    with start_gateway(entry_env(dead)) as entry:
        reply = chat(entry.url, DECIDE, ENTRY_AUTH)
    assert reply.status == 503 and reply.headers["retry-after"]
    assert f"{dead} (unreachable)" in reply.error["message"]


def test_only_the_fleet_key_is_exempt_from_the_owners_in_flight_limit():
    limited = {"GATEWAY_MAX_INFLIGHT_PER_KEY": "1"}
    with start_sim("spark-cortex", time_scale=5) as slow, \
            start_gateway(owner_env(slow, "unsloth/Qwen3.8-27B-NVFP4", **limited)) as owner:

        def three(key, headers=None):
            auth = {"Authorization": f"Bearer {key}", **(headers or {})}
            with ThreadPoolExecutor(3) as pool:
                return sorted(reply.status for reply in pool.map(
                    lambda _: chat(owner.url, {**DECIDE, "max_tokens": 160}, auth), range(3)))

        assert three(FLEET) == [200, 200, 200]
        claimed = three(OWNER_KEY, {"X-Lobes-Forwarded-By": ENTRY})
        assert claimed.count(429) == 2 and claimed.count(200) == 1


def test_an_owner_routed_role_is_advertised_while_an_owner_serves_it(sims):
    sim, _ = sims
    owner = start_gateway(owner_env(sim))
    dead = dead_origin()
    try:
        with start_gateway(entry_env(dead, owner.url, GATEWAY_PROBE_INTERVAL_S="0.1")) as entry:

            def cortex():
                return entry.get_json("/capabilities")["roles"]["cortex"]

            def models():
                return [m["id"] for m in entry.get_json("/v1/models", ENTRY_AUTH)["data"]]

            wait_until(lambda: cortex()["ready"], message="cortex advertised ready")
            assert [(o["origin"], o["ready"]) for o in cortex()["owners"]] == [
                (dead, False), (owner.url, True)]
            assert "cortex" in models()
            owner.stop()
            wait_until(lambda: not cortex()["ready"], message="cortex no longer ready")
            assert "cortex" not in models()
    finally:
        owner.stop()
