"""What placement knows of a request before sending it: its shape, and who holds its prefix.

The shape is the prompt's size in tokens (its text at the role's learned characters per token,
policy/tokens.py, four until learned; four per chat message and two for the template, as the
simulator and the window check count), the answer's budget (max_tokens, None when the caller
named none) and the chained hashes of the prompt's leading blocks. Prefix affinity is learned
from what this gateway itself sent where, with no round trip: each placed prompt's blocks are
remembered against its replica, a bounded LRU per replica, and a later prompt's expected cache
hit on a replica is its leading run of blocks found there. A replica that went dark restarts
with an empty cache, so it is forgotten.

The answer counts too: vLLM caches the full blocks of what it generated, so the next turn of a
conversation finds the answer it carries. The gateway credits it without reading any answer
(a stream's chunks are passed through unparsed): it remembers where each chat prompt it sent
ended, and a later prompt whose run of held blocks reaches such an end and goes on with an
assistant message is taken to hold that message too, the answer the replica wrote there.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS = 2
# 64 characters is ~16 tokens, vLLM's block size: an affinity block is about a cache block.
BLOCK_CHARS = 64
# Hash at most this many leading blocks (256 KiB of prompt): bounded work per request.
MAX_PROMPT_BLOCKS = 4096
# Remembered per replica: ~512k tokens of prompt, a few MB; the oldest go first.
BLOCKS_PER_REPLICA = 32768
# Prompt ends remembered per replica (each a sent chat prompt an answer may follow).
ENDS_PER_REPLICA = 4096
# Choices priced per request at most: more than any replica runs at once, and a hostile n
# (a billion) must not become a billion sequences in placement's arithmetic.
MAX_CHOICES = 256
# How the chat text marks an assistant message that follows a prompt's end.
_ASSISTANT_OPENS = "assistant\x1f"
_MESSAGE_ENDS = "\x1e"


@dataclass(frozen=True)
class RequestShape:
    """A request as placement prices it."""

    prompt_tokens: int = 0
    max_tokens: int | None = None
    blocks: tuple[int, ...] = ()
    # The prompt's text characters and its tokens that do not scale with them (template
    # markers, token ids): what a reported prompt_tokens teaches the characters per token.
    text_chars: int = 0
    fixed_tokens: int = 0
    text: str = ""  # the chat as hashed, kept only with blocks: an answer that follows is found
    # The answer placement expects: a named max_tokens at the pool's learned fill (set by
    # Placer.priced); None for a request that named none (priced at the typical answer).
    answer_tokens: int | None = None
    # The sequences the request runs side by side: its n (or best_of, when larger) choices.
    choices: int = 1

    def fits(self, window: int | None) -> bool:
        """vLLM's window check: the prompt leaves room, and so does prompt plus max_tokens."""
        if window is None:
            return True
        if self.prompt_tokens >= window:
            return False
        return self.max_tokens is None or self.prompt_tokens + self.max_tokens <= window

    def with_max_tokens(self, tokens: int) -> RequestShape:
        return replace(self, max_tokens=tokens)


def _max_tokens(payload: dict) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _choices(payload: dict) -> int:
    """The sequences a request runs side by side: vLLM decodes max(n, best_of) of them
    (at most MAX_CHOICES)."""
    counts = [value for key in ("n", "best_of")
              if isinstance(value := payload.get(key), int) and not isinstance(value, bool)]
    return min(max([1, *counts]), MAX_CHOICES)


def _text_tokens(chars: int, chars_per_token: float) -> int:
    return -int(-chars // chars_per_token)


@dataclass(frozen=True)
class _Prompt:
    """A prompt as text, its estimated tokens, and what a reported count can teach of it:
    its plain text characters (0 when parts of it are not plain text, such as images) and
    the tokens that do not scale with text (template markers, token ids)."""

    text: str
    tokens: int
    text_chars: int
    fixed_tokens: int


def _chat_prompt(messages: list, chars_per_token: float) -> _Prompt:
    """The chat as one text (role and content of each message), priced per message."""
    parts: list[str] = []
    chars, plain = 0, True
    fixed = TEMPLATE_TOKENS
    tokens = TEMPLATE_TOKENS
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        plain = plain and isinstance(content, str)
        text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
        parts += [str(message.get("role")), "\x1f", text, _MESSAGE_ENDS]
        chars += len(text)
        fixed += TOKENS_PER_MESSAGE
        tokens += TOKENS_PER_MESSAGE + _text_tokens(len(text), chars_per_token)
    return _Prompt("".join(parts), tokens, chars if plain else 0, fixed)


def _completion_prompt(prompt: object, chars_per_token: float) -> _Prompt:
    """A text completion's prompt: a text, token ids (counted exactly), or a list of texts."""
    if isinstance(prompt, str):
        return _Prompt(prompt, _text_tokens(len(prompt), chars_per_token), len(prompt), 0)
    if isinstance(prompt, list) and all(isinstance(item, int) for item in prompt):
        return _Prompt(",".join(map(str, prompt)), len(prompt), 0, len(prompt))
    text = json.dumps(prompt)
    return _Prompt(text, _text_tokens(len(text), chars_per_token), 0, 0)


def chained_blocks(text: str) -> tuple[int, ...]:
    """Hashes of the text's full BLOCK_CHARS blocks, each chained to the one before it."""
    hashes: list[int] = []
    parent = 0
    end = min(len(text) // BLOCK_CHARS, MAX_PROMPT_BLOCKS) * BLOCK_CHARS
    for start in range(0, end, BLOCK_CHARS):
        parent = hash((parent, text[start:start + BLOCK_CHARS]))
        hashes.append(parent)
    return tuple(hashes)


def request_shape(payload: dict | None, with_blocks: bool,
                  chars_per_token: float = CHARS_PER_TOKEN) -> RequestShape:
    """The shape of a chat or text completion payload, its text priced at chars_per_token;
    blocks only when asked (they cost)."""
    if not payload:
        return RequestShape()
    messages = payload.get("messages")
    if isinstance(messages, list):
        prompt = _chat_prompt(messages, chars_per_token)
    elif "prompt" in payload:
        prompt = _completion_prompt(payload["prompt"], chars_per_token)
    else:
        return RequestShape(max_tokens=_max_tokens(payload), choices=_choices(payload))
    shape = RequestShape(prompt.tokens, _max_tokens(payload), (), prompt.text_chars,
                         prompt.fixed_tokens, choices=_choices(payload))
    if not with_blocks:
        return shape
    chat = prompt.text if isinstance(messages, list) else ""
    return replace(shape, blocks=chained_blocks(prompt.text), text=chat)


class PrefixAffinity:
    """The blocks this gateway sent to each replica, most recent last, bounded; and where
    the chat prompts it sent there ended, so the answers that followed count as held."""

    def __init__(self, origins: Iterable[str], capacity: int = BLOCKS_PER_REPLICA) -> None:
        self.capacity = capacity
        self._held: dict[str, OrderedDict[int, None]] = {o: OrderedDict() for o in origins}
        # A sent chat prompt's last full block -> the prompt's length in characters.
        self._ends: dict[str, OrderedDict[int, int]] = {o: OrderedDict() for o in self._held}

    def cached_chars(self, origin: str, request: RequestShape) -> int:
        """Prompt characters the replica likely holds: its leading run of this prompt's
        blocks, and through the answer that followed a prompt it was sent, when the run
        reaches that prompt's end."""
        held = self._held[origin]
        run = 0
        for block in request.blocks:
            if block not in held:
                break
            run += 1
        if run == 0:
            return 0
        ended_at = self._ends[origin].get(request.blocks[run - 1])
        return max(run * BLOCK_CHARS, _answer_end(request.text, ended_at))

    def remember(self, origin: str, request: RequestShape) -> None:
        """The replica will hold these blocks. Tail first, so a prompt's head is the most
        recent and goes last, as vLLM frees a request's blocks tail first."""
        held = self._held[origin]
        for block in reversed(request.blocks):
            held[block] = None
            held.move_to_end(block)
        while len(held) > self.capacity:
            held.popitem(last=False)
        if request.blocks and len(request.blocks) == len(request.text) // BLOCK_CHARS:
            self._note_end(origin, request.blocks[-1], len(request.text))

    def _note_end(self, origin: str, last_block: int, length: int) -> None:
        ends = self._ends[origin]
        ends[last_block] = length
        ends.move_to_end(last_block)
        if len(ends) > ENDS_PER_REPLICA:
            ends.popitem(last=False)

    def forget(self, origin: str) -> None:
        """The replica went dark: whatever it held is gone."""
        self._held[origin].clear()
        self._ends[origin].clear()

    def size(self, origin: str) -> int:
        return len(self._held[origin])


def _answer_end(text: str, ended_at: int | None) -> int:
    """Where the assistant message that follows a sent prompt's end closes, in full blocks
    (the replica cached the answer it wrote there); 0 when none follows."""
    if ended_at is None or not text.startswith(_ASSISTANT_OPENS, ended_at):
        return 0
    closes = text.find(_MESSAGE_ENDS, ended_at + len(_ASSISTANT_OPENS))
    return 0 if closes < 0 else closes // BLOCK_CHARS * BLOCK_CHARS
