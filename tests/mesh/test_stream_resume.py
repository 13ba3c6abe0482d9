"""A pooled stream survives its replica (P_STREAM_RESUME=true): a replica that breaks a stream
off (the sim's die-after-N-chunks), is killed, or is stopped (SIGSTOP, then the stall timeout)
has the stream continued on the other replica; the client reads one unbroken stream whose text
equals an unbroken reference answer, with one id, one role delta, usage counting both parts and
the resume marker. Without resume (a lone backend, a pool with it off, n > 1) the stream ends
as before: cleanly, with a stream_interrupted error event.

Real processes: two simulators (seed 0, the same model), a peer gateway in front of each, and a
pooling gateway placing pinned (always the first replica unless it is tried already).
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim
from tests.support.sse import Streamed, stream_chat
from tests.support.wait import wait_until

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
TIME_SCALE = 4
ASK = {"model": "cortex", "messages": [{"role": "user", "content": "Tell me of pools."}],
       "max_tokens": 120, "stream_options": {"include_usage": True}}
BROKEN_AFTER = 12  # events of the first part


def peer_env(sim) -> dict[str, str]:
    return {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
            "PRIMARY_MAX_MODEL_LEN": "262144", "PRIMARY_MAX_ACTIVE": "4"}


def pool_env(origins: list[str], resume: bool = True, **extra: str) -> dict[str, str]:
    return {"PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "pool",
            "PRIMARY_PEER_ORIGINS": ",".join(origins), "GATEWAY_POOL_POLICY": "pinned",
            "PRIMARY_STREAM_RESUME": "true" if resume else "false",
            "GATEWAY_PROBE_INTERVAL_S": "0.1", **extra}


def ready(gateway, count: int = 2) -> None:
    def check() -> bool:
        rows = gateway.get_json("/capabilities")["roles"]["cortex"].get("replicas", [])
        return sum(1 for r in rows if r["ready"] and r["compatible"]) == count

    wait_until(check, message=f"{count} cortex replicas ready")


def posts(sim) -> list[dict]:
    return [r for r in sim.requests() if r["method"] == "POST"]


@pytest.fixture(scope="module")
def pair():
    with start_sim("spark-cortex", time_scale=TIME_SCALE) as first_sim, \
            start_sim("spark-cortex", time_scale=TIME_SCALE) as second_sim, \
            start_gateway(peer_env(first_sim)) as first, \
            start_gateway(peer_env(second_sim)) as second:
        yield {"first": first, "second": second, "first_sim": first_sim,
               "second_sim": second_sim}


@pytest.fixture(scope="module")
def reference(pair) -> Streamed:
    """The unbroken answer: the same request straight to a replica's gateway."""
    answer = stream_chat(pair["second"].url, ASK)
    assert answer.done and answer.usage is not None
    return answer


@pytest.fixture
def faults(pair, reference):
    """The first replica's simulator, to break it; the test starts with no request recorded
    (the reference answer's among them) and ends with no fault set."""
    pair["second_sim"].clear_requests()
    yield pair["first_sim"]
    pair["first_sim"].set_faults({})


def assert_one_unbroken_stream(streamed: Streamed, reference: Streamed, replicas: list[str]):
    assert streamed.status == 200 and streamed.done and not streamed.errors
    assert streamed.text == reference.text  # no token lost, none repeated
    assert len({e["id"] for e in streamed.events}) == 1
    assert len({e["created"] for e in streamed.events}) == 1
    assert {e["model"] for e in streamed.events} == {reference.events[0]["model"]}
    roles = [c for e in streamed.events for c in e.get("choices") or ()
             if "role" in (c.get("delta") or {})]
    assert len(roles) == 1
    assert streamed.usage == reference.usage  # the prompt once, both parts' completion
    assert streamed.finish["choices"][0]["finish_reason"] == (
        reference.finish["choices"][0]["finish_reason"])
    assert streamed.finish["lobes_resumed"] == {"resumes": 1, "replicas": replicas}


def test_a_stream_its_replica_breaks_off_goes_on_on_the_other(pair, reference, faults):
    first, second = pair["first"], pair["second"]
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    with start_gateway(pool_env([first.url, second.url])) as pool:
        ready(pool)
        streamed = stream_chat(pool.url, ASK)
    assert streamed.headers["x-lobes-proxied-by"] == first.url
    assert_one_unbroken_stream(streamed, reference, [first.url, second.url])
    [continuation] = posts(pair["second_sim"])
    body = json.loads(continuation["body"])
    produced = BROKEN_AFTER - 1  # the role delta was one of the chunks
    assert body["messages"][-1] == {"role": "assistant",
                                    "content": reference.text[:len(body["messages"][-1]
                                                                   ["content"])]}
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    assert body["max_tokens"] == ASK["max_tokens"] - produced
    assert body["model"] == SERVED


def test_a_killed_replica_has_its_stream_continued():
    with start_sim("spark-cortex", time_scale=TIME_SCALE) as first_sim, \
            start_sim("spark-cortex", time_scale=TIME_SCALE) as second_sim, \
            start_gateway(peer_env(first_sim)) as first, \
            start_gateway(peer_env(second_sim)) as second, \
            start_gateway(pool_env([first.url, second.url])) as pool:
        ready(pool)
        reference = stream_chat(second.url, ASK)

        def kill_midway(streamed: Streamed) -> None:
            if streamed.content_events == BROKEN_AFTER:
                os.kill(first.pid, signal.SIGKILL)

        streamed = stream_chat(pool.url, ASK, after_event=kill_midway)
    assert_one_unbroken_stream(streamed, reference, [first.url, second.url])


def test_a_stopped_replica_is_cut_off_after_the_stall_timeout_and_its_stream_continued():
    with start_sim("spark-cortex", time_scale=TIME_SCALE) as first_sim, \
            start_sim("spark-cortex", time_scale=TIME_SCALE) as second_sim, \
            start_gateway(peer_env(first_sim)) as first, \
            start_gateway(peer_env(second_sim)) as second, \
            start_gateway(pool_env([first.url, second.url],
                                   GATEWAY_STREAM_STALL_S="0.5")) as pool:
        ready(pool)
        reference = stream_chat(second.url, ASK)
        stopped: list[int] = []

        def stop_midway(streamed: Streamed) -> None:
            if streamed.content_events == BROKEN_AFTER and not stopped:
                os.kill(first_sim.process.pid, signal.SIGSTOP)
                stopped.append(first_sim.process.pid)

        try:
            streamed = stream_chat(pool.url, ASK, after_event=stop_midway)
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
    assert_one_unbroken_stream(streamed, reference, [first.url, second.url])
    assert streamed.largest_gap() >= 0.5  # the stall it waited out before moving on


def interrupted(streamed: Streamed) -> bool:
    """Ended as an unresumed stream does: cleanly, its last event a stream_interrupted error."""
    return (streamed.status == 200 and not streamed.done
            and [e["code"] for e in streamed.errors] == ["stream_interrupted"])


def test_a_lone_backend_still_ends_a_broken_stream_cleanly(pair, reference, faults):
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    streamed = stream_chat(pair["first"].url, ASK)
    assert interrupted(streamed)
    assert reference.text.startswith(streamed.text) and streamed.text != reference.text


def test_a_pool_with_resume_off_ends_a_broken_stream_cleanly(pair, faults):
    first, second = pair["first"], pair["second"]
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    with start_gateway(pool_env([first.url, second.url], resume=False)) as pool:
        ready(pool)
        streamed = stream_chat(pool.url, ASK)
    assert interrupted(streamed)
    assert posts(pair["second_sim"]) == []


def test_a_stream_of_several_choices_is_not_resumed(pair, faults):
    """n > 1 cannot be continued as one final assistant message: refused, documented."""
    first, second = pair["first"], pair["second"]
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    with start_gateway(pool_env([first.url, second.url])) as pool:
        ready(pool)
        streamed = stream_chat(pool.url, {**ASK, "n": 2})
    assert interrupted(streamed)
    assert posts(pair["second_sim"]) == []


def test_a_whole_stream_passes_unchanged_and_unmarked(pair, reference):
    first, second = pair["first"], pair["second"]
    with start_gateway(pool_env([first.url, second.url])) as pool:
        ready(pool)
        streamed = stream_chat(pool.url, ASK)
    assert streamed.done and streamed.text == reference.text
    assert streamed.usage == reference.usage
    assert "lobes_resumed" not in streamed.finish
