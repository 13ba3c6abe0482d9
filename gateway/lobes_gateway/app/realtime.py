"""/v1/realtime: relay the WebSocket handshake, then tunnel opaque bytes both ways."""

from __future__ import annotations

import asyncio
import contextlib
import re

from ..transport import errors
from ..transport.channel import Channel
from ..transport.http import Request, error_bytes, header_block, status_line
from ..transport.upstream import (
    Connections,
    Origin,
    UpstreamError,
    exchange,
    read_body,
    request_head,
)

# The caller's key opens this gateway only: the bridge sees no key.
_SKIP = frozenset({"host", "content-length", "authorization"})
# A bridge's own X-Request-Id line: the gateway's trace gives the answer the request's id.
_REQUEST_ID_LINE = re.compile(rb"^x-request-id[ \t]*:[^\r\n]*\r\n", re.I | re.M)


async def tunnel(connections: Connections, origin: Origin, req: Request, client: Channel,
                 timeout_s: float) -> None:
    """Relay the upgrade to `origin`; on 101, pump bytes until either side closes."""
    headers = header_block([(name, value) for name, value in req.headers.items()
                            if name not in _SKIP])
    try:
        head = request_head("GET", req.target, origin, headers, None)
        response = await exchange(connections, origin, head, b"", timeout_s, upgrade=True)
    except UpstreamError:
        error = errors.backend_unavailable("the realtime bridge", 5)
        client.write(error_bytes(error, keep_alive=False))
        return
    conn = response.conn  # the upgraded socket: never back in the pool
    if response.status != 101:
        try:
            body = await read_body(response, connections.body_timeouts)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            body = b""
        conn.close()
        client.write(status_line(response.status) + response.relayed
                     + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        return
    # The handshake's status line and every header line (it was read strictly), upgrade ones
    # included, but its request id: the trace writes the request's own.
    client.write(_REQUEST_ID_LINE.sub(b"", response.raw))
    pumps = [asyncio.create_task(_pump(client, conn.channel)),
             asyncio.create_task(_pump(conn.channel, client))]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        conn.close()


async def _pump(source: Channel, sink: Channel) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            data = await source.read(65536)
            if not data:
                return
            sink.write(data)
            await sink.drain()
