"""The bench backend's step clock: aligned streams send their chunks on one clock, as vLLM sends
every running stream's token at one decode step."""

from __future__ import annotations

import http.client
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.wait import http_ok, wait_until

BENCH = Path(__file__).resolve().parents[2] / "bench"
_SPEC = importlib.util.spec_from_file_location("fast_backend", BENCH / "fast_backend.py")
fast_backend = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fast_backend)


@pytest.mark.parametrize(("now", "interval", "tick"), [
    (10.0011, 0.004, 10.004),  # within a step: its end
    (10.004, 0.004, 10.008),  # on a tick: the next one, never now
    (0.0, 0.25, 0.25),
    (7.9, 1.0, 8.0),
])
def test_the_next_step_is_the_first_tick_of_the_clock_after_now(now, interval, tick):
    assert fast_backend.next_step(now, interval) == pytest.approx(tick)


def test_streams_started_apart_share_every_tick_after_their_first():
    """Two streams whose chunks start a fraction of a step apart send the rest on one tick."""
    first = fast_backend.next_step(3.0007, 0.004)
    second = fast_backend.next_step(3.0031, 0.004)
    assert first == second == pytest.approx(3.004)
    assert fast_backend.next_step(first, 0.004) == fast_backend.next_step(second, 0.004)


@pytest.fixture
def backend_port():
    port = free_port()
    process = subprocess.Popen([sys.executable, str(BENCH / "fast_backend.py"), "--port",
                                str(port)])
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"),
                   message=f"a 200 from /health on port {port}")
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_an_aligned_stream_carries_every_chunk_and_its_end(backend_port):
    body = {"model": "bench-model", "stream": True, "bench_chunks": 6, "bench_interval_ms": 2,
            "bench_step_aligned": True}
    conn = http.client.HTTPConnection("127.0.0.1", backend_port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    answer = conn.getresponse().read()
    conn.close()

    events = [event for event in answer.split(b"\n\n") if event]
    assert sum(b'"content":" fox"' in event for event in events) == 6
    assert events[-1] == b"data: [DONE]"
