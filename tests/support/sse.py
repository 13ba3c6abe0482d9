"""Read a streamed chat completion event by event, as a client does, with each event's arrival
time, and a hook called after every event (to kill or stop a replica mid-stream)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Streamed:
    """What a client read of one stream."""

    status: int
    headers: dict[str, str]
    events: list[dict] = field(default_factory=list)  # the JSON events, in order
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each event
    done: bool = False  # ended with data: [DONE]
    body: bytes = b""  # the body of an answer that is not a stream (an error)

    @property
    def text(self) -> str:
        return "".join((c.get("delta") or {}).get("content") or ""
                       for e in self.events for c in e.get("choices") or ())

    @property
    def content_events(self) -> int:
        return sum(1 for e in self.events for c in e.get("choices") or ()
                   if (c.get("delta") or {}).get("content"))

    @property
    def usage(self) -> dict | None:
        return next((e["usage"] for e in reversed(self.events) if e.get("usage")), None)

    @property
    def errors(self) -> list[dict]:
        return [e["error"] for e in self.events if "error" in e]

    @property
    def finish(self) -> dict | None:
        """The event that carries the choice's finish_reason."""
        return next((e for e in self.events for c in e.get("choices") or ()
                     if c.get("finish_reason") is not None), None)

    def largest_gap(self) -> float:
        """The longest wait between two events after the first (the stall a client saw)."""
        gaps = [b - a for a, b in zip(self.arrivals[1:], self.arrivals[2:], strict=False)]
        return max(gaps, default=0.0)


def stream_chat(url: str, payload: dict, headers: dict[str, str] | None = None,
                after_event: Callable[[Streamed], None] | None = None,
                timeout: float = 30.0) -> Streamed:
    """POST a chat completion with stream=true and read it to its end."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({**payload, "stream": True}),
                     {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        streamed = Streamed(response.status, {k.lower(): v for k, v in response.getheaders()})
        if not streamed.headers.get("content-type", "").startswith("text/event-stream"):
            streamed.body = response.read()
            return streamed
        try:
            for line in response:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    streamed.done = True
                    break
                streamed.events.append(json.loads(data))
                streamed.arrivals.append(time.monotonic())
                if after_event is not None:
                    after_event(streamed)
        except (http.client.IncompleteRead, ConnectionError):
            pass  # cut off: `done` stays False
        return streamed
    finally:
        conn.close()
