"""Counting the completion tokens of a relayed answer, cheaply: for /metrics, the access log
and to teach replica rates.

The relay writes every chunk of a stream once, through the client's write (also when it
passes chunks straight from the upstream socket's callback); this shim stands in for the
client and counts `data: ` events with bytes.count (no JSON parsing per chunk). When the
stream carries a usage chunk (stream_options.include_usage), its completion_tokens wins over
the count. A whole JSON answer's usage is found by the same pattern, not parsed either.
"""

from __future__ import annotations

import re
import time

from ..transport.channel import Channel

_EVENT = b"data: "
_DONE = b"data: [DONE]"
# In JSON text a key's closing quote is never escaped, so this finds only real
# "completion_tokens" keys, never one quoted inside a string.
_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class CountingWriter:
    """A client channel as relay() uses it (write, drain, transport), counting events."""

    __slots__ = ("_client", "done", "events", "first_event_at", "transport", "usage_data",
                 "usage_tokens")

    def __init__(self, client: Channel) -> None:
        self._client = client
        self.transport = client.transport
        self.events = 0
        self.done = 0
        self.usage_tokens: int | None = None
        self.usage_data: bytes | None = None  # the last bytes that carried a usage
        self.first_event_at: float | None = None  # when the first event came (monotonic)

    def write(self, data: bytes) -> None:
        self.count(data)
        self._client.write(data)

    def count(self, data: bytes) -> None:
        """Account for bytes on their way to the client."""
        if self.first_event_at is None and _EVENT in data:
            self.first_event_at = time.monotonic()
        self.events += data.count(_EVENT)
        if _DONE in data:
            self.done += 1
        if b'"usage"' in data:  # rare: only the usage-bearing chunks are searched further
            found = _USAGE.findall(data)
            if found:
                self.usage_tokens = int(found[-1])
                self.usage_data = data

    async def drain(self) -> None:
        await self._client.drain()

    @property
    def completion_tokens(self) -> int:
        """Tokens the stream carried: its usage when reported, else one per content event."""
        if self.usage_tokens is not None:
            return self.usage_tokens
        return max(0, self.events - self.done)


def completion_tokens(body: bytes) -> int:
    """usage.completion_tokens of a JSON answer (its last such key), 0 when it carries none."""
    found = _USAGE.findall(body)
    return int(found[-1]) if found else 0
