"""A scriptable fake gear: a raw socket server that records exactly what the gateway sends and
answers each POST with whatever its script says, well-formed or not.

The simulator cannot misbehave on the wire (a negative chunk size, a header with a bare LF, an
answer longer than its Content-Length, bytes on an idle connection); this server can. GETs (the
gateway's probes) get a healthy gear's answers, so the gateway sees the gear ready.

A script is a function of the parsed request (a `Received`) returning the steps of its answer:
bytes to send, a float to sleep that many seconds, HANG (keep the connection open and silent
until the server closes) or CLOSE (close the connection now). After the steps, the connection
serves its next request.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

SERVED = "fake-gear"
HANG = object()
CLOSE = object()
Step = bytes | float | object
Script = Callable[["Received"], Iterable[Step]]


@dataclass
class Received:
    """One request as it arrived: its raw head and body bytes, and what they parse to."""

    raw_head: bytes
    body: bytes
    method: str
    target: str
    headers: list[tuple[str, str]]
    connection: int  # which accepted connection it came on (0, 1, ...)

    def header(self, name: str) -> str | None:
        found = [value for key, value in self.headers if key.lower() == name.lower()]
        return found[-1] if found else None

    def json(self) -> dict:
        return json.loads(self.body)


def json_answer(payload: dict, status: int = 200, extra: bytes = b"") -> bytes:
    """A complete answer with Content-Length (`extra` header lines, each ending CRLF)."""
    body = json.dumps(payload).encode()
    return (b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
            % (status, len(body), extra) + body)


def chat_answer(content: str, model: str = SERVED, tokens: int = 3) -> dict:
    """A chat completion that says `content`, with its usage."""
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": 2 + tokens}}


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_event(content: str, model: str = SERVED, finish: str | None = None) -> bytes:
    """One chat.completion.chunk event, framed as SSE."""
    event = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
             "model": model, "choices": [{"index": 0, "delta": {"content": content},
                                          "finish_reason": finish}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
               b"transfer-encoding: chunked\r\n\r\n")


def stream_answer(words: list[str], model: str = SERVED) -> bytes:
    """A whole, well-formed SSE answer: a chunk per word, the finish, [DONE], the last chunk."""
    events = [sse_event(word, model) for word in words]
    events.append(sse_event("", model, finish="stop"))
    events.append(b"data: [DONE]\n\n")
    return STREAM_HEAD + b"".join(chunk(event) for event in events) + b"0\r\n\r\n"


def echo_script(request: Received) -> list[Step]:
    """The honest gear: it says back the last user message's content, so a caller can tell
    its own answer from anyone else's."""
    content = request.json()["messages"][-1]["content"]
    if request.json().get("stream"):
        return [stream_answer([content])]
    return [json_answer(chat_answer(content))]


class FakeGear:
    """A raw HTTP/1.1 server on 127.0.0.1 answering POSTs by `script`; a context manager."""

    def __init__(self, script: Script = echo_script, served: str = SERVED,
                 max_model_len: int = 4096, echo_id: bool = False,
                 probes: Script | None = None) -> None:
        self.script = script
        # GETs' answers when set (a fake peer gateway's /capabilities, /v1/models, /status).
        self.probes = probes
        self.served = served
        self.max_model_len = max_model_len
        # Every answer head a script sends echoes the X-Request-Id of the request it answers,
        # as a peer gateway does (and vLLM with --enable-request-id-headers).
        self.echo_id = echo_id
        self.received: list[Received] = []
        # The connections (by index) whose far side closed while a HANG held them open.
        self.closed_on_hang: list[int] = []
        self._lock = threading.Lock()
        self._connections: list[socket.socket] = []
        self._closed = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> FakeGear:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def posts(self) -> list[Received]:
        """The POSTs received so far, in order."""
        with self._lock:
            return [r for r in self.received if r.method == "POST"]

    def close(self) -> None:
        self._closed.set()
        self.server.close()
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()

    def _accept(self) -> None:
        index = 0
        while True:
            try:
                conn, _address = self.server.accept()
            except OSError:
                return
            with self._lock:
                self._connections.append(conn)
            threading.Thread(target=self._serve, args=(conn, index), daemon=True).start()
            index += 1

    def _serve(self, conn: socket.socket, index: int) -> None:
        buffer = b""
        try:
            while True:
                request, buffer = self._read_request(conn, buffer, index)
                if request is None:
                    return
                with self._lock:
                    self.received.append(request)
                if request.method == "POST":
                    steps = self.script(request)
                else:
                    steps = self.probes(request) if self.probes else [self._probe_answer(request)]
                echoed = request.header("x-request-id") if self.echo_id else None
                if not self._play(conn, steps, echoed, index):
                    return
        except OSError:
            return
        finally:
            conn.close()

    def _play(self, conn: socket.socket, steps: Iterable[Step], echoed: str | None,
              index: int) -> bool:
        """Send a script's steps (each answer head naming `echoed`, if given); False when the
        connection is done."""
        for step in steps:
            if step is HANG:
                self._hang(conn, index)
                return False
            if step is CLOSE:
                return False
            if isinstance(step, float | int):
                time.sleep(step)
            else:
                assert isinstance(step, bytes)
                if echoed is not None and step.startswith(b"HTTP/1.1 "):
                    line_end = step.index(b"\r\n") + 2
                    step = (step[:line_end] + b"X-Request-Id: " + echoed.encode("latin-1")
                            + b"\r\n" + step[line_end:])
                conn.sendall(step)
        return True

    def _hang(self, conn: socket.socket, index: int) -> None:
        """Hold the connection open and silent until the server closes, noting when the far
        side closes it first."""
        while not self._closed.wait(0.05):
            readable, _w, _x = select.select([conn], [], [], 0)
            if readable and conn.recv(1, socket.MSG_PEEK) == b"":
                with self._lock:
                    self.closed_on_hang.append(index)
                return

    def _probe_answer(self, request: Received) -> bytes:
        path = request.target.split("?", 1)[0]
        if path == "/v1/models":
            return json_answer({"object": "list", "data": [
                {"id": self.served, "object": "model", "max_model_len": self.max_model_len}]})
        if path == "/health":
            return b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
        return json_answer({"error": {"message": "not found"}}, 404)

    @staticmethod
    def _read_request(conn: socket.socket, buffer: bytes,
                      index: int) -> tuple[Received | None, bytes]:
        while b"\r\n\r\n" not in buffer:
            data = conn.recv(65536)
            if not data:
                return None, b""
            buffer += data
        head, buffer = buffer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        method, target, _version = lines[0].decode("latin-1").split(" ", 2)
        headers = []
        for line in lines[1:]:
            name, _sep, value = line.decode("latin-1").partition(":")
            headers.append((name, value.strip()))
        request = Received(head + b"\r\n\r\n", b"", method, target, headers, index)
        length = int(request.header("content-length") or 0)
        chunked = (request.header("transfer-encoding") or "").lower() == "chunked"
        body, buffer = (FakeGear._read_chunked(conn, buffer) if chunked
                        else FakeGear._read_exactly(conn, buffer, length))
        request.body = body
        return request, buffer

    @staticmethod
    def _read_exactly(conn: socket.socket, buffer: bytes, size: int) -> tuple[bytes, bytes]:
        while len(buffer) < size:
            data = conn.recv(65536)
            if not data:
                raise OSError("closed mid-body")
            buffer += data
        return buffer[:size], buffer[size:]

    @staticmethod
    def _read_chunked(conn: socket.socket, buffer: bytes) -> tuple[bytes, bytes]:
        body = b""
        while True:
            while b"\r\n" not in buffer:
                buffer += conn.recv(65536)
            line, buffer = buffer.split(b"\r\n", 1)
            size = int(line.split(b";")[0], 16)
            data, buffer = FakeGear._read_exactly(conn, buffer, size + 2)
            if size == 0:
                return body, buffer
            body += data[:-2]


def wired_to(gear: FakeGear, prefix: str = "PRIMARY") -> dict[str, str]:
    """The env that wires `gear` as a role's backend."""
    return {f"{prefix}_BASE_URL": gear.url, f"{prefix}_SERVED_NAME": gear.served}
