"""The event-stream pass-through's backpressure, end to end (its chunk framing:
test_chunked.py)."""

from __future__ import annotations

import time

from tests.support.sse import Streamed, stream_chat


def test_a_client_that_stops_reading_gets_the_whole_stream_once_it_reads_again(
        sim_factory, gateway_factory):
    """The pass-through pauses its upstream while the client's unsent bytes are over the
    high-water mark and resumes once they drain: nothing is dropped or reordered."""
    sim = sim_factory("instant", served_name="sim-a")
    gateway = gateway_factory({"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": "sim-a",
                               "PRIMARY_MAX_MODEL_LEN": "131072"})
    ask = {"model": "cortex", "messages": [{"role": "user", "content": "go on"}],
           "max_tokens": 40000, "ignore_eos": True}
    napped: list[bool] = []

    def nap_once(_streamed: Streamed) -> None:
        if not napped:  # the stream fills every buffer on its way meanwhile
            napped.append(True)
            time.sleep(1.5)

    streamed = stream_chat(gateway.url, ask, after_event=nap_once)
    assert streamed.done and streamed.content_events == ask["max_tokens"]
    reference = stream_chat(sim.url, {**ask, "model": "sim-a"})
    assert streamed.text == reference.text
