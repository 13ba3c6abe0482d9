"""Prefix- and window-aware placement across real processes: a pooling gateway (default policy,
prefix) in front of two peer gateways, each fronting a spark-cortex simulator; the second
serves a smaller window, as a pool may now mix windows."""

from __future__ import annotations

import re
import urllib.request

import pytest

from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

from .test_pool_mesh import SERVED, all_selectable

SMALL_WINDOW = 16384
# ~4,000 tokens of shared system prompt, as an agent's.
SYSTEM = "You are the fleet's agent; you route, you measure, you answer. " * 250


def peer_env(sim, window: int) -> dict[str, str]:
    return {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
            "PRIMARY_MAX_MODEL_LEN": str(window), "PRIMARY_MAX_ACTIVE": "2"}


@pytest.fixture(scope="module")
def pool():
    small = ["--max-model-len", str(SMALL_WINDOW)]
    with start_sim("spark-cortex", time_scale=20) as big_sim, \
            start_sim("spark-cortex", time_scale=20, extra_args=small) as small_sim, \
            start_gateway(peer_env(big_sim, 262144)) as big, \
            start_gateway(peer_env(small_sim, SMALL_WINDOW)) as small, \
            start_gateway({"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGIN": big.url,
                           "PRIMARY_PEER_PROXY": "true",
                           "PRIMARY_PEER_ORIGINS": f"{big.url},{small.url}",
                           "PRIMARY_MAX_ACTIVE": "2",
                           "GATEWAY_PROBE_INTERVAL_S": "0.1"}) as orin:
        all_selectable(orin)
        yield {"orin": orin, "big": big, "small": small,
               "sims": {big.url: big_sim, small.url: small_sim}}


def turn(url: str, history: list[dict], question: str) -> tuple[str, list[dict]]:
    messages = [*history, {"role": "user", "content": question}]
    reply = chat(url, {"model": "cortex", "messages": messages, "max_tokens": 16})
    assert reply.status == 200, reply.body
    answer = reply.json()["choices"][0]["message"]["content"]
    return reply.headers["x-lobes-proxied-by"], [*messages, {"role": "assistant",
                                                             "content": answer}]


def test_a_conversation_stays_on_the_replica_that_holds_its_prefix(pool):
    history = [{"role": "system", "content": SYSTEM}]
    served = []
    for question in ("Where does cortex run?", "And senses?", "Why there?", "Since when?"):
        origin, history = turn(pool["orin"].url, history, question)
        served.append(origin)
    assert len(set(served)) == 1, served
    holder = pool["sims"][served[0]]
    other = next(sim for url, sim in pool["sims"].items() if url != served[0])
    assert metric(holder, "vllm:prefix_cache_hits_total") >= 3 * 3900  # the system prompt, 3x
    assert metric(other, "vllm:prefix_cache_queries_total") == 0


def test_a_prompt_too_long_for_the_small_window_goes_to_the_big_one(pool):
    long_prompt = "x" * (SMALL_WINDOW * 4)  # ~16k tokens: over the small window alone
    for _attempt in range(3):
        reply = chat(pool["orin"].url, {"model": "cortex", "max_tokens": 4,
                                        "messages": [{"role": "user", "content": long_prompt}]})
        assert reply.status == 200, reply.body
        assert reply.headers["x-lobes-proxied-by"] == pool["big"].url


def test_a_prompt_too_long_for_every_window_is_a_400_naming_the_largest(pool):
    reply = chat(pool["orin"].url, {"model": "cortex", "max_tokens": 4096,
                                    "messages": [{"role": "user", "content": "y" * 1_048_576}]})
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "pool serves is 262144 tokens" in error["message"]
    assert reply.headers["x-lobes-route-reason"] == "none"


def metric(sim, name: str) -> float:
    """One sample of the simulator's /metrics, by name."""
    with urllib.request.urlopen(f"{sim.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))
