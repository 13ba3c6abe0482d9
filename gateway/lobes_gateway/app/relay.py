"""Relay an upstream response to the client: bodies by length, SSE chunk by chunk, untouched."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Coroutine
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

# What a relay returns: whether the client connection stays usable, or the coroutine to await
# for it (an answer written at once makes no coroutine).
Relayed = bool | Coroutine[object, object, bool]


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
          metered: bool, strip_usage: bool = False) -> Relayed:
    """Relay an outcome to `client`: whether the client connection stays usable, or the
    coroutine to await for it (an answer that came whole with its head is written here, with
    no coroutine at all). The caller settles the outcome when the relay ends.

    A metered request's 200 (a generate lane's) has its completion tokens counted into the
    outcome, and a placed replica's rate taught from them; `strip_usage`: its stream's usage
    chunk was asked for by the gateway, not the caller.
    """
    meter = outcome if metered and outcome.response.status == 200 else None
    if outcome.resume is not None and meter is not None and is_event_stream(outcome.response):
        return _relay_resumable(connections, outcome, client, keep_alive)
    outcome.strip_usage = strip_usage
    if outcome.body is not None:
        return _write_read(outcome.response, outcome.body, outcome.extra, client, keep_alive)
    return pass_through(connections, outcome, client, keep_alive, meter)


async def _relay_resumable(connections: Connections, outcome: Outcome, client: Channel,
                           keep_alive: bool) -> bool:
    """A pooled stream relayed by its StreamResume; a replica's rate is taught here only from
    a stream it served whole (a continued one is taught by the StreamResume)."""
    resume, placement = outcome.resume, outcome.placement
    assert resume is not None and placement is not None
    kept, tokens = await resume.relay(connections, outcome.response, outcome.extra, placement,
                                      client, keep_alive)
    if resume.whole and not resume.resumes:
        outcome.learn(tokens, prompt_tokens=resume.prompt_tokens,
                      first_event_at=resume.first_event_at)
    else:
        outcome.tokens = tokens
    return kept


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


def pass_through(connections: Connections, outcome: Outcome, client: Channel,
                 keep_alive: bool, meter: Outcome | None = None) -> Relayed:
    """Relay the outcome's response to `client` as it comes: whether the client connection
    stays usable, or the coroutine to await for it. With a `meter`, the answer's completion
    tokens are counted into it (except a body too large to hold: it is relayed unmetered)."""
    response, extra = outcome.response, outcome.extra
    length = response.length
    if length is not None and length <= _BODY_IN_ONE_READ:
        # The usual answer: a small JSON body that came in with its head, relayed at once.
        body = response.conn.channel.take(length)
        if body is not None:
            client.write(head_bytes(response, extra, b"Content-Length: %d" % length, keep_alive)
                         + body)
            finish(connections, response)
            if meter is not None:  # counted once the caller has its answer, not before
                meter.learn(completion_tokens(body), body)
            return keep_alive
    elif length is not None:
        return _relay_large(connections, response, client, extra, keep_alive, meter)
    elif not response.chunked or is_event_stream(response):
        return _relay_stream(connections, outcome, client, keep_alive, meter)
    # A small body still arriving, or a chunked JSON one: read whole, then relay it sized.
    return _relay_read_whole(connections, response, client, extra, keep_alive, meter)


async def _relay_read_whole(connections: Connections, response: Response, client: Channel,
                            extra: list[bytes], keep_alive: bool, meter: Outcome | None) -> bool:
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
                        keep_alive: bool, metered: Outcome | None = None) -> bool:
    """Pass a stream through as it arrives: chunks as they came where they are whole and plain,
    otherwise decoded and framed again; a stream its backend breaks off or stalls (or, when
    `metered`, ends without its answer) is ended with an error event (for an event stream)
    and counted on the outcome as cut. `metered`: the stream is read on its way by a
    StreamMeter, its tokens are its usage's, and only a stream that ended whole teaches its
    replica's rate."""
    response = outcome.response
    own = client.write  # the gateway's own bytes, which no meter reads
    own(head_bytes(response, outcome.extra, b"Transfer-Encoding: chunked", keep_alive))
    event_stream, conn = is_event_stream(response), response.conn
    # Sent: not kept for a held stream (its headers and relayed lines are its shape's, shared).
    response.raw, response.ids = b"", ()
    counted = None if metered is None else StreamMeter(client, outcome.strip_usage)
    sink = client if counted is None else counted  # where the upstream's chunks go
    # A caller that leaves while the upstream is silent (a long prefill) ends the stream now,
    # not at the upstream's next bytes: its placement and counts are given back at once.
    abort = conn.abort  # one bound method for both watches
    if not client.watch_gone(abort):
        abort()
    try:
        if response.chunked:
            # Awaited inline, not in a coroutine of its own: a held stream keeps one frame less.
            pipe = _ChunkPipe(sink.write, client, conn, abort, connections.body_timeouts)
            try:
                pipe.attach(conn)
                while (ended := await pipe.wait()) is None:
                    pipe.rest()
                    await client.drain()
                    pipe.resume()
            finally:
                pipe.detach(conn)
            response.keep_alive &= ended
        else:
            timeouts = connections.body_timeouts
            reader = BodyReader(conn, BodyTimeouts(timeouts.idle_s, math.inf), timeouts.total_s)
            await _frame_until_eof(reader, sink, client.transport)
            response.keep_alive = False
    except _BROKEN:
        conn.close()
        _cut(outcome, client, STALLED if conn.timed_out else BROKEN, event_stream)
        kept = False
    else:
        if counted is not None and (counted.cut or not counted.done):
            # Ended without its answer: [DONE] before a finish, an error event, or no [DONE].
            outcome.cut = BROKEN
            event = interrupted_event(BROKEN)
            own(b"%x\r\n%s\r\n" % (len(event), event))
        own(_STREAM_END)
        finish(connections, response)
        kept = keep_alive
    finally:
        client.watch_gone(None)
    if metered is not None and counted is not None:
        _learn_from_stream(metered, counted)
    return kept


def _cut(outcome: Outcome, client: Channel, why: str, event_stream: bool) -> None:
    """End a stream its upstream broke off or stalled: an error event for an event stream, then
    the client's connection (unless the client ended it first)."""
    transport = client.transport
    if transport.is_closing():
        return
    outcome.cut = why
    if event_stream:
        event = interrupted_event(why)
        client.write(b"%x\r\n%s\r\n" % (len(event), event) + _STREAM_END)
    transport.close()


def _learn_from_stream(metered: Outcome, counted: StreamMeter) -> None:
    """A metered stream's tokens are its usage's; only one that ended whole teaches its
    replica's rate."""
    if counted.usage_tokens is not None and counted.done and not counted.cut:
        metered.learn(counted.usage_tokens, counted.usage_data,
                      first_event_at=counted.first_event_at)
    else:
        metered.tokens = counted.usage_tokens


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


class _ChunkPipe(StreamPipe):
    """The upstream socket's protocol while a chunked stream passes through it; its outcome is
    whether the upstream ended cleanly (reusable)."""

    __slots__ = ("_abort", "_decoder", "_first_s", "_held", "_idle_s", "_idling", "_watchdog",
                 "_write")

    def __init__(self, write: Callable[[bytes], None], client: Channel, conn: Connection,
                 abort: Callable[[], None], timeouts: BodyTimeouts) -> None:
        super().__init__(client, conn.channel.transport)
        self._write = write  # the client's write (traced, metered)
        # The upstream's silence is bounded: first_s for its first bytes (a long prompt's
        # prefill), then idle_s from each read; a wait for a slow client is not counted.
        self._watchdog, self._abort = conn.watchdog, abort
        self._first_s, self._idle_s = timeouts.total_s, timeouts.idle_s
        # Armed for idle_s since the last read: a read then only moves the deadline later.
        self._idling = False
        # A chunk too large to hold, or one to judge (the last one): made when one comes, so
        # a held stream of plain chunks keeps none.
        self._decoder: ChunkDecoder | None = None
        self._held = b""  # the start of a small chunk, passed on once it is whole

    def attach(self, conn: Connection) -> None:
        """Take the upstream socket's bytes from its channel, those that came with the response
        head first, so complete chunks reach the client from the socket's own callback (no
        future, task wake-up or read call per chunk)."""
        self._watchdog.arm(self._first_s, self._abort)
        held = conn.channel.divert(self)
        if held:
            self.data_received(held)
        if self.outcome is None and conn.channel.at_eof():
            raise ConnectionResetError("upstream closed mid-stream")

    def detach(self, conn: Connection) -> None:
        """Give the upstream socket back to its channel, its deadline off."""
        conn.watchdog.disarm()
        conn.channel.divert(None)

    def rest(self) -> None:
        """Paused for the client to drain: a slow client is no stalled upstream."""
        self._watchdog.disarm()
        self._idling = False

    def resume(self) -> None:
        """The client drained: the upstream's silence is timed again and its reads resume."""
        self._watchdog.arm(self._idle_s, self._abort)
        self._idling = True
        super().resume()

    def data_received(self, data: bytes) -> None:
        if self.outcome is not None or self._error is not None:
            return
        if self._idling:  # the usual read: no call, the deadline only moves later
            self._watchdog.deadline = time.monotonic() + self._idle_s
        else:
            self._watchdog.arm(self._idle_s, self._abort)
            self._idling = True
        try:
            self._pass(data)
        except (ValueError, ConnectionError) as exc:
            self._fail(exc)

    def _pass(self, data: bytes) -> None:
        decoder = self._decoder
        while data:
            if decoder is None or decoder.between_chunks:
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
                if decoder is None:
                    decoder = self._decoder = ChunkDecoder()
                payload, used = decoder.take(data)
                if payload:
                    self._send(b"%x\r\n%s\r\n" % (len(payload), payload))
                data = data[used:]
                if decoder.done:
                    self._end(decoder.clean)
                    return
        if self._channel.write_paused:  # _hold_if_full inlined: a frame less per read
            self._hold()

    def _send(self, data: bytes) -> None:
        if self._client.is_closing():
            raise ConnectionResetError("client went away")
        self._write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.outcome is None:
            self._fail(ConnectionResetError("upstream closed mid-stream"))
