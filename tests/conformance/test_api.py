"""The OpenAI surface the gateway relies on, the same on both engines, direct and through the
gateway: models, chat answers and streams, usage, finish reasons, bad requests, embeddings."""

from __future__ import annotations

import pytest

from tests.conformance.servers import (
    CHAT_NAME,
    EMBED_DIM,
    EMBED_NAME,
    EOS_ID,
    WINDOW,
    Target,
    error_of,
)
from tests.support.client import call
from tests.support.sse import stream_chat

# Sampled, with a seed: random weights decoded greedily repeat one token.
SAMPLED = {"temperature": 1.0, "seed": 7}


def test_models_lists_the_served_name_with_its_window(server: Target):
    reply = call(server.url, "GET", "/v1/models")
    assert reply.status == 200
    models = {model["id"]: model for model in reply.json()["data"]}
    assert CHAT_NAME in models
    assert models[CHAT_NAME]["object"] == "model"
    if not server.through_gateway:  # the gateway lists its roles' aliases too
        assert list(models) == [CHAT_NAME]
        assert models[CHAT_NAME]["max_model_len"] == WINDOW


def test_an_answer_cut_by_max_tokens_counts_them_and_says_length(server: Target):
    reply = server.chat(max_tokens=12, ignore_eos=True, **SAMPLED)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert answer["object"] == "chat.completion"
    assert answer["model"] == CHAT_NAME
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    usage = answer["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12


def test_an_answer_that_ends_itself_says_stop_and_counts_what_it_made(server: Target):
    # The real engine's random model is told to end at once (its EOS, favoured); the
    # simulator's answers end on their own well before 200 tokens.
    reply = server.chat(max_tokens=200, logit_bias={str(EOS_ID): 100}, **SAMPLED)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert 0 < answer["usage"]["completion_tokens"] < 200


def test_a_stream_without_include_usage_carries_no_count(server: Target):
    streamed = stream_chat(server.url, {"model": CHAT_NAME, "max_tokens": 20, "ignore_eos": True,
                                        "messages": [{"role": "user", "content": "hi"}],
                                        **SAMPLED})
    assert streamed.status == 200
    assert streamed.done
    first = streamed.events[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    assert first["finish_reason"] is None
    assert all(event.get("usage") is None for event in streamed.events)
    assert streamed.finish is not None
    assert streamed.finish["choices"][0]["finish_reason"] == "length"
    # The last token comes in the event that finishes the choice, never after it.
    assert streamed.events[-1] is streamed.finish
    assert streamed.text


def test_a_stream_with_include_usage_ends_with_the_count(server: Target):
    streamed = stream_chat(server.url, {"model": CHAT_NAME, "max_tokens": 20, "ignore_eos": True,
                                        "messages": [{"role": "user", "content": "hi"}],
                                        "stream_options": {"include_usage": True}, **SAMPLED})
    assert streamed.done
    last = streamed.events[-1]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 20
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 20
    assert all(event.get("usage") is None for event in streamed.events[:-1])
    assert streamed.events[-2]["choices"][0]["finish_reason"] == "length"


def test_max_tokens_past_the_window_is_a_400_naming_it(server: Target):
    reply = server.chat(max_tokens=WINDOW + 1)
    assert reply.status == 400
    error = error_of(reply)
    assert error["type"] == "BadRequestError"
    assert error["code"] == 400
    assert error["param"] == "max_tokens"
    assert f"max_tokens={WINDOW + 1} cannot be greater than max_model_len={WINDOW}" in \
        error["message"]


def test_max_tokens_past_what_the_prompt_leaves_ends_at_the_window(server: Target):
    prompt = [{"role": "user", "content": " ".join(f"w{n}" for n in range(500))}]
    measured = server.chat(messages=prompt, max_tokens=1)
    assert measured.status == 200, measured.body
    left = WINDOW - measured.json()["usage"]["prompt_tokens"]
    reply = server.chat(messages=prompt, max_tokens=left + 10, ignore_eos=True,
                        timeout=180, **SAMPLED)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == left
    assert answer["usage"]["total_tokens"] == WINDOW


def test_a_prompt_past_the_window_is_a_400(server: Target):
    reply = server.chat(messages=[{"role": "user", "content": "word " * WINDOW * 2}],
                        max_tokens=1)
    assert reply.status == 400
    error = error_of(reply)
    assert error["type"] == "BadRequestError"
    assert error["param"] == "input_tokens"
    assert (f"maximum context length is {WINDOW} tokens. However, your prompt contains at "
            f"least {WINDOW + 1} input tokens") in error["message"]


def test_a_model_not_served_is_a_404_naming_it(server: Target):
    reply = server.chat(model="no-such-model")
    if server.through_gateway:  # an unknown name goes to the default model (docs/gateway.md)
        assert reply.status == 200
        assert reply.json()["model"] == CHAT_NAME
        return
    assert reply.status == 404
    error = error_of(reply)
    assert error["type"] == "NotFoundError"
    assert error["message"] == (f"The model `no-such-model` does not exist. Valid aliases: "
                                f"{CHAT_NAME}.")


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]"], ids=["malformed", "not-an-object"])
def test_a_body_that_is_no_json_object_is_a_400(server: Target, body: bytes):
    reply = call(server.url, "POST", "/v1/chat/completions", body,
                 {"Content-Type": "application/json"})
    assert reply.status == 400
    error = error_of(reply)
    if not server.through_gateway:  # the gateway reads the body itself and answers its own
        assert error["type"] == "Bad Request"
        assert error["code"] == 400
        assert error["param"].startswith("body")


def test_a_chat_without_messages_is_a_400_naming_the_field(server: Target):
    reply = server.post("/v1/chat/completions", {"model": CHAT_NAME, "max_tokens": 4})
    assert reply.status == 400
    error = error_of(reply)
    assert error["type"] == "Bad Request"
    assert error["param"] == "body.messages"
    assert "Field required" in error["message"]


@pytest.mark.parametrize("priority", [5, -5])
def test_a_priority_is_accepted(server: Target, priority: int):
    reply = server.chat(priority=priority, max_tokens=4, ignore_eos=True)
    assert reply.status == 200, reply.body
    assert reply.json()["usage"]["completion_tokens"] == 4


def test_embeddings_are_vectors_of_the_model_and_count_the_prompt(server: Target):
    reply = server.post("/v1/embeddings", {"model": EMBED_NAME,
                                           "input": ["a first text", "and a second one"]})
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert answer["object"] == "list"
    assert [item["index"] for item in answer["data"]] == [0, 1]
    assert all(item["object"] == "embedding" for item in answer["data"])
    assert all(len(item["embedding"]) == EMBED_DIM for item in answer["data"])
    usage = answer["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"]
    assert usage.get("completion_tokens", 0) == 0
