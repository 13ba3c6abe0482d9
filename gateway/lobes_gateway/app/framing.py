"""How a relayed answer is framed: its head, whether it is a stream of events, and the event
that ends a stream its backend cut. Shared by the plain relay and the resumable stream."""

from __future__ import annotations

import json

from ..transport.http import status_line
from ..transport.upstream import Response

_CLOSE = b"Connection: close"
# Why a stream ended without its own end (lobes_gateway_streams_cut_total{reason}): its backend
# broke it off (closed, reset, or broke its framing), or sent nothing for GATEWAY_STREAM_STALL_S.
BROKEN, STALLED = "broken", "stalled"
_CUT_MESSAGES = {
    BROKEN: ("stream_interrupted", "the backend broke the stream off mid-response; retry the "
                                   "request"),
    STALLED: ("stream_stalled", "the backend sent nothing for GATEWAY_STREAM_STALL_S seconds "
                                "mid-response and was cut off; retry the request"),
}


def _cut_event(code: str, message: str) -> bytes:
    error = {"message": message, "type": "upstream_unavailable", "param": None, "code": code}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


# Made once: a stream cut off is no rare event for a box whose engine restarts.
_CUT_EVENTS = {reason: _cut_event(*said) for reason, said in _CUT_MESSAGES.items()}


def interrupted_event(reason: str = BROKEN) -> bytes:
    """The SSE event that ends a stream its backend broke off (or stalled)."""
    return _CUT_EVENTS[reason]


def head_bytes(response: Response, extra: list[bytes], framing: bytes, keep_alive: bool) -> bytes:
    """Status line, upstream headers minus hop-by-hop ones, the gateway's headers, framing."""
    lines = [*extra, framing, b"\r\n"] if keep_alive else [*extra, framing, _CLOSE, b"\r\n"]
    return status_line(response.status) + response.relayed + b"\r\n".join(lines)


def is_event_stream(response: Response) -> bool:
    return response.headers.get(b"content-type", b"").startswith(b"text/event-stream")
