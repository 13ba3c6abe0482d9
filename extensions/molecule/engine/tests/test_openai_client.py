"""The box's gateway in front of vLLM's CPU build, as a user's program sees it: the official
openai client, chat (plain, streamed, a tool call) and embeddings, with real tokens."""

from __future__ import annotations

import json
import os

import pytest
from openai import OpenAI

CHAT = "tiny-chat"
EMBED = "tiny-embed"
CITIES = ["Paris", "Rome"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                   "required": ["city"], "additionalProperties": False}}}
# Random weights: sampled with a seed, and told to ignore the end of sequence, the tiny model
# writes exactly max_tokens tokens.
EXACT = {"temperature": 1.0, "seed": 3, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client() -> OpenAI:
    return OpenAI(base_url=os.environ["LOBES_GATEWAY_URL"] + "/v1", api_key="unused",
                  timeout=120, max_retries=0)


def test_the_gateway_lists_the_served_models(client: OpenAI):
    ids = {model.id for model in client.models.list()}
    assert {CHAT, EMBED} <= ids


def test_a_chat_answer_carries_real_tokens(client: OpenAI):
    answer = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Say something."}], max_tokens=16,
        **EXACT)
    assert answer.model == CHAT
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].message.content
    assert answer.usage.completion_tokens == 16
    assert answer.usage.prompt_tokens > 0


def test_a_streamed_chat_ends_with_its_usage(client: OpenAI):
    stream = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Stream something."}], max_tokens=24,
        stream=True, stream_options={"include_usage": True}, **EXACT)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 24


def test_a_required_tool_call_is_answered_as_a_call(client: OpenAI):
    reasons = []
    for seed in range(6):
        answer = client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "The weather?"}], tools=[WEATHER],
            tool_choice="required", max_tokens=200, temperature=1.0, seed=seed)
        choice = answer.choices[0]
        reasons.append(choice.finish_reason)
        if choice.finish_reason == "tool_calls":
            call = choice.message.tool_calls[0]
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments)["city"] in CITIES
            return
    raise AssertionError(f"no seed finished its call: {reasons}")


def test_embeddings_are_vectors_of_the_tiny_model(client: OpenAI):
    answer = client.embeddings.create(model=EMBED, input=["a first text", "a second one"])
    assert [item.index for item in answer.data] == [0, 1]
    assert all(len(item.embedding) == 128 for item in answer.data)
    assert answer.usage.prompt_tokens > 0
