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
from collections.abc import Callable

from ..transport.channel import Channel

_EVENT = b"data: "
_DONE = b"data: [DONE]"
# In JSON text a key's closing quote is never escaped, so this finds only real
# "completion_tokens" keys, never one quoted inside a string.
_USAGE_KEY = b'"completion_tokens"'
_USAGE = re.compile(_USAGE_KEY + rb'\s*:\s*(\d+)')


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
            found = last_usage_count(data)
            if found is not None:
                self.usage_tokens = found
                self.usage_data = data

    async def drain(self) -> None:
        await self._client.drain()

    def watch_gone(self, callback: Callable[[], None] | None) -> bool:
        return self._client.watch_gone(callback)

    @property
    def completion_tokens(self) -> int:
        """Tokens the stream carried: its usage when reported, else one per content event."""
        if self.usage_tokens is not None:
            return self.usage_tokens
        return max(0, self.events - self.done)


def completion_tokens(body: bytes) -> int:
    """usage.completion_tokens of a JSON answer (its last such key), 0 when it carries none."""
    found = last_usage_count(body)
    return 0 if found is None else found


def last_usage_count(data: bytes) -> int | None:
    """The count of the last "completion_tokens" key in `data` that has one, None when none
    has. Looked for from the end, where an answer's usage is: a scan of the whole body cost
    more than the rest of the metering."""
    at = data.rfind(_USAGE_KEY)
    if at < 0:
        return None
    found = _USAGE.match(data, at)
    if found is not None:
        return int(found.group(1))
    # The last key has no count (null): an earlier one may, and no earlier match runs past it.
    counts = _USAGE.findall(data, 0, at)
    return int(counts[-1]) if counts else None
