"""The floor of a stdlib asyncio proxy: the cheapest relay the gateway's own tools can build.

gateway_bench.py runs it beside nginx and the gateway. It relays bytes and nothing else: one
asyncio Protocol per socket, callbacks only (no coroutine, no Future), pooled keep-alive
upstream connections, requests framed by Content-Length, responses by Content-Length or
chunked transfer (chunk sizes tracked, bytes passed through untouched), TCP_NODELAY and the
gateway's read size on both sides, and the gateway's garbage-collector settings. No auth, no
routing, no body parsing, no metrics: what it costs is what Python and asyncio cost on the
host, so the gateway's CPU as a ratio to it is the price of the gateway's own work, and its
ratio to nginx is the host's.

    python3 bench/bare_relay.py --port 8100 --backend http://127.0.0.1:8200

It trusts its client and backend (the benchmark's own): no limits, no timeouts, one request
in flight per client connection.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import socket
from urllib.parse import urlsplit

HEAD_END = b"\r\n\r\n"
CRLF = b"\r\n"
LAST_CHUNK_TRAILER = 2  # the CRLF after the last chunk's size line (no trailers are sent)
# The gateway's settings (lobes_gateway/__main__.py), so the floor is collected alike.
GC_THRESHOLDS = (50_000, 20, 100)
LISTEN_BACKLOG = 4096
# The gateway's read size (lobes_gateway/transport/channel.py): asyncio's own 256 KiB a recv()
# is an mmap, mremap and munmap a read under glibc, which the floor does not pay either.
READ_SIZE = 64 * 1024


def tune_socket(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY, and reads of at most READ_SIZE, as the gateway's sockets."""
    transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport.max_size = READ_SIZE


def content_length(head: bytes) -> int | None:
    """The head's Content-Length, or None when it has none (a chunked response)."""
    start = head.lower().find(b"\r\ncontent-length:")
    if start < 0:
        return None
    return int(head[start + 17 : head.find(CRLF, start + 2)])


class ChunkTracker:
    """Where a chunked body stands, fed each segment as it passes: whether it has ended."""

    def __init__(self) -> None:
        self.left = 0  # bytes of the current chunk's data and its CRLF still to pass
        self.line = b""  # a chunk-size line split across segments
        self.last = False  # the zero-size chunk was seen: only its CRLF is left

    def ended_by(self, data: bytes) -> bool:
        """Account for `data`; True when it completes the body."""
        at, size = 0, len(data)
        while at < size:
            if self.left:
                step = min(self.left, size - at)
                self.left -= step
                at += step
                if self.last and not self.left:
                    return True
                continue
            # A size line ends at its LF (its CR may come in the segment before).
            end = data.find(b"\n", at)
            if end < 0:
                self.line += data[at:]
                return False
            chunk = int((self.line + data[at:end]).split(b";", 1)[0], 16)  # int() drops the CR
            self.line = b""
            at = end + 1
            self.last = chunk == 0
            self.left = LAST_CHUNK_TRAILER if self.last else chunk + 2
        return False


class Upstream(asyncio.Protocol):
    """A pooled backend connection relaying one response at a time to its client."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport
        self.client: Client | None = None
        self.head = bytearray()
        self.body_left = 0  # a Content-Length body's bytes still to pass
        self.chunks: ChunkTracker | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        tune_socket(transport)

    def send(self, client: Client, request: bytes) -> None:
        self.client = client
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        head = b""
        if self.chunks is None and not self.body_left:
            parts = self._read_head(data)
            if parts is None:
                return
            head, data = parts
        if self.chunks is not None:
            done = self.chunks.ended_by(data)
        else:
            self.body_left -= len(data)
            done = self.body_left <= 0
        assert self.client is not None
        # The head and the body bytes that came with it leave in one write, as the gateway's do.
        self.client.transport.write(head + data)
        if done:
            self._done()

    def _read_head(self, data: bytes) -> tuple[bytes, bytes] | None:
        """Collect the response head; once whole, the head and the body's bytes that came with
        it (None: not whole yet). Sets how the body is framed."""
        self.head += data
        end = self.head.find(HEAD_END)
        if end < 0:
            return None
        head, rest = bytes(self.head[: end + 4]), bytes(self.head[end + 4 :])
        self.head.clear()
        length = content_length(head)
        if length is None:
            self.chunks = ChunkTracker()
        else:
            self.body_left = length
        return head, rest

    def _done(self) -> None:
        client, self.client = self.client, None
        self.chunks, self.body_left = None, 0
        self.relay.idle.append(self)
        assert client is not None
        client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.relay.idle:
            self.relay.idle.remove(self)
        if self.client is not None:
            self.client.transport.close()


class Client(asyncio.Protocol):
    """A client connection: each whole request goes to an idle pooled upstream, in turn."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport
        self.buffer = bytearray()
        self.waiting = False  # a request of this connection is at the backend

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        tune_socket(transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.waiting:
            self._forward_next()

    def answered(self) -> None:
        self.waiting = False
        if self.buffer:
            self._forward_next()

    def _forward_next(self) -> None:
        end = self.buffer.find(HEAD_END)
        if end < 0:
            return
        total = end + 4 + (content_length(bytes(self.buffer[: end + 4])) or 0)
        if len(self.buffer) < total:
            return
        request = bytes(self.buffer[:total])
        del self.buffer[:total]
        self.waiting = True
        self.relay.forward(self, request)


class Relay:
    """The listening side's state: the backend's address and its idle connections."""

    def __init__(self, backend_host: str, backend_port: int) -> None:
        self.backend = (backend_host, backend_port)
        self.idle: list[Upstream] = []

    def forward(self, client: Client, request: bytes) -> None:
        if self.idle:
            self.idle.pop().send(client, request)
        else:
            asyncio.get_running_loop().create_task(self._dial(client, request))

    async def _dial(self, client: Client, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _transport, upstream = await loop.create_connection(lambda: Upstream(self), *self.backend)
        upstream.send(client, request)


async def serve(port: int, backend: str) -> None:
    origin = urlsplit(backend)
    relay = Relay(origin.hostname or "127.0.0.1", origin.port or 80)
    loop = asyncio.get_running_loop()
    await loop.create_server(
        lambda: Client(relay), "127.0.0.1", port, backlog=LISTEN_BACKLOG, reuse_address=True
    )
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="origin, e.g. http://127.0.0.1:8200")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.backend))


if __name__ == "__main__":
    main()
