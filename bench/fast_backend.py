"""A minimal, fast vLLM-shaped backend for the gateway benchmark (stdlib only).

It answers chat completions as fast as Python allows so that the proxy under test,
not the backend, is what the benchmark sees. A streamed request takes its shape from
two extra body fields the proxies pass through untouched:
``bench_chunks`` (content chunks before the stream's end: a finish_reason, the usage chunk and
``data: [DONE]``, as vLLM ends one) and ``bench_interval_ms`` (the spacing between chunks, so
streams stay open and each chunk travels alone). With ``bench_step_aligned`` every stream's
chunks fall on one clock of that interval, as vLLM sends each running stream's token at the
same decode step: the streams' chunks then leave together, not at whatever phase each stream
happened to start in.
``GET /bench/finish`` ends every open stream at once (its end and the last chunk),
so a benchmark can hold streams for as long as it needs and still see each one end cleanly.

Run: ``python3 bench/fast_backend.py --port P`` (it serves the model ``bench-model``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import socket

SERVED_NAME = "bench-model"
HEADER_END = b"\r\n\r\n"

COMPLETION_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1764400000,
        "model": SERVED_NAME,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The quick brown fox jumps."},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "total_tokens": 19, "completion_tokens": 7},
    },
    separators=(",", ":"),
).encode()

CHUNK_EVENT = (
    b"data: "
    + json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1764400000,
            "model": SERVED_NAME,
            "choices": [{"index": 0, "delta": {"content": " fox"}, "finish_reason": None}],
        },
        separators=(",", ":"),
    ).encode()
    + b"\n\n"
)
DONE_EVENT = b"data: [DONE]\n\n"


def _event(choices: list, **extra: object) -> bytes:
    payload = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1764400000,
               "model": SERVED_NAME, "choices": choices, **extra}
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


# A stream ends as vLLM ends one: the choice's finish_reason, then the usage chunk (vLLM sends
# it when asked; the gateway asks on every stream and leaves it out for a caller who did not),
# then [DONE]. A stream without them is one an engine cut off, and the gateway says so.
FINISH_EVENT = _event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
USAGE_EVENT = _event([], usage={"prompt_tokens": 12, "total_tokens": 19,
                                "completion_tokens": 7})


def _chunk(payload: bytes) -> bytes:
    """Frame one payload as an HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


CHUNK_FRAME = _chunk(CHUNK_EVENT)
LAST_FRAMES = _chunk(FINISH_EVENT) + _chunk(USAGE_EVENT) + _chunk(DONE_EVENT) + b"0\r\n\r\n"
JSON_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(COMPLETION_BODY), COMPLETION_BODY)
)
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _plain(status: bytes, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        content_type,
        len(body),
        body,
    )


MODELS_RESPONSE = _plain(
    b"200 OK",
    json.dumps(
        {
            "object": "list",
            "data": [
                {"id": SERVED_NAME, "object": "model", "owned_by": "bench", "max_model_len": 8192}
            ],
        }
    ).encode(),
)
HEALTH_RESPONSE = _plain(b"200 OK", b"")
METRICS_RESPONSE = _plain(
    b"200 OK",
    (
        f'vllm:num_requests_running{{model_name="{SERVED_NAME}"}} 0.0\n'
        f'vllm:num_requests_waiting{{model_name="{SERVED_NAME}"}} 0.0\n'
    ).encode(),
    b"text/plain; version=0.0.4",
)
NOT_FOUND = _plain(b"404 Not Found", b'{"error":{"type":"NotFoundError","code":404}}')

# Streams now being sent, so that /bench/finish can end them all.
OPEN_STREAMS: set[BackendProtocol] = set()


class BackendProtocol(asyncio.Protocol):
    """One keep-alive client connection; requests are handled strictly in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.streaming = False
        self.closed = False
        self.next_chunk: asyncio.TimerHandle | None = None
        self.aligned = False  # this stream's chunks fall on the shared step clock

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        OPEN_STREAMS.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while not self.streaming and self._handle_one():
            pass

    def _handle_one(self) -> bool:
        """Answer the first complete request in the buffer; False when none is complete yet."""
        end = self.buffer.find(HEADER_END)
        if end < 0:
            return False
        head = bytes(self.buffer[:end]).lower()
        body_start = end + 4
        body = self._take_body(head, body_start)
        if body is None:
            return False
        request_line = head.split(b"\r\n", 1)[0]
        method, path = request_line.split(b" ", 2)[:2]
        if method == b"post":
            self._answer_post(body)
        else:
            self.transport.write(self._answer_get(path))
        return True

    def _take_body(self, head: bytes, body_start: int) -> bytes | None:
        """Remove one request from the buffer and return its body (None: not all here yet)."""
        if b"transfer-encoding: chunked" in head:
            return self._take_chunked_body(body_start)
        length = 0
        marker = head.find(b"content-length:")
        if marker >= 0:
            line_end = head.find(b"\r\n", marker)
            length = int(head[marker + 15 : line_end if line_end >= 0 else None])
        if len(self.buffer) < body_start + length:
            return None
        body = bytes(self.buffer[body_start : body_start + length])
        del self.buffer[: body_start + length]
        return body

    def _take_chunked_body(self, pos: int) -> bytes | None:
        parts = []
        while True:
            line_end = self.buffer.find(b"\r\n", pos)
            if line_end < 0:
                return None
            size = int(bytes(self.buffer[pos:line_end]).split(b";")[0], 16)
            if size == 0:
                if len(self.buffer) < line_end + 4:
                    return None
                del self.buffer[: line_end + 4]
                return b"".join(parts)
            start = line_end + 2
            if len(self.buffer) < start + size + 2:
                return None
            parts.append(bytes(self.buffer[start : start + size]))
            pos = start + size + 2

    @staticmethod
    def _answer_get(path: bytes) -> bytes:
        if path == b"/bench/finish":
            ended = len(OPEN_STREAMS)
            for stream in list(OPEN_STREAMS):
                stream.finish_now()
            return _plain(b"200 OK", b'{"finished":%d}' % ended)
        if path == b"/health":
            return HEALTH_RESPONSE
        if path == b"/v1/models":
            return MODELS_RESPONSE
        if path == b"/metrics":
            return METRICS_RESPONSE
        return NOT_FOUND

    def _answer_post(self, body: bytes) -> None:
        request = json.loads(body) if body else {}
        if not request.get("stream"):
            self.transport.write(JSON_RESPONSE)
            return
        chunks = int(request.get("bench_chunks", 8))
        interval = float(request.get("bench_interval_ms", 0)) / 1000.0
        self.aligned = bool(request.get("bench_step_aligned"))
        self.streaming = True
        OPEN_STREAMS.add(self)
        self.transport.write(STREAM_HEAD + CHUNK_FRAME)
        self._continue_stream(chunks - 1, interval)

    def finish_now(self) -> None:
        """End this stream with its last frames, whatever chunks it had left."""
        if self.next_chunk is not None:
            self.next_chunk.cancel()
        self._continue_stream(0, 0.0)

    def _continue_stream(self, remaining: int, interval: float) -> None:
        """Send the rest of a stream one chunk per interval, then resume reading requests."""
        if self.closed:
            return
        if remaining <= 0:
            self.transport.write(LAST_FRAMES)
            self.streaming = False
            self.next_chunk = None
            OPEN_STREAMS.discard(self)
            while self._handle_one():
                pass
            return
        if interval <= 0:
            self.transport.write(CHUNK_FRAME * remaining)
            self._continue_stream(0, interval)
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        when = next_step(now, interval) if self.aligned else now + interval
        self.next_chunk = loop.call_at(when, self._send_chunk, remaining, interval)

    def _send_chunk(self, remaining: int, interval: float) -> None:
        if self.closed:
            return
        self.transport.write(CHUNK_FRAME)
        self._continue_stream(remaining - 1, interval)


def next_step(now: float, interval: float) -> float:
    """The first tick of a clock of `interval` seconds after `now`: the time every aligned
    stream sends its next chunk."""
    return (math.floor(now / interval) + 1) * interval


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(BackendProtocol, host, port, backlog=4096)
    gc.freeze()
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
