"""What the gateway makes of each engine's answers: the token counts it keeps, and whether a
role it calls ready answers at all."""

from __future__ import annotations

from tests.conformance.servers import CHAT_NAME, Engine, gateway_env
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import Scrape
from tests.support.sse import stream_chat
from tests.support.wait import wait_until

TOKENS = 200
COMPLETION_TOKENS = "lobes_gateway_completion_tokens_total"


def test_a_stream_without_usage_is_counted_to_the_token(engine: Engine):
    before = Scrape.of(engine.gateway.url).value(COMPLETION_TOKENS)
    streamed = stream_chat(engine.gateway.url, {
        "model": CHAT_NAME, "max_tokens": TOKENS, "ignore_eos": True, "temperature": 1.0,
        "seed": 11, "messages": [{"role": "user", "content": "count me"}]})
    assert streamed.done
    counted = wait_until(
        lambda: Scrape.of(engine.gateway.url).value(COMPLETION_TOKENS) - before or None,
        message="the gateway to count the stream")
    assert counted == TOKENS


def test_a_served_name_the_engine_does_not_serve_is_not_ready(engine: Engine):
    env = gateway_env(engine.chat.url, engine.embed.url, PRIMARY_SERVED_NAME="not-served")
    with start_gateway({**env, "GATEWAY_DEFAULT_MODEL": "not-served"}) as gateway:
        cortex = gateway.get_json("/capabilities")["roles"]["cortex"]
    assert cortex["ready"] is False
    assert "not-served" in cortex.get("reason", "") and CHAT_NAME in cortex.get("reason", "")
