"""Placement: in-flight accounting, the three policies, rate learning and the ECT property."""

import asyncio

import pytest
from lobes_contract import POOL_POLICIES
from lobes_gateway.policy.placer import Candidate, Placer
from lobes_gateway.policy.policies import (
    POLICIES,
    PinnedPolicy,
    PrefixPolicy,
    QueuePolicy,
    RatePolicy,
    RouteReason,
    policy_named,
)

from .queue_model import SEED_TOKENS, SPARK, THOR, burst_makespan

A, B = "http://a:8000", "http://b:8000"
PAIR = [Candidate(A, 2), Candidate(B, 2)]


def placer(policy, priors=None):
    return Placer(policy, priors or {A: None, B: None})


def test_concurrent_placements_spread_across_replicas():
    p = placer(RatePolicy())
    seen = []

    async def request():
        with p.place(PAIR) as placement:
            seen.append(placement.origin)
            await asyncio.sleep(0.01)

    async def burst():
        await asyncio.gather(*(request() for _ in range(4)))

    asyncio.run(burst())
    assert sorted(seen) == [A, A, B, B]
    assert p.in_flight(A) == p.in_flight(B) == 0


@pytest.mark.parametrize("policy", [RatePolicy(), QueuePolicy()])
def test_simultaneous_acquires_do_not_all_pick_one_replica(policy):
    p = placer(policy)
    held = [p.place(PAIR) for _ in range(4)]
    assert {h.origin for h in held} == {A, B}
    assert p.in_flight(A) == 2 and p.in_flight(B) == 2


def test_a_released_dispatch_stops_counting_against_its_replica():
    p = placer(QueuePolicy())
    first = p.place(PAIR)
    assert first.origin == A and p.in_flight(A) == 1
    first.release()
    first.release()
    assert p.in_flight(A) == 0
    assert p.place(PAIR).origin == A


def test_the_context_manager_releases_when_the_dispatch_fails():
    p = placer(RatePolicy())
    with pytest.raises(ConnectionRefusedError), p.place(PAIR):
        raise ConnectionRefusedError
    assert p.in_flight(A) == p.in_flight(B) == 0


def test_queue_policy_skips_a_full_replica_and_returns_none_when_all_are_full():
    p = placer(QueuePolicy())
    reasons = [p.place(PAIR).reason for _ in range(3)]
    assert reasons == [RouteReason.PEER_LESS_LOADED] * 2 + [RouteReason.PEER_LESS_LOADED]
    fourth = p.place(PAIR)
    assert fourth.reason == RouteReason.SOLE_READY
    assert p.place(PAIR) is None


def test_queue_policy_ties_break_by_origin():
    p = placer(QueuePolicy(), {B: None, A: None})
    assert p.place([Candidate(B, 2), Candidate(A, 2)]).origin == A


def test_pinned_policy_always_takes_the_first_declared_replica():
    p = placer(PinnedPolicy(), {B: None, A: None})
    placements = [p.place([Candidate(A, 2), Candidate(B, 2)]) for _ in range(5)]
    assert {x.origin for x in placements} == {B}
    assert placements[0].reason == RouteReason.PINNED


def test_a_single_candidate_is_sole_ready_and_no_candidate_places_nothing():
    for policy in (RatePolicy(), QueuePolicy(), PinnedPolicy()):
        p = placer(policy)
        assert p.place([Candidate(B, 2)]).reason == RouteReason.SOLE_READY
        assert p.place([]) is None


def test_rate_policy_queues_on_a_fast_replica_while_it_still_finishes_first():
    p = placer(RatePolicy(), {A: 48.9, B: 11.0})
    origins = [p.place(PAIR, 155).origin for _ in range(10)]
    assert origins[:8] == [A] * 8
    assert origins[8:] == [B, B]
    assert p.place(PAIR).reason == RouteReason.EARLIEST_COMPLETION


def test_expected_completion_counts_waves_over_slots():
    (view,) = placer(RatePolicy(), {A: 50.0, B: None}).views([Candidate(A, 2)])
    assert view.expected_completion_s(100) == 2.0
    p = placer(RatePolicy(), {A: 50.0, B: None})
    p.place([Candidate(A, 2)])
    p.place([Candidate(A, 2)])
    (view,) = p.views([Candidate(A, 2)])
    assert view.expected_completion_s(100) == 4.0


def test_an_unknown_rate_borrows_the_best_known_rate():
    p = placer(RatePolicy(), {A: 40.0, B: None})
    assert [v.rate for v in p.views(PAIR)] == [40.0, 40.0]
    origins = [p.place(PAIR).origin for _ in range(4)]
    assert sorted(origins) == [A, A, B, B]


def test_no_rate_known_anywhere_places_like_equal_rates():
    p = placer(RatePolicy())
    assert [v.rate for v in p.views(PAIR)] == [1.0, 1.0]


def test_completed_responses_teach_the_rate_from_its_prior():
    p = placer(RatePolicy(), {A: 10.0, B: 10.0})
    placement = p.place(PAIR, 100)
    placement.record_completion(tokens=100, elapsed_s=2.0)
    placement.release()
    assert p.rate(A) == pytest.approx(10.0 + 0.3 * (50.0 - 10.0))


def test_a_continuation_teaches_its_own_rate_and_the_whole_answers_length():
    """A resumed stream's last part: its replica's rate from the part's tokens in the part's
    time; the pool's typical answer from the whole answer the client got."""
    p = placer(RatePolicy(), {A: 10.0, B: 10.0})
    before = p.typical_answer_tokens()
    continuation = p.place(PAIR, 40)
    continuation.record_completion(tokens=40, elapsed_s=2.0, answer_tokens=120)
    continuation.release()
    assert p.rate(A) == pytest.approx(10.0 + 0.3 * (20.0 - 10.0))
    assert p.typical_answer_tokens() == round(before + 0.3 * (120 - before))


def test_a_queued_completion_is_corrected_for_the_waves_ahead_of_it():
    p = placer(RatePolicy(), {A: None, B: None})
    single = [Candidate(A, 1)]
    p.place(single)
    queued = p.place(single)
    assert queued.waves_at_dispatch == 2
    queued.record_completion(tokens=100, elapsed_s=4.0)
    assert p.rate(A) == 50.0


def test_learning_moves_traffic_off_a_replica_that_turned_slow():
    p = placer(RatePolicy(), {A: 50.0, B: 40.0})
    first = p.place(PAIR)
    assert first.origin == A
    first.release()
    for _ in range(10):
        placement = p.place([Candidate(A, 2)])
        placement.record_completion(tokens=100, elapsed_s=10.0)
        placement.release()
    assert p.rate(A) < 40.0
    assert p.place(PAIR).origin == B


def test_empty_or_nonsense_completions_teach_nothing():
    p = placer(RatePolicy(), {A: 10.0, B: None})
    placement = p.place([Candidate(A, 2)])
    placement.record_completion(tokens=0, elapsed_s=1.0)
    placement.record_completion(tokens=5, elapsed_s=0.0)
    assert p.rate(A) == 10.0


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        (None, PrefixPolicy),
        ("", PrefixPolicy),
        ("prefix", PrefixPolicy),
        ("rate", RatePolicy),
        ("Queue", QueuePolicy),
        ("pinned", PinnedPolicy),
    ],
)
def test_policy_is_selected_by_name_with_prefix_the_default(name, cls):
    assert isinstance(policy_named(name), cls)


def test_the_gateway_implements_exactly_the_policies_the_contract_names():
    # The collection validates fleet_gateway_pool_policy against the contract's names.
    assert set(POLICIES) == set(POOL_POLICIES)


def test_an_unknown_policy_names_the_variable_and_choices():
    with pytest.raises(ValueError,
                       match=r"GATEWAY_POOL_POLICY='fastest'.*prefix, rate, queue, pinned"):
        policy_named("fastest")


# The ECT property on seed 000's pair (Spark 48.9 tok/s, Thor 11.0, 2 slots each). A request
# the policy cannot place falls through to the singular peer, the Spark, as in seed 000.

SEED_REPLICAS = {"spark": SPARK, "thor": THOR}


def place_burst(policy, size):
    p = Placer(policy, {"spark": 48.9, "thor": 11.0})
    candidates = [Candidate("spark", 2), Candidate("thor", 2)]
    placements = [p.place(candidates, SEED_TOKENS) for _ in range(size)]
    return ["spark" if x is None else x.origin for x in placements]


def makespan(policy, size):
    return burst_makespan(place_burst(policy, size), SEED_REPLICAS, SEED_TOKENS)


@pytest.mark.parametrize("size", [4, 8, 16])
def test_rate_placement_is_never_slower_than_pinned_to_the_fast_replica(size):
    assert makespan(RatePolicy(), size) <= makespan(PinnedPolicy(), size)


def test_rate_placement_beats_pinned_once_the_fast_queue_outgrows_the_slow_replica():
    assert place_burst(RatePolicy(), 16).count("thor") == 2
    assert makespan(RatePolicy(), 16) < 0.9 * makespan(PinnedPolicy(), 16)


@pytest.mark.parametrize("size", [4, 8])
def test_queue_depth_placement_is_slower_than_pinned_the_regression_rate_fixes(size):
    assert makespan(QueuePolicy(), size) > makespan(PinnedPolicy(), size)


def test_the_queue_model_reproduces_seed_000():
    assert makespan(PinnedPolicy(), 4) == pytest.approx(7.08, rel=0.02)
    assert makespan(PinnedPolicy(), 8) == pytest.approx(14.03, rel=0.02)
    assert makespan(QueuePolicy(), 4) == pytest.approx(14.47, rel=0.02)
    assert place_burst(QueuePolicy(), 8).count("spark") == 6


def test_a_near_tie_stays_on_the_faster_replica():
    # Spark at 40 tok/s with 6 queued: 4 waves x 155/40 = 15.5 s; one request alone on Thor at
    # 11 tok/s: 14.1 s, 9% sooner. Within the margin, the burst stays on the faster replica.
    p = Placer(RatePolicy(), {"spark": 40.0, "thor": 11.0})
    candidates = [Candidate("spark", 2), Candidate("thor", 2)]
    origins = [p.place(candidates, SEED_TOKENS).origin for _ in range(8)]
    assert origins == ["spark"] * 8


def test_a_slower_replica_wins_when_it_finishes_clearly_sooner():
    # The 9th request would wait 5 waves on Spark (19.4 s): Thor's 14.1 s is 27% sooner.
    p = Placer(RatePolicy(), {"spark": 40.0, "thor": 11.0})
    candidates = [Candidate("spark", 2), Candidate("thor", 2)]
    origins = [p.place(candidates, SEED_TOKENS).origin for _ in range(9)]
    assert origins == ["spark"] * 8 + ["thor"]


@pytest.mark.parametrize("policy", [RatePolicy(), QueuePolicy()])
def test_a_replica_busy_with_other_boxes_work_is_not_taken_for_idle(policy):
    p = placer(policy)
    p.note_load(A, 2)  # its probe: two requests from elsewhere fill A's two slots
    assert p.place(PAIR).origin == B


def test_this_boxes_own_dispatches_are_not_counted_twice_as_probed_load():
    p = placer(QueuePolicy())
    mine = p.place(PAIR)
    p.note_load(mine.origin, 1)  # the probe saw only this box's own request
    assert p.external_load(mine.origin) == 0
    p.note_load(mine.origin, 3)
    assert p.external_load(mine.origin) == 2


@pytest.mark.parametrize("policy", [RatePolicy(), QueuePolicy(), PrefixPolicy()])
def test_own_requests_that_ended_during_a_probe_are_not_taken_for_other_boxes_work(policy):
    now = [100.0]
    p = Placer(policy, {A: 48.9, B: 48.9}, clock=lambda: now[0])
    mine = [p.place([Candidate(A, 2)]) for _request in range(2)]
    probe_started = now[0]
    now[0] += 0.05
    for placement in mine:  # both end after the probe read A's load, before it is noted
        placement.release()
    p.note_load(A, 2, probe_started)
    assert p.external_load(A) == 0
    assert p.place(PAIR).origin == A  # free, and first in declaration order
    p.note_load(A, 3, now[0] + 0.01)  # a later probe sees three, the one just placed ours
    assert p.external_load(A) == 2


def test_other_boxes_running_work_is_aged_from_its_probe_and_gone_when_forecast_done():
    now = [100.0]
    p = Placer(QueuePolicy(), {A: 25.6, B: 25.6}, clock=lambda: now[0])
    p.note_load(A, 2, probed_at=99.0)  # two of another box's typical answers: 10 s each
    # Seen half done a second ago: 4 s left, and A full until then.
    assert p.external_ends_in_s(PAIR) == pytest.approx(4.0)
    assert [v.in_flight for v in p.views(PAIR)] == [2, 0]
    assert p.place(PAIR).origin == B
    now[0] += 4.01
    assert p.external_ends_in_s(PAIR) is None
    assert p.place(PAIR).origin == A  # free again without a new probe


def test_other_boxes_waiting_work_runs_through_the_slots_after_the_running():
    now = [100.0]
    p = Placer(RatePolicy(), {A: 25.6, B: 25.6}, clock=lambda: now[0])
    p.note_load(A, 5)  # on 2 slots: 2 running (5 s left), then 2, then 1 (10 s each)
    in_flight = []
    for elapsed in (0.0, 5.5, 15.5, 25.5):
        now[0] = 100.0 + elapsed
        view = p.views([Candidate(A, 2)])[0]
        in_flight.append((view.in_flight, p.external_ends_in_s([Candidate(A, 2)])))
    assert in_flight == [(5, pytest.approx(5.0)), (3, pytest.approx(9.5)),
                         (1, pytest.approx(9.5)), (0, None)]
    assert p.views([Candidate(A, 2)])[0].work_s == ()


def test_a_peer_that_stops_reporting_load_is_no_longer_counted_busy():
    p = placer(QueuePolicy())
    p.note_load(A, 2)
    p.note_load(A, None)
    assert p.place(PAIR).origin == A
