"""Chunk framing as the event-stream pass-through sees it: whole chunks only, then trailers;
and its backpressure, end to end."""

from __future__ import annotations

import time

import pytest
from lobes_gateway.app.relay import _trailers_end, scan_chunks

from tests.support.sse import Streamed, stream_chat

TWO_EVENTS = b"6\r\ndata:1\r\n6\r\ndata:2\r\n"


def test_complete_chunks_pass_and_the_last_chunk_is_found():
    assert scan_chunks(TWO_EVENTS) == (len(TWO_EVENTS), False, 0)
    assert scan_chunks(TWO_EVENTS + b"0\r\n\r\n") == (len(TWO_EVENTS), True, 0)


def test_a_chunk_split_mid_data_is_held_back_with_the_bytes_it_still_needs():
    partial = TWO_EVENTS + b"6\r\nda"
    assert scan_chunks(partial) == (len(TWO_EVENTS), False, 6)


def test_a_split_size_line_is_held_back_until_it_ends():
    assert scan_chunks(TWO_EVENTS + b"1") == (len(TWO_EVENTS), False, 0)


def test_chunk_extensions_are_passed_verbatim():
    data = b"6;name=v\r\ndata:1\r\n"
    assert scan_chunks(data) == (len(data), False, 0)


def test_a_malformed_size_line_is_an_error():
    with pytest.raises(ValueError):
        scan_chunks(b"zz\r\ndata\r\n")


def test_trailers_end_after_the_blank_line_and_extra_bytes_make_it_unclean():
    assert _trailers_end(b"0\r\n\r\n") is True
    assert _trailers_end(b"0\r\nX-Checksum: 1\r\n\r\n") is True
    assert _trailers_end(b"0\r\nX-Checksum: 1\r\n") is None
    assert _trailers_end(b"0\r\n") is None
    assert _trailers_end(b"0\r\n\r\nHTTP/1.1 200 OK") is False


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
