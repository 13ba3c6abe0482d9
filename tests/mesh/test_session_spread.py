"""Agent sessions spread over a pool of identical replicas (the added scenario of
bench/agent_sessions_bench.py): a pooling gateway (default policy, prefix) in front of two
peer gateways, each fronting a 2-slot spark-cortex simulator. Four sessions over one shared
system prompt start at once; affinity must not stack three of them on two slots."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

from .test_pool_mesh import all_selectable, peer_env, pool_env

TIME_SCALE = 20
SPARK_RATE = 48.9  # tok/s per stream, the profile's (docs/simulator.md)
# ~4,000 tokens of shared system prompt, as an agent's, and a ~2,000-token task per session:
# long enough that a second session's first turn waiting for a replica's prefill of another's
# clearly costs more than prefilling its own on the idle replica.
SYSTEM = "You are the fleet's agent; you route, you measure, you answer. " * 250
TASK = "Session {}: the fleet's replica table and probe history to act on. "
SESSIONS = 4


@pytest.fixture
def pool():
    """A fresh pool per test: nothing placed, nothing cached."""
    rate = f"{SPARK_RATE * TIME_SCALE:g}"
    with start_sim("spark-cortex", time_scale=TIME_SCALE) as first_sim, \
            start_sim("spark-cortex", time_scale=TIME_SCALE) as second_sim, \
            start_gateway(peer_env(first_sim) | {"PRIMARY_MAX_ACTIVE": "2"}) as first, \
            start_gateway(peer_env(second_sim) | {"PRIMARY_MAX_ACTIVE": "2"}) as second, \
            start_gateway(pool_env(first.url, [first.url, second.url],
                                   PRIMARY_PEER_RATES=f"{rate},{rate}")) as orin:
        all_selectable(orin)
        yield orin


def turn(url: str, history: list[dict]) -> tuple[str, list[dict]]:
    """One turn of a session: the replica that served it and the history with its answer."""
    reply = chat(url, {"model": "cortex", "messages": history, "max_tokens": 16})
    assert reply.status == 200, reply.body
    answer = reply.json()["choices"][0]["message"]["content"]
    return reply.headers["x-lobes-proxied-by"], [*history, {"role": "assistant",
                                                            "content": answer}]


def round_of_turns(url: str, histories: list[list[dict]]) -> list[tuple[str, list[dict]]]:
    """Every session's next turn, all sent at once."""
    with ThreadPoolExecutor(len(histories)) as sessions:
        return list(sessions.map(lambda history: turn(url, history), histories))


def test_four_sessions_over_two_pairs_of_slots_split_two_and_two_and_stay(pool):
    histories = [[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": TASK.format(i) * 120}] for i in range(SESSIONS)]
    first = round_of_turns(pool.url, histories)
    first_origins = [origin for origin, _history in first]
    # Three on one replica would queue one of them for a whole turn while the other replica
    # has a slot open: the replica that took the first turn is busy prefilling the shared
    # prompt, so it is not free for the second.
    assert sorted(Counter(first_origins).values()) == [2, 2], first_origins
    following = [[*history, {"role": "user", "content": "Next step?"}]
                 for _origin, history in first]
    second_origins = [origin for origin, _history in round_of_turns(pool.url, following)]
    assert second_origins == first_origins  # each session back where its prefix is
