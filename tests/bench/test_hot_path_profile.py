"""bench/hot_path_profile.py counts each layer's bytecode steps of a real request through the
real Gateway: every step of the gateway's own code is charged to a named layer, and each phase
holds the work that really runs in it (the body is parsed before the upstream send, the answer
is relayed after it, the request is counted once it was written)."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def profile():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("hot_path_profile")
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def counted(profile):
    """The steps of 20 requests at c=1, by phase and layer (the harness checks each came back
    a 200 with the backend's body)."""
    return asyncio.run(profile.phases_in_process(20))


def test_every_step_of_the_gateway_is_charged_to_a_named_layer(profile, counted):
    total = counted.by_layer()
    assert total[profile.OTHER_GATEWAY] == 0
    named = {layer for layer, _tails in profile.LAYERS}
    gateway_layers = set(total) - {profile.OUTSIDE}
    assert gateway_layers <= named
    # the harness's own steps are a small part, never the gateway's
    assert total[profile.OUTSIDE] < sum(total.values()) / 10


def test_each_phase_holds_the_work_that_runs_in_it(profile, counted):
    before = counted.by_layer(profile.BEFORE_SEND)
    answer = counted.by_layer(profile.ANSWER)
    after = counted.by_layer(profile.AFTER)
    assert before["JSON body"] > 0 and answer["JSON body"] == after["JSON body"] == 0
    assert before["relay to the caller"] == 0 and answer["relay to the caller"] > 0
    assert after["metrics and request trace"] > 0  # the request is counted once answered
    assert sum(counted.by_layer().values()) == sum(before.values()) + sum(answer.values()) \
        + sum(after.values())


def test_the_tables_give_steps_a_request(profile, counted):
    table = profile.phases_table(counted, 20)
    total = sum(counted.by_layer().values())
    assert f"**{total / 20:,.0f}**" in table
    assert table.count("\n") == len(counted.by_layer()) + 2  # header, rule, layers, total


def test_a_module_is_named_by_its_path(profile):
    assert profile.layer_of("/x/gateway/lobes_gateway/transport/json_body.py") == "JSON body"
    assert profile.layer_of("/usr/lib/python3.11/asyncio/selector_events.py") == \
        "event loop (asyncio, selectors)"
    assert profile.layer_of("/x/gateway/lobes_gateway/mesh/peers.py") == profile.OTHER_GATEWAY
    assert profile.layer_of("/x/bench/loadgen.py") == profile.OUTSIDE


def test_over_sockets_a_chunk_is_mostly_the_relay_and_the_event_loop(profile):
    counter, events = asyncio.run(profile.chunks_over_sockets(1.0))
    assert events >= profile.SSE_STREAMS * 10  # streams ran and were relayed
    per_chunk = counter.by_layer()
    relay, loop = per_chunk["relay to the caller"], per_chunk["event loop (asyncio, selectors)"]
    assert relay > per_chunk["JSON body"] and loop > per_chunk["JSON body"]
    assert per_chunk[profile.OTHER_GATEWAY] == 0
    assert "steps a chunk" in profile.sockets_table(counter, events, "chunk")


def test_over_sockets_every_request_is_counted_with_the_event_loop(profile):
    counter, answered = asyncio.run(profile.over_sockets(4, 0.5, 0.5))
    assert answered > 0
    total = counter.by_layer()
    assert total["event loop (asyncio, selectors)"] > 0 and total["JSON body"] > 0
    assert total[profile.OTHER_GATEWAY] == 0
