"""A misbehaving gear behind a pool of two real gateways: its bad answers stay its own. Extra
bytes after its answers never become another caller's answer anywhere down the chain, and a
stream whose framing sends a scanner backwards ends with an error event while the gateway in
front of it, and the pool in front of that, go on serving."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.client import call, chat
from tests.support.fake_gear import (
    HANG,
    SERVED,
    STREAM_HEAD,
    FakeGear,
    Received,
    chat_answer,
    chunk,
    echo_script,
    json_answer,
    sse_event,
    wired_to,
)
from tests.support.gateway_proc import GatewayProcess, start_gateway
from tests.support.sse import stream_chat
from tests.support.wait import wait_until

EVIL = json_answer(chat_answer("someone else's answer"))


def _pool_env(origins: list[str]) -> dict[str, str]:
    return {"PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "pool",
            "PRIMARY_PEER_ORIGINS": ",".join(origins), "GATEWAY_POOL_POLICY": "queue",
            "GATEWAY_PROBE_INTERVAL_S": "0.2", "GATEWAY_STREAM_STALL_S": "2"}


@pytest.fixture
def chain() -> Iterator[tuple[GatewayProcess, list[FakeGear]]]:
    """Two fake gears, a gateway in front of each, and a pool gateway in front of both."""
    gears = [FakeGear(), FakeGear()]
    backs = [start_gateway({**wired_to(gear), "PRIMARY_MAX_MODEL_LEN": "4096",
                            "PRIMARY_MAX_ACTIVE": "2", "GATEWAY_STREAM_STALL_S": "2"})
             for gear in gears]
    front = start_gateway(_pool_env([back.url for back in backs]))
    try:
        wait_until(lambda: all(row["ready"] for row in front.get_json(
            "/capabilities")["roles"]["cortex"]["replicas"]), message="both replicas ready")
        yield front, gears
    finally:
        for process in (front, *backs):
            process.stop()
        for gear in gears:
            gear.close()


def _ask(front: GatewayProcess, content: str):
    return chat(front.url, {"model": "cortex", "max_tokens": 4,
                            "messages": [{"role": "user", "content": content}]}, timeout=20)


def test_extra_bytes_after_a_gears_answers_never_reach_another_caller_through_the_pool(chain):
    front, gears = chain

    def with_extra(request: Received):
        return [json_answer(chat_answer(request.json()["messages"][-1]["content"])) + EVIL]

    for gear in gears:
        gear.script = with_extra
    contents = [f"caller-{index}" for index in range(16)]
    with ThreadPoolExecutor(4) as callers:  # at once, so both replicas take some
        answers = dict(zip(contents, callers.map(lambda c: _ask(front, c), contents),
                           strict=True))
    assert {content: reply.status for content, reply in answers.items()} == dict.fromkeys(
        answers, 200)
    assert {content: reply.json()["choices"][0]["message"]["content"]
            for content, reply in answers.items()} == {content: content for content in answers}
    assert {reply.headers["x-lobes-proxied-by"] for reply in answers.values()} == set(
        front.env["PRIMARY_PEER_ORIGINS"].split(","))


def test_a_stream_that_would_freeze_its_gateway_ends_and_the_pool_goes_on(chain):
    front, gears = chain

    def freezing(_request: Received):
        return [STREAM_HEAD + chunk(sse_event("a", SERVED)) + b"-6\r\n" + b"data: {}\n\n" * 4,
                HANG]

    for gear in gears:
        gear.script = freezing
    streams = [stream_chat(front.url, {"model": "cortex", "max_tokens": 4, "messages": [
        {"role": "user", "content": f"stream-{index}"}]}, timeout=20) for index in range(4)]
    assert [s.errors[-1]["code"] if s.errors else None for s in streams] == [
        "stream_interrupted"] * 4
    for back in front.env["PRIMARY_PEER_ORIGINS"].split(","):
        assert call(back, "GET", "/health", timeout=5).status == 200  # not frozen
    for gear in gears:
        gear.script = echo_script
    assert [_ask(front, f"after-{i}").json()["choices"][0]["message"]["content"]
            for i in range(4)] == [f"after-{i}" for i in range(4)]
