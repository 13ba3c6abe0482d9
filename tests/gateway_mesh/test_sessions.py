"""Sessions in placement (policy/sessions.py): conversations followed from their prompts, the
closed-loop model of a replica's bound sessions, and the prefix policy pricing a turn with
what its session adds to the sessions where it goes. Time is a fake clock."""

from __future__ import annotations

import pytest
from lobes_gateway.mesh.peers import PooledRole
from lobes_gateway.mesh.pool_queue import PoolQueue
from lobes_gateway.mesh.replicas import Fingerprint, ProbeResult, ReplicaSet, ReplicaSpec
from lobes_gateway.policy.admission import STANDARD, Ticket
from lobes_gateway.policy.placer import Candidate, Placer
from lobes_gateway.policy.policies import PrefixPolicy
from lobes_gateway.policy.prefix import RequestShape, request_shape
from lobes_gateway.policy.sessions import (
    DEFAULT_THINK_S,
    EXPIRY_THINK_TIMES,
    MAX_QUEUED_S,
    MAX_ROUNDS_AHEAD,
    MAX_THINKING,
    Conversations,
    TurnCost,
    join_cost_s,
    response_s,
)

A, B = "http://spark:8000", "http://thor:8000"
SYSTEM = "You are the fleet's agent; answer with care. " * 360  # ~4k tokens, shared


def chat(session: int, turns: int, short: bool = False) -> RequestShape:
    """Session `session`'s prompt at its turn `turns`: every earlier question and answer."""
    messages = [{"role": "system", "content": SYSTEM}]
    for number in range(turns):
        if number:
            messages.append({"role": "assistant", "content": f"Answer {number}. " * 20})
        question = "ok" if short else f"Session {session}, step {number}: the tool output. " * 30
        messages.append({"role": "user", "content": question})
    return request_shape({"model": "cortex", "messages": messages, "max_tokens": 64}, True)


# --- the closed-loop model -------------------------------------------------------------

def test_one_session_alone_takes_its_turns_time_and_two_queue_by_mean_value_analysis():
    turn = TurnCost(engine_s=2.0, overlap_s=1.0)
    assert response_s(turn, think_s=10.0, sessions=1) == pytest.approx(3.0)
    # Exact MVA, n = 2: the other session is at the engine 2 / (2 + 1 + 10) of its cycle.
    assert response_s(turn, 10.0, 2) == pytest.approx(2.0 * (1 + 2.0 / 13.0) + 1.0)
    assert join_cost_s(turn, 10.0, 0) == pytest.approx(3.0)


def test_a_saturated_replica_answers_as_its_sessions_queue_and_each_one_more_costs_more():
    turn = TurnCost(engine_s=1.0, overlap_s=0.5)
    # Far past saturation a round is every session's engine time: R = n x E - think.
    assert response_s(turn, 5.0, 60) == pytest.approx(60 * 1.0 - 5.0 + 0.5, rel=0.01)
    costs = [join_cost_s(turn, 5.0, n) for n in range(20)]
    assert costs == sorted(costs)
    assert costs[-1] > 10 * costs[0]


def test_sessions_joined_by_their_cost_split_seed_000s_pair_as_the_measured_sweep_did():
    # Tool-output turns (2,000 new tokens, 64-token answers, 10 s tool calls) on seed 000's
    # Spark (prefill 2,575 tok/s, 48.9 tok/s a stream) and Thor (1,000, 11.0), two slots
    # each. Static splits measured 12.05 s p50 with none on the Thor, 5.97 s with four at
    # 1.24x the throughput, 5.14 s with five at 0.95x (changelogs/benchmark-runs.md).
    def turn(prefill_rate: float, rate: float) -> TurnCost:
        decode_s = 64 / rate
        return TurnCost(2000 / prefill_rate + decode_s / 2, decode_s / 2)

    turns = {"spark": turn(2575, 48.9), "thor": turn(1000, 11.0)}
    on = {"spark": 0, "thor": 0}
    while sum(on.values()) < 16:
        cheaper = min(on, key=lambda name: join_cost_s(turns[name], 10.0, on[name]))
        on[cheaper] += 1
    assert on == {"spark": 12, "thor": 4}


# --- conversations ---------------------------------------------------------------------

def test_a_turn_that_begins_with_the_last_prompt_continues_its_conversation():
    sessions = Conversations(smoothing=0.3)
    key = sessions.placed(chat(1, 1), A, now=0.0)
    assert sessions.continued(chat(1, 2)) is None  # its first turn still runs
    sessions.ended(key, now=1.0)
    found = sessions.continued(chat(1, 2))
    assert found is not None and found[1].origin == A
    assert sessions.continued(chat(2, 2)) is None  # another session: only the system prompt
    sessions.placed(chat(1, 2), B, now=11.0)
    assert sessions.think_s() == pytest.approx(10.0)
    assert sessions.bound(B) == 1 and sessions.bound(A) == 0  # established where it went


def test_first_turns_count_where_they_went_as_many_as_first_turns_go_on():
    sessions = Conversations(smoothing=0.3)
    sessions.ended(sessions.placed(chat(1, 1), A, now=0.0), now=1.0)
    second = sessions.placed(chat(2, 1), B, now=1.0)  # a first turn, running on B
    assert sessions.bound(B) == 0  # no first turn went on yet: one-off prompts, for all we know
    sessions.placed(chat(1, 2), A, now=3.0)  # one did: a first turn is a session in the making
    assert (sessions.bound(A), sessions.bound(B)) == (1, 1)
    sessions.ended(second, now=4.0)
    own = sessions.continued(chat(2, 2))[1]
    assert sessions.bound(B, excluding=own) == 0  # its own turn does not count against it
    sessions.placed(chat(2, 2), B, now=5.0)
    # Two more first turns on B, and one first turn that is never continued: two of three
    # first turns went on, so one of B's two new ones counts, beside its session.
    for session in (3, 4):
        sessions.placed(chat(session, 1), B, now=5.0)
    sessions.ended(sessions.placed(chat(5, 1), A, now=5.0), now=5.0)
    sessions.expire(now=5.0 + EXPIRY_THINK_TIMES * sessions.think_s() + 0.1)
    assert sessions.continued(chat(5, 2)) is None
    assert (sessions.bound(A), sessions.bound(B)) == (1, 2)


def test_a_turn_asked_about_again_is_searched_once_until_the_conversations_change(
        monkeypatch):
    sessions = Conversations(smoothing=0.3)
    sessions.ended(sessions.placed(chat(1, 1), A, now=0.0), now=1.0)
    searched = []
    search = sessions._find_continued
    monkeypatch.setattr(sessions, "_find_continued",
                        lambda request: searched.append(request) or search(request))
    turn = chat(1, 2)
    # Arrival, pricing and placement ask about the same turn: one search.
    sessions.returned(turn, now=5.0)
    assert sessions.continued(turn)[1].origin == A
    assert len(searched) == 1
    # Another turn is searched for itself.
    other = chat(2, 2)
    assert sessions.continued(other) is None and len(searched) == 2
    # A conversation that ends changes what a turn may continue: searched again.
    sessions.ended(sessions.placed(chat(3, 1), B, now=6.0), now=7.0)  # (placing searches too)
    assert sessions.continued(other) is None and len(searched) == 4
    # Placed, the turn's conversation runs: the same turn continues nothing now.
    key = sessions.placed(turn, A, now=8.0)
    assert sessions.continued(turn) is None
    following = chat(1, 3)
    assert sessions.continued(following) is None  # not while its conversation runs
    sessions.ended(key, now=9.0)
    assert sessions.continued(following)[1].turns == 2
    # Expired (while another session still thinks): the following turn continues nothing.
    sessions.ended(sessions.placed(chat(4, 1), B, now=1e6 - 2), now=1e6 - 1)
    assert sessions.continued(following)[1].turns == 2
    sessions.expire(now=1e6)
    assert sessions.remembered() == 1 and sessions.continued(following) is None


def test_a_short_first_turn_ending_inside_the_shared_prompt_is_no_ones_conversation():
    # Its last full block lies in the system prompt, which every session's prompt holds:
    # only the text past that block tells its own.
    sessions = Conversations(smoothing=0.3)
    sessions.ended(sessions.placed(chat(1, 1, short=True), A, now=0.0), now=1.0)
    assert sessions.continued(chat(2, 1)) is None
    assert sessions.continued(chat(1, 2, short=True)) is not None


def test_the_same_prompt_again_is_a_retry_or_a_twin_not_a_turn():
    sessions = Conversations(smoothing=0.3)
    key = sessions.placed(chat(1, 1), A, now=0.0)
    assert sessions.placed(chat(1, 1), B, now=0.0) is None  # a twin while it runs
    sessions.ended(key, now=1.0)
    assert sessions.placed(chat(1, 1), B, now=2.0) is None  # a retry after its answer
    assert sessions.rounds_ahead() == 0.0
    assert sessions.placed(RequestShape(prompt_tokens=5000, max_tokens=64), A, 3.0) is None


def test_the_think_time_ends_when_the_next_turn_arrives_not_when_it_is_placed():
    sessions = Conversations(smoothing=0.3)
    assert sessions.think_s() == DEFAULT_THINK_S  # until a continuation is seen
    sessions.ended(sessions.placed(chat(1, 1), A, now=0.0), now=1.0)
    sessions.returned(chat(1, 2), now=11.0)  # then waits 5 s in the pool's queue
    sessions.placed(chat(1, 2), A, now=16.0)
    assert sessions.think_s() == pytest.approx(10.0)


def test_conversations_not_continued_expire_and_lower_the_rounds_ahead():
    sessions = Conversations(smoothing=0.3)
    key = sessions.placed(chat(1, 1), A, now=0.0)
    for turn in range(2, 5):
        sessions.ended(key, now=10.0 * turn - 8)
        key = sessions.placed(chat(1, turn), A, now=10.0 * turn)
    assert sessions.think_s() == pytest.approx(8.0)
    assert sessions.rounds_ahead() == pytest.approx(3.0, rel=0.02)  # 1 + 0.99 + 0.99²
    sessions.ended(key, now=41.0)
    sessions.expire(now=41.0 + EXPIRY_THINK_TIMES * 8.0)
    assert sessions.bound(A) == 1
    sessions.expire(now=41.1 + EXPIRY_THINK_TIMES * 8.0)
    assert sessions.bound(A) == 0
    assert sessions.rounds_ahead() < 3.0 / 1.9
    assert sessions.continued(chat(1, 5)) is None


def test_the_rounds_ahead_are_bounded_and_one_off_prompts_are_remembered_boundedly():
    sessions = Conversations(smoothing=0.3)
    key = sessions.placed(chat(1, 1), A, now=0.0)
    for turn in range(2, 40):
        sessions.ended(key, now=turn - 0.5)
        key = sessions.placed(chat(1, turn), A, now=turn)
    assert sessions.rounds_ahead() == MAX_ROUNDS_AHEAD
    for index in range(MAX_THINKING + 10):
        one_off = request_shape({"messages": [{"role": "user", "content": f"{index} " * 40}]},
                                True)
        sessions.ended(sessions.placed(one_off, A, now=50.0), now=50.0)
    sessions.expire(now=50.0)
    assert sessions.remembered() == MAX_THINKING


# --- the prefix policy with sessions ---------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def seed_pair(clock: Clock) -> Placer:
    """Seed 000's Spark and Thor, their rates measured."""
    p = Placer(PrefixPolicy(), {A: 48.9, B: 11.0}, clock=clock)
    for origin, rate, prefill_rate in ((A, 48.9, 2575.0), (B, 11.0, 1000.0)):
        p.observe_rate(origin, rate)
        p.observe_prefill_rate(origin, prefill_rate)
    return p


def run_turn(p: Placer, clock: Clock, request: RequestShape,
             candidates: list[Candidate]) -> str:
    """Place a turn, answer it at once, and half a second later the next."""
    placement = p.place(candidates, request=request)
    placement.release()
    clock.now += 0.5
    return placement.origin


@pytest.mark.parametrize("sessions_on_spark", [0, 12])
def test_a_session_stays_on_the_slow_replica_that_holds_it_when_the_fast_ones_sessions_queue(
        sessions_on_spark):
    clock = Clock()
    p = seed_pair(clock)
    for turn in (1, 2):
        for session in range(sessions_on_spark):
            run_turn(p, clock, chat(session, turn), [Candidate(A, 2)])
        run_turn(p, clock, chat(99, turn), [Candidate(B, 2)])
    assert p.conversations.bound(A) == sessions_on_spark
    both = [Candidate(A, 2), Candidate(B, 2)]
    goes_to = run_turn(p, clock, chat(99, 3), both)
    # Alone, its turn finishes far sooner on the Spark, history prefill and all (~6 s
    # against ~6 s of decode alone on the Thor): it moves. With twelve sessions bound to
    # the Spark, each round of theirs would wait for its turns there: it stays.
    assert goes_to == (B if sessions_on_spark else A)


def test_a_burst_of_first_turns_keeps_its_sessions_where_the_first_turns_went():
    # Seed 000's pair, tool outputs: a burst of first turns, four of them on the Thor, still
    # running there when the Spark's sessions come back. Counted as nothing, the Thor looked
    # empty and Spark sessions moved there, prefilling their histories again, while the Thor's
    # own sessions moved back to the Spark when their second turns came (7 of 16 in a run).
    clock = Clock()
    p = seed_pair(clock)
    for session in range(12):
        run_turn(p, clock, chat(session, 1), [Candidate(A, 2)])
    for session in range(12, 16):
        p.place([Candidate(B, 2)], request=chat(session, 1))  # running on the Thor
    both = [Candidate(A, 2), Candidate(B, 2)]
    assert [run_turn(p, clock, chat(session, 2), both) for session in range(12)] == [A] * 12
    assert p.conversations.bound(B) == 4


def test_a_turn_that_waits_in_the_pools_queue_waits_in_its_turn_not_in_its_think_time():
    clock = Clock()
    replicas = ReplicaSet("cortex", (ReplicaSpec(A),))
    replicas.apply_pass({A: ProbeResult(ready=True, fingerprint=Fingerprint("m", 262144))},
                        now=1.0)
    p = Placer(PrefixPolicy(), {A: 48.9}, clock=clock)
    queue = PoolQueue(PooledRole("cortex", replicas, p, 1))
    first = Ticket("k", STANDARD, 64, chat(1, 1))
    assert queue.arrive(first, clock.now) == [first]
    queue.finish(first, clock.now, 64)  # answered: session 1 thinks from now
    blocker = Ticket("k", STANDARD, 64, chat(2, 1))
    assert queue.arrive(blocker, clock.now) == [blocker]  # holds the slot (and the next)
    assert queue.arrive(Ticket("k", STANDARD, 64, chat(3, 1)), clock.now)
    clock.now += 10.0
    second = Ticket("k", STANDARD, 64, chat(1, 2))
    assert queue.arrive(second, clock.now) == []  # waits for a slot
    clock.now += 5.0
    while second.placement is None:
        queue.finish(next(iter(queue.running - {second})), clock.now, 64)
    assert p.conversations.think_s() == pytest.approx(10.0)


def test_a_turn_waiting_in_the_queue_keeps_its_session_until_it_is_placed_or_given_up():
    sessions = Conversations(smoothing=0.3)
    key = sessions.placed(chat(1, 1), A, now=0.0)
    sessions.ended(key, now=1.0)
    sessions.ended(sessions.placed(chat(1, 2), A, now=3.0), now=4.0)  # think 2 s
    sessions.returned(chat(1, 3), now=6.0)  # then waits far past 4 think times
    sessions.expire(now=6.0 + MAX_QUEUED_S)
    assert sessions.continued(chat(1, 3)) is not None
    sessions.expire(now=6.1 + MAX_QUEUED_S)
    assert sessions.continued(chat(1, 3)) is None
