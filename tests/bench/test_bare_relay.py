"""bench/bare_relay.py, the floor gateway_bench.py measures the gateway against: it must relay
exactly what the backend sends, or the floor it reports is not a relay's. Real processes: the
benchmark's fast backend and the relay on 127.0.0.1 ports."""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from lobes_gateway.transport.channel import READ_SIZE

from tests.support.ports import free_port
from tests.support.sockets import SizedReads, waiting_tcp_pair
from tests.support.wait import http_ok, wait_until

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load_relay_module():
    spec = importlib.util.spec_from_file_location("bare_relay", BENCH / "bare_relay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bare_relay = _load_relay_module()
CHUNKED_BODY = b"5\r\nhello\r\n1a;ext=1\r\n" + b"x" * 26 + b"\r\n0\r\n\r\n"


def _ends(pieces: list[bytes]) -> list[bool]:
    tracker = bare_relay.ChunkTracker()
    return [tracker.ended_by(piece) for piece in pieces]


@pytest.mark.parametrize("cut", range(1, len(CHUNKED_BODY)))
def test_a_chunked_body_ends_with_its_last_byte_wherever_it_is_cut(cut):
    assert _ends([CHUNKED_BODY[:cut], CHUNKED_BODY[cut:]]) == [False, True]


def test_a_chunked_body_fed_byte_by_byte_ends_only_at_its_last_byte():
    ends = _ends([CHUNKED_BODY[i:i + 1] for i in range(len(CHUNKED_BODY))])
    assert ends == [False] * (len(CHUNKED_BODY) - 1) + [True]


@pytest.fixture
def backend_and_relay(tmp_path):
    backend_port, relay_port = free_port(), free_port()
    started = [
        subprocess.Popen([sys.executable, str(BENCH / "fast_backend.py"), "--port",
                          str(backend_port)]),
        subprocess.Popen([sys.executable, str(BENCH / "bare_relay.py"), "--port",
                          str(relay_port), "--backend", f"http://127.0.0.1:{backend_port}"]),
    ]
    try:
        for port in (backend_port, relay_port):
            wait_until(lambda port=port: http_ok(f"http://127.0.0.1:{port}/health"),
                       message=f"a 200 from /health on port {port}")
        yield backend_port, relay_port
    finally:
        for process in started:
            process.terminate()
            process.wait(timeout=10)


def _exchanges(port: int) -> list[tuple[int, bytes]]:
    """A JSON answer, a streamed one and a JSON one again, on one keep-alive connection."""
    bodies = [{"model": "bench-model"},
              {"model": "bench-model", "stream": True, "bench_chunks": 5},
              {"model": "bench-model"}]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    answers = []
    for body in bodies:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        answers.append((response.status, response.read()))
    conn.close()
    return answers


def test_the_relay_answers_byte_for_byte_what_the_backend_does(backend_and_relay):
    backend_port, relay_port = backend_and_relay
    direct = _exchanges(backend_port)
    relayed = _exchanges(relay_port)
    assert relayed == direct
    assert [status for status, _body in relayed] == [200, 200, 200]
    # Five content chunks, then the end vLLM sends: the finish, the usage chunk and [DONE].
    assert relayed[1][1].count(b"data: ") == 8 and relayed[1][1].endswith(b"data: [DONE]\n\n")
    assert b'"finish_reason":"stop"' in relayed[1][1] and b'"completion_tokens":7' in relayed[1][1]


def test_the_floor_reads_its_sockets_as_the_gateway_does():
    """At most the gateway's READ_SIZE a read (asyncio's own 256 KiB costs an mmap, mremap
    and munmap a read): otherwise the floor pays a cost the gateway does not."""

    class RelaySizedReads(SizedReads):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            bare_relay.tune_socket(transport)

    written = 3 * READ_SIZE

    async def scenario() -> list[int]:
        ours, theirs = waiting_tcp_pair(b"x" * written)
        loop = asyncio.get_running_loop()
        protocol = (await loop.create_connection(RelaySizedReads, sock=ours))[1]
        sizes = await protocol.until(written)
        theirs.close()
        return sizes

    assert bare_relay.READ_SIZE == READ_SIZE
    sizes = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert max(sizes) == READ_SIZE and sum(sizes) == written
