"""A request's class travels to a gear that runs vLLM's priority scheduling (P_PRIORITY_SCHEDULING)
as its `priority`: interactive -1, batch 1, standard not sent (vLLM's default 0); never to a gear
without it, which (as vLLM under fcfs) would refuse a non-zero priority."""

from __future__ import annotations

import json

import pytest

from tests.support.client import chat, wired
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

BOX_KEY = "box-key"
CLIENT_KEYS = "person=k-person:interactive,agents=k-agents:batch"
KEYS = {"box": BOX_KEY, "person": "k-person", "agents": "k-agents"}
SERVED = "unsloth/Qwen3.8-27B-NVFP4"


def _sent_priorities(sim, markers: list[str]) -> dict[str, object]:
    """marker -> the `priority` field of the request the gear received (None: absent)."""
    sent = {}
    for request in sim.requests():
        if request["method"] != "POST":
            continue
        body = json.loads(request["body"])
        sent[body["messages"][0]["content"]] = body.get("priority")
    return {marker: sent[marker] for marker in markers}


def _ask(url: str, marker: str, key: str, **headers: str):
    payload = {"model": "main", "max_tokens": 4,
               "messages": [{"role": "user", "content": marker}]}
    return chat(url, payload, {"Authorization": f"Bearer {KEYS[key]}", **headers})


@pytest.mark.parametrize("scheduled", [True, False], ids=["priority-gear", "fcfs-gear"])
def test_a_class_travels_as_priority_only_to_a_gear_that_schedules_by_it(scheduled: bool):
    policy = ["--scheduling-policy", "priority"] if scheduled else []
    env = {"GATEWAY_API_KEY": BOX_KEY, "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
           "PRIMARY_PRIORITY_SCHEDULING": "true" if scheduled else "false"}
    with start_sim("instant", served_name=SERVED, extra_args=policy) as sim, \
            start_gateway({**wired(sim, served=SERVED), **env}) as gateway:
        lowered = {"X-Lobes-Priority": "batch"}
        replies = {"interactive": _ask(gateway.url, "interactive", "person"),
                   "standard": _ask(gateway.url, "standard", "box"),
                   "batch": _ask(gateway.url, "batch", "agents"),
                   "lowered": _ask(gateway.url, "lowered", "person", **lowered)}
        statuses = {marker: reply.status for marker, reply in replies.items()}
        assert statuses == dict.fromkeys(replies, 200)
        sent = _sent_priorities(sim, list(replies))
    if scheduled:
        assert sent == {"interactive": -1, "standard": None, "batch": 1, "lowered": 1}
    else:
        assert sent == dict.fromkeys(replies)


def test_a_peer_is_told_the_class_the_request_runs_in():
    """Proxied (the same holds for pool replicas and owners), the request carries its class
    here as X-Lobes-Priority, replacing what the caller sent: a batch key asking for
    interactive is still batch at the peer; standard sends nothing."""
    # A proxied request names the role, which a peer gateway resolves: the stand-in serves it
    # (and answers for it: no served name is declared here for its answers to be held to).
    with start_sim("instant", served_name="cortex") as peer:
        env = {"GATEWAY_API_KEY": BOX_KEY, "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
               "PRIMARY_ROUTE": "proxy", "PRIMARY_FEASIBLE": "false",
               "PRIMARY_PEER_ORIGIN": peer.url}
        with start_gateway(env) as gateway:
            for marker, key, headers in (("batch", "agents", {}),
                                         ("raised", "agents", {"X-Lobes-Priority": "interactive"}),
                                         ("standard", "box", {}),
                                         ("interactive", "person", {})):
                assert _ask(gateway.url, marker, key, **headers).status == 200
        seen = {json.loads(r["body"])["messages"][0]["content"]: r["headers"]
                for r in peer.requests() if r["method"] == "POST"}
    classes = {marker: headers.get("x-lobes-priority") for marker, headers in seen.items()}
    assert classes == {"batch": "batch", "raised": "batch", "standard": None,
                       "interactive": "interactive"}
