"""Connection life: dial deadlines and a quiet shutdown with connections still open."""

import socket
import time

from tests.gateway.client import call, chat, wired


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
    time.sleep(0.1)
    return listener, fillers, port


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
