"""Connection life: dial deadlines and a quiet shutdown with connections still open."""

import json
import socket
import time
from pathlib import Path

import pytest

from tests.support.client import call, chat, wired
from tests.support.wait import wait_until


def _accept_queue_full(port: int) -> bool:
    """Whether the listener on `port` has a full accept queue (Linux's /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:  # 0A: LISTEN
            limit, queued = (int(value, 16) for value in fields[4].split(":"))
            return queued > limit
    return False


def _unanswered_listener() -> tuple[socket.socket, list[socket.socket], int]:
    """A port whose accept queue is full: a further connect hangs in SYN retries.

    Linux drops SYNs to a listener whose backlog is full, so a dial to it neither succeeds
    nor fails until the caller gives up: the real fault a dead-but-routable box produces.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _filler in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    wait_until(lambda: _accept_queue_full(port), timeout=5, interval=0.01,
               message=f"the accept queue of port {port} to fill")
    return listener, fillers, port


@pytest.mark.timing  # the 503 must come within the client's 3 s of wall time
def test_a_dial_that_hangs_ends_at_the_connect_timeout_with_a_503(gateway_factory):
    listener, fillers, port = _unanswered_listener()
    try:
        gateway = gateway_factory({"PRIMARY_BASE_URL": f"http://127.0.0.1:{port}",
                                   "GATEWAY_CONNECT_TIMEOUT_S": "0.2"})
        # SYN retries alone take seconds; an answer within the client's 3 s is the deadline's.
        reply = chat(gateway.url, {"model": "main"}, timeout=3)
        assert reply.status == 503
        assert reply.error["type"] == "backend_unavailable"
        assert gateway.alive()
    finally:
        for sock in [listener, *fillers]:
            sock.close()


def test_sigterm_with_open_connections_exits_cleanly_and_quietly(gateway_factory, sim_factory):
    primary = sim_factory("instant")
    gateway = gateway_factory(wired(primary))
    assert call(gateway.url, "GET", "/health").status == 200
    idle = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200 OK" in idle.recv(65536)  # served, now idle in keep-alive
    partial = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
    partial.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # head half sent
    try:
        code, output = gateway.shutdown()
        assert code == 0
        assert "Traceback" not in output
        assert idle.recv(65536) == b""  # the server closed the idle connection
    finally:
        idle.close()
        partial.close()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_a_client_that_stops_reading_holds_the_stream_back_not_the_gateways_memory(
        gateway_factory, sim_factory):
    primary = sim_factory("instant")
    gateway = gateway_factory(wired(primary))
    body = json.dumps({"model": "main", "stream": True, "max_tokens": 60_000, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "go"}]}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               b"Content-Type: application/json\r\nContent-Length: %d\r\n"
               b"Connection: close\r\n\r\n" % len(body)) + body
    before = _rss_kib(gateway.pid)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", gateway.port))
        sock.sendall(request)
        # The behaviour under test, not a wait for an event: for 3 s this client reads
        # nothing, and the stream (about 10 MB) must wait upstream meanwhile, not here.
        time.sleep(3)
        held = _rss_kib(gateway.pid) - before
        sock.settimeout(30)
        chunks = []
        while data := sock.recv(1 << 20):
            chunks.append(data)
    answer = b"".join(chunks)
    events = [line for line in answer.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    tokens = [json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[1:-1]
              if b'"choices":[{' in e or b'"choices": [{' in e]
    assert len([t for t in tokens if t]) == 60_000
    assert held < 4 * 1024  # KiB: far below the stream, which waited upstream
