"""Relay an upstream response to the client: bodies by length, SSE chunk by chunk, untouched."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING

from ..policy.placer import Placement
from ..policy.tokens import reported_prompt_tokens
from ..transport import errors
from ..transport.channel import Channel
from ..transport.chunked import ChunkDecoder, scan_chunks, unfinished_chunk
from ..transport.http import error_bytes
from ..transport.upstream import (
    BodyReader,
    BodyTimeouts,
    Connection,
    Connections,
    Response,
    finish,
    read_body,
)
from .framing import BROKEN, STALLED, head_bytes, interrupted_event, is_event_stream
from .meter import StreamMeter, completion_tokens
from .stream_pipe import HIGH_WATER, StreamPipe

if TYPE_CHECKING:
    from .resume import StreamResume

_BODY_IN_ONE_READ = 256 * 1024
# How much of a large answer's end is kept to find its usage block (vLLM writes usage last but
# for a few short fields).
_USAGE_TAIL = 4096
_BROKEN = (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError)
_STREAM_END = b"0\r\n\r\n"
# A chunk up to this size that arrives in pieces is held and passed on whole, as it came; a
# larger one is passed on as its pieces come, framed anew.
_HELD_CHUNK = 64 * 1024


class Outcome:
    """The answer a dispatch ended in, relayed by the connection's top frame.

    Dispatch returns it instead of relaying, so the routing frames (payload, bodies, headers)
    are gone while a long stream is held. It carries what hangs on the answer: the placement
    counted on a pool replica (released, and taught the replica's rate, when the relay ends),
    the peer in-flight count of its role, and the completion tokens a metered relay counted.
    A pooled stream with resume on carries its StreamResume (app/resume.py).
    """

    __slots__ = ("body", "counter", "cut", "extra", "placement", "response", "resume", "role",
                 "started", "strip_usage", "tokens")

    def __init__(self, response: Response, extra: list[bytes], placement: Placement | None,
                 started: float, body: bytes | None = None) -> None:
        self.response = response
        self.extra = extra
        self.placement = placement
        self.started = started
        self.body = body  # read already (a peer's 404, a strict-lane 400)
        self.counter: Counter[str] | None = None
        self.role = ""
        self.tokens: int | None = None
        self.resume: StreamResume | None = None
        # Why the relayed stream ended without its own end (BROKEN, STALLED), if it did.
        self.cut: str | None = None
        # The stream's usage chunk was asked for by the gateway alone: left out for the caller.
        self.strip_usage = False

    def count(self, counter: Counter[str], role: str) -> None:
        """Hold one of `role`'s in-flight count in `counter` until the relay ends."""
        self.counter, self.role = counter, role

    def learn(self, tokens: int, usage: bytes | None = None,
              prompt_tokens: int | None = None, first_event_at: float | None = None) -> None:
        """A metered answer carried `tokens`; a placed replica's rate is taught from them
        (a stream's decode timed from `first_event_at`, when its first event came), and its
        role's characters per token from the prompt tokens reported: `prompt_tokens` when
        counted already (a resumable stream's), else read from `usage` (the answer's bytes
        that carry its usage, if any), only for a placed answer."""
        self.tokens = tokens
        if self.placement is not None:
            if prompt_tokens is None:
                prompt_tokens = reported_prompt_tokens(usage)
            first_token_s = None if first_event_at is None else first_event_at - self.started
            self.placement.record_completion(tokens, time.monotonic() - self.started,
                                             prompt_tokens=prompt_tokens,
                                             first_token_s=first_token_s)

    def settle(self) -> None:
        """The relay ended: release the placement and the in-flight count."""
        if self.placement is not None:
            self.placement.release()
        if self.counter is not None:
            self.counter[self.role] -= 1


def relay(connections: Connections, outcome: Outcome, client: Channel, keep_alive: bool,
          metered: bool, strip_usage: bool = False) -> Coroutine[object, object, bool]:
    """Relay an outcome to `client`: the coroutine to await, whose result is whether the
    client connection stays usable.

    A metered request's 200 (a generate lane's) has its completion tokens counted into the
    outcome, and a placed replica's rate taught from them; `strip_usage`: its stream's usage
    chunk was asked for by the gateway, not the caller. An answer with nothing to settle
    passes straight through (returned, not awaited here: one coroutine frame less); otherwise
    the outcome is settled when the relay ends.
    """
    meter = outcome if metered and outcome.response.status == 200 else None
    if outcome.resume is not None and meter is not None and is_event_stream(outcome.response):
        return _relay_resumable(connections, outcome, client, keep_alive)
    outcome.strip_usage = strip_usage
    if outcome.placement is None and outcome.counter is None and outcome.body is None:
        return pass_through(connections, outcome, client, keep_alive, meter)
    return _relay_settling(connections, outcome, client, keep_alive, meter)


async def _relay_settling(connections: Connections, outcome: Outcome, client: Channel,
                          keep_alive: bool, meter: Outcome | None) -> bool:
    try:
        if outcome.body is not None:
            return _write_read(outcome.response, outcome.body, outcome.extra, client,
                               keep_alive)
        return await pass_through(connections, outcome, client, keep_alive, meter)
    finally:
        outcome.settle()


async def _relay_resumable(connections: Connections, outcome: Outcome, client: Channel,
                           keep_alive: bool) -> bool:
    """A pooled stream relayed by its StreamResume; a replica's rate is taught here only from
    a stream it served whole (a continued one is taught by the StreamResume)."""
    resume, placement = outcome.resume, outcome.placement
    assert resume is not None and placement is not None
    try:
        kept, tokens = await resume.relay(connections, outcome.response, outcome.extra,
                                          placement, client, keep_alive)
        if resume.whole and not resume.resumes:
            outcome.learn(tokens, prompt_tokens=resume.prompt_tokens,
                          first_event_at=resume.first_event_at)
        else:
            outcome.tokens = tokens
        return kept
    finally:
        outcome.settle()


async def read_whole(connections: Connections, response: Response) -> bytes | None:
    """The whole body, its connection pooled again; None when the upstream broke off, stalled
    or sent a body the gateway does not hold (closed)."""
    try:
        body = await read_body(response, connections.body_timeouts)
    except _BROKEN:
        response.conn.close()
        return None
    finish(connections, response)
    return body


def _broke_off(client: Channel) -> bool:
    """The upstream closed before its answer was whole and none of it was sent: answer a 502
    (the client would otherwise see its connection closed with no status at all)."""
    client.write(error_bytes(errors.upstream_interrupted(), keep_alive=False))
    return False


def _write_read(response: Response, body: bytes, extra: list[bytes], client: Channel,
                keep_alive: bool) -> bool:
    """An answer whose body was read already, relayed with the gateway's headers."""
    framing = b"Content-Length: %d" % len(body)
    client.write(head_bytes(response, extra, framing, keep_alive) + body)
    return keep_alive


async def _relay_metered_stream(connections: Connections, outcome: Outcome, client: Channel,
                                keep_alive: bool, meter: Outcome) -> bool:
    """A stream relayed through a StreamMeter: its tokens are its usage's, and only a stream
    that ended whole teaches its replica's rate."""
    counted = StreamMeter(client, outcome.strip_usage)
    kept = await _relay_stream(connections, outcome, counted,  # type: ignore[arg-type]
                               keep_alive, counted)
    if counted.usage_tokens is not None and counted.done and not counted.cut:
        meter.learn(counted.usage_tokens, counted.usage_data,
                    first_event_at=counted.first_event_at)
    else:
        meter.tokens = counted.usage_tokens
    return kept


async def pass_through(connections: Connections, outcome: Outcome, client: Channel,
                       keep_alive: bool, meter: Outcome | None = None) -> bool:
    """Relay the outcome's response to `client` as it comes; returns whether the client
    connection stays usable. With a `meter`, the answer's completion tokens are counted into it
    (except a body too large to hold: it is relayed unmetered)."""
    response, extra = outcome.response, outcome.extra
    length = response.length
    if length is not None and length <= _BODY_IN_ONE_READ:
        # The usual answer: a small JSON body that came in with its head, relayed at once.
        body = response.conn.channel.take(length)
        if body is not None:
            if meter is not None:
                meter.learn(completion_tokens(body), body)
            client.write(head_bytes(response, extra, b"Content-Length: %d" % length, keep_alive)
                         + body)
            finish(connections, response)
            return keep_alive
    elif length is not None:
        return await _relay_large(connections, response, client, extra, keep_alive, meter)
    elif not response.chunked or is_event_stream(response):
        if meter is not None:
            return await _relay_metered_stream(connections, outcome, client, keep_alive, meter)
        return await _relay_stream(connections, outcome, client, keep_alive)
    # A small body still arriving, or a chunked JSON one: read whole, then relay it sized.
    body = await read_whole(connections, response)
    if body is None:
        return _broke_off(client)
    if meter is not None:
        meter.learn(completion_tokens(body), body)
    return _write_read(response, body, extra, client, keep_alive)


async def _relay_large(connections: Connections, response: Response, client: Channel,
                       extra: list[bytes], keep_alive: bool, meter: Outcome | None) -> bool:
    """A body too large to hold: the head goes first, so a cut can only end the connection.

    With a `meter`, the body's last bytes are kept: an OpenAI answer ends in its usage, whose
    completion tokens are counted (and teach a placed replica's rate) once the body is whole.
    """
    length = response.length or 0
    upstream = BodyReader(response.conn, connections.body_timeouts)
    tail = b""
    try:
        client.write(head_bytes(response, extra, b"Content-Length: %d" % length, keep_alive))
        left = length
        while left:
            data = await upstream.read(min(left, _BODY_IN_ONE_READ))
            if not data:
                raise ConnectionResetError("upstream closed mid-body")
            left -= len(data)
            client.write(data)
            if meter is not None:
                tail = (tail + data if len(data) < _USAGE_TAIL else data)[-_USAGE_TAIL:]
            await client.drain()
    except _BROKEN:
        response.conn.close()
        return False
    finish(connections, response)
    if meter is not None:
        meter.learn(completion_tokens(tail), tail)
    return keep_alive


async def _relay_stream(connections: Connections, outcome: Outcome, client: Channel,
                        keep_alive: bool, meter: StreamMeter | None = None) -> bool:
    """Pass a stream through as it arrives: chunks as they came where they are whole and plain,
    otherwise decoded and framed again; a stream its backend breaks off or stalls (or, read by
    a `meter`, ends without its answer) is ended with an error event (for an event stream)
    and counted on the outcome as cut."""
    response = outcome.response
    own = client.write if meter is None else meter.write_own  # the gateway's own bytes
    own(head_bytes(response, outcome.extra, b"Transfer-Encoding: chunked", keep_alive))
    event_stream, chunked, conn = is_event_stream(response), response.chunked, response.conn
    # Sent: not kept for a held stream.
    response.raw, response.headers, response.relayed = b"", {}, b""
    transport = client.transport
    timeouts = connections.body_timeouts
    # A caller that leaves while the upstream is silent (a long prefill) ends the stream now,
    # not at the upstream's next bytes: its placement and counts are given back at once.
    if not client.watch_gone(conn.abort):
        conn.abort()
    try:
        if chunked:
            response.keep_alive &= await _pass_chunks(conn, client, transport, timeouts)
        else:
            reader = BodyReader(conn, BodyTimeouts(timeouts.idle_s, math.inf), timeouts.total_s)
            await _frame_until_eof(reader, client, transport)
            response.keep_alive = False
    except _BROKEN:
        conn.close()
        if not transport.is_closing():
            outcome.cut = STALLED if conn.timed_out else BROKEN
            if event_stream:
                event = interrupted_event(outcome.cut)
                own(b"%x\r\n%s\r\n" % (len(event), event) + _STREAM_END)
            transport.close()
        return False
    finally:
        client.watch_gone(None)
    if meter is not None and (meter.cut or not meter.done):
        # Ended without its answer: [DONE] before a finish, an error event, or no [DONE].
        outcome.cut = BROKEN
        event = interrupted_event(BROKEN)
        own(b"%x\r\n%s\r\n" % (len(event), event))
    own(_STREAM_END)
    finish(connections, response)
    return keep_alive


async def _frame_until_eof(upstream: BodyReader, client: Channel,
                           transport: asyncio.WriteTransport) -> None:
    while True:
        data = await upstream.read(65536)
        if not data:
            return
        if transport.is_closing():
            raise ConnectionResetError("client went away")
        client.write(b"%x\r\n%s\r\n" % (len(data), data))
        if transport.get_write_buffer_size() > HIGH_WATER:
            await client.drain()


async def _pass_chunks(conn: Connection, client: Channel, transport: asyncio.WriteTransport,
                       timeouts: BodyTimeouts) -> bool:
    """Relay a chunked stream from the upstream socket's own callback, so complete chunks reach
    the client as they are received, with no future, task wake-up or read call per chunk.

    The upstream's silence is bounded: total_s for its first bytes (a long prompt's prefill),
    then idle_s between reads; a wait for a slow client is not counted.
    Returns whether the upstream connection ended cleanly (reusable).
    """
    upstream = conn.channel
    idle_s, watchdog, abort = timeouts.idle_s, conn.watchdog, conn.abort
    # A partial, not a lambda: the arm on every read costs no frame of its own.
    pipe = _ChunkPipe(client.write, transport, upstream.transport,
                      partial(watchdog.arm, idle_s, abort))
    watchdog.arm(timeouts.total_s, abort)
    held = upstream.divert(pipe)
    try:
        if held:  # bytes that came with the response head go first
            pipe.data_received(held)
        if pipe.outcome is None and upstream.at_eof():
            raise ConnectionResetError("upstream closed mid-stream")
        while True:
            outcome = await pipe.wait()
            if outcome is not None:
                return outcome
            watchdog.disarm()  # paused for the client: a slow client is no stalled upstream
            await client.drain()
            watchdog.arm(idle_s, abort)
            pipe.resume()
    finally:
        watchdog.disarm()
        upstream.divert(None)


class _ChunkPipe(StreamPipe):
    """The upstream socket's protocol while a chunked stream passes through it; its outcome is
    whether the upstream ended cleanly (reusable)."""

    __slots__ = ("_arm", "_decoder", "_held", "_write")

    def __init__(self, write: Callable[[bytes], None], client: asyncio.WriteTransport,
                 upstream: asyncio.Transport, arm: Callable[[], None]) -> None:
        super().__init__(client, upstream)
        self._write = write  # the client's write (traced, metered)
        self._arm = arm  # the upstream's silence is timed again from each read
        self._decoder = ChunkDecoder()  # a chunk too large to hold, or one to judge
        self._held = b""  # the start of a small chunk, passed on once it is whole

    def data_received(self, data: bytes) -> None:
        if self.outcome is not None or self._error is not None:
            return
        self._arm()
        try:
            self._pass(data)
        except (ValueError, ConnectionError) as exc:
            self._fail(exc)

    def _pass(self, data: bytes) -> None:
        decoder = self._decoder
        while data:
            if decoder.between_chunks:
                # The usual read: whole chunks with plain size lines, written as they came (a
                # small one split across reads is held until it is whole).
                if self._held:
                    data, self._held = self._held + data, b""
                end, last = scan_chunks(data)
                if end == len(data):  # nothing left to judge: _send inlined, one frame less
                    if self._client.is_closing():
                        raise ConnectionResetError("client went away")
                    self._write(data)
                    break
                if end:
                    self._send(data[:end])
                    data = data[end:]
                if data and not last and unfinished_chunk(data, _HELD_CHUNK):
                    self._held, data = data, b""
                    break
            if data:
                # Any other chunk (too large to hold, with extensions, the last one, or one to
                # judge): decoded, its data framed anew as it comes, until it ends.
                payload, used = decoder.take(data)
                if payload:
                    self._send(b"%x\r\n%s\r\n" % (len(payload), payload))
                data = data[used:]
                if decoder.done:
                    self._end(decoder.clean)
                    return
        self._hold_if_full()

    def _send(self, data: bytes) -> None:
        if self._client.is_closing():
            raise ConnectionResetError("client went away")
        self._write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.outcome is None:
            self._fail(ConnectionResetError("upstream closed mid-stream"))
