"""Automatic prefix caching: cached leading blocks skip their prefill, counted as vLLM counts."""

from __future__ import annotations

import pytest
from lobes_sim.prefix_cache import BLOCK_SIZE, PrefixCache, PromptBlocks, block_hashes
from lobes_sim.textgen import answer_token_units, chat_token_units, count_chat_tokens

from .client import post, stream
from .test_engine import metrics

CHAT = "/v1/chat/completions"
# 16,000 characters: 4,000 content tokens, with the template's 8 a 4,008-token prompt.
SYSTEM = "You are the fleet's agent. " * 593


def conversation(*turns: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SYSTEM}]
    return messages + [{"role": "user", "content": turn} for turn in turns]


def test_token_units_count_what_the_window_check_counts():
    messages = [*conversation("first"), {"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]}]
    assert len(chat_token_units(messages)) == count_chat_tokens(messages)


def test_blocks_are_chained_so_a_block_matches_only_behind_an_equal_prefix():
    first = block_hashes(chat_token_units(conversation("a question")))
    longer = block_hashes(chat_token_units(conversation("a question", "and another")))
    other = block_hashes(chat_token_units([{"role": "system", "content": "Other. " + SYSTEM}]))
    shared = len(chat_token_units(conversation())) // BLOCK_SIZE
    assert longer[:shared] == first[:shared]
    assert not set(other) & set(first)


def test_beyond_its_capacity_the_cache_forgets_the_oldest_prompt_tail_first():
    cache = PrefixCache(capacity_blocks=4)
    old, new = (1, 2, 3), (4, 5)
    cache.admit(old, 48)
    cache.admit(new, 40)
    assert cache.admit(new, 40) == 2 * BLOCK_SIZE
    assert cache.admit(old, 48) == 2 * BLOCK_SIZE  # block 3, the old tail, went first
    assert (cache.queries_total, cache.hits_total) == (48 + 40 + 40 + 48, 4 * BLOCK_SIZE)


def test_a_fully_cached_prompt_still_computes_its_last_token_and_hits_whole_blocks():
    cache = PrefixCache(capacity_blocks=8)
    cache.admit((7, 8), 32)
    # Its last token is computed, and a hit counts whole blocks: the second block is read again.
    assert cache.admit((7, 8), 32) == 16
    assert cache.admit((7, 8), 33) == 32


def test_hits_count_blocks_of_the_caches_own_size():
    cache = PrefixCache(capacity_blocks=8, block_size=128)
    cache.admit((1, 2, 3), 300)
    assert cache.admit((1, 2, 3), 300) == 256
    assert cache.admit((1,), 127) == 0


def test_a_repeated_prompt_is_served_from_the_cache_and_counted(sim_factory):
    sim = sim_factory("spark-cortex", time_scale=20)
    payload = {"messages": conversation("What runs where?"), "max_tokens": 2}
    prompt = post(sim.url, CHAT, payload).json()["usage"]["prompt_tokens"]
    cold = metrics(sim.url)
    assert cold["vllm:prefix_cache_queries_total"] == prompt
    assert cold["vllm:prefix_cache_hits_total"] == 0
    post(sim.url, CHAT, payload)
    warm = metrics(sim.url)
    assert warm["vllm:prefix_cache_queries_total"] == 2 * prompt
    assert warm["vllm:prefix_cache_hits_total"] == prompt // BLOCK_SIZE * BLOCK_SIZE
    assert warm["vllm:prompt_tokens_total"] == 2 * prompt  # vLLM counts every prompt token


def test_a_growing_conversation_hits_its_earlier_turns(sim_factory):
    sim = sim_factory("instant")
    post(sim.url, CHAT, {"messages": conversation("turn one"), "max_tokens": 2})
    post(sim.url, CHAT, {"messages": conversation("turn one", "turn two"), "max_tokens": 2})
    hits = metrics(sim.url)["vllm:prefix_cache_hits_total"]
    system_blocks = (len(chat_token_units(conversation())) - 2) // BLOCK_SIZE
    assert hits >= system_blocks * BLOCK_SIZE


@pytest.mark.timing  # simulated seconds: a cache hit skips 1.5 s of the 4k prompt's prefill
def test_a_cached_4k_prompt_answers_its_first_token_sooner(sim_factory):
    scale = 10
    sim = sim_factory("spark-cortex", time_scale=scale)
    payload = {"messages": conversation("What runs where?"), "max_tokens": 2}
    cold = stream(sim.url, CHAT, payload)
    warm = stream(sim.url, CHAT, payload)
    assert cold.first_event_s is not None and warm.first_event_s is not None
    # Uncached: 0.06 + 0.00037 x 4,013 + one 20 ms step = 1.56 s, the GB10's 4k prefill.
    assert 1.56 * 0.9 <= cold.first_event_s * scale <= 1.56 * 1.3
    assert warm.first_event_s * scale < 0.5


def test_with_prefill_free_an_uncached_4k_prompt_answers_as_fast_as_a_cached_one(sim_factory):
    # --prefill-scale 0: the bound on what any prefix caching (or affinity) could save.
    scale = 10
    sim = sim_factory("spark-cortex", time_scale=scale, extra_args=["--prefill-scale", "0"])
    payload = {"messages": conversation("What runs where?"), "max_tokens": 2}
    cold = stream(sim.url, CHAT, payload)
    assert cold.first_event_s is not None
    assert cold.first_event_s * scale < 0.5  # one 20 ms step, not 1.56 s of prefill
    assert metrics(sim.url)["vllm:prefix_cache_hits_total"] == 0  # and uncached it was


def test_the_next_turn_finds_the_answer_it_carries_cached(sim_factory):
    """vLLM caches the full blocks of the output too: a next turn that carries the answer as
    an assistant message reads its prompt and the answer from the cache."""
    sim = sim_factory("instant")
    first = conversation("turn one")
    answer = post(sim.url, CHAT, {"messages": first, "max_tokens": 64, "ignore_eos": True})
    text = answer.json()["choices"][0]["message"]["content"]
    before = metrics(sim.url)["vllm:prefix_cache_hits_total"]
    second = [*first, {"role": "assistant", "content": text}, {"role": "user", "content": "two"}]
    post(sim.url, CHAT, {"messages": second, "max_tokens": 2})
    hits = metrics(sim.url)["vllm:prefix_cache_hits_total"] - before
    sequence = len(chat_token_units(first)) + len(answer_token_units(text))
    assert hits == sequence // BLOCK_SIZE * BLOCK_SIZE
    assert hits > (len(chat_token_units(first)) // BLOCK_SIZE + 2) * BLOCK_SIZE


def test_an_answer_reread_with_other_words_misses_from_there():
    blocks = PromptBlocks.of(chat_token_units(conversation("turn one")))
    kept = blocks.with_output(answer_token_units(" the model answers" * 20))
    cache = PrefixCache(capacity_blocks=4096)
    cache.keep(kept)
    other = [*conversation("turn one"), {"role": "assistant", "content": " other words" * 30}]
    reread = block_hashes(chat_token_units(other))
    assert cache.admit(reread, len(reread) * BLOCK_SIZE) == len(blocks.hashes) * BLOCK_SIZE


def test_a_coarser_tokenizer_counts_fewer_prompt_tokens(sim_factory):
    """--chars-per-token sets the stand-in tokenizer's grain (the gateway must learn it)."""
    fine = sim_factory("instant")
    coarse = sim_factory("instant", extra_args=["--chars-per-token", "6"])
    payload = {"messages": conversation("What runs where?"), "max_tokens": 2}
    counted = [post(s.url, CHAT, payload).json()["usage"]["prompt_tokens"] for s in (fine, coarse)]
    assert counted == [count_chat_tokens(payload["messages"]),
                       count_chat_tokens(payload["messages"], chars=6)]
    assert counted[1] < counted[0] * 0.7
