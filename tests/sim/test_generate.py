"""The vLLM serving surface for generate gears: health, models, chat and text completions."""

from __future__ import annotations

import http.client
import json

import openai
import pytest

from tests.support.sim_proc import start_sim

from .client import chat_payload, post, request, stream

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def sim():
    with start_sim("spark-cortex", time_scale=200) as running:
        yield running


@pytest.fixture(scope="module")
def instant():
    with start_sim("instant", served_name="sim-a", extra_args=["--max-model-len", "4096"]) as s:
        yield s


def test_health_answers_200(sim):
    assert request(sim.url, "GET", "/health").status == 200


def test_models_lists_the_served_name_and_window(sim):
    listing = request(sim.url, "GET", "/v1/models").json()
    assert listing["object"] == "list"
    [model] = listing["data"]
    assert model["id"] == "unsloth/Qwen3.8-27B-NVFP4"
    assert model["max_model_len"] == 262144
    assert model["owned_by"] == "vllm"


def test_served_name_and_window_overrides_reach_the_listing(instant):
    [model] = request(instant.url, "GET", "/v1/models").json()["data"]
    assert (model["id"], model["max_model_len"]) == ("sim-a", 4096)


def test_chat_stops_naturally_near_seed_000_length(sim):
    answer = post(sim.url, CHAT, chat_payload(max_tokens=160)).json()
    choice = answer["choices"][0]
    assert answer["object"] == "chat.completion"
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] in (154, 155)
    assert answer["usage"]["total_tokens"] == (
        answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
    )


def test_max_tokens_caps_output_with_finish_reason_length(sim):
    answer = post(sim.url, CHAT, chat_payload(max_tokens=7)).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 7
    assert len(answer["choices"][0]["message"]["content"].split()) == 7


def test_output_is_deterministic_for_a_seed_and_differs_across_seeds(sim):
    first = post(sim.url, CHAT, chat_payload(max_tokens=20, seed=7)).json()
    again = post(sim.url, CHAT, chat_payload(max_tokens=20, seed=7)).json()
    other = post(sim.url, CHAT, chat_payload(max_tokens=20, seed=8)).json()
    text = first["choices"][0]["message"]["content"]
    assert text == again["choices"][0]["message"]["content"]
    assert text != other["choices"][0]["message"]["content"]


def test_ignore_eos_generates_to_max_tokens(sim):
    answer = post(sim.url, CHAT, chat_payload(max_tokens=200, ignore_eos=True)).json()
    assert answer["usage"]["completion_tokens"] == 200
    assert answer["choices"][0]["finish_reason"] == "length"


def test_completions_default_to_16_tokens(sim):
    answer = post(sim.url, COMPLETIONS, {"prompt": "Once upon a time"}).json()
    assert answer["object"] == "text_completion"
    assert answer["usage"]["completion_tokens"] == 16
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["choices"][0]["text"]


def test_chat_stream_has_role_tokens_finish_usage_and_done(sim):
    payload = chat_payload(max_tokens=12, seed=3, stream_options={"include_usage": True})
    reply = stream(sim.url, CHAT, payload)
    assert reply.status == 200 and reply.done
    first, *tokens, usage = reply.events
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 12
    assert all(e["object"] == "chat.completion.chunk" for e in reply.events)
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 11 + ["length"]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 12
    whole = post(sim.url, CHAT, chat_payload(max_tokens=12, seed=3)).json()
    streamed = "".join(e["choices"][0]["delta"]["content"] for e in tokens)
    assert streamed == whole["choices"][0]["message"]["content"]


def test_stream_without_include_usage_sends_no_usage_chunk(sim):
    reply = stream(sim.url, COMPLETIONS, {"prompt": "abc", "max_tokens": 5})
    assert reply.done
    assert len(reply.events) == 5
    assert all("usage" not in e for e in reply.events)
    assert reply.events[-1]["choices"][0]["finish_reason"] == "length"


def test_continuous_usage_stats_count_up(sim):
    options = {"include_usage": True, "continuous_usage_stats": True}
    reply = stream(sim.url, COMPLETIONS, {"prompt": "abc", "max_tokens": 4,
                                          "stream_options": options})
    counts = [e["usage"]["completion_tokens"] for e in reply.events]
    assert counts == [1, 2, 3, 4, 4]
    chat = stream(sim.url, CHAT, chat_payload(max_tokens=3, stream_options=options))
    # As vLLM's, a chat stream's opening role delta counts no completion tokens yet.
    assert [e["usage"]["completion_tokens"] for e in chat.events] == [0, 1, 2, 3, 3]


def test_unknown_model_is_vllms_404(sim):
    reply = post(sim.url, CHAT, chat_payload(model="no/such-model"))
    assert reply.status == 404
    assert reply.json() == {
        "error": {
            "message": "The model `no/such-model` does not exist. Valid aliases: "
                       "unsloth/Qwen3.8-27B-NVFP4.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_max_tokens_over_the_window_is_400(instant):
    reply = post(instant.url, CHAT, chat_payload(max_tokens=4097))
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == "max_tokens"
    assert "max_tokens=4097 cannot be greater than max_model_len=4096" in error["message"]


def test_max_tokens_past_what_the_prompt_leaves_ends_at_the_window(instant):
    answer = post(instant.url, CHAT, chat_payload(max_tokens=4090, ignore_eos=True)).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["total_tokens"] == 4096


def test_prompt_alone_over_the_window_is_400(instant):
    reply = post(instant.url, COMPLETIONS, {"prompt": "word " * 5000, "max_tokens": 1})
    assert reply.status == 400
    assert "maximum context length is 4096 tokens" in reply.json()["error"]["message"]


def test_without_max_tokens_the_window_remainder_is_allowed(instant):
    answer = post(instant.url, CHAT, chat_payload(ignore_eos=True, content="x" * 16000)).json()
    usage = answer["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 4096


def test_malformed_json_is_400(sim):
    reply = request(sim.url, "POST", CHAT, raw=b"{not json")
    assert reply.status == 400
    # vLLM's request schema refuses it: pydantic's error, typed "Bad Request".
    assert reply.json()["error"]["type"] == "Bad Request"
    assert reply.json()["error"]["param"] == "body"


def test_unknown_route_is_fastapis_404_and_wrong_method_405(sim):
    assert request(sim.url, "GET", "/v1/nothing").json() == {"detail": "Not Found"}
    assert request(sim.url, "GET", CHAT).status == 405


def test_embeddings_route_does_not_exist_on_a_generate_gear(sim):
    assert post(sim.url, "/v1/embeddings", {"input": "x"}).status == 404


def test_the_openai_sdk_streams_from_the_simulator(instant):
    client = openai.OpenAI(base_url=f"{instant.url}/v1", api_key="unused")
    pieces = client.chat.completions.create(
        model="sim-a",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(pieces)
    assert chunks[-1].usage.completion_tokens == 9
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 9


def test_keep_alive_serves_several_requests_on_one_connection(sim):
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    try:
        for stream_it in (False, True, False):
            body = json.dumps(chat_payload(max_tokens=3, stream=stream_it))
            conn.request("POST", CHAT, body=body)
            response = conn.getresponse()
            assert response.status == 200
            assert response.getheader("connection") == "keep-alive"
            text = response.read()
            assert (b"data: [DONE]" in text) == stream_it
        sock_before = conn.sock
        conn.request("GET", "/health")
        conn.getresponse().read()
        assert conn.sock is sock_before
    finally:
        conn.close()


def test_a_chunked_request_body_is_read(sim):
    body = json.dumps(chat_payload(max_tokens=2)).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:]))
    reply = request(sim.url, "POST", CHAT, raw=chunked + b"0\r\n\r\n",
                    headers={"Transfer-Encoding": "chunked"})
    assert reply.status == 200
    assert reply.json()["usage"]["completion_tokens"] == 2


def test_min_tokens_lengthens_the_natural_stop(instant):
    answer = post(instant.url, CHAT, chat_payload(min_tokens=100, max_tokens=200)).json()
    assert answer["usage"]["completion_tokens"] == 100
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_n_answers_several_choices_each_its_own_and_counts_them_all(sim):
    one = post(sim.url, CHAT, chat_payload(max_tokens=200)).json()
    several = post(sim.url, CHAT, chat_payload(max_tokens=200, n=3)).json()
    choices = several["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    assert choices[0]["message"] == one["choices"][0]["message"]  # the first, as with n=1
    assert len({choice["message"]["content"] for choice in choices}) == 3
    lengths = [len(choice["message"]["content"].split()) for choice in choices]
    assert several["usage"]["completion_tokens"] == sum(lengths)  # as vLLM: every choice's
    assert several["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]


def test_a_stream_of_n_choices_carries_each_by_its_index_and_counts_them_all(sim):
    payload = chat_payload(max_tokens=200, n=2, stream_options={"include_usage": True})
    reply = stream(sim.url, CHAT, payload)
    whole = post(sim.url, CHAT, chat_payload(max_tokens=200, n=2)).json()
    assert reply.status == 200 and reply.done
    *chunks, usage = reply.events
    for index, choice in enumerate(whole["choices"]):
        own = [c for e in chunks for c in e["choices"] if c["index"] == index]
        assert own[0]["delta"] == {"role": "assistant", "content": ""}  # its role delta first
        assert "".join(c["delta"]["content"] for c in own[1:]) == choice["message"]["content"]
        assert [c["finish_reason"] for c in own[1:]][-1] == choice["finish_reason"]
    assert usage["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_n_out_of_bounds_or_not_an_integer_is_400_naming_n(instant):
    for extra in ({"n": 0}, {"n": "two"}, {"n": 10**9}):
        reply = post(instant.url, CHAT, chat_payload(**extra))
        assert reply.status == 400, extra
        assert reply.json()["error"]["param"] == "n"


def test_ill_typed_fields_are_400_naming_the_field(instant):
    for field, value in (("min_tokens", "many"), ("stream_options", "yes"), ("max_tokens", 0)):
        reply = post(instant.url, CHAT, chat_payload(**{field: value}))
        assert reply.status == 400, field
        assert reply.json()["error"]["param"] == field


def _continued(answer_so_far: str, **extra) -> dict:
    messages = [{"role": "user", "content": "Say something."},
                {"role": "assistant", "content": answer_so_far}]
    return {"messages": messages, "continue_final_message": True,
            "add_generation_prompt": False, **extra}


@pytest.mark.parametrize("split", [0, 1, 37, 153])
def test_a_continued_answer_goes_on_exactly_where_its_prefix_stops(sim, split):
    whole = post(sim.url, CHAT, chat_payload(max_tokens=160)).json()
    events = stream(sim.url, CHAT, chat_payload(max_tokens=160)).events
    pieces = [e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]]
    pieces = [piece for piece in pieces if piece]
    prefix = "".join(pieces[:split])
    rest = post(sim.url, CHAT, _continued(prefix, max_tokens=160 - split)).json()
    assert prefix + rest["choices"][0]["message"]["content"] == (
        whole["choices"][0]["message"]["content"])
    assert rest["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    usage, reference = rest["usage"], whole["usage"]
    # The prefix is prompt now: the same total, split differently.
    assert usage["prompt_tokens"] == reference["prompt_tokens"] + split
    assert usage["completion_tokens"] == reference["completion_tokens"] - split


def test_a_continued_text_of_other_words_still_gets_an_answer(sim):
    rest = post(sim.url, CHAT, _continued("Words this seed never says", max_tokens=8)).json()
    assert rest["usage"]["completion_tokens"] == 8
    plain = post(sim.url, CHAT, chat_payload(max_tokens=8)).json()
    assert rest["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]


@pytest.mark.parametrize(("extra", "last_role"), [
    ({"add_generation_prompt": True}, "assistant"),  # vLLM refuses both at once
    ({}, "assistant"),  # add_generation_prompt defaults to true
    ({"add_generation_prompt": False}, "user"),  # nothing of the assistant's to continue
])
def test_continue_final_message_is_checked_as_vllm_checks_it(sim, extra, last_role):
    payload = {"messages": [{"role": last_role, "content": "hi"}],
               "continue_final_message": True, **extra}
    reply = post(sim.url, CHAT, payload)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "continue_final_message"


def _contents(events: list[dict]) -> list[str]:
    return [e["choices"][0]["delta"]["content"] for e in events
            if e["choices"] and e["choices"][0]["delta"].get("content")]


def test_a_speculative_gear_streams_several_tokens_per_chunk(sim, sim_factory):
    """--tokens-per-chunk 3 (MTP): the same text in chunks of three tokens, the last one
    shorter, and usage per chunk counting tokens, not chunks."""
    ask = chat_payload(max_tokens=100, stream=True,
                       stream_options={"include_usage": True, "continuous_usage_stats": True})
    mtp = sim_factory("spark-cortex", time_scale=200, extra_args=["--tokens-per-chunk", "3"])
    plain_events = stream(sim.url, CHAT, ask).events
    mtp_events = stream(mtp.url, CHAT, ask).events
    one_each = _contents(plain_events)
    assert _contents(mtp_events) == ["".join(one_each[i:i + 3])
                                     for i in range(0, len(one_each), 3)]
    counted = [e["usage"]["completion_tokens"] for e in mtp_events
               if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert counted == [min(i + 3, len(one_each)) for i in range(0, len(one_each), 3)]
    assert mtp_events[-1]["usage"] == plain_events[-1]["usage"]
