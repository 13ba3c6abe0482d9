"""Counting the completion tokens of a relayed SSE stream, cheaply, to teach replica rates.

The relay writes every chunk once; this shim stands in for the client writer and counts
`data: ` events with bytes.count (no JSON parsing per chunk). When the stream carries a
usage chunk (stream_options.include_usage), its completion_tokens wins over the count.
"""

from __future__ import annotations

import asyncio
import re

_EVENT = b"data: "
_DONE = b"data: [DONE]"
_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class CountingWriter:
    """A client StreamWriter as relay() uses it (write, drain, transport), counting events."""

    __slots__ = ("_writer", "done", "events", "transport", "usage_tokens")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self.transport = writer.transport
        self.events = 0
        self.done = 0
        self.usage_tokens: int | None = None

    def write(self, data: bytes) -> None:
        self.events += data.count(_EVENT)
        if _DONE in data:
            self.done += 1
        if b'"usage"' in data:  # rare: only the usage-bearing chunks are searched further
            found = _USAGE.findall(data)
            if found:
                self.usage_tokens = int(found[-1])
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    @property
    def completion_tokens(self) -> int:
        """Tokens the stream carried: its usage when reported, else one per content event."""
        if self.usage_tokens is not None:
            return self.usage_tokens
        return max(0, self.events - self.done)
