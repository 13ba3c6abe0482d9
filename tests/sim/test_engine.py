"""Continuous batching seen through /metrics: slots, the waiting queue, aborts, counters."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
from lobes_sim.profiles import PROFILES

from tests.support.wait import wait_until

from .client import chat_payload, post, request

CHAT = "/v1/chat/completions"


def metrics(url: str) -> dict[str, float]:
    """The /metrics samples keyed by name plus label set, e.g. 'vllm:num_requests_running'."""
    text = request(url, "GET", "/metrics").body.decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        reason = re.search(r'finished_reason="(\w+)"', name)
        key = name.split("{", 1)[0] + (f":{reason.group(1)}" if reason else "")
        samples[key] = float(value)
    return samples


def test_every_metric_carries_the_served_model_name(sim_factory):
    sim = sim_factory("instant", served_name="m-1")
    text = request(sim.url, "GET", "/metrics").body.decode()
    # The cache config's info gauge is labelled by its settings, as vLLM's is, not the model.
    samples = [line for line in text.splitlines()
               if not line.startswith(("#", "vllm:cache_config_info"))]
    assert samples and all('model_name="m-1"' in line for line in samples)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total"):
        assert any(line.startswith(name + "{") for line in samples), name
    assert "# TYPE vllm:prompt_tokens counter" in text


def test_requests_beyond_max_num_seqs_wait_and_show_in_the_gauges(sim_factory):
    sim = sim_factory("spark-cortex", time_scale=4)
    payload = chat_payload(max_tokens=150, ignore_eos=True)
    with ThreadPoolExecutor(4) as pool:
        replies = [pool.submit(post, sim.url, CHAT, payload) for _ in range(4)]

        def two_running_two_waiting() -> bool:
            busy = metrics(sim.url)
            running = busy["vllm:num_requests_running"]
            return (running, busy["vllm:num_requests_waiting"]) == (2, 2)

        wait_until(two_running_two_waiting, interval=0.01,
                   message="2 requests running and 2 waiting")
        assert 0 < metrics(sim.url)["vllm:kv_cache_usage_perc"] < 1
        answers = [reply.result().json() for reply in replies]
    done = metrics(sim.url)
    assert done["vllm:num_requests_running"] == 0
    assert done["vllm:num_requests_waiting"] == 0
    assert done["vllm:kv_cache_usage_perc"] == 0
    assert done["vllm:generation_tokens_total"] == 600
    assert done["vllm:prompt_tokens_total"] == sum(a["usage"]["prompt_tokens"] for a in answers)
    assert done["vllm:request_success_total:length"] == 4


def test_finished_reasons_are_counted_apart(sim_factory):
    sim = sim_factory("instant")
    post(sim.url, CHAT, chat_payload(max_tokens=500))
    post(sim.url, CHAT, chat_payload(max_tokens=3))
    counted = metrics(sim.url)
    assert counted["vllm:request_success_total:stop"] == 1
    assert counted["vllm:request_success_total:length"] == 1


@pytest.mark.timing  # the freed slot answers within 1 s of wall time, not after 3 s
def test_a_client_that_disconnects_is_aborted_and_frees_its_slot(sim_factory):
    sim = sim_factory("spark-cortex", extra_args=["--max-num-seqs", "1"])
    sock = socket.create_connection(("127.0.0.1", sim.port))
    body = json.dumps(chat_payload(max_tokens=160, stream=True)).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: s\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.close()
    wait_until(lambda: metrics(sim.url)["vllm:num_requests_running"] == 0,
               interval=0.01, message="the disconnected request to be aborted")
    # As vLLM's: an abandoned request is counted in no request_success series.
    assert metrics(sim.url)["vllm:request_success_total:abort"] == 0
    # The one slot is free again: a short request is answered at once, not after 3 s.
    assert post(sim.url, CHAT, chat_payload(max_tokens=2), timeout=1.0).status == 200


def test_aggregate_throughput_rises_sub_linearly_with_the_batch():
    for name in ("spark-cortex", "thor-cortex", "spark-senses", "minor"):
        profile = PROFILES[name]
        rates = [batch / profile.step_seconds(batch) for batch in (1, 2, 4, 8)]
        assert rates == sorted(rates), name
        assert all(rate < batch * rates[0] for rate, batch in zip(rates[1:], (2, 4, 8),
                                                                  strict=True)), name


async def _one_stream(port: int, index: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(chat_payload(f"stream {index}", max_tokens=5, ignore_eos=True,
                                   stream=True)).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: s\r\nConnection: close\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    received = await reader.read()
    writer.close()
    return received.count(b"data: ") == 7 and b"data: [DONE]" in received


def test_two_thousand_concurrent_streams_all_complete(sim_factory):
    sim = sim_factory("instant")

    async def burst() -> list[bool]:
        streams = asyncio.gather(*(_one_stream(sim.port, i) for i in range(2000)))
        return await asyncio.wait_for(streams, timeout=120)

    results = asyncio.run(burst())
    assert all(results)
    assert metrics(sim.url)["vllm:generation_tokens_total"] == 10_000
