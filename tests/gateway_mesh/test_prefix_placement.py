"""The prefix policy: request shapes, learned prefix affinity, size- and window-aware placement,
slower replicas priced pessimistically. Time is a fake clock: nothing here waits or reads the
wall clock."""

from __future__ import annotations

from dataclasses import replace

import pytest
from lobes_gateway.mesh.peers import PooledRole
from lobes_gateway.mesh.replicas import Fingerprint, ProbeResult, ReplicaSet, ReplicaSpec
from lobes_gateway.policy.answer_size import AnswerFill
from lobes_gateway.policy.forecast import PREFILL_SPEEDUP, ReplicaView, forecast
from lobes_gateway.policy.placer import Candidate, Placer
from lobes_gateway.policy.policies import (
    SLOWER_REPLICA_MARGIN,
    PrefixPolicy,
    RatePolicy,
    RouteReason,
)
from lobes_gateway.policy.prefix import (
    BLOCK_CHARS,
    CHARS_PER_TOKEN,
    MAX_CHOICES,
    PrefixAffinity,
    RequestShape,
    request_shape,
)
from lobes_sim.textgen import count_chat_tokens, count_prompt_tokens

from .queue_model import SEED_TOKENS, SPARK, THOR, burst_makespan

A, B = "http://a:8000", "http://b:8000"
PAIR = [Candidate(A, 2), Candidate(B, 2)]
SYSTEM = "You are the fleet's agent; answer with care. " * 360  # ~4k tokens


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def placer(policy=None, priors=None, clock=None) -> Placer:
    return Placer(policy or PrefixPolicy(), priors or {A: 48.9, B: 48.9},
                  clock=clock or Clock())


def chat(*turns: str, max_tokens: int | None = 160) -> dict:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user", "content": turn} for turn in turns]
    payload: dict = {"model": "cortex", "messages": messages}
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    return payload


def shape(payload: dict) -> RequestShape:
    return request_shape(payload, with_blocks=True)


def test_the_prompt_is_estimated_as_the_simulator_counts_it():
    payload = chat("What runs where?", "And why?")
    assert shape(payload).prompt_tokens == count_chat_tokens(payload["messages"])
    text = {"prompt": "x" * 1001, "max_tokens": 5}
    assert shape(text).prompt_tokens == count_prompt_tokens(text["prompt"])
    assert shape({"prompt": [1, 2, 3]}).prompt_tokens == 3


def test_a_growing_conversation_shares_its_leading_blocks_and_another_shares_none():
    first, longer = shape(chat("turn one")), shape(chat("turn one", "turn two"))
    assert longer.blocks[:len(first.blocks) - 1] == first.blocks[:-1]
    other = shape({"messages": [{"role": "system", "content": "Other. " + SYSTEM}]})
    assert not set(other.blocks) & set(first.blocks)
    assert request_shape(chat("turn one"), with_blocks=False).blocks == ()


def test_affinity_is_bounded_keeps_a_prompts_head_longest_and_forgets_a_dark_replica():
    affinity = PrefixAffinity([A], capacity=4)
    affinity.remember(A, RequestShape(blocks=(1, 2, 3)))
    affinity.remember(A, RequestShape(blocks=(7, 8)))
    assert affinity.size(A) == 4
    # The tail, 3, went first.
    assert affinity.cached_chars(A, RequestShape(blocks=(1, 2, 3))) == 2 * BLOCK_CHARS
    # A run counts from the prompt's head.
    assert affinity.cached_chars(A, RequestShape(blocks=(3, 1))) == 0
    affinity.forget(A)
    assert affinity.cached_chars(A, RequestShape(blocks=(7, 8))) == 0


def test_a_conversation_goes_back_to_the_replica_that_holds_its_prefix():
    p = placer()
    p.place([Candidate(B, 2)], request=shape(chat("turn one"))).release()
    again = p.place(PAIR, request=shape(chat("turn one", "turn two")))
    assert again.origin == B
    assert again.reason == RouteReason.EARLIEST_COMPLETION
    # Without the prefix, the tie goes to declaration order.
    assert p.place(PAIR, request=shape({"messages": [{"role": "user", "content": "hi"}]})
                   ).origin == A


def test_a_twin_learned_a_hair_faster_does_not_take_a_conversation_off_its_prefix():
    # Identical replicas whose learned rates differ by noise (0.2%): both hold the system
    # prompt, A also the conversation's first turn (~400 tokens), ~5% sooner there.
    p = placer(priors={A: 48.9, B: 49.0})
    turn_one = "The replica table and the probe results, for the next call. " * 27
    p.place([Candidate(B, 2)], request=shape(chat("another session"))).release()
    p.place([Candidate(A, 2)], request=shape(chat(turn_one))).release()
    assert p.place(PAIR, request=shape(chat(turn_one, "turn two"))).origin == A


def test_a_cached_prefix_shortens_the_forecast_by_its_prefill():
    p = placer()
    request = shape(chat("turn one"))
    cold = p.place([Candidate(A, 2)], request=request)
    warm = p.place([Candidate(A, 2)], request=request)
    saved = cold.forecast.prefill_s - warm.forecast.prefill_s
    held = len(request.blocks) * BLOCK_CHARS / CHARS_PER_TOKEN
    assert saved == pytest.approx(held / (48.9 * PREFILL_SPEEDUP))


def test_load_still_wins_when_the_replica_holding_the_prefix_is_saturated():
    clock = Clock()
    p = placer(clock=clock)
    p.place([Candidate(B, 2)], request=shape(chat("turn one")))
    p.place([Candidate(B, 2)], request=shape(chat("turn one")))  # B's two slots now busy
    later = p.place(PAIR, request=shape(chat("turn one", "turn two")))
    assert later.origin == A
    # The rate policy, which knows nothing of prefixes, makes the same call.
    rate = placer(RatePolicy(), clock=clock)
    rate.place([Candidate(B, 2)], 160)
    rate.place([Candidate(B, 2)], 160)
    assert rate.place(PAIR, 160).origin == A


def test_a_short_answer_is_not_queued_behind_long_ones_on_the_faster_replica():
    # Seed 000's pair: the Spark's two slots hold 1,024-token answers (~21 s left), the Thor
    # is idle: 32 tokens there take ~3 s. The rate policy's waves price the queue at the new
    # request's own 32 tokens and keep it on the Spark.
    priors = {A: 48.9, B: 11.0}
    prefix, rate = placer(priors=priors), placer(RatePolicy(), priors=priors)
    for pool in (prefix, rate):
        pool.place([Candidate(A, 2)], request=RequestShape(10, 1024))
        pool.place([Candidate(A, 2)], request=RequestShape(10, 1024))
    assert prefix.place(PAIR, request=RequestShape(10, 32)).origin == B
    assert rate.place(PAIR, request=RequestShape(10, 32)).origin == A


def test_work_in_flight_counts_down_as_the_clock_runs():
    clock = Clock()
    p = placer(priors={A: 10.0, B: 10.0}, clock=clock)
    p.place([Candidate(A, 1)], request=RequestShape(0, 100))  # 10 s of decode on A's one slot
    assert p.views([Candidate(A, 1)])[0].slot_wait_s() == pytest.approx(10.0)
    clock.now += 4.0
    assert p.views([Candidate(A, 1)])[0].slot_wait_s() == pytest.approx(6.0)
    clock.now += 60.0  # overdue: it still holds the slot, for a little while
    assert 0 < p.views([Candidate(A, 1)])[0].slot_wait_s() < 1.0


def test_a_request_without_max_tokens_is_priced_at_the_learned_answer_length():
    p = placer()
    for _answer in range(30):
        placement = p.place([Candidate(A, 2)], request=RequestShape(10, None))
        placement.record_completion(tokens=40, elapsed_s=1.0)
        placement.release()
    assert p.typical_answer_tokens() == 40
    placement = p.place([Candidate(A, 2)], request=RequestShape(10, None))
    assert placement.forecast.decode_s == pytest.approx(40 / p.rate(A))


def test_a_named_max_tokens_is_priced_at_the_share_of_it_answers_take():
    p = placer()
    asked = RequestShape(10, 4096)
    first = p.place([Candidate(A, 2)], request=asked)
    assert first.forecast.decode_s == pytest.approx(4096 / p.rate(A))  # nothing learned yet
    first.record_completion(tokens=155, elapsed_s=3.0)
    first.release()
    assert p.place([Candidate(A, 2)], request=asked).forecast.decode_s == pytest.approx(
        155 / p.rate(A), rel=0.01)
    # A budget of another size keeps its own share: a label asked exactly is not shortened.
    label = p.place([Candidate(A, 2)], request=RequestShape(10, 32))
    assert label.forecast.decode_s == pytest.approx(32 / p.rate(A))


def test_answers_to_requests_without_max_tokens_teach_no_share_of_one():
    p = placer()
    for _answer in range(5):
        placement = p.place([Candidate(A, 2)], request=RequestShape(10, None))
        placement.record_completion(tokens=40, elapsed_s=1.0)
        placement.release()
    assert p.answer_fill.expected(256) == 256


def test_a_fill_is_learned_per_budget_bucket_and_never_priced_past_max_tokens():
    fill = AnswerFill(smoothing=0.5)
    assert fill.expected(4096) == 4096
    fill.observe(4096, 1024)
    assert fill.expected(4096) == 1024  # the first answer replaces the guess of a full budget
    assert fill.expected(5000) == 1250  # the same bucket (4,096-8,191): the same share
    fill.observe(4096, 0)
    assert fill.expected(4096) == 512  # then an EWMA
    fill.observe(2048, 9000)  # more than asked (a counting error) is a full budget
    assert fill.expected(2048) == 2048
    assert fill.expected(64) == 64


def test_a_request_queued_behind_loose_budgets_teaches_the_replica_its_true_rate():
    # One slot; every request asks max_tokens 4,096 and answers 155 tokens in 3.2 s. Priced
    # at its budget, the request ahead looked 84 s long, so the second request's 6.3 s looked
    # all wait and taught a decode rate twice the true one: the fast replica looked faster
    # still, and seed 000's Thor was left idle (changelogs/benchmark-runs.md, mixed request sizes).
    clock = Clock()
    p = placer(priors={A: 48.9, B: 11.0}, clock=clock)
    answer_s = 155 / 48.9
    asked = RequestShape(10, 4096)
    taught = p.place([Candidate(A, 1)], request=asked)
    clock.now += answer_s
    taught.record_completion(tokens=155, elapsed_s=answer_s)
    taught.release()
    first = p.place([Candidate(A, 1)], request=asked)
    second = p.place([Candidate(A, 1)], request=asked)  # waits for the slot
    for placement, elapsed_s in ((first, answer_s), (second, 2 * answer_s)):
        clock.now += answer_s
        placement.record_completion(tokens=155, elapsed_s=elapsed_s)
        placement.release()
    assert p.rate(A) == pytest.approx(48.9, rel=0.02)


def test_an_answer_that_is_all_decode_teaches_the_decode_rate_alone():
    p = placer(priors={A: 50.0, B: 50.0})
    placement = p.place([Candidate(A, 2)], request=RequestShape(0, 100))
    placement.record_completion(tokens=100, elapsed_s=4.0)
    assert p.rate(A) == pytest.approx(25.0)
    assert p.prefill_rate(A) is None  # nothing was prefilled to learn from


def test_a_streams_decode_rate_is_timed_from_its_first_event_not_from_the_forecast():
    # An 8k-token prompt priced at a guessed prefill (50x decode: 3.2 s) took 0.8 s; its 155
    # tokens then came at 25 tok/s. Split by forecast shares, the time past the forecast
    # taught a decode rate of 47.6 tok/s, near its prior; the stream's own timing says 25.
    p = placer(priors={A: 50.0, B: 50.0})
    placement = p.place([Candidate(A, 2)], request=RequestShape(8000, 155))
    placement.record_completion(tokens=155, elapsed_s=0.8 + 154 / 25.0, first_token_s=0.8)
    assert p.rate(A) == pytest.approx(25.0)
    # It started at once (a slot free, no prefill under way): its first event timed the
    # prefill, 8,000 tokens in 0.8 s.
    assert p.prefill_rate(A) == pytest.approx(10_000)


def test_a_stream_forecast_to_wait_teaches_no_prefill_rate():
    # Its wait is a forecast: overrated (the work ahead ended sooner), it left a prefill too
    # short to be true, which taught seed 000's Spark 2.5x its prefill rate (issue 13).
    p = placer(priors={A: 50.0, B: 50.0})
    p.place([Candidate(A, 1)], request=RequestShape(0, 100))  # 2 s of work ahead
    waited = p.place([Candidate(A, 1)], request=RequestShape(8000, 155))
    assert waited.forecast.wait_s == pytest.approx(2.0)
    waited.record_completion(tokens=155, elapsed_s=0.5 + 154 / 25.0, first_token_s=0.5)
    assert p.rate(A) == pytest.approx(25.0)
    assert p.prefill_rate(A) is None


def test_an_answer_of_several_choices_teaches_no_rate_answer_length_or_share():
    p = placer(priors={A: 50.0, B: 50.0})
    placement = p.place([Candidate(A, 4)], request=RequestShape(10, 100, choices=4))
    placement.record_completion(tokens=400, elapsed_s=2.0, first_token_s=0.1)
    assert p.rate(A) == 50.0
    assert p.typical_answer_tokens() == 256
    assert p.answer_fill.expected(100) == 100


def test_a_request_of_n_choices_holds_n_slots_and_prefills_once():
    p = placer(priors={A: 10.0, B: 10.0})
    p.place([Candidate(A, 4)], request=RequestShape(0, 100, choices=4))
    view = p.views([Candidate(A, 4)])[0]
    assert view.in_flight == 4
    assert view.slot_wait_s() == pytest.approx(10.0)  # every slot busy for its 100 tokens
    p.place([Candidate(B, 4)], request=RequestShape(2500, 100, choices=2))
    assert p.views([Candidate(B, 4)])[0].prefill_left_s == (pytest.approx(5.0), 0.0)


def test_a_request_of_n_choices_waits_for_n_slots_and_decodes_in_waves_beyond_them():
    p = placer(priors={A: 10.0, B: 10.0})
    p.place([Candidate(A, 4)], request=RequestShape(0, 100))  # two slots busy for 10 s
    p.place([Candidate(A, 4)], request=RequestShape(0, 100))
    view = p.views([Candidate(A, 4)])[0]
    assert view.slot_wait_s() == view.slot_wait_s(2) == 0.0
    assert view.slot_wait_s(3) == pytest.approx(10.0)
    idle = p.views([Candidate(B, 4)])[0]
    assert forecast(idle, RequestShape(0, 100, choices=4)).decode_s == pytest.approx(10.0)
    assert forecast(idle, RequestShape(0, 100, choices=6)).decode_s == pytest.approx(20.0)


@pytest.mark.parametrize(("fields", "choices"), [
    ({}, 1), ({"n": 3}, 3), ({"n": 2, "best_of": 5}, 5), ({"n": True}, 1), ({"n": "4"}, 1),
    ({"n": -2}, 1), ({"n": 10**9}, MAX_CHOICES)])
def test_a_requests_choices_are_its_n_or_best_of(fields, choices):
    assert shape({**chat("go"), **fields}).choices == choices


def test_prefill_and_decode_rates_are_learned_apart_from_answers_of_different_mixes():
    # The replica decodes at 20 tok/s and prefills at 1,000: its prior (40) is twice too
    # fast, and the default ratio (50x) prices its prefill at 2,000. Its answers mix long and
    # short prompts and answers; the time each took is all the gateway sees.
    p = placer(priors={A: 40.0, B: 40.0})
    mixes = [RequestShape(0, 64), RequestShape(4000, 64), RequestShape(1000, 256),
             RequestShape(8000, 32)]
    for i in range(80):
        request = mixes[i % len(mixes)]
        placement = p.place([Candidate(A, 2)], request=request)
        took = request.prompt_tokens / 1000 + (request.max_tokens or 0) / 20
        placement.record_completion(tokens=request.max_tokens or 0, elapsed_s=took)
        placement.release()
    assert p.rate(A) == pytest.approx(20.0, rel=0.05)
    assert p.prefill_rate(A) == pytest.approx(1000.0, rel=0.1)
    long_prompt = p.place([Candidate(A, 2)], request=RequestShape(4000, 64))
    assert long_prompt.forecast.prefill_s == pytest.approx(4.0, rel=0.1)


def test_a_replica_with_a_pessimistic_prior_waits_for_a_queue_it_beats_then_is_measured():
    # B's prior is ten times too low: priced at it (and pessimistically), its 100 tokens take
    # 27.8 s, A's waves 2.5 s each. Nothing goes to B on a guess that it may be faster: only
    # once A's queue would finish the request later than B so priced (a 12th wave, 30 s).
    p = placer(priors={A: 40.0, B: 4.0})
    placed = [p.place(PAIR, request=RequestShape(0, 100)) for _request in range(23)]
    assert [x.origin for x in placed] == [A] * 22 + [B]
    assert placed[-1].forecast.completion_s / (1 - SLOWER_REPLICA_MARGIN) <= 12 * 2.5
    placed[-1].record_completion(tokens=100, elapsed_s=2.0)
    assert p.rate(B) == pytest.approx(50.0)  # the answer replaced the prior


def windowed_pool(windows: dict[str, int]) -> PooledRole:
    specs = tuple(ReplicaSpec(origin) for origin in windows)
    replicas = ReplicaSet("cortex", specs)
    replicas.apply_pass({o: ProbeResult(ready=True, fingerprint=Fingerprint("m", window))
                         for o, window in windows.items()}, now=1.0)
    return PooledRole("cortex", replicas, placer(), 2)


def test_a_request_goes_only_where_its_prompt_and_max_tokens_fit():
    pool = windowed_pool({A: 8192, B: 262144})
    long = RequestShape(prompt_tokens=8000, max_tokens=500)
    assert [c.origin for c in pool.candidates(set(), long)] == [B]
    assert [c.origin for c in pool.candidates(set(), RequestShape(100, 500))] == [A, B]
    assert [c.origin for c in pool.candidates(set(), RequestShape(8192, None))] == [B]
    assert pool.too_long(long) is None
    assert pool.failover({B}, long) is None  # the small replica is never a failover target


def test_a_request_that_fits_no_replica_is_a_400_naming_the_largest_window():
    pool = windowed_pool({A: 8192, B: 32768})
    error = pool.too_long(RequestShape(prompt_tokens=30000, max_tokens=4096))
    assert error is not None
    assert (error.status, error.code) == (400, "context_length_exceeded")
    assert "pool serves is 32768 tokens" in error.message and "lower max_tokens" in error.message


def burst_placement(policy, size: int) -> list[str]:
    p = Placer(policy, {"spark": 48.9, "thor": 11.0}, clock=Clock())
    candidates = [Candidate("spark", 2), Candidate("thor", 2)]
    return [p.place(candidates, request=RequestShape(8, SEED_TOKENS)).origin
            for _request in range(size)]


@pytest.mark.parametrize("size", range(1, 17))
def test_prefix_placement_is_never_slower_than_rate_placement_on_a_burst(size):
    # Seed 000's pair and burst, in the queue model: the prefix policy's per-request pricing
    # never costs makespan against the rate policy's waves.
    replicas = {"spark": SPARK, "thor": THOR}
    prefix = burst_makespan(burst_placement(PrefixPolicy(), size), replicas, SEED_TOKENS)
    rate = burst_makespan(burst_placement(RatePolicy(), size), replicas, SEED_TOKENS)
    assert prefix <= rate * 1.0001


def test_a_queued_prefill_holds_up_every_busy_slot_of_the_replica():
    # Two slots; three requests of 0.8 s prefill + 1.4 s decode. The second's prefill stalls
    # the first (an engine step prefills before it decodes), the third's stalls the first
    # again: a slot frees at 3.8 s, not at the 2.2 s that independent slots would give.
    busy = ReplicaView(A, 0, slots=2, in_flight=3, rate=48.9, work_s=(2.2, 2.2, 2.2),
                       prefill_left_s=(0.8, 0.8, 0.8))
    assert busy.slot_wait_s() == pytest.approx(3.8)
    decoding = ReplicaView(A, 0, slots=2, in_flight=3, rate=48.9, work_s=(2.2, 2.2, 2.2),
                           prefill_left_s=(0.0, 0.0, 0.0))
    assert decoding.slot_wait_s() == pytest.approx(2.2)


def test_a_replica_still_prefilling_is_not_free_with_a_slot_open():
    # One of two slots runs a request with 0.8 s of prefill left: a request placed now
    # starts its own prefill once that one is done (the engine's step prefills it first).
    prefilling = ReplicaView(A, 0, slots=2, in_flight=1, rate=48.9, work_s=(2.2,),
                             prefill_left_s=(0.8,))
    assert prefilling.slot_wait_s() == pytest.approx(0.8)
    decoding = replace(prefilling, prefill_left_s=(0.0,))
    assert decoding.slot_wait_s() == 0.0


def test_the_prefill_under_way_holds_up_the_slots_decoding_beside_it():
    # Both slots busy: the second request's 0.8 s of prefill left stalls the first one's
    # decode (1.0 s left), so the first slot frees at 1.8 s, not at 1.0 s.
    busy = ReplicaView(A, 0, slots=2, in_flight=2, rate=48.9, work_s=(1.0, 2.2),
                       prefill_left_s=(0.0, 0.8))
    assert busy.slot_wait_s() == pytest.approx(1.8)


def test_four_sessions_first_turns_split_two_and_two_over_a_pair_of_two_slots():
    # Issue 13's added scenario: 4 agent sessions over one ~4k-token system prompt start at
    # once on two identical 2-slot replicas. A holds the prompt after the first turn is
    # sent, but it is still prefilling it: a second turn there would wait for that prefill
    # and then some, where B prefills it at once. Priced as free, A took three of the four
    # turns, the third waiting a whole turn for a slot while B had one open.
    p = placer()
    turns = [shape(chat(f"session {i}", max_tokens=64)) for i in range(4)]
    placed = [p.place(PAIR, request=turn).origin for turn in turns]
    assert sorted(placed) == [A, A, B, B]


def test_a_placed_requests_prefill_left_counts_down_once_it_starts():
    clock = Clock()
    p = placer(priors={A: 10.0, B: 10.0}, clock=clock)
    first = p.place([Candidate(A, 1)], request=RequestShape(5000, 10))
    second = p.place([Candidate(A, 1)], request=RequestShape(5000, 10))
    prefill = first.forecast.prefill_s
    assert prefill == pytest.approx(5000 / (10.0 * PREFILL_SPEEDUP))
    assert second.prefill_left_s(clock.now) == pytest.approx(prefill)  # waits: all of it
    clock.now += prefill / 2
    assert first.prefill_left_s(clock.now) == pytest.approx(prefill / 2)
    assert second.prefill_left_s(clock.now) == pytest.approx(prefill)


def test_a_first_burst_goes_to_the_slower_replica_only_where_it_finishes_no_later():
    # Sessions over a shared 4k system prompt start at once on seed 000's pair; nothing is
    # measured yet. A holds the prompt after the first; the Thor would prefill all of it at
    # a guessed rate (~15 s for a turn, priced pessimistically, against the Spark's waves of
    # ~1.3 s). A request goes there only when, so priced, it finishes there no later than
    # queued on the Spark: not in the first 8, and some of 32.
    p = placer(priors={A: 48.9, B: 11.0})
    burst = [p.priced(shape(chat(f"session {i}", max_tokens=64))) for i in range(32)]
    origins = []
    for request in burst:
        views = {view.origin: view for view in p.views(PAIR, request)}
        placed = p.place(PAIR, request=request)
        origins.append(placed.origin)
        if placed.origin == B:
            thor = forecast(views[B], request).completion_s / (1 - SLOWER_REPLICA_MARGIN)
            assert thor <= forecast(views[A], request).completion_s
        assert placed.reason == RouteReason.EARLIEST_COMPLETION
    assert origins[:8] == [A] * 8 and B in origins


def test_a_slower_replica_gets_nothing_while_the_fastest_has_a_free_slot():
    # Measured or not, the Spark with a free slot serves the request at once: the Thor
    # could not serve it sooner.
    p = placer(priors={A: 48.9, B: 11.0})
    for _request in range(24):
        placed = p.place(PAIR, request=RequestShape(0, 64))
        assert placed.origin == A
        placed.record_completion(tokens=64, elapsed_s=1.3)
        placed.release()
