"""Prefix affinity credits the answer a replica wrote: vLLM caches the full blocks of its output,
so the next turn of a conversation, which carries that answer, finds it cached there. The
gateway reads no answer for this (streams pass through unparsed): a prompt whose held run
reaches the end of a chat prompt sent to that replica, and goes on with an assistant message,
holds that message too. Also the grain learned from reported prompt tokens."""

from __future__ import annotations

import pytest
from lobes_gateway.policy.placer import Candidate, Placer
from lobes_gateway.policy.policies import PrefixPolicy
from lobes_gateway.policy.prefix import BLOCK_CHARS, PrefixAffinity, request_shape
from lobes_gateway.policy.tokens import CharsPerToken, reported_prompt_tokens

A, B = "http://a:8000", "http://b:8000"
SYSTEM = "You are the fleet's agent; answer with care. " * 90  # ~1k tokens
ANSWER = "The Spark holds it; the Thor is slower per stream. " * 20  # ~1,000 characters


def conversation(*messages: tuple[str, str]) -> dict:
    chat = [{"role": "system", "content": SYSTEM}]
    chat += [{"role": role, "content": content} for role, content in messages]
    return {"model": "cortex", "messages": chat, "max_tokens": 64}


def shape(payload: dict):
    return request_shape(payload, with_blocks=True)


FIRST = conversation(("user", "Where does cortex run?"))
SECOND = conversation(("user", "Where does cortex run?"), ("assistant", ANSWER),
                      ("user", "And why there?"))


def test_the_next_turn_holds_the_answer_where_its_prompt_was_sent():
    affinity = PrefixAffinity([A, B])
    affinity.remember(A, shape(FIRST))
    affinity.remember(B, shape(conversation()))  # only the system prompt
    text = shape(SECOND).text
    answer_closes = text.index(ANSWER) + len(ANSWER)
    assert affinity.cached_chars(A, shape(SECOND)) == answer_closes // BLOCK_CHARS * BLOCK_CHARS
    assert affinity.cached_chars(A, shape(SECOND)) > len(shape(FIRST).text) + 900
    assert affinity.cached_chars(B, shape(SECOND)) < len(shape(FIRST).text)


def test_a_user_message_after_the_prompt_is_not_credited():
    affinity = PrefixAffinity([A])
    affinity.remember(A, shape(FIRST))
    follow_up = conversation(("user", "Where does cortex run?"), ("user", ANSWER))
    held = len(shape(FIRST).text) // BLOCK_CHARS * BLOCK_CHARS
    assert affinity.cached_chars(A, shape(follow_up)) == held


def test_a_dark_replica_forgets_the_ends_of_its_prompts():
    affinity = PrefixAffinity([A])
    affinity.remember(A, shape(FIRST))
    affinity.forget(A)
    affinity.remember(A, shape(conversation()))
    assert affinity.cached_chars(A, shape(SECOND)) < len(shape(FIRST).text)


def test_the_credited_answer_takes_its_prefill_off_the_forecast():
    placer = Placer(PrefixPolicy(), {A: 48.9, B: 48.9})
    placer.place([Candidate(A, 2)], request=shape(FIRST)).release()
    placer.place([Candidate(B, 2)], request=shape(conversation())).release()
    on_a, on_b = placer.views([Candidate(A, 2), Candidate(B, 2)], shape(SECOND))
    # The answer, less at most the one block it shares with what follows, is priced as held.
    assert on_a.cached_tokens - on_b.cached_tokens >= (len(ANSWER) - BLOCK_CHARS) // 4
    assert placer.place([Candidate(A, 2), Candidate(B, 2)], request=shape(SECOND)).origin == A


def test_reported_prompt_tokens_teach_the_grain_and_price_later_prompts():
    placer = Placer(PrefixPolicy(), {A: 48.9})
    payload = conversation(("user", "x" * 4000))
    chars = shape(payload).text_chars
    for _answer in range(12):
        placement = placer.place([Candidate(A, 2)], request=shape(payload))
        placement.record_completion(64, 2.0, prompt_tokens=chars // 6 + 4 * 2 + 2)
        placement.release()
    assert placer.chars_per_token.value == pytest.approx(6.0, rel=0.03)
    priced = request_shape(payload, True, placer.chars_per_token.value)
    assert priced.prompt_tokens == pytest.approx(chars / 6 + 10, rel=0.03)


def test_a_short_prompt_or_a_missing_usage_teaches_nothing():
    grain = CharsPerToken(0.3)
    short = request_shape({"prompt": "x" * 100}, False)
    grain.observe(short.text_chars, short.fixed_tokens, 10)
    assert (grain.value, grain.samples) == (4.0, 0)
    assert reported_prompt_tokens(None) is None
    assert reported_prompt_tokens(b'{"usage":{"completion_tokens":3}}') is None
    assert reported_prompt_tokens(b'{"usage":{"prompt_tokens": 12,"total_tokens":15}}') == 12


def test_a_prompt_with_an_image_teaches_no_grain():
    # An image part is tokens the text does not tell: the sample would be wrong.
    grain = CharsPerToken(0.3)
    parts = [{"type": "text", "text": "describe " * 100},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    multimodal = shape({"messages": [{"role": "user", "content": parts}]})
    grain.observe(multimodal.text_chars, multimodal.fixed_tokens, 300)
    assert (grain.value, grain.samples) == (4.0, 0)
