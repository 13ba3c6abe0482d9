"""Response heads parsed once per shape (transport/heads.py): a backend's answers of one shape
differ in Content-Length, and each is relayed whole; lengths that disagree make the backend
unavailable (503), never a guessed body.

The backend is a scripted socket server: the simulator cannot send a malformed head."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.support.client import chat
from tests.support.gateway_proc import start_gateway

HEAD = (b"HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 01:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-length: %d\r\ncontent-type: application/json\r\n\r\n")


def answer(content: str) -> bytes:
    body = json.dumps({"id": "c", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": content},
         "finish_reason": "stop"}]}).encode()
    return HEAD % len(body) + body


class ScriptedBackend:
    """Answers each POST on a keep-alive connection with the next scripted response; any GET
    (the gateway's probes) with a 404."""

    def __init__(self, script: list[bytes]) -> None:
        self.script = script
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _address = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while head := self._read_head(reader):
                length = next((int(line.split(b":")[1]) for line in head
                               if line.lower().startswith(b"content-length:")), 0)
                reader.read(length)
                if head[0].startswith(b"POST") and self.script:
                    conn.sendall(self.script.pop(0))
                else:
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")

    @staticmethod
    def _read_head(reader) -> list[bytes]:
        lines = []
        while (line := reader.readline()) not in (b"\r\n", b""):
            lines.append(line.rstrip(b"\r\n"))
        return lines

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def backend_factory() -> Iterator:
    made: list[ScriptedBackend] = []

    def factory(script: list[bytes]) -> ScriptedBackend:
        made.append(ScriptedBackend(script))
        return made[-1]

    yield factory
    for backend in made:
        backend.close()


def wired_to(backend: ScriptedBackend) -> dict[str, str]:
    return {"PRIMARY_BASE_URL": backend.url, "PRIMARY_SERVED_NAME": "scripted"}


def test_answers_of_one_shape_with_other_lengths_are_each_relayed_whole(backend_factory):
    contents = ["short", "long " * 800, "again"]
    backend = backend_factory([answer(content) for content in contents])
    with start_gateway(wired_to(backend)) as gateway:
        for content in contents:
            reply = chat(gateway.url, {"model": "main", "max_tokens": 4})
            assert reply.status == 200
            assert reply.json()["choices"][0]["message"]["content"] == content


def test_content_lengths_that_disagree_are_refused_not_guessed(backend_factory):
    body = answer("hello").split(b"\r\n\r\n", 1)[1]
    conflicting = HEAD.replace(b"server:", b"content-length: 3\r\nserver:") % len(body) + body
    # Twice: a bad head on a pooled connection is asked once more on a fresh one.
    backend = backend_factory([answer("fine"), conflicting, conflicting])
    with start_gateway(wired_to(backend)) as gateway:
        assert chat(gateway.url, {"model": "main", "max_tokens": 4}).status == 200
        refused = chat(gateway.url, {"model": "main", "max_tokens": 4})
        assert refused.status == 503  # the backend gave no usable answer, as when it is down
        assert refused.json()["error"]["code"] == "backend_unavailable"
