"""app/resume.py's pure parts: which streams may be continued, and the continuation request."""

import pytest
from lobes_gateway.app.resume import (
    UsageAsked,
    _split_usage,
    continuation_body,
    counting_payload,
    resumable_request,
)

ASK = {"model": "cortex", "stream": True, "max_tokens": 100,
       "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("extra", "resumable"), [
    ({}, True),
    ({"n": 1}, True),
    ({"response_format": {"type": "text"}}, True),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, True),  # until a tool call
    ({"stream": False}, False),
    ({"n": 2}, False),
    ({"response_format": {"type": "json_object"}}, False),
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, False),
    ({"guided_json": {"type": "object"}}, False),
    ({"messages": []}, False),
])
def test_which_requests_may_be_continued(extra, resumable):
    assert resumable_request({**ASK, **extra}) is resumable


def test_the_continuation_appends_the_text_and_spends_the_budget():
    body = continuation_body({**ASK, "min_tokens": 30}, "The answer so", 12)
    assert body["messages"] == [*ASK["messages"], {"role": "assistant", "content": "The answer so"}]
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    assert (body["max_tokens"], body["min_tokens"]) == (88, 18)
    assert ASK["messages"] == [{"role": "user", "content": "hi"}]  # the caller's left as it was


def test_max_completion_tokens_is_spent_like_max_tokens():
    body = continuation_body({**ASK, "max_completion_tokens": 50}, "x", 20)
    assert (body["max_completion_tokens"], body["max_tokens"]) == (30, 80)


def test_a_callers_own_continuation_is_extended_not_nested():
    own = {**ASK, "continue_final_message": True, "add_generation_prompt": False,
           "messages": [*ASK["messages"], {"role": "assistant", "content": "Once"}]}
    body = continuation_body(own, " upon a", 2)
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon a"}
    assert len(body["messages"]) == 2


def test_a_spent_budget_needs_no_continuation():
    assert continuation_body(ASK, "all of it", 100) is None


@pytest.mark.parametrize(("options", "asked"), [
    (None, UsageAsked(final=False, per_chunk=False)),
    ({"include_usage": True}, UsageAsked(final=True, per_chunk=False)),
    ({"include_usage": True, "continuous_usage_stats": True}, UsageAsked(True, True)),
    # vLLM reports usage per chunk only with include_usage.
    ({"continuous_usage_stats": True}, UsageAsked(final=False, per_chunk=False)),
])
def test_the_replicas_are_asked_for_usage_per_chunk_whatever_the_client_asked(options, asked):
    payload = ASK if options is None else {**ASK, "stream_options": options}
    assert UsageAsked.of(payload) == asked
    counted = counting_payload(payload)
    assert counted["stream_options"] == {**(options or {}), "include_usage": True,
                                         "continuous_usage_stats": True}
    assert counted["messages"] == ASK["messages"] and payload.get("stream_options") == options


def test_a_malformed_stream_options_is_left_for_the_replica_to_refuse():
    payload = {**ASK, "stream_options": "usage please"}
    assert counting_payload(payload) is payload


def test_a_stream_that_broke_off_before_its_first_token_is_asked_again_as_it_was():
    assert continuation_body(ASK, "", 0) == ASK


CHUNK = (b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":"a \\"usage\\": {"},'
         b'"logprobs":null,"finish_reason":null}]')


@pytest.mark.parametrize("usage", [
    b'{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5}',
    b'{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5,"prompt_tokens_details":null}',
    b'{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5,'
    b'"prompt_tokens_details":{"cached_tokens":4}}',
], ids=["vllm", "with-null-details", "with-cached-details"])
def test_a_chunks_trailing_usage_is_read_and_cut_by_bytes(usage):
    assert _split_usage(CHUNK + b',"usage":' + usage + b"}") == (CHUNK + b"}", 5)


@pytest.mark.parametrize("chunk", [
    CHUNK + b"}",  # no usage
    CHUNK + b',"usage":{"prompt_tokens":7,"completion_tokens":5},"extra":1}',  # not last
    CHUNK + b',"usage":null}',
], ids=["none", "not-last", "null"])
def test_any_other_shape_is_left_to_the_parser(chunk):
    assert _split_usage(chunk) is None
