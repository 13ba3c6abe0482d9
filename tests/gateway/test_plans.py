"""A plan of attempts ends where it stands when it is sent None (dispatch.end_plan), for every
kind of route: its answered attempt is the last one, nothing further is tried or placed.

The dispatcher ends each request's plan so, not with plan.close(), whose GeneratorExit cost a
traceback per request. A plan that went on after being ended would place (and leak) another
replica or try another peer; end_plan refuses it loudly."""

from __future__ import annotations

import asyncio

import pytest
from lobes_gateway.app.dispatch import Answer, Attempt, Failure, end_plan
from lobes_gateway.app.gateway import Gateway
from lobes_gateway.mesh.replicas import Fingerprint, ProbeResult
from lobes_gateway.policy.config import load_config
from lobes_gateway.transport.http import parse_head

GEAR, FALLBACK = "http://127.0.0.1:9", "http://127.0.0.1:10"
PEER_A, PEER_B = "http://127.0.0.1:11", "http://127.0.0.1:12"
SELF = "http://127.0.0.1:8000"

ROUTES = {
    "local, with a fallback": {"PRIMARY_BASE_URL": GEAR, "FALLBACK_URL": FALLBACK},
    "proxy": {"PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "proxy",
              "PRIMARY_PEER_ORIGIN": PEER_A},
    "pool": {"PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "pool",
             "PRIMARY_PEER_ORIGINS": f"{PEER_A},{PEER_B}"},
    "pool hosting a replica": {"PRIMARY_BASE_URL": GEAR, "PRIMARY_ROUTE": "pool",
                               "GATEWAY_SELF_ORIGIN": SELF,
                               "PRIMARY_PEER_ORIGINS": f"{SELF},{PEER_A}"},
    "owners": {"PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "owners",
               "GATEWAY_FLEET_KEY": "fleet-key", "PRIMARY_PEER_ORIGINS": f"{PEER_A},{PEER_B}"},
}

BODY = b'{"model": "main", "messages": [{"role": "user", "content": "hi"}]}'


def first_attempt(env: dict[str, str]):
    """A gateway for `env`, and the plan of a chat request with its first attempt taken."""
    gateway = Gateway(load_config(env))
    pool = gateway.peers.pooled.get("cortex")
    if pool is not None:  # every replica probed ready, as the prober would find them
        ready = ProbeResult(ready=True, fingerprint=Fingerprint("cortex-served", 8192), slots=2)
        pool.replicas.apply_pass({spec.origin: ready for spec in pool.replicas.specs}, 0.0)
    req = parse_head(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(BODY))
    req.body = BODY
    payload = {"model": "main", "messages": [{"role": "user", "content": "hi"}]}
    route = gateway.router.resolve("chat", "main").route
    plan = gateway.dispatcher.plan(req, route, None, payload, [], None)
    step = next(plan)
    assert isinstance(step, Attempt), step
    return gateway, plan, step


def placed(gateway: Gateway) -> dict[str, int]:
    """Requests counted on each replica of the cortex pool."""
    role = gateway.peers.pooled["cortex"]
    return {spec.origin: role.placer.in_flight(spec.origin) for spec in role.replicas.specs}


@pytest.mark.parametrize("kind", ROUTES)
def test_a_plan_sent_none_ends_after_its_answered_attempt(kind):
    async def scenario():
        gateway, plan, attempt = first_attempt(ROUTES[kind])
        pooled = "cortex" in gateway.peers.pooled
        before = placed(gateway) if pooled else None
        end_plan(plan)
        assert plan.gi_frame is None  # finished, not suspended
        if pooled:
            # The answered attempt's placement is the only one; the relay releases it.
            assert placed(gateway) == before and sum(before.values()) == 1
            attempt.placement.release()
            assert sum(placed(gateway).values()) == 0
        await gateway.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ROUTES)
def test_a_failed_attempt_still_moves_the_plan_on(kind):
    """The end is None alone: a failure sent back goes on to the next attempt or the answer."""
    async def scenario():
        gateway, plan, attempt = first_attempt(ROUTES[kind])
        step = plan.send(Failure(attempt.name, None))
        assert isinstance(step, (Attempt, Answer))
        if isinstance(step, Attempt):
            assert (step.origin, step.name) != (attempt.origin, attempt.name)
        end_plan(plan)
        assert plan.gi_frame is None
        await gateway.close()
    asyncio.run(scenario())


def test_a_plan_that_goes_on_after_its_end_is_refused():
    def careless():
        yield "first"
        yield "second"  # ignores the None that ends it

    plan = careless()
    next(plan)
    with pytest.raises(RuntimeError, match="went on after it was ended: 'second'"):
        end_plan(plan)
    assert plan.gi_frame is None  # closed all the same
