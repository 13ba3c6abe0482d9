"""Relay an upstream response to the client: bodies by length, SSE chunk by chunk, untouched."""

from __future__ import annotations

import asyncio
import json

from .http import status_line
from .upstream import Pool, Response, finish, read_body

# Above this many unsent bytes the relay waits for the client (backpressure).
HIGH_WATER = 64 * 1024
_BODY_IN_ONE_READ = 256 * 1024
_BROKEN = (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError)
_STREAM_END = b"0\r\n\r\n"
_INTERRUPTED = json.dumps({"error": {
    "type": "upstream_unavailable", "code": "stream_interrupted",
    "message": "the backend closed the stream mid-response; retry the request"}}).encode()


class Pending:
    """A response head chosen for the client, relayed by the connection's top frame.

    Dispatch returns it instead of relaying, so the routing frames (payload, bodies, headers)
    are gone while a long stream is held.
    """

    __slots__ = ("extra", "response")

    def __init__(self, response: Response, extra: list[bytes]) -> None:
        self.response = response
        self.extra = extra


def head_bytes(response: Response, extra: list[bytes], framing: bytes, keep_alive: bool) -> bytes:
    """Status line, upstream headers minus hop-by-hop ones, the gateway's headers, framing."""
    lines = [*response.relayed_headers(), *extra, framing]
    if not keep_alive:
        lines.append(b"Connection: close")
    return status_line(response.status) + b"\r\n".join(lines) + b"\r\n\r\n"


async def relay(pool: Pool, response: Response, client: asyncio.StreamWriter,
                extra: list[bytes], keep_alive: bool) -> bool:
    """Relay `response` to `client`; returns whether the client connection stays usable."""
    if response.length is not None:
        return await _relay_sized(pool, response, client, extra, keep_alive)
    if response.chunked and not _is_event_stream(response):
        try:
            body = await read_body(response)
        except _BROKEN:
            response.conn.close()
            return False
        finish(pool, response)
        framing = b"Content-Length: %d" % len(body)
        client.write(head_bytes(response, extra, framing, keep_alive) + body)
        return keep_alive
    return await _relay_stream(pool, response, client, extra, keep_alive)


def _is_event_stream(response: Response) -> bool:
    return response.headers.get(b"content-type", b"").startswith(b"text/event-stream")


async def _relay_sized(pool: Pool, response: Response, client: asyncio.StreamWriter,
                       extra: list[bytes], keep_alive: bool) -> bool:
    length = response.length or 0
    head = head_bytes(response, extra, b"Content-Length: %d" % length, keep_alive)
    reader = response.conn.reader
    try:
        if length <= _BODY_IN_ONE_READ:
            client.write(head + (await reader.readexactly(length) if length else b""))
        else:
            client.write(head)
            left = length
            while left:
                data = await reader.read(min(left, _BODY_IN_ONE_READ))
                if not data:
                    raise ConnectionResetError("upstream closed mid-body")
                left -= len(data)
                client.write(data)
                await client.drain()
    except _BROKEN:
        response.conn.close()
        return False
    finish(pool, response)
    return keep_alive


async def _relay_stream(pool: Pool, response: Response, client: asyncio.StreamWriter,
                        extra: list[bytes], keep_alive: bool) -> bool:
    """Pass chunks through as they arrive, one client write per upstream chunk."""
    client.write(head_bytes(response, extra, b"Transfer-Encoding: chunked", keep_alive))
    event_stream, chunked = _is_event_stream(response), response.chunked
    # Sent: not kept for a held stream.
    response.header_lines, response.headers, response.relayed = [], {}, []
    reader = response.conn.reader
    transport = client.transport
    try:
        if chunked:
            # Inline on purpose: one frame per held stream, one client write per chunk.
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass
                    break
                data = await reader.readexactly(size + 2)
                if transport.is_closing():
                    raise ConnectionResetError("client went away")
                client.write(line + data)
                if transport.get_write_buffer_size() > HIGH_WATER:
                    await client.drain()
        else:
            await _frame_until_eof(reader, client, transport)
            response.keep_alive = False
    except _BROKEN:
        response.conn.close()
        if not transport.is_closing():
            if event_stream:
                event = b"data: " + _INTERRUPTED + b"\n\n"
                client.write(b"%x\r\n%s\r\n" % (len(event), event) + _STREAM_END)
            transport.close()
        return False
    client.write(_STREAM_END)
    finish(pool, response)
    return keep_alive


async def _frame_until_eof(reader: asyncio.StreamReader, client: asyncio.StreamWriter,
                           transport: asyncio.WriteTransport) -> None:
    while True:
        data = await reader.read(65536)
        if not data:
            return
        if transport.is_closing():
            raise ConnectionResetError("client went away")
        client.write(b"%x\r\n%s\r\n" % (len(data), data))
        if transport.get_write_buffer_size() > HIGH_WATER:
            await client.drain()
