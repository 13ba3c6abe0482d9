"""The pool queue's virtual load: requests priced ahead count on their replica as placed ones
would, their work and its prefill side by side."""

from lobes_gateway.mesh.pool_queue import VirtualLoad
from lobes_gateway.policy.forecast import ReplicaView, forecast
from lobes_gateway.policy.prefix import RequestShape

LONG_PROMPT = RequestShape(prompt_tokens=6000, max_tokens=1000)


def busy(prefill_left_s=()):
    """A 2-slot replica with both slots busy (10 s and 12 s of work left)."""
    return ReplicaView("http://spark:8001", 0, 2, 2, 50.0, work_s=(10.0, 12.0),
                       prefill_left_s=prefill_left_s, prefill_rate=1000.0)


def test_a_request_priced_ahead_adds_its_work_and_its_prefill():
    load = VirtualLoad()
    view = busy(prefill_left_s=(0.0, 0.0))
    load.add(view, LONG_PROMPT)
    seen = load.on(view)
    ahead = forecast(view, LONG_PROMPT)
    assert seen.in_flight == 3
    assert seen.work_s == (10.0, 12.0, ahead.prefill_s + ahead.decode_s)
    assert seen.prefill_left_s == (0.0, 0.0, ahead.prefill_s)
    # It starts at 10 s; its 6 s prefill holds up the slot still busy then (free at 12 s, so
    # at 18 s), which frees before its own 20 s of decode ends.
    assert seen.slot_wait_s() == 12.0 + ahead.prefill_s


def test_a_replica_without_known_prefills_is_padded_so_the_two_stay_in_step():
    load = VirtualLoad()
    view = busy()
    load.add(view, LONG_PROMPT)
    seen = load.on(view)
    assert len(seen.prefill_left_s) == len(seen.work_s) == 3
    assert seen.slot_wait_s() > 0
