"""Tool calls as the engine's hermes parser and its grammar shape them: a call the model
finished, a call cut by max_tokens (raw text, non-streamed), streamed call deltas, and the
choice `none`, which answers text."""

from __future__ import annotations

import json

from tests.conformance.servers import CHAT_NAME, Target
from tests.support.sse import stream_chat

CITIES = ["Paris", "Rome"]
# strict: the grammar holds the arguments to the schema; an enum makes a finished call likely.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                   "required": ["city"], "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather like?"}]
SEEDS = range(6)


def _call(server: Target, seed: int, max_tokens: int = 200, tool_choice: object = "required"):
    reply = server.chat(messages=ASK, tools=[WEATHER], tool_choice=tool_choice,
                        max_tokens=max_tokens, temperature=1.0, seed=seed)
    assert reply.status == 200, reply.body
    return reply.json()["choices"][0]


def _assert_finished_call(choice: dict, reason: str = "tool_calls") -> None:
    assert choice["finish_reason"] == reason
    message = choice["message"]
    assert not message["content"]
    assert message["tool_calls"]
    for call in message["tool_calls"]:
        assert call["type"] == "function"
        assert call["id"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"])["city"] in CITIES


def test_a_required_call_that_finishes_is_parsed_into_tool_calls(server: Target):
    choices = [_call(server, seed) for seed in SEEDS]
    finished = [choice for choice in choices if choice["finish_reason"] == "tool_calls"]
    assert finished, [choice["finish_reason"] for choice in choices]
    for choice in finished:
        _assert_finished_call(choice)


def test_a_named_function_is_called_and_ends_with_stop(server: Target):
    # The named call is structured output to the engine: it ends "stop", its call parsed.
    choices = [_call(server, seed, tool_choice=NAMED) for seed in SEEDS]
    finished = [choice for choice in choices if choice["finish_reason"] == "stop"]
    assert finished, [choice["finish_reason"] for choice in choices]
    for choice in finished:
        _assert_finished_call(choice, "stop")


def test_a_call_cut_by_max_tokens_comes_back_as_raw_text(server: Target):
    choice = _call(server, seed=0, max_tokens=6)
    assert choice["finish_reason"] == "length"
    assert not choice["message"].get("tool_calls")
    assert choice["message"]["content"].startswith("<tool_call>")


def test_a_streamed_call_sends_its_name_first_then_argument_fragments(server: Target):
    for seed in SEEDS:
        streamed = stream_chat(server.url, {
            "model": CHAT_NAME, "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
            "max_tokens": 200, "temperature": 1.0, "seed": seed})
        assert streamed.status == 200 and streamed.done
        deltas = [call for event in streamed.events for choice in event["choices"]
                  for call in (choice["delta"].get("tool_calls") or [])]
        assert deltas, streamed.events[:3]
        assert deltas[0]["id"] and deltas[0]["function"] == {"name": "get_weather"}
        assert all(set(d["function"]) == {"arguments"} for d in deltas[1:])
        arguments = "".join(d["function"].get("arguments") or "" for d in deltas)
        reason = streamed.finish["choices"][0]["finish_reason"]
        if reason == "tool_calls":
            assert json.loads(arguments)["city"] in CITIES
            return
        assert reason == "length"
    raise AssertionError("no seed finished its streamed call")


def test_a_cut_streamed_call_ends_with_length(server: Target):
    streamed = stream_chat(server.url, {
        "model": CHAT_NAME, "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
        "max_tokens": 14, "temperature": 1.0, "seed": 1})
    assert streamed.done
    assert streamed.finish["choices"][0]["finish_reason"] == "length"


def test_tool_choice_none_answers_text(server: Target):
    reply = server.chat(messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=6,
                        ignore_eos=True, temperature=1.0, seed=2)
    assert reply.status == 200
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert not choice["message"].get("tool_calls")
    assert choice["message"]["content"]
