"""The `priority` field, as vLLM 0.32 takes it: accepted and ignored under fcfs (arrival
order), ordering the waiting queue under --scheduling-policy priority (lower first, then
arrival); a value that is no integer is a 400 either way."""

from __future__ import annotations

import threading

import pytest

from tests.support.wait import wait_until

from .client import chat_payload, post
from .test_engine import metrics

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(("priority", "status"), [(0, 200), (3, 200), (-1, 200), ("1", 400),
                                                  (True, 400)])
def test_fcfs_takes_any_integer_priority(sim_factory, priority, status):
    sim = sim_factory("instant")
    reply = post(sim.url, CHAT, chat_payload(priority=priority))
    assert reply.status == status
    if status == 400:
        assert reply.json()["error"]["param"] == "priority"


def test_the_priority_policy_runs_lower_values_first(sim_factory):
    assert _finish_order(sim_factory, "priority") == ["holder", "urgent", "normal", "low"]


def test_fcfs_ignores_priority_and_runs_in_arrival_order(sim_factory):
    assert _finish_order(sim_factory, "fcfs") == ["holder", "low", "normal", "urgent"]


def _finish_order(sim_factory, policy: str) -> list[str]:
    """Requests of priorities 5, 0, -2, queued in that order behind a running one on one
    slot: the order they finish in."""
    sim = sim_factory("spark-cortex", time_scale=10,
                      extra_args=["--max-num-seqs", "1", "--scheduling-policy", policy])
    finished: list[str] = []

    def send(name: str, priority: int, tokens: int) -> None:
        reply = post(sim.url, CHAT, chat_payload(content=name, max_tokens=tokens,
                                                 ignore_eos=True, priority=priority))
        assert reply.status == 200
        finished.append(name)

    def queued(name: str, priority: int, tokens: int, gauge: str, count: int) -> None:
        threads.append(threading.Thread(target=send, args=(name, priority, tokens)))
        threads[-1].start()
        wait_until(lambda: metrics(sim.url)[gauge] == count, timeout=10, interval=0.01,
                   message=f"{name} to reach the engine")

    threads: list[threading.Thread] = []
    queued("holder", 0, 600, "vllm:num_requests_running", 1)
    # low, normal and urgent wait behind the holder, queued in that order.
    for count, (name, priority) in enumerate([("low", 5), ("normal", 0), ("urgent", -2)], 1):
        queued(name, priority, 8, "vllm:num_requests_waiting", count)
    for thread in threads:
        thread.join(timeout=30)
    return finished
