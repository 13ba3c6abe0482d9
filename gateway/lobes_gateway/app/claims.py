"""What a peer's answer says it is: the model it names, read before any of it is relayed.

A peer is trusted with its own role's answers, not with naming a role it does not serve: an
answer from a pool replica, the proxied peer or an owner must come from the model the role's
plan names. Its `model` is read without consuming the answer (a JSON body whole, a stream up to
its first event), so a peer that answers with another model is an upstream error and the
request moves on before the caller has a byte of it.
"""

from __future__ import annotations

import json

from ..transport.chunked import ChunkDecoder
from ..transport.upstream import BodyTimeouts, Response

# Larger JSON answers are not held back to be read; a stream's first event within this.
_READ_AT_MOST = 256 * 1024
_FIRST_EVENT_AT_MOST = 64 * 1024
# An answer the check does not apply to (audio, text, a body too large to hold back).
NOT_CHECKED = object()


async def claimed_model(response: Response, timeouts: BodyTimeouts) -> str | object | None:
    """The model a 200 answer names (None: it names none, or cannot be read), or NOT_CHECKED.
    Waits for the body (a JSON answer) or the first event (a stream) under `timeouts`."""
    content_type = response.headers.get(b"content-type", b"")
    if content_type.startswith(b"application/json"):
        length = response.length
        if length is None or length > _READ_AT_MOST:
            return NOT_CHECKED
        return _model_of(await _peek(response, length, b"", timeouts.idle_s))
    if content_type.startswith(b"text/event-stream"):
        # The first event may wait for the prompt's prefill: as a stream's first bytes do.
        head = await _peek(response, 0, b"\n\n", timeouts.total_s)
        return _first_event_model(head, response.chunked)
    return NOT_CHECKED


async def _peek(response: Response, at_least: int, marker: bytes, wait_s: float) -> bytes:
    conn = response.conn
    conn.watchdog.arm(wait_s, conn.abort)
    try:
        return await conn.channel.peek_until(marker, at_least, max(at_least,
                                                                   _FIRST_EVENT_AT_MOST))
    finally:
        conn.watchdog.disarm()


def _first_event_model(head: bytes, chunked: bool) -> str | None:
    if chunked:
        try:
            head = ChunkDecoder().feed(head)
        except ValueError:
            return None
    event, ended, _rest = head.partition(b"\n\n")
    if not ended or not event.startswith(b"data:"):
        return None
    return _model_of(event[5:])


def _model_of(data: bytes) -> str | None:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) else None
