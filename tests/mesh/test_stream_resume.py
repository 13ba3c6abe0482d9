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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from lobes_sim.profiles import PROFILES

from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import Scrape
from tests.support.ports import free_port
from tests.support.sim_proc import start_sim
from tests.support.sse import Streamed, stream_chat
from tests.support.wait import wait_until

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
TIME_SCALE = 4
ASK = {"model": "cortex", "messages": [{"role": "user", "content": "Tell me of pools."}],
       "max_tokens": 120, "stream_options": {"include_usage": True}}
BROKEN_AFTER = 12  # events of the first part
RESUMES = "lobes_gateway_stream_resumes_total"


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
        scrape = Scrape.of(pool.url)
    assert streamed.headers["x-lobes-proxied-by"] == first.url
    assert_one_unbroken_stream(streamed, reference, [first.url, second.url])
    assert scrape.value(RESUMES, role="cortex", outcome="resumed") == 1
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


def learned_rates(gateway) -> dict[str, float]:
    rows = gateway.get_json("/capabilities")["roles"]["cortex"]["replicas"]
    return {row["origin"]: row["rate"] for row in rows}


def test_the_continuation_teaches_its_replicas_rate_and_the_broken_part_teaches_nothing(
        pair, reference, faults):
    """Both replicas declared far faster than the simulators run (~200 tok/s at time-scale 4):
    the continuation's part, a healthy answer, pulls its replica's estimate down; the first
    replica, which broke the stream off, keeps its prior."""
    first, second = pair["first"], pair["second"]
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    with start_gateway(pool_env([first.url, second.url],
                                PRIMARY_PEER_RATES="1000,1000")) as pool:
        ready(pool)
        assert learned_rates(pool) == {first.url: 1000, second.url: 1000}
        streamed = stream_chat(pool.url, ASK)
        assert streamed.finish["lobes_resumed"]["replicas"] == [first.url, second.url]
        wait_until(lambda: learned_rates(pool)[second.url] < 900,
                   message="the continuation's replica to learn a rate below its prior")
        assert learned_rates(pool)[first.url] == 1000


@pytest.mark.parametrize("resume", [True, False], ids=["resumable", "plain"])
def test_a_pooled_stream_teaches_its_replicas_decode_rate_from_its_own_timing(pair, resume):
    """A long prompt the prefix policy prices at a guessed prefill (50x the declared decode
    rate): the answer's time past its forecast, split between prefill and decode by their
    forecast shares, taught a decode rate 2.4-3.3x the simulator's (477 and 664 tok/s against
    its 200 at time-scale 4). A stream times its decode from its first event to its end."""
    first, second = pair["first"], pair["second"]
    long_ask = {**ASK, "max_tokens": 155, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Read this. " * 3200}]}  # ~8k tokens
    true_rate = TIME_SCALE / PROFILES["spark-cortex"].step_seconds(1)
    with start_gateway(pool_env([first.url, second.url], resume=resume,
                                GATEWAY_POOL_POLICY="prefix",
                                PRIMARY_PEER_RATES="1000,1000")) as pool:
        ready(pool)
        streamed = stream_chat(pool.url, long_ask)
        assert streamed.done and streamed.usage["completion_tokens"] == 155
        served = streamed.headers["x-lobes-proxied-by"]
        wait_until(lambda: learned_rates(pool)[served] < 1000,
                   message="the replica to learn a rate from the stream")
        assert 0.8 * true_rate < learned_rates(pool)[served] < 1.25 * true_rate


def test_a_continuation_teaches_its_replicas_decode_rate_from_its_own_parts_timing(
        pair, reference, faults):
    first, second = pair["first"], pair["second"]
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    true_rate = TIME_SCALE / PROFILES["spark-cortex"].step_seconds(1)
    with start_gateway(pool_env([first.url, second.url], GATEWAY_POOL_POLICY="prefix",
                                PRIMARY_PEER_RATES="1000,1000")) as pool:
        ready(pool)
        streamed = stream_chat(pool.url, {**ASK, "max_tokens": 155, "ignore_eos": True})
        assert streamed.finish["lobes_resumed"]["resumes"] == 1
        continued_on = streamed.finish["lobes_resumed"]["replicas"][-1]
        wait_until(lambda: learned_rates(pool)[continued_on] < 1000,
                   message="the continuation's replica to learn a rate")
        assert 0.8 * true_rate < learned_rates(pool)[continued_on] < 1.25 * true_rate


def test_an_answer_of_several_choices_teaches_its_replica_no_rate(pair):
    """vLLM's usage counts every choice's tokens, decoded side by side: taken as one answer,
    this n=4 answer taught 327 tok/s where the simulator decodes ~181 (a stream, timed from its
    first event, would teach four choices' tokens over one's time: 4x)."""
    first, second = pair["first"], pair["second"]
    with start_gateway(pool_env([first.url, second.url], GATEWAY_POOL_POLICY="prefix",
                                PRIMARY_PEER_RATES="1000,1000")) as pool:
        ready(pool)
        several = chat(pool.url, {"model": "cortex", "n": 4, "max_tokens": 32})
        assert several.status == 200
        assert several.json()["usage"]["completion_tokens"] == 4 * 32
        assert rate_once_counted(pool, 1, several.headers["x-lobes-proxied-by"]) == 1000
        one = chat(pool.url, {"model": "cortex", "max_tokens": 32})
        assert one.status == 200
        assert rate_once_counted(pool, 2, one.headers["x-lobes-proxied-by"]) < 1000


def test_a_request_of_four_choices_holds_four_slots_of_its_replica(pair):
    """Each peer runs 4 at once (PRIMARY_MAX_ACTIVE): while one request of n=4 runs on the
    first, the next goes to the idle second, not behind it. Counted as one request, the first
    looked three slots free and took it too, until a load probe saw its four sequences (here
    the probe after the first is a minute away)."""
    first, second = pair["first"], pair["second"]
    with start_gateway(pool_env([first.url, second.url], GATEWAY_POOL_POLICY="prefix",
                                PRIMARY_PEER_RATES="200,200",
                                GATEWAY_PROBE_INTERVAL_S="60")) as pool:
        ready(pool)
        answers: list = []
        several = threading.Thread(target=lambda: answers.append(chat(
            pool.url, {"model": "cortex", "n": 4, "max_tokens": 400, "ignore_eos": True})))
        several.start()
        wait_until(lambda: Scrape.of(pool.url).value("lobes_gateway_pool_replica_in_flight",
                                                     role="cortex") == 1,
                   message="the request of four choices placed")
        next_one = chat(pool.url, {"model": "cortex", "max_tokens": 8})
        several.join()
    [held] = answers
    assert held.headers["x-lobes-proxied-by"] == first.url
    assert next_one.headers["x-lobes-proxied-by"] == second.url


def rate_once_counted(pool, answers: int, replica: str) -> float:
    """The replica's rate (live, from /metrics; /capabilities publishes it each probe) once the
    pool has counted `answers` cortex answers: an answer is counted after its relay, and what
    it teaches, is done."""
    wait_until(lambda: Scrape.of(pool.url).value("lobes_gateway_requests_total",
                                                 role="cortex") == answers,
               message=f"{answers} cortex answers counted")
    return Scrape.of(pool.url).value("lobes_gateway_pool_replica_service_rate_tokens_per_second",
                                     role="cortex", replica=replica)


def hosted_box(local_sim, order: list[str | None], **extra: str) -> tuple[str, object]:
    """A box that serves cortex on `local_sim` and pools it with peers; None in `order` is
    this box's own slot."""
    port = free_port()
    me = f"http://127.0.0.1:{port}"
    env = {**peer_env(local_sim), **pool_env([origin or me for origin in order], **extra),
           "PRIMARY_FEASIBLE": "true", "GATEWAY_SELF_ORIGIN": me}
    return me, start_gateway(env, port=port)


@contextmanager
def box_over_gear(gear: str, other: str) -> Iterator[tuple[str, object]]:
    """A ready box pooling its own gear (at `gear`) with the peer `other`: its origin and it."""
    port = free_port()
    me = f"http://127.0.0.1:{port}"
    env = {**pool_env([me, other]), "PRIMARY_BASE_URL": gear, "PRIMARY_SERVED_NAME": SERVED,
           "PRIMARY_MAX_MODEL_LEN": "262144", "PRIMARY_FEASIBLE": "true",
           "GATEWAY_SELF_ORIGIN": me}
    with start_gateway(env, port=port) as box:
        ready(box)
        yield me, box


def test_a_hosted_pool_continues_its_own_gears_broken_stream_on_the_peer(
        pair, reference, faults):
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    me, box = hosted_box(pair["first_sim"], [None, pair["second"].url])
    with box:
        ready(box)
        streamed = stream_chat(box.url, ASK)
    assert streamed.headers["x-lobes-served-by"] == me
    assert_one_unbroken_stream(streamed, reference, [me, pair["second"].url])


def test_a_hosted_pool_continues_a_peers_broken_stream_on_its_own_gear(pair, reference, faults):
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    me, box = hosted_box(pair["second_sim"], [pair["first"].url, None])
    with box:
        ready(box)
        streamed = stream_chat(box.url, ASK)
    assert streamed.headers["x-lobes-proxied-by"] == pair["first"].url
    assert_one_unbroken_stream(streamed, reference, [pair["first"].url, me])
    [continuation] = posts(pair["second_sim"])
    assert json.loads(continuation["body"])["continue_final_message"] is True


@pytest.mark.parametrize("fault", [{"error_status": 503}, {"refuse": True}],
                         ids=["5xx", "refused"])
def test_a_hosted_pools_failing_gear_fails_over_to_the_peer_replica(
        pair, reference, faults, fault):
    """Its own gear is a replica like the others: a 5xx or a refused connection moves the
    request on to the peer (it used to go to the fallback, or answer 503 with none wired)."""
    _me, box = hosted_box(pair["first_sim"], [None, pair["second"].url],
                          GATEWAY_PROBE_INTERVAL_S="60")
    with box:
        ready(box)
        faults.set_faults(fault)  # after the probe: still selectable
        streamed = stream_chat(box.url, ASK)
    assert streamed.status == 200 and streamed.done and not streamed.errors
    assert streamed.headers["x-lobes-proxied-by"] == pair["second"].url
    assert streamed.text == reference.text and streamed.usage == reference.usage
    assert "lobes_resumed" not in streamed.finish  # moved on before its first byte


def test_a_hosted_pool_whose_replicas_all_fail_falls_back_without_the_resume_counting(
        pair, faults):
    """The fallback serves another model and no resume: it is sent the client's own request,
    asked only for its final usage (every stream's tokens are counted from it), not resume's
    per-chunk counting; and the client reads no usage it did not ask for."""
    asked = {key: value for key, value in ASK.items() if key != "stream_options"}
    with start_sim("instant", served_name="fb-served") as fallback_sim:
        _me, box = hosted_box(pair["first_sim"], [None, pair["second"].url],
                              GATEWAY_PROBE_INTERVAL_S="60", FALLBACK_URL=fallback_sim.url,
                              FALLBACK_SERVED_NAME="fb-served")
        with box:
            ready(box)
            faults.set_faults({"error_status": 503})  # after the probe: still selectable
            pair["second_sim"].set_faults({"error_status": 503})
            try:
                streamed = stream_chat(box.url, asked)
            finally:
                pair["second_sim"].set_faults({})
        [sent] = posts(fallback_sim)
    assert streamed.status == 200 and streamed.done and not streamed.errors
    assert streamed.headers["x-lobes-route-reason"] == "failover"
    assert {e["model"] for e in streamed.events} == {"fb-served"}
    assert not [e for e in streamed.events if "usage" in e]
    assert json.loads(sent["body"])["stream_options"] == {"include_usage": True}


TOOL_CALL = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                             "function": {"name": "look_up", "arguments": ""}}]}


@contextmanager
def breaking_gear(deltas: list[dict], opening: bool = True) -> Iterator[str]:
    """A vLLM stand-in that lists the served model and streams `deltas` (after the role
    delta, when `opening`), then drops the connection mid-stream; yields its origin."""

    class Gear(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [
                {"id": SERVED, "object": "model", "max_model_len": 262144}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            opened = [{"role": "assistant", "content": ""}] if opening else []
            for delta in [*opened, *deltas]:
                chunk = {"id": "chatcmpl-gear", "object": "chat.completion.chunk", "created": 1,
                         "model": SERVED, "choices": [{"index": 0, "delta": delta,
                                                       "finish_reason": None}]}
                self._send(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            self.close_connection = True  # dropped: no last chunk, no [DONE]

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gear)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("deltas", "resumed"), [
    ([{"content": "Let"}, {"content": " me"}], True),
    ([{"content": "Let"}, {"content": " me"}, TOOL_CALL], False),
], ids=["text-only", "after-a-tool-call"])
def test_a_stream_is_continued_until_it_carries_a_tool_call(pair, deltas, resumed):
    """A final assistant message cannot hold a tool call: once one has been streamed, a broken
    stream ends as an unpooled one does (documented), and no continuation is sent."""
    pair["second_sim"].clear_requests()
    with breaking_gear(deltas) as gear, box_over_gear(gear, pair["second"].url) as (_me, box):
        streamed = stream_chat(box.url, ASK)
        scrape = Scrape.of(box.url)
    assert streamed.text.startswith("Let me")
    outcome = "resumed" if resumed else "not_resumable"
    assert scrape.value(RESUMES, role="cortex", outcome=outcome) == 1
    assert scrape.value(RESUMES) == 1
    if resumed:
        assert streamed.done and streamed.finish["lobes_resumed"]["resumes"] == 1
        assert len(posts(pair["second_sim"])) == 1
    else:
        assert interrupted(streamed)
        assert posts(pair["second_sim"]) == []
        assert streamed.events[-2]["choices"][0]["delta"] == TOOL_CALL


def test_a_stream_broken_off_before_its_first_event_is_answered_whole_by_the_other(
        pair, reference):
    """The replica sent its response head and died: the request is sent again as it was
    (nothing to continue), and its answer relayed as the stream's first part: one role
    delta, the reference's text and usage."""
    pair["second_sim"].clear_requests()
    with breaking_gear([], opening=False) as gear, \
            box_over_gear(gear, pair["second"].url) as (me, box):
        streamed = stream_chat(box.url, ASK)
    assert_one_unbroken_stream(streamed, reference, [me, pair["second"].url])
    [again] = posts(pair["second_sim"])
    assert "continue_final_message" not in json.loads(again["body"])


def test_a_client_that_reads_slowly_is_no_stalled_replica():
    """Backpressure pauses the replica's stream while the client does not read: the stall
    timeout does not count that pause, so the stream is not moved."""
    long = {"model": "cortex", "messages": [{"role": "user", "content": "go on"}],
            "max_tokens": 40000, "ignore_eos": True}
    with start_sim("instant", served_name=SERVED) as first_sim, \
            start_sim("instant", served_name=SERVED) as second_sim, \
            start_gateway({**peer_env(first_sim), "PRIMARY_MAX_MODEL_LEN": "131072"}) as first, \
            start_gateway({**peer_env(second_sim), "PRIMARY_MAX_MODEL_LEN": "131072"}) as second, \
            start_gateway(pool_env([first.url, second.url],
                                   GATEWAY_STREAM_STALL_S="0.3")) as pool:
        ready(pool)
        napped: list[bool] = []

        def nap_once(streamed: Streamed) -> None:
            if not napped:  # stop reading while the stream fills every buffer on its way
                napped.append(True)
                time.sleep(1.5)

        streamed = stream_chat(pool.url, long, after_event=nap_once)
        scrape = Scrape.of(pool.url)
    assert streamed.done and streamed.content_events == long["max_tokens"]
    assert "lobes_resumed" not in streamed.finish
    assert scrape.value(RESUMES) == 0


def interrupted(streamed: Streamed) -> bool:
    """Ended as an unresumed stream does: cleanly, its last event a stream_interrupted error."""
    return (streamed.status == 200 and not streamed.done
            and [e["code"] for e in streamed.errors] == ["stream_interrupted"])


def test_when_every_replica_breaks_off_the_stream_ends_cleanly_with_what_it_had(
        pair, reference, faults):
    first, second = pair["first"], pair["second"]
    faults.set_faults({"die_after_chunks": BROKEN_AFTER})
    pair["second_sim"].set_faults({"die_after_chunks": BROKEN_AFTER})
    try:
        with start_gateway(pool_env([first.url, second.url])) as pool:
            ready(pool)
            streamed = stream_chat(pool.url, ASK)
            scrape = Scrape.of(pool.url)
    finally:
        pair["second_sim"].set_faults({})
    assert interrupted(streamed)
    # Both parts' tokens, none lost or repeated at the switch: the reference's start.
    assert streamed.content_events == 2 * (BROKEN_AFTER - 1)
    assert reference.text.startswith(streamed.text)
    assert scrape.value(RESUMES, role="cortex", outcome="resumed") == 1
    assert scrape.value(RESUMES, role="cortex", outcome="no_replica") == 1


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


MTP_TOKENS = 3  # tokens per chunk of a gear with speculative decoding


@pytest.fixture(scope="module")
def mtp_pair():
    """Two gears that stream three tokens per chunk (lobes_sim --tokens-per-chunk)."""
    mtp = ["--tokens-per-chunk", str(MTP_TOKENS)]
    with start_sim("spark-cortex", time_scale=TIME_SCALE, extra_args=mtp) as first_sim, \
            start_sim("spark-cortex", time_scale=TIME_SCALE, extra_args=mtp) as second_sim, \
            start_gateway(peer_env(first_sim)) as first, \
            start_gateway(peer_env(second_sim)) as second:
        yield {"first": first, "second": second, "first_sim": first_sim,
               "second_sim": second_sim}


@pytest.mark.parametrize("options", [
    {"include_usage": True},
    {},
    {"include_usage": True, "continuous_usage_stats": True},
], ids=["final-usage", "no-usage", "usage-per-chunk"])
def test_a_speculative_replicas_tokens_are_counted_not_its_chunks(mtp_pair, options):
    """Several tokens per chunk: the continuation's max_tokens is what is left of the
    client's, counted in tokens, so the client gets the answer it asked for, no longer; usage
    reaches the client as it asked for it, and only then."""
    ask = {**ASK, "stream_options": options}
    reference = stream_chat(mtp_pair["second"].url, ask)
    first, second = mtp_pair["first"], mtp_pair["second"]
    mtp_pair["second_sim"].clear_requests()
    mtp_pair["first_sim"].set_faults({"die_after_chunks": BROKEN_AFTER})
    try:
        with start_gateway(pool_env([first.url, second.url])) as pool:
            ready(pool)
            streamed = stream_chat(pool.url, ask)
    finally:
        mtp_pair["first_sim"].set_faults({})
    assert streamed.done and streamed.text == reference.text
    [continuation] = posts(mtp_pair["second_sim"])
    produced = (BROKEN_AFTER - 1) * MTP_TOKENS  # the role delta was one of the chunks
    assert json.loads(continuation["body"])["max_tokens"] == ASK["max_tokens"] - produced
    assert streamed.usage == reference.usage
    with_usage = [event for event in streamed.events if "usage" in event]
    if options.get("continuous_usage_stats"):
        assert all("usage" in event for event in streamed.events
                   if event["choices"] and event["choices"][0]["delta"].get("content"))
        counted = [event["usage"]["completion_tokens"] for event in with_usage]
        assert counted == sorted(counted) and counted[-1] == ASK["max_tokens"]
    elif options:
        assert with_usage == [streamed.events[-1]]
        assert streamed.usage["completion_tokens"] == ASK["max_tokens"]
    else:
        assert with_usage == [] and streamed.usage is None
