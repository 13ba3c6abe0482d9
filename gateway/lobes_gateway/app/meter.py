"""Counting the completion tokens of a relayed SSE stream, cheaply, to teach replica rates.

The relay writes every chunk once, through the client channel or (when it passes chunks
straight from the upstream socket's callback) through the client transport; this shim stands
in for both and counts `data: ` events with bytes.count (no JSON parsing per chunk). When the
stream carries a usage chunk (stream_options.include_usage), its completion_tokens wins over
the count.
"""

from __future__ import annotations

import asyncio
import json
import re

from ..transport.channel import Channel

_EVENT = b"data: "
_DONE = b"data: [DONE]"
_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class CountingWriter:
    """A client channel as relay() uses it (write, drain, transport), counting events."""

    __slots__ = ("_client", "done", "events", "transport", "usage_tokens")

    def __init__(self, client: Channel) -> None:
        self._client = client
        self.transport = _CountingTransport(client.transport, self)
        self.events = 0
        self.done = 0
        self.usage_tokens: int | None = None

    def write(self, data: bytes) -> None:
        self.count(data)
        self._client.write(data)

    def count(self, data: bytes) -> None:
        """Account for bytes on their way to the client."""
        self.events += data.count(_EVENT)
        if _DONE in data:
            self.done += 1
        if b'"usage"' in data:  # rare: only the usage-bearing chunks are searched further
            found = _USAGE.findall(data)
            if found:
                self.usage_tokens = int(found[-1])

    async def drain(self) -> None:
        await self._client.drain()

    @property
    def completion_tokens(self) -> int:
        """Tokens the stream carried: its usage when reported, else one per content event."""
        if self.usage_tokens is not None:
            return self.usage_tokens
        return max(0, self.events - self.done)


class _CountingTransport:
    """The client transport as the relay's chunk pipe uses it, counting what is written."""

    __slots__ = ("_meter", "_transport")

    def __init__(self, transport: asyncio.WriteTransport, meter: CountingWriter) -> None:
        self._transport = transport
        self._meter = meter

    def write(self, data: bytes) -> None:
        self._meter.count(data)
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def close(self) -> None:
        self._transport.close()


def completion_tokens(body: bytes) -> int:
    """usage.completion_tokens of a JSON answer, 0 when it carries none."""
    try:
        usage = json.loads(body).get("usage") or {}
    except (ValueError, AttributeError, UnicodeDecodeError):
        return 0
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else 0
