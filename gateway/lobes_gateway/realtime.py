"""/v1/realtime: relay the WebSocket handshake, then tunnel opaque bytes both ways."""

from __future__ import annotations

import asyncio
import contextlib

from . import errors
from .channel import Channel
from .config import Origin
from .http import Request, error_bytes
from .upstream import Pool, UpstreamError, read_body, read_head

_SKIP = frozenset({"host", "content-length"})


async def tunnel(pool: Pool, origin: Origin, req: Request, client: Channel,
                 timeout_s: float) -> None:
    """Relay the upgrade to `origin`; on 101, pump bytes until either side closes."""
    lines = [f"GET {req.target} HTTP/1.1", f"Host: {origin.host_header}"]
    lines += [f"{name}: {value}" for name, value in req.headers.items() if name not in _SKIP]
    try:
        conn = await pool.open(origin)
        conn.channel.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        response = await read_head(conn, timeout_s)
    except UpstreamError:
        error = errors.backend_unavailable("the realtime bridge", 5)
        client.write(error_bytes(error, keep_alive=False))
        return
    head = response.raw[:-2]  # its status line and every header line, upgrade ones included
    if response.status != 101:
        try:
            body = await read_body(response)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            body = b""
        conn.close()
        length = b"Content-Length: %d\r\n" % len(body) if response.length is None else b""
        client.write(head + length + b"Connection: close\r\n\r\n" + body)
        return
    client.write(head + b"\r\n")
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
