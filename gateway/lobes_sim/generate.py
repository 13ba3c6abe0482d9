"""POST /v1/chat/completions and /v1/completions, streamed (SSE) or not, through the engine."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import errors
from .engine import ABORT, DEAD, STOP, Sequence
from .httpio import Connection, Request, stop_watching
from .prefix_cache import NO_PROMPT, PromptBlocks
from .state import ClientGone, SimState
from .textgen import (
    CHARS_PER_TOKEN,
    TokenStream,
    answer_token_units,
    chat_token_units,
    count_chat_tokens,
    count_prompt_tokens,
    count_text_tokens,
    digest_seed,
    natural_length,
    prompt_token_units,
)
from .tools import ForcedCall, forced_call
from .validation import checked_model, int_field, request_json

# vLLM's /v1/completions default when the caller names no max_tokens (as OpenAI's).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CONTINUE_WITH_GENERATION_PROMPT = (
    "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
CONTINUE_WITHOUT_ASSISTANT = (
    "continue_final_message needs the final message to be the assistant's.")
# A forced tool call the model finished (vLLM's finish reason for it).
TOOL_CALLS = "tool_calls"
# The simulator's bound on n: each choice is a sequence in its engine.
MAX_CHOICES = 256


@dataclass(frozen=True)
class GenerateCall:
    """A validated generate request: what to run and how to answer."""

    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    natural: int | None
    seed: int
    # Output tokens the request's final assistant message holds already (continue_final_message):
    # the answer goes on from this token of the seed's sequence.
    offset: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    priority: int = 0
    prompt: PromptBlocks = NO_PROMPT
    chars_per_token: int = CHARS_PER_TOKEN
    # The other choices a request of n asks for, each (its seed, where it stops on its own):
    # like the first, each its own sequence in the engine, decoded side by side.
    more_choices: tuple[tuple[int, int | None], ...] = ()
    # The call a forced tool choice writes (its text is the output), else None.
    tool_call: ForcedCall | None = None

    @property
    def seeds(self) -> list[int]:
        """Each choice's seed, in order."""
        return [self.seed, *(seed for seed, _natural in self.more_choices)]

    def output_text(self, seed: int, generated: int) -> str:
        """The text of a choice's first `generated` output tokens."""
        if self.tool_call is not None:
            return self.tool_call.written(generated)
        return TokenStream(seed).text(generated, start=self.offset)

    def answer_units(self, generated: int) -> list[object]:
        """The stand-ins of the first `generated` output tokens, as a next turn re-reads them."""
        return answer_token_units(self.output_text(self.seed, generated), self.chars_per_token)


def _has_strict_tool(body: dict[str, Any]) -> bool:
    tools = body.get("tools") or []
    return any(
        isinstance(tool, dict)
        and (tool.get("strict") is True or (tool.get("function") or {}).get("strict") is True)
        for tool in tools
    )


def _prompt(body: dict[str, Any], chat: bool, chars: int) -> tuple[int, str, str | None]:
    """Prompt tokens, a canonical text of the prompt (for the output seed), and the final
    assistant message's text when the request continues it (continue_final_message)."""
    if chat:
        messages = body.get("messages")
        if messages is None:
            raise errors.validation_error("body.messages", "missing", "Field required")
        if not isinstance(messages, list) or not messages:
            raise errors.bad_request("'messages' must be a non-empty list.", param="messages")
        prefix = _continued_text(body, messages)
        if prefix is not None:
            # The answer so far is not part of the prompt the seed is drawn from: a continuation
            # draws the same sequence as the request that produced the prefix.
            messages = messages[:-1]
        return count_chat_tokens(messages, chars), json.dumps(messages, sort_keys=True), prefix
    prompt = body.get("prompt")
    if not isinstance(prompt, str | list) or not prompt:
        raise errors.bad_request("'prompt' must be a string or a list.", param="prompt")
    return count_prompt_tokens(prompt, chars), json.dumps(prompt, sort_keys=True), None


def _continued_text(body: dict[str, Any], messages: list[Any]) -> str | None:
    """The final assistant message's text when the request asks to continue it, as vLLM
    checks it (continue_final_message needs add_generation_prompt false)."""
    if not body.get("continue_final_message"):
        return None
    if body.get("add_generation_prompt", True):
        raise errors.bad_request(CONTINUE_WITH_GENERATION_PROMPT, "continue_final_message")
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        raise errors.bad_request(CONTINUE_WITHOUT_ASSISTANT, "continue_final_message")
    content = last.get("content")
    return content if isinstance(content, str) else ""


def _max_tokens(body: dict[str, Any], chat: bool) -> int | None:
    value = body.get("max_completion_tokens") if chat else None
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise errors.bad_request(f"max_tokens must be at least 1, got {value}.", "max_tokens")
    return value


def parse_call(state: SimState, body: dict[str, Any], chat: bool) -> GenerateCall:
    """Validate a generate request the way vLLM does, in vLLM's order."""
    model = checked_model(state, body)
    if chat and state.faults.reject_strict_tools and _has_strict_tool(body):
        raise errors.bad_request(errors.GRAMMAR_COMPILE_FAILURE)
    chars = state.profile.chars_per_token
    prompt_tokens, prompt_text, prefix = _prompt(body, chat, chars)
    seed = digest_seed(state.seed, body.get("seed"), prompt_text)
    offset = 0
    if prefix is not None:
        offset, prefix_tokens = _continue_at(seed, prefix, chars)
        prompt_tokens += prefix_tokens
        if offset is None:  # not this seed's words: go on with the sequence of the whole prompt
            seed, offset = digest_seed(seed, prefix), 0
    window = state.profile.max_model_len
    requested = _max_tokens(body, chat)
    if requested is not None and requested > window:
        raise errors.max_tokens_over_window(window, requested)
    if prompt_tokens >= window:
        raise errors.prompt_over_window(window, prompt_tokens)
    # As vLLM 0.32: a max_tokens within the window but past what the prompt leaves is
    # accepted, and the output ends (length) where the window does.
    max_tokens = min(requested or window, window - prompt_tokens)
    priority = _priority(body)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise errors.bad_request("'stream_options' must be an object.", "stream_options")
    choices = int_field(body, "n", 1)
    if not 1 <= choices <= MAX_CHOICES:
        raise errors.bad_request(f"n must be from 1 to {MAX_CHOICES} on the simulator, got "
                                 f"{choices}.", "n")
    more_seeds = [digest_seed(seed, "choice", index) for index in range(1, choices)]
    tool_call = forced_call(body, body.get("seed") or 0, chars) if chat else None
    natural = tool_call.length if tool_call else _stops_at(state, body, seed, offset)
    return GenerateCall(
        chat=chat,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        natural=natural,
        seed=seed,
        offset=offset,
        stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
        priority=priority,
        prompt=_prompt_blocks(body, chat, chars, state.profile.block_size),
        chars_per_token=chars,
        more_choices=tuple((each, _stops_at(state, body, each, offset)) for each in more_seeds),
        tool_call=tool_call,
    )


def _stops_at(state: SimState, body: dict[str, Any], seed: int, offset: int) -> int | None:
    """Where a choice drawn from `seed` stops on its own (None: at max_tokens, ignore_eos),
    less what the continued prefix holds already."""
    if body.get("ignore_eos"):
        return None
    natural = max(natural_length(seed, state.profile.natural_length) - offset, 1)
    return max(natural, int_field(body, "min_tokens", 0))


def _prompt_blocks(body: dict[str, Any], chat: bool, chars: int,
                   block_size: int) -> PromptBlocks:
    """The prefix-cache stand-ins and block hashes of a validated prompt."""
    if chat:
        return PromptBlocks.of(chat_token_units(body["messages"], chars), block_size)
    return PromptBlocks.of(prompt_token_units(body["prompt"], chars), block_size)


def _continue_at(seed: int, prefix: str, chars: int) -> tuple[int | None, int]:
    """(the output token a continuation starts at, the prefix's prompt tokens): the prefix's
    length in the seed's tokens when it is exactly their start, else (None, its text's count)."""
    tokens = TokenStream(seed)
    text, count = "", 0
    while len(text) < len(prefix):
        text += tokens.token(count)
        count += 1
    if text == prefix:
        return count, count
    return None, count_text_tokens(prefix, chars)


def _priority(body: dict[str, Any]) -> int:
    """The request's `priority` (vLLM: an integer, lower runs first). Under the fcfs policy
    vLLM accepts any and ignores it; only the priority policy orders by it."""
    value = body.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.bad_request(f"'priority' must be an integer, got {value!r}.", "priority")
    return value


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


class _Answer:
    """Builds the response objects of one call (ids, envelopes, choices)."""

    def __init__(self, call: GenerateCall) -> None:
        self.call = call
        prefix = "chatcmpl" if call.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.call.model,
            "choices": choices,
        }

    def full(self, answers: list[tuple[str, Sequence]]) -> dict[str, Any]:
        """The whole answer of each choice's (text, sequence), in order; usage counts them all
        (vLLM's completion_tokens is every choice's)."""
        choices = []
        for index, (text, sequence) in enumerate(answers):
            choice: dict[str, Any] = {"index": index}
            finish_reason = self.finish_reason(sequence)
            if self.call.chat:
                choice["message"] = {"role": "assistant", "content": text}
                if self.call.tool_call is not None and sequence.finish_reason == STOP:
                    choice["message"] = {"role": "assistant", "content": "",
                                         "tool_calls": self.call.tool_call.tool_calls()}
            else:
                choice["text"] = text
            choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
            choices.append(choice)
        answer = self.envelope("chat.completion" if self.call.chat else "text_completion",
                               choices)
        answer["usage"] = _usage(self.call.prompt_tokens,
                                 sum(sequence.generated for _text, sequence in answers))
        return answer

    def finish_reason(self, sequence: Sequence) -> str | None:
        """The sequence's finish reason as the answer says it: a forced call the model
        finished is "tool_calls"."""
        call = self.call.tool_call
        if call is not None and sequence.finish_reason == STOP and not call.named:
            return TOOL_CALLS
        return sequence.finish_reason

    def call_chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        """A chunk of a streamed forced call: a tool_calls delta, or its end."""
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = None
        return self.envelope("chat.completion.chunk", [choice])

    def chunk(self, piece: str | None, finish_reason: str | None,
              index: int = 0) -> dict[str, Any]:
        """One stream chunk of choice `index`; piece=None on a chat stream is the opening role
        delta."""
        if self.call.chat:
            delta = {"role": "assistant", "content": ""} if piece is None else {"content": piece}
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": piece or "", "logprobs": None}
            obj = "text_completion"
        choice["finish_reason"] = finish_reason
        if finish_reason is not None:
            choice["stop_reason"] = None
        return self.envelope(obj, [choice])

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        chunk = self.envelope(
            "chat.completion.chunk" if self.call.chat else "text_completion", []
        )
        chunk["usage"] = _usage(self.call.prompt_tokens, completion_tokens)
        return chunk


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class _TokenEvents:
    """SSE bytes of plain token chunks from a pre-rendered template (no dict, no full dump)."""

    _MARK = "\x00piece\x00"

    def __init__(self, answer: _Answer, index: int = 0) -> None:
        rendered = _sse(answer.chunk(self._MARK, None, index))
        self._head, self._tail = rendered.split(json.dumps(self._MARK).encode())

    def event(self, piece: str) -> bytes:
        return self._head + json.dumps(piece).encode() + self._tail


async def handle_generate(
    state: SimState, conn: Connection, request: Request, chat: bool
) -> None:
    """Run one chat or text completion through the engine and answer it."""
    call = parse_call(state, request_json(request), chat)
    sequence = Sequence(call.prompt_tokens, call.max_tokens, call.natural, call.priority,
                        call.prompt, call.answer_units)
    others = [Sequence(call.prompt_tokens, call.max_tokens, natural, call.priority, call.prompt)
              for _seed, natural in call.more_choices]
    everyone = [sequence, *others]
    abort = state.engine.submit_all(everyone)
    watcher = asyncio.create_task(conn.watch_disconnect(abort))
    try:
        if call.stream:
            await _stream(state, conn, call, everyone, abort, request.keep_alive)
        else:
            await _respond_whole(conn, call, everyone, request.keep_alive)
    except (ConnectionError, OSError) as exc:
        abort()
        raise ClientGone from exc
    finally:
        await stop_watching(watcher)


async def _respond_whole(
    conn: Connection, call: GenerateCall, sequences: list[Sequence], keep_alive: bool
) -> None:
    """Answer once every choice's sequence has finished."""
    for sequence in sequences:
        while not sequence.finished:
            await sequence.progress()
        if sequence.finish_reason == ABORT:
            raise ClientGone
        if sequence.finish_reason == DEAD:
            raise errors.engine_dead()
    answers = [(call.output_text(seed, sequence.generated), sequence)
               for seed, sequence in zip(call.seeds, sequences, strict=True)]
    await conn.send_json(200, _Answer(call).full(answers), keep_alive)


@dataclass
class _CallProgress:
    """What a streamed forced call has sent: its name, how much of its arguments."""

    named: bool = False
    arguments: int = 0


@dataclass
class _Choice:
    """One choice of a stream: its sequence, its words and event template, what it has sent."""

    index: int
    sequence: Sequence
    tokens: TokenStream
    plain: _TokenEvents
    opened: bool
    sent: int = 0
    call_progress: _CallProgress = field(default_factory=_CallProgress)

    @property
    def unsent(self) -> bool:
        return not self.sequence.finished or self.sent < self.sequence.generated


async def _stream(
    state: SimState, conn: Connection, call: GenerateCall, sequences: list[Sequence],
    abort: Callable[[], None], keep_alive: bool,
) -> None:
    answer = _Answer(call)
    choices = [_Choice(index, sequence, TokenStream(seed), _TokenEvents(answer, index),
                       opened=not call.chat)
               for index, (seed, sequence) in enumerate(zip(call.seeds, sequences, strict=True))]
    writer = _SseWriter(state.faults.die_after_chunks)
    await conn.start_chunked(200, "text/event-stream; charset=utf-8", keep_alive)
    try:
        while any(choice.unsent for choice in choices):
            # The choices decode side by side: the first still running paces them.
            running = next((c.sequence for c in choices if not c.sequence.finished), None)
            if running is not None:
                await running.progress()
            if any(choice.sequence.finish_reason == ABORT for choice in choices):
                raise ClientGone
            if any(choice.sequence.finish_reason == DEAD for choice in choices):
                # As vLLM's server when its engine core dies or it stops: the stream ends at
                # once, in-band, with an error event and [DONE] (no finish_reason).
                writer.add(_sse(errors.engine_dead().body()))
                break
            for choice in choices:
                if call.tool_call is not None:
                    _send_call_ready(writer, answer, call.tool_call, choice)
                else:
                    _send_ready(writer, answer, call, choice, choices,
                                state.profile.tokens_per_chunk)
            if any(not choice.sequence.finished for choice in choices):
                await writer.flush(conn)
        if call.include_usage and not state.engine.dead:
            writer.add(_sse(answer.usage_chunk(sum(s.generated for s in sequences))))
        writer.add(b"data: [DONE]\n\n")
        await writer.flush(conn, end=True)
    except _StreamCut:
        await writer.flush(conn)
        abort()
        conn.drop()
        raise ClientGone from None


def _send_ready(writer: _SseWriter, answer: _Answer, call: GenerateCall, choice: _Choice,
                choices: list[_Choice], tokens_per_chunk: int) -> None:
    """Queue a choice's events for what it has generated: as vLLM, a chat choice's role delta
    goes out with its first output, after prefill; then its tokens, chunk by chunk."""
    sequence = choice.sequence
    if not choice.opened and sequence.generated:
        writer.add(_sse(_role_chunk(answer, call, choice.index)))
        choice.opened = True
    per_chunk = max(1, tokens_per_chunk)
    while count := _chunk_tokens(sequence, choice.sent, per_chunk):
        start = call.offset + choice.sent
        piece = "".join(choice.tokens.token(start + i) for i in range(count))
        choice.sent += count
        last = sequence.finished and choice.sent == sequence.generated
        if last or call.continuous_usage:
            sent = sum(each.sent for each in choices)
            writer.add(_sse(_final_or_usage_chunk(answer, call, choice, piece, last, sent)))
        else:
            writer.add(choice.plain.event(piece))


def _send_call_ready(writer: _SseWriter, answer: _Answer, tool_call: ForcedCall,
                     choice: _Choice) -> None:
    """Queue a forced call's events as the hermes parser streams it: the id and name once
    the name is written, then each new fragment of the arguments, then the finish reason."""
    sequence = choice.sequence
    if not choice.opened and sequence.generated:
        writer.add(_sse(answer.chunk(None, None)))
        choice.opened = True
    if choice.sent == sequence.generated and not sequence.finished:
        return
    progress = choice.call_progress
    written = tool_call.arguments_written(sequence.generated)
    if written is not None and not progress.named:
        writer.add(_sse(answer.call_chunk({"content": None, "tool_calls": [{
            "id": tool_call.call_id, "type": "function", "index": 0,
            "function": {"name": tool_call.name}}]}, None)))
        progress.named = True
    if written is not None and len(written) > progress.arguments:
        fragment = written[progress.arguments:]
        progress.arguments = len(written)
        writer.add(_sse(answer.call_chunk(
            {"content": None, "tool_calls": [{"index": 0, "function": {"arguments": fragment}}]},
            None)))
    choice.sent = sequence.generated
    if sequence.finished:
        writer.add(_sse(answer.call_chunk({}, answer.finish_reason(sequence))))


def _role_chunk(answer: _Answer, call: GenerateCall, index: int = 0) -> dict[str, Any]:
    """A chat stream's opening role delta; with continuous usage it carries vLLM's usage of
    no completion tokens yet."""
    chunk = answer.chunk(None, None, index)
    if call.include_usage and call.continuous_usage:
        chunk["usage"] = _usage(call.prompt_tokens, 0)
    return chunk


def _chunk_tokens(sequence: Sequence, sent: int, per_chunk: int) -> int:
    """How many generated tokens the next chunk carries: `per_chunk` of them, fewer only for
    the answer's last chunk; 0 while fewer are waiting."""
    waiting = sequence.generated - sent
    if sequence.finished:
        return min(waiting, per_chunk)
    return per_chunk if waiting >= per_chunk else 0


def _final_or_usage_chunk(
    answer: _Answer, call: GenerateCall, choice: _Choice, piece: str, last: bool, sent: int
) -> dict[str, Any]:
    """A choice's last chunk (its finish reason) or a chunk with continuous usage (`sent`
    tokens of every choice so far)."""
    chunk = answer.chunk(piece, choice.sequence.finish_reason if last else None, choice.index)
    if call.include_usage and call.continuous_usage:
        chunk["usage"] = _usage(call.prompt_tokens, sent)
    return chunk


class _StreamCut(Exception):
    """The die_after_chunks fault's budget is spent: the stream must end here."""


class _SseWriter:
    """Collects SSE events as HTTP chunks and writes them in one go (one syscall per wake)."""

    def __init__(self, die_after_chunks: int) -> None:
        self.limit = die_after_chunks
        self.sent = 0
        self.pending: list[bytes] = []

    def add(self, event: bytes) -> None:
        if self.limit and self.sent >= self.limit:
            raise _StreamCut
        self.pending.append(b"%x\r\n%s\r\n" % (len(event), event))
        self.sent += 1

    async def flush(self, conn: Connection, end: bool = False) -> None:
        if end:
            self.pending.append(b"0\r\n\r\n")
        conn.writer.write(b"".join(self.pending))
        self.pending.clear()
        await conn.writer.drain()
