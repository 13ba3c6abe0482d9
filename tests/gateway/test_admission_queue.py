"""The admission queue alone (policy/admission.py), the named-key gate and GATEWAY_CLIENT_KEYS.

Time is the callers' `now` argument: nothing here sleeps or reads a clock.
"""

import pytest
from lobes_gateway.policy.admission import (
    BATCH,
    INTERACTIVE,
    STANDARD,
    AdmissionQueue,
    Ticket,
    effective_class,
)
from lobes_gateway.policy.auth import CLIENT, FLEET, Gate, InflightLimits
from lobes_gateway.policy.config import ConfigError, load_config


def full_queue(slots: int = 2, rate: float | None = None) -> tuple[AdmissionQueue, list[Ticket]]:
    """A queue with its slots taken at time 0 by 100-token requests of key `busy`."""
    queue = AdmissionQueue(slots)
    if rate is not None:
        queue.rate.observe(rate)
    running = [Ticket("busy", STANDARD, 100) for _slot in range(slots)]
    for ticket in running:
        assert queue.arrive(ticket, 0.0) == [ticket]
    return queue, running


def drain(queue: AdmissionQueue, running: list[Ticket], count: int) -> list[Ticket]:
    """Finish running requests one at a time; the order the waiting ones were admitted."""
    order = []
    for step in range(count):
        admitted = queue.finish(running.pop(0), float(step + 1), 100)
        order += admitted
        running += admitted
    return order


def test_a_free_slot_admits_at_once_and_a_full_gear_queues():
    queue, _running = full_queue(slots=1)
    waiting = Ticket("alice", STANDARD, 10)
    assert queue.arrive(waiting, 0.0) == []
    assert waiting.started is None and queue.depth_by_class()[STANDARD] == 1


def test_classes_are_released_strongest_first():
    queue, running = full_queue(slots=1)
    batch, standard, interactive = (Ticket("k", BATCH, 10), Ticket("k", STANDARD, 10),
                                    Ticket("k", INTERACTIVE, 10))
    for ticket in (batch, standard, interactive):
        queue.arrive(ticket, 0.0)
    assert drain(queue, running, 3) == [interactive, standard, batch]


def test_a_key_with_many_waiting_does_not_starve_one_with_few():
    queue, running = full_queue(slots=1)
    flood = [Ticket("agent", BATCH, 100) for _n in range(10)]
    for ticket in flood:
        queue.arrive(ticket, 0.0)
    late = Ticket("eval", BATCH, 100)
    queue.arrive(late, 0.0)
    order = drain(queue, running, 3)
    # The newcomer goes second: after the flood's head, never behind its backlog.
    assert order[:2] == [flood[0], late]


def test_fair_share_counts_tokens_not_requests():
    queue, running = full_queue(slots=1)
    big = [Ticket("big", BATCH, 400) for _n in range(3)]
    small = [Ticket("small", BATCH, 100) for _n in range(8)]
    for ticket in [*big, *small]:
        queue.arrive(ticket, 0.0)
    order = drain(queue, running, 6)
    # One 400-token request of `big` is worth four of `small`'s 100-token ones.
    assert [t.client for t in order] == ["big", "small", "small", "small", "small", "big"]


def test_a_key_idle_for_a_while_gets_no_saved_up_credit():
    queue, running = full_queue(slots=1)
    for _round in range(5):  # alice alone: her virtual time moves on
        queue.arrive(Ticket("alice", BATCH, 100), 0.0)
    drain(queue, running, 5)
    bob = [Ticket("bob", BATCH, 100) for _n in range(3)]
    alice = [Ticket("alice", BATCH, 100) for _n in range(3)]
    for ticket in [*bob, *alice]:
        queue.arrive(ticket, 0.0)
    order = drain(queue, running, 6)
    assert [t.client for t in order] == ["bob", "alice", "bob", "alice", "bob", "alice"]


def test_withdrawn_tickets_never_start():
    queue, running = full_queue(slots=1)
    gone, stays = Ticket("a", STANDARD, 10), Ticket("b", STANDARD, 10)
    queue.arrive(gone, 0.0)
    queue.arrive(stays, 0.0)
    assert queue.withdraw(gone) and not queue.withdraw(gone)
    assert drain(queue, running, 1) == [stays]
    assert gone.started is None


def test_an_occupied_slot_beyond_the_limit_delays_admission():
    queue, running = full_queue(slots=1)
    arrival = Ticket("fleet", STANDARD, 10)
    queue.occupy(arrival, 0.0)  # another box admitted it: it runs without waiting
    waiting = Ticket("a", STANDARD, 10)
    queue.arrive(waiting, 0.0)
    assert queue.finish(running[0], 1.0, 100) == []  # still one running: no slot free
    assert queue.finish(arrival, 2.0, 10) == [waiting]


def test_expected_wait_is_unknown_until_a_rate_is_learned():
    queue, _running = full_queue(slots=2)
    assert queue.expected_wait_s(Ticket("a", STANDARD, 10), 0.0) is None
    assert AdmissionQueue(2).expected_wait_s(Ticket("a", STANDARD, 10), 0.0) == 0.0


def test_expected_wait_follows_the_running_ends_and_the_work_ahead():
    queue, _running = full_queue(slots=2, rate=50.0)  # 100 tokens: 2 s each, ending at 2.0
    assert queue.expected_wait_s(Ticket("a", STANDARD, 10), 0.5) == pytest.approx(1.5)
    for _n in range(3):  # key b queues three more, 2 s each
        queue.arrive(Ticket("b", STANDARD, 100), 0.5)
    # b's own next one waits for all three: two start at 2.0, the third at 4.0.
    assert queue.expected_wait_s(Ticket("b", STANDARD, 10), 0.5) == pytest.approx(3.5)
    # Another key's takes its fair turn after b's first: it starts when the second slot frees.
    assert queue.expected_wait_s(Ticket("c", STANDARD, 10), 0.5) == pytest.approx(1.5)
    # An interactive ticket goes before the waiting standard ones: only the running ends.
    assert queue.expected_wait_s(Ticket("c", INTERACTIVE, 10), 0.5) == pytest.approx(1.5)
    # A batch ticket waits for everything queued in the stronger classes.
    assert queue.expected_wait_s(Ticket("c", BATCH, 10), 0.5) == pytest.approx(3.5)


def test_a_declared_rate_prices_the_wait_until_a_request_finishes():
    queue = AdmissionQueue(1, prior=50.0)  # P_RATE: 100 tokens take 2 s
    running = Ticket("busy", STANDARD, 100)
    queue.arrive(running, 0.0)
    assert queue.expected_wait_s(Ticket("a", STANDARD, 10), 0.5) == pytest.approx(1.5)
    queue.finish(running, 4.0, 100)  # measured 25 tok/s: the sample replaces the prior
    assert queue.rate.value == pytest.approx(25.0)


def test_p_rate_is_the_gears_prior_and_must_be_a_positive_rate():
    config = load_config({**ENV, "PRIMARY_BASE_URL": "http://127.0.0.1:9", "PRIMARY_RATE": "48.9"})
    assert config.roles["cortex"].rate == pytest.approx(48.9)
    for bad in ("fast", "0", "-3"):
        with pytest.raises(ConfigError) as caught:
            load_config({**ENV, "PRIMARY_RATE": bad})
        assert caught.value.variable == "PRIMARY_RATE"
        assert "tokens per second" in str(caught.value)


def test_the_rate_is_learned_from_finished_requests():
    queue = AdmissionQueue(1)
    ticket = Ticket("a", STANDARD, 100)
    queue.arrive(ticket, 10.0)
    queue.finish(ticket, 12.0, 100)
    assert queue.rate.value == pytest.approx(50.0)


@pytest.mark.parametrize(("key_class", "asked", "runs"), [
    (INTERACTIVE, None, INTERACTIVE), (INTERACTIVE, BATCH, BATCH),
    (BATCH, INTERACTIVE, BATCH), (STANDARD, INTERACTIVE, STANDARD), (STANDARD, BATCH, BATCH)])
def test_a_request_may_lower_its_class_never_raise_it(key_class, asked, runs):
    assert effective_class(key_class, asked) == runs


ENV = {"GATEWAY_API_KEY": "box-key", "GATEWAY_FLEET_KEY": "mesh-key"}


def test_client_keys_parse_with_class_and_limit():
    config = load_config({**ENV, "GATEWAY_CLIENT_KEYS": "alice=k1:interactive, agents=k2:batch:4"})
    alice, agents = config.client_keys
    assert (alice.name, alice.key, alice.priority, alice.inflight_limit) == (
        "alice", "k1", INTERACTIVE, None)
    assert (agents.name, agents.priority, agents.inflight_limit) == ("agents", BATCH, 4)
    assert "k1" not in repr(alice)


@pytest.mark.parametrize("value", [
    "alice=k1", "alice=k1:urgent", "alice=k1:batch:0", "alice=k1:batch:x", "=k1:batch",
    "fleet=k1:batch", "a=k1:batch,b=k1:batch", "a=k1:batch,a=k2:batch", "a=box-key:batch",
    "a=k1:batch:2:extra"])
def test_bad_client_keys_stop_start_up_without_echoing_the_key(value):
    with pytest.raises(ConfigError) as caught:
        load_config({**ENV, "GATEWAY_CLIENT_KEYS": value})
    assert caught.value.variable == "GATEWAY_CLIENT_KEYS"
    assert "k1" not in str(caught.value) and "box-key" not in str(caught.value)


def test_client_keys_need_the_box_key():
    with pytest.raises(ConfigError, match="GATEWAY_API_KEY"):
        load_config({"GATEWAY_CLIENT_KEYS": "alice=k1:interactive"})


def test_the_gate_names_a_named_key_and_its_class():
    config = load_config({**ENV, "GATEWAY_CLIENT_KEYS": "alice=k1:interactive:3"})
    gate = Gate(config.api_key, config.fleet_key, config.client_keys)
    alice = gate.identify("Bearer k1")
    assert (alice.key_id, alice.priority, alice.inflight_limit) == ("alice", INTERACTIVE, 3)
    assert gate.identify("Bearer box-key").key_id == CLIENT
    assert gate.identify("Bearer mesh-key").key_id == FLEET
    assert gate.identify("Bearer k2") is None


def test_each_key_is_limited_on_its_own():
    config = load_config({**ENV, "GATEWAY_CLIENT_KEYS": "alice=k1:interactive:1,bob=k2:batch"})
    gate = Gate(config.api_key, config.fleet_key, config.client_keys)
    limits = InflightLimits(2)
    alice, bob, box = (gate.identify(f"Bearer {key}") for key in ("k1", "k2", "box-key"))
    assert limits.acquire(alice) and not limits.acquire(alice)  # her own limit: 1
    assert limits.acquire(bob) and limits.acquire(bob) and not limits.acquire(bob)  # gateway's
    assert limits.acquire(box)  # the box key counts apart from both
    limits.release(alice)
    assert limits.acquire(alice)


def test_once_nobody_waits_shares_start_over():
    queue, running = full_queue(slots=1)
    queue.arrive(Ticket("big", BATCH, 1000), 0.0)
    for _n in range(3):
        queue.arrive(Ticket("small", BATCH, 100), 0.0)
    drain(queue, running, 4)  # big took 1000 tokens, small 300: then the class emptied
    later = [Ticket("small", BATCH, 100), Ticket("big", BATCH, 100), Ticket("small", BATCH, 100),
             Ticket("big", BATCH, 100)]
    for ticket in later:
        queue.arrive(ticket, 0.0)
    order = drain(queue, running, 4)
    # big's earlier 1000 tokens are not held against it in the next backlog.
    assert [t.client for t in order] == ["small", "big", "small", "big"]
