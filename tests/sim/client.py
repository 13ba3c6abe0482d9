"""A plain HTTP client for the simulator tests (http.client: nothing hides the wire)."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class StreamReply:
    """A parsed SSE stream: the JSON events, whether [DONE] came, and timings."""

    status: int
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    first_event_s: float | None = None
    total_s: float = 0.0


def _connect(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def request(
    url: str, method: str, path: str, payload: Any = None, timeout: float = 30.0,
    raw: bytes | None = None, headers: dict[str, str] | None = None,
) -> Reply:
    conn = _connect(url, timeout)
    try:
        body = raw if raw is not None else (None if payload is None else json.dumps(payload))
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Reply(response.status, dict(response.getheaders()), response.read())
    finally:
        conn.close()


def post(url: str, path: str, payload: Any, timeout: float = 30.0) -> Reply:
    return request(url, "POST", path, payload, timeout)


def stream(url: str, path: str, payload: dict[str, Any], timeout: float = 30.0) -> StreamReply:
    """POST with stream=true and read SSE events until [DONE] (or the connection ends)."""
    conn = _connect(url, timeout)
    started = time.monotonic()
    try:
        conn.request("POST", path, body=json.dumps({**payload, "stream": True}))
        response = conn.getresponse()
        reply = StreamReply(response.status)
        with contextlib.suppress(http.client.IncompleteRead):
            _read_events(response, reply, started)
        # A stream that ends without [DONE] was cut off (http.client does not always raise).
        reply.truncated = not reply.done
        reply.total_s = time.monotonic() - started
        return reply
    finally:
        conn.close()


def _read_events(
    response: http.client.HTTPResponse, reply: StreamReply, started: float
) -> None:
    for line in response:
        if not line.startswith(b"data: "):
            continue
        if reply.first_event_s is None:
            reply.first_event_s = time.monotonic() - started
        data = line[len(b"data: "):].strip()
        if data == b"[DONE]":
            reply.done = True
            return
        reply.events.append(json.loads(data))


def chat_payload(content: str = "Say something.", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **extra}
