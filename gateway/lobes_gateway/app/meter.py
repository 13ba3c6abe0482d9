"""Counting the completion tokens of a relayed answer, exactly and cheaply: for /metrics, the
access log and to teach replica rates; and telling a stream that ended from one cut off.

A token count comes only from the engine's own usage, never from counting events (an event may
carry several tokens, the role delta none, and the engine holds back a token that ends
mid-character). Every generate stream is asked for its usage (stream_options.include_usage,
asking_usage); the relay writes each chunk of the stream through a StreamMeter standing in for
the client, which reads the usage chunk and, when the caller did not ask for it, leaves it out.
The meter also reads how the stream ends: an engine that stops (SIGTERM) or loses its core ends
its streams at once, with an error event and [DONE], or with [DONE] right after an ordinary
content event and no finish_reason at all. Either is a stream cut off, not an answer: the
caller gets the gateway's stream_interrupted event in place of [DONE]. The usual chunk is
looked at with three scans that each start at a literal (C speed), never parsed.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

from ..transport.channel import Channel
from ..transport.chunked import ChunkDecoder

_EVENT = b"data: "
_DONE = b"data: [DONE]"
# In JSON text a key's closing quote is never escaped, so this finds only real
# "completion_tokens" keys, never one quoted inside a string.
_USAGE_KEY = b'"completion_tokens"'
_USAGE = re.compile(_USAGE_KEY + rb'\s*:\s*(\d+)')
# The finish_reason of a request the engine aborted (vLLM stopping): no answer's end.
ABORTED = "abort"
# A finish_reason with a value (the content events carry null): a choice's end or an abort.
_FINISH_VALUE = re.compile(rb'"finish_reason"\s*:\s*"')
# A finish_reason with a value, but an abort.
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"(?!abort")')
# The chunks the meter must read: a usage, the end, an upstream error event, an abort. Each
# pattern starts with a literal, so a chunk is scanned at C speed; one alternation of them all
# had no literal start and cost several times more per chunk.
_USAGE_FIELD = b'"usage"'
_END_OR_ERROR = re.compile(rb'data: (?:\[DONE\]|\{"error")')
_UPSTREAM_ERROR = b'data: {"error"'
_ABORT = re.compile(rb'"finish_reason"\s*:\s*"abort"')


def asking_usage(payload: dict) -> tuple[dict, bool]:
    """A stream's payload asking the engine for its usage: (the payload to send, whether the
    caller did not ask for it, so it is taken out again). A malformed stream_options is left
    for the engine to refuse."""
    options = payload.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return payload, False
    return {**payload, "stream_options": {**options, "include_usage": True}}, True


class StreamMeter:
    """A client channel as relay() uses it (write, drain, transport, watch_gone), reading the
    stream's usage and its end on the way."""

    __slots__ = ("_client", "_strip", "cut", "done", "finished", "first_event_at", "transport",
                 "upstream_error", "usage_data", "usage_tokens")

    def __init__(self, client: Channel, strip_usage: bool) -> None:
        self._client = client
        self._strip = strip_usage  # the caller did not ask for the usage chunk
        self.transport = client.transport
        self.finished = False  # a finish_reason came
        self.done = False  # the stream's [DONE] came
        self.cut = False  # it ended without its answer: the caller got stream_interrupted
        self.upstream_error: bytes | None = None  # an error event the engine sent mid-stream
        self.usage_tokens: int | None = None
        self.usage_data: bytes | None = None  # the last bytes that carried a usage
        self.first_event_at: float | None = None  # when the first event came (monotonic)

    def write(self, data: bytes) -> None:
        """Whole chunks on their way to the client (the relay writes nothing else)."""
        if self.first_event_at is None and _EVENT in data:
            self.first_event_at = time.monotonic()
        # find, not `in`: the same search, without the sequence protocol's detour (a third
        # less on a usual chunk).
        notable = data.find(_USAGE_FIELD) >= 0 or _END_OR_ERROR.search(data) is not None
        if _FINISH_VALUE.search(data) is not None:  # rare: a choice ended, or was aborted
            if not self.finished and _FINISHED.search(data) is not None:
                self.finished = True
            notable = notable or _ABORT.search(data) is not None
        if notable:
            data = self._read_notable(data)
        if data:
            self._client.write(data)

    def write_own(self, data: bytes) -> None:
        """Bytes of the gateway's own (its error event, the last chunk): not read."""
        self._client.write(data)

    def _read_notable(self, data: bytes) -> bytes:
        """The chunks for the client of chunks that carry a usage, the end, an error or an
        abort: the usage read (and left out when not asked for), an error or an end that is no
        answer's left for the gateway's stream_interrupted event, an abort's finish taken off."""
        found = last_usage_count(data)
        if found is not None:
            self.usage_tokens, self.usage_data = found, data
        if (not self._strip and _DONE not in data and _UPSTREAM_ERROR not in data
                and _ABORT.search(data) is None):
            return data  # a usage the caller asked for, passed as it came
        try:
            payload = ChunkDecoder().feed(data)
        except ValueError:
            return data
        kept = [each for event in payload.split(b"\n\n")
                if event and (each := self._kept(event)) is not None]
        events = b"".join(event + b"\n\n" for event in kept)
        return b"%x\r\n%s\r\n" % (len(events), events) if events else b""

    def _kept(self, event: bytes) -> bytes | None:
        """What goes on of one event: itself, without an abort's finish_reason, or nothing."""
        if event.startswith(_UPSTREAM_ERROR):
            self.upstream_error = event
            return None
        if event.startswith(_DONE):
            self.done = True
            if not self.finished:
                self.cut = True
                return None
            return event
        if self._strip and _USAGE_FIELD in event and b'"choices":[]' in event:
            return None
        if _ABORT.search(event) is not None:
            return _without_abort(event)
        return event

    async def drain(self) -> None:
        await self._client.drain()

    def watch_gone(self, callback: Callable[[], None] | None) -> bool:
        return self._client.watch_gone(callback)


def _without_abort(event: bytes) -> bytes:
    """An event whose choices the engine aborted, their finish_reason taken off (their text
    kept): the stream is cut, and its caller is told so by the gateway's own event."""
    try:
        chunk = json.loads(event[5:])
    except ValueError:
        return event
    for choice in chunk.get("choices") or () if isinstance(chunk, dict) else ():
        if isinstance(choice, dict) and choice.get("finish_reason") == ABORTED:
            choice["finish_reason"] = None
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode()


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
