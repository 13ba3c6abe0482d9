"""Streams that survive their replica: a pooled chat stream whose replica dies, or stops sending
for GATEWAY_STREAM_STALL_S, goes on on another replica of the pool (P_STREAM_RESUME=true).

The relay reads the stream as it passes (from the upstream socket's callback, as relay.py's
chunk pipe does) and keeps what a continuation needs: the text streamed so far and the tokens
it took. Whole chunks of plain text-token events pass as they came, recognised by byte scans
and kept unparsed; anything else is cut into events and parsed. When the stream breaks
off before `data: [DONE]` (a reset, an end without [DONE], an `error` event, a stall), the
request is sent again to a replica not tried yet, with the text so far as a final assistant
message to continue (vLLM's `continue_final_message: true`, `add_generation_prompt: false`)
and `max_tokens` less the tokens already produced. The continuation's opening role delta is
dropped and its `id`, `created` and `model` are rewritten to the first part's, so the client
reads one stream. Its usage block counts the client's prompt once (the continuation's
prompt_tokens less the streamed tokens it re-read as prompt) and the completion tokens of every
part; the chunk that carries finish_reason says the stream was resumed (`lobes_resumed`).

What is not continued (the stream then ends as an unpooled one does, with a
`stream_interrupted` error event): a request with `n` > 1, a structured-output or
guided-decoding request (a grammar restarts at the continuation's first token), and a stream
once it carries a delta other than text (tool calls, reasoning), which a final assistant
message cannot hold.

Tokens are counted from the replicas' own usage: every part is asked for usage on each chunk
(stream_options.continuous_usage_stats), because a replica with speculative decoding (MTP)
sends several tokens in one chunk and a chunk count would leave the continuation's max_tokens
too large. What the client did not ask for is taken out again: the usage of each chunk, and
the final usage chunk. A replica that ignores the option is counted one token per chunk.

A continuation that ends the stream whole teaches its replica's rate from its own part (its
tokens after its prompt, in its time) and the pool's answer length from the whole answer; a
part that broke off teaches nothing (its replica failed).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..mesh.peers import PooledRole
from ..policy.placer import Placement
from ..policy.tokens import reported_prompt_tokens
from ..transport.channel import Channel
from ..transport.chunked import ChunkDecoder, scan_chunks
from ..transport.json_body import JsonBody
from ..transport.upstream import (
    Connections,
    Origin,
    Response,
    UpstreamError,
    exchange,
    finish,
    request_head,
)
from .framing import head_bytes, interrupted_event, is_event_stream
from .meter import ABORTED
from .stream_pipe import StreamPipe

# How a broken-off stream ended, as lobes_gateway_stream_resumes_total counts it.
RESUMED, NOT_RESUMABLE, NO_REPLICA = "resumed", "not_resumable", "no_replica"
_DONE = b"[DONE]"
# What _event gives for a [DONE] that ends a stream before its answer did.
_CUT = b"cut"
_STREAM_END = b"0\r\n\r\n"
# Request fields whose meaning a continuation cannot keep (a grammar restarts at its first token).
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
# Delta keys a final assistant message holds; any other non-empty one ends resumability.
_TEXT_DELTA = frozenset({"role", "content"})
# Byte patterns that tell a plain text-token event from one that must be parsed.
_NOT_FINISHED, _FINISH = b'"finish_reason":null', b'"finish_reason"'
# One search each, not a scan per marker: this runs for every read of a resumable stream.
_NOT_TEXT = re.compile(rb'"(?:error|tool_calls|function_call|reasoning)')
_NOT_PLAIN = re.compile(rb'"(?:error|tool_calls|function_call|reasoning|usage")')
_USAGE = b'"usage"'
# A compact chunk whose last member is its usage (vLLM's continuous_usage_stats): the usage
# object (one level of nesting: prompt_tokens_details) and its completion tokens.
_LAST_USAGE = b',"usage":{'
_USAGE_OBJECT = re.compile(rb"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
_TEXT, _EMPTY_TEXT = b'"content":"', b'"content":""'
# An SSE event longer than this is a broken stream, not a reason to grow without bound.
MAX_EVENT_BYTES = 8 * 1024 * 1024
# The ids a continuation's events take from the first part's, so the client sees one stream.
_IDS = ("id", "created", "model")


def resumable_request(payload: dict | None) -> bool:
    """Whether a chat request's stream can be continued on another replica."""
    if not payload or payload.get("stream") is not True:
        return False
    if payload.get("n") not in (None, 1):
        return False
    response_format = payload.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") != "text":
        return False
    if any(payload.get(name) is not None for name in _GUIDED):
        return False
    messages = payload.get("messages")
    return isinstance(messages, list) and bool(messages)


@dataclass(frozen=True)
class UsageAsked:
    """The usage a client asked of its stream (stream_options)."""

    final: bool  # include_usage: a usage chunk before [DONE]
    per_chunk: bool  # continuous_usage_stats too: usage on every chunk

    @classmethod
    def of(cls, payload: dict, asked_by_gateway: bool = False) -> UsageAsked:
        """What `payload` asks; nothing when the gateway added the asking itself."""
        options = payload.get("stream_options")
        if asked_by_gateway or not isinstance(options, dict):
            return cls(False, False)
        final = options.get("include_usage") is True
        return cls(final, final and options.get("continuous_usage_stats") is True)


def counting_payload(payload: dict) -> dict:
    """The request as the replicas get it: asking for usage on every chunk, so the tokens a
    stream carried are known wherever it breaks off (a malformed stream_options is left for
    the replica to refuse)."""
    options = payload.get("stream_options", {})
    if not isinstance(options, dict):
        return payload
    return {**payload, "stream_options": {**options, "include_usage": True,
                                          "continuous_usage_stats": True}}


@dataclass(frozen=True)
class ContinuationTarget:
    """Where a continuation goes: the origin dialled, the headers sent, the model named."""

    origin: Origin
    headers: str
    model: str | None


@dataclass
class _Stream:
    """What the client has been sent so far, across the parts of one stream."""

    # The text streamed, delta by delta: a str, a plain event's JSON or a block of plain
    # events as they came, decoded only when a continuation needs the text.
    pieces: list[str | bytes | _Block] = field(default_factory=list)
    produced: int = 0  # completion tokens of the parts before the current one
    part_tokens: int = 0  # completion tokens of the current part
    part_prompt_tokens: int | None = None  # the prompt tokens the current part's usage reports
    part_first_at: float | None = None  # when the current part's first bytes came (monotonic)
    ids: dict[str, object] = field(default_factory=dict)
    continuing: bool = False  # the current part is a continuation
    resumable: bool = True  # only text deltas so far
    finished: bool = False  # a finish_reason was sent
    done: bool = False  # data: [DONE] was sent
    error_sent: bool = False  # an upstream error event was relayed (not continued)
    spent: bool = False  # the token budget was spent: nothing to continue
    replicas: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.produced + self.part_tokens

    @property
    def text(self) -> str:
        return "".join(piece if isinstance(piece, str) else _content(piece)
                       for piece in self.pieces)


class _Block(bytes):
    """Whole chunks of plain text-token events, as the replica framed them."""


class StreamResume:
    """The relay of one resumable pooled stream, and the continuations it may need; each
    break is counted in `outcomes` by (role, RESUMED | NOT_RESUMABLE | NO_REPLICA)."""

    def __init__(self, role: PooledRole, body: JsonBody, payload: dict, path: str,
                 target_of: Callable[[str], ContinuationTarget], timeout_s: float,
                 stall_s: float, outcomes: defaultdict[tuple[str, str], int],
                 usage_asked_by_gateway: bool = False) -> None:
        self._role = role
        self._outcomes = outcomes
        self._asked = UsageAsked.of(payload, usage_asked_by_gateway)
        # What every part's replica is sent: `payload` (made from the caller's `body`, whose
        # bytes every part is written from) asking for usage.
        self._body = body
        self.payload = counting_payload(payload)
        self._path = path  # the request target: /v1/chat/completions
        self._target_of = target_of  # a replica's origin -> where and how to send it
        self._timeout = timeout_s
        self._stall = stall_s
        self.resumes = 0  # continuations this stream needed
        self.whole = False  # the stream ended with its [DONE]
        # The prompt tokens the usage of the part that ended the stream reported (taught to
        # the pool's characters per token by the relay of a stream served whole), and when
        # that part's first event came (its decode is timed from there).
        self.prompt_tokens: int | None = None
        self.first_event_at: float | None = None
        self._part_started = 0.0  # when the current continuation was sent

    async def relay(self, connections: Connections, response: Response, extra: list[bytes],
                    placement: Placement, client: Channel, keep_alive: bool) -> tuple[bool, int]:
        """Relay the stream, continued where it breaks off: (whether the client connection
        stays usable, the completion tokens it carried)."""
        stream = _Stream(replicas=[placement.origin])
        tried = {placement.origin}
        held = [placement]  # each part's placement, released once its part ends
        client.write(head_bytes(response, extra, b"Transfer-Encoding: chunked", keep_alive))
        try:
            part: Response | None = response
            while part is not None:
                whole = await self._relay_part(connections, part, stream, client)
                if whole and self.resumes:
                    self._teach(held[-1], stream)
                held[-1].release()
                if whole:
                    self.whole = True
                    self.prompt_tokens = stream.part_prompt_tokens
                    self.first_event_at = stream.part_first_at
                    client.write(_STREAM_END)
                    return keep_alive, stream.tokens
                if client.transport.is_closing():
                    return False, stream.tokens
                part = await self._continuation(connections, stream, tried, held)
            _end_interrupted(client, stream.error_sent)
            return False, stream.tokens
        finally:
            for each in held:
                each.release()

    def _teach(self, placement: Placement, stream: _Stream) -> None:
        """The continuation that ended the stream whole: its replica's rate from its own part,
        the pool's answer length from the whole answer."""
        first = stream.part_first_at
        placement.record_completion(stream.part_tokens, time.monotonic() - self._part_started,
                                    answer_tokens=stream.tokens,
                                    prompt_tokens=stream.part_prompt_tokens,
                                    first_token_s=None if first is None
                                    else first - self._part_started)

    async def _relay_part(self, connections: Connections, response: Response, stream: _Stream,
                          client: Channel) -> bool:
        """Relay one part's events; True when the stream ended whole ([DONE] sent)."""
        conn = response.conn
        events = _Events(response.chunked)
        pipe = _EventPipe(lambda data: self._relay_data(data, events, stream), events,
                          client, conn.channel.transport,
                          lambda: conn.watchdog.arm(self._stall if events.seen else self._timeout,
                                                    conn.abort))
        held = conn.channel.divert(pipe)
        try:
            pipe.arm()
            if held:  # bytes that came with the response head go first
                pipe.data_received(held)
            if conn.channel.at_eof():
                pipe.connection_lost(None)
            while await pipe.wait() is None:  # paused for the client to drain
                conn.watchdog.disarm()  # a slow client is no stalled replica
                await client.drain()
                pipe.arm()
                pipe.resume()
        except ConnectionError:
            pass  # the client went away while the relay waited, or the upstream was gone
        finally:
            conn.channel.divert(None)
            conn.watchdog.disarm()
        if stream.done and events.ended and events.clean:
            finish(connections, response)
        else:
            conn.close()
        if stream.finished and not stream.done:
            # The answer was whole; only its [DONE] (and usage) was lost on the way.
            client.write(_chunk(b"data: [DONE]\n\n"))
            stream.done = True
        return stream.done

    def _relay_data(self, data: bytes, events: _Events,
                    stream: _Stream) -> tuple[list[bytes], bool]:
        """The client's bytes for what arrived, and whether the part broke off there."""
        if stream.part_first_at is None:
            stream.part_first_at = time.monotonic()
        if stream.ids and not stream.continuing:
            block = events.plain_block(data)
            if block is not None:
                # The usual read: whole chunks of text tokens, relayed as they came and kept
                # unparsed until a continuation needs their text.
                stream.pieces.append(_Block(block))
                stream.part_tokens += block.count(_TEXT) - block.count(_EMPTY_TEXT)
                return [block], False
        return self._relay_events(events.feed(data), stream)

    def _relay_events(self, events: list[bytes], stream: _Stream) -> tuple[list[bytes], bool]:
        """The client's bytes for a run of events, and whether an error event broke the part
        off there (it is relayed only when the stream cannot be continued)."""
        out = []
        for event in events:
            relayed = self._event(event, stream)
            if relayed is _CUT:  # ended with no answer: broken off, whatever it says
                return out, True
            if relayed is None:
                if stream.resumable and not stream.finished:
                    return out, True
                stream.error_sent = True
                relayed = _chunk(event + b"\n\n")
            if relayed:
                out.append(relayed)
        return out, False

    def _event(self, event: bytes, stream: _Stream) -> bytes | None:
        """The bytes the client gets for one upstream event (b"" for none); None for an
        error event, _CUT for a [DONE] before any finish_reason (an engine that stopped ends
        its streams so: a cut that looks finished)."""
        as_is = _chunk(event + b"\n\n")
        if not event.startswith(b"data:"):
            return as_is
        data = event[5:].strip()
        if data == _DONE:
            if not stream.finished:
                return _CUT
            stream.done = True
            return as_is
        if stream.ids and not stream.continuing and _is_text(data):
            # The usual event, text tokens: kept unparsed until a resume needs its text.
            relayed = self._plain_event(data, stream)
            if relayed is not None:
                return as_is if relayed is data else _chunk(b"data: " + relayed + b"\n\n")
        try:
            chunk = json.loads(data)
        except ValueError:
            return as_is
        if not isinstance(chunk, dict):
            return as_is
        if "error" in chunk:
            return None
        changed = self._note(chunk, stream)
        if "usage" in chunk and not self._asked.per_chunk:
            if not chunk.get("choices"):  # the final usage chunk
                if not self._asked.final:
                    return b""
            else:
                del chunk["usage"]
                changed = True
        if not stream.continuing:
            return _dumped(chunk) if changed else as_is
        if _is_role_only(chunk):
            return b""
        chunk.update(stream.ids)
        return _dumped(chunk)

    def _plain_event(self, data: bytes, stream: _Stream) -> bytes | None:
        """The data the client gets for a text-token event, its tokens counted by byte scans
        (`data` itself when unchanged); None when it must be parsed."""
        bare, tokens = data, None
        if _USAGE in data:
            split = _split_usage(data)
            if split is None:
                return None
            bare, tokens = split
            if stream.part_prompt_tokens is None:
                stream.part_prompt_tokens = reported_prompt_tokens(data)
        if _TEXT in bare and _EMPTY_TEXT not in bare:
            stream.pieces.append(bare)
        stream.part_tokens = stream.part_tokens + 1 if tokens is None else tokens
        return data if tokens is None or self._asked.per_chunk else bare

    def _note(self, chunk: dict, stream: _Stream) -> bool:
        """Keep what a continuation needs from one chunk; True when the chunk must change."""
        if not stream.ids:
            stream.ids = {key: chunk[key] for key in _IDS if key in chunk}
        changed = False
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if any(value for key, value in delta.items() if key not in _TEXT_DELTA):
                stream.resumable = False
            content = delta.get("content")
            if content:
                stream.pieces.append(content)
                stream.part_tokens += 1
            if choice.get("finish_reason") == ABORTED:
                # The engine aborted it (it is stopping): no answer's end, whatever it says.
                choice["finish_reason"] = None
                changed = True
            elif choice.get("finish_reason") is not None:
                stream.finished = True
                if self.resumes:
                    chunk["lobes_resumed"] = {"resumes": self.resumes,
                                              "replicas": stream.replicas}
                    changed = True
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            stream.part_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int) and stream.part_prompt_tokens is None:
                stream.part_prompt_tokens = usage["prompt_tokens"]  # as the replica counted
            if stream.continuing:
                _count_once(usage, stream.produced)
                changed = True
        return changed

    async def _continuation(self, connections: Connections, stream: _Stream, tried: set[str],
                            held: list[Placement]) -> Response | None:
        """The continuation's response, from a replica not tried yet that answers with a
        stream; None when the stream cannot or need not go on (counted by why)."""
        response = await self._continue_on(connections, stream, tried, held)
        if response is not None:
            outcome = RESUMED
        elif not stream.resumable or stream.finished or stream.spent:
            outcome = NOT_RESUMABLE
        else:
            outcome = NO_REPLICA
        self._outcomes[self._role.role, outcome] += 1
        return response

    async def _continue_on(self, connections: Connections, stream: _Stream, tried: set[str],
                           held: list[Placement]) -> Response | None:
        if not stream.resumable or stream.finished:
            return None
        stream.produced, stream.part_tokens = stream.tokens, 0
        stream.part_prompt_tokens = stream.part_first_at = None
        body = continuation_body(self.payload, stream.text, stream.produced)
        if body is None:
            stream.spent = True
            return None
        # Placed as its own request: the window must hold the prompt, the text so far and
        # what is left to generate, and a replica holding the prefix is cheaper.
        role = self._role
        request = role.placer.shape_of(body)
        while (placement := role.placer.place(role.candidates(tried, request), request=request)
               or role.failover(tried, request)) is not None:
            tried.add(placement.origin)
            held.append(placement)
            target = self._target_of(placement.origin)
            encoded = self._body.encode({**body, "model": target.model} if target.model
                                        else body)
            head = request_head("POST", self._path, target.origin, target.headers,
                                len(encoded))
            self._part_started = time.monotonic()
            try:
                response = await exchange(connections, target.origin, head, encoded,
                                          self._timeout)
            except UpstreamError:
                placement.release()
                continue
            if response.status == 200 and is_event_stream(response):
                # A stream that broke off before its first event is a new answer to the
                # client: relayed as a first part, its role delta and ids its own.
                stream.continuing = bool(stream.ids)
                stream.replicas.append(placement.origin)
                self.resumes += 1
                return response
            response.conn.close()
            placement.release()
        return None


def continuation_body(payload: dict, text: str, produced: int) -> dict | None:
    """The request that continues `text`, `produced` tokens into the answer; None when the
    token budget is spent. Nothing produced yet: the request itself, sent again."""
    if not text and not produced:
        return payload
    body = {**payload, "continue_final_message": True, "add_generation_prompt": False}
    for key in ("max_completion_tokens", "max_tokens"):
        budget = payload.get(key)
        if isinstance(budget, int) and not isinstance(budget, bool):
            if budget - produced < 1:
                return None
            body[key] = budget - produced
    least = payload.get("min_tokens")
    if isinstance(least, int) and not isinstance(least, bool):
        body["min_tokens"] = max(0, least - produced)
    messages = list(payload["messages"])
    last = messages[-1]
    if (payload.get("continue_final_message") and isinstance(last, dict)
            and last.get("role") == "assistant" and isinstance(last.get("content"), str)):
        # The caller continued its own assistant message: the answer extends it further.
        messages[-1] = {**last, "content": last["content"] + text}
    else:
        messages.append({"role": "assistant", "content": text})
    body["messages"] = messages
    return body


def _is_text(data: bytes) -> bool:
    """A chunk with no finish, error or delta other than text (compact JSON, as vLLM writes
    it; any other spelling is parsed)."""
    return _NOT_FINISHED in data and _NOT_TEXT.search(data) is None


def _split_usage(data: bytes) -> tuple[bytes, int] | None:
    """A compact chunk whose last member is its usage: (the chunk without it, its completion
    tokens); None for any other shape (it is parsed instead). A quote inside a JSON string is
    escaped, so the last `,"usage":{` is the member's own."""
    at = data.rfind(_LAST_USAGE)
    start = at + len(_LAST_USAGE) - 1
    if at < 0 or not data.endswith(b"}"):
        return None
    if not _USAGE_OBJECT.fullmatch(data, start, len(data) - 1):
        return None
    tokens = _COMPLETION_TOKENS.search(data, start)
    return (data[:at] + b"}", int(tokens.group(1))) if tokens is not None else None


def _content(data: bytes) -> str:
    """The text of a plain event, or of a block of them, kept unparsed."""
    if isinstance(data, _Block):
        return "".join(_content(event[5:].strip()) for event in _Events(True).feed(data))
    chunk = json.loads(data)
    return "".join((choice.get("delta") or {}).get("content") or ""
                   for choice in chunk.get("choices") or ())


def _count_once(usage: dict, produced: int) -> None:
    """A continuation's usage, made the whole stream's: its prompt re-read the `produced`
    tokens already streamed, which count as completion tokens, once."""
    prompt = usage.get("prompt_tokens")
    if isinstance(prompt, int):
        usage["prompt_tokens"] = max(0, prompt - produced)
    usage["completion_tokens"] += produced
    if isinstance(usage.get("prompt_tokens"), int):
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]


def _is_role_only(chunk: dict) -> bool:
    """The opening chunk of a chat stream: the role and no text, no finish."""
    choices = chunk.get("choices") or ()
    return bool(choices) and all(
        not (c.get("delta") or {}).get("content") and c.get("finish_reason") is None
        and "role" in (c.get("delta") or {}) for c in choices)


def _dumped(chunk: dict) -> bytes:
    return _chunk(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _end_interrupted(client: Channel, error_sent: bool) -> None:
    """No replica could go on: end as an unpooled stream does (an error event, then close)."""
    if not client.transport.is_closing():
        client.write((b"" if error_sent else _chunk(interrupted_event())) + _STREAM_END)
        client.transport.close()


class _EventPipe(StreamPipe):
    """The upstream socket's protocol while one part of a resumable stream passes through it,
    its events relayed as they come; its outcome is True once the part ended (whole, broken
    off, or its client gone), judged by what the stream saw."""

    __slots__ = ("_events", "_relay", "_write", "arm")

    def __init__(self, relay: Callable[[bytes], tuple[list[bytes], bool]], events: _Events,
                 client: Channel, upstream: asyncio.Transport, arm: Callable[[], None]) -> None:
        super().__init__(client, upstream)
        self._relay = relay  # data in, (the client's bytes, whether the part broke off) out
        self._events = events
        self._write = client.write
        self.arm = arm  # (re)starts the part's deadline: the watchdog aborts a stalled replica

    def data_received(self, data: bytes) -> None:
        if self.outcome is not None:
            return
        self.arm()
        try:
            out, broke = self._relay(data)
        except ValueError:  # broken chunk framing
            out, broke = [], True
        if out and not self._client.is_closing():
            self._write(b"".join(out))
        if broke or self._events.ended or self._client.is_closing():
            self._end(True)
        else:
            self._hold_if_full()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(True)


class _Events:
    """An upstream body (chunked or close-delimited) cut into SSE events."""

    __slots__ = ("_decoder", "_text", "seen")

    def __init__(self, chunked: bool) -> None:
        self._decoder = ChunkDecoder() if chunked else None
        self._text = b""
        self.seen = False  # an event came

    @property
    def ended(self) -> bool:
        """The last chunk came."""
        return self._decoder is not None and self._decoder.ended

    @property
    def clean(self) -> bool:
        """Nothing followed the last chunk but its trailers."""
        return self._decoder is not None and self._decoder.done and self._decoder.clean

    def plain_block(self, data: bytes) -> bytes | None:
        """`data` when it is whole chunks of plain text-token events and nothing is held from
        before (else None: it is cut into events and read one by one)."""
        if (self._decoder is None or not self._decoder.between_chunks or self._text
                or not data.endswith(b"\n\n\r\n") or _NOT_PLAIN.search(data) is not None
                or _DONE in data or data.count(_NOT_FINISHED) != data.count(_FINISH)):
            return None
        end, last = scan_chunks(data)
        if last or end != len(data):
            return None
        self.seen = True
        return data

    def feed(self, data: bytes) -> list[bytes]:
        """The whole events `data` completes, in order; a ValueError on broken chunk framing or
        an event longer than MAX_EVENT_BYTES."""
        if self._decoder is not None:
            data = self._decoder.feed(data)
        self._text += data.replace(b"\r\n", b"\n")
        *events, self._text = self._text.split(b"\n\n")
        if len(self._text) > MAX_EVENT_BYTES:
            raise ValueError(f"an event longer than {MAX_EVENT_BYTES} bytes")
        events = [event for event in events if event]
        self.seen = self.seen or bool(events)
        return events
