"""What placement knows of a request before sending it: its shape, and who holds its prefix.

The shape is the prompt's size in tokens (estimated as the simulator and the window check
count: a token per four characters, four per chat message, two for the template), the
answer's budget (max_tokens, None when the caller named none) and the chained hashes of the
prompt's leading blocks. Prefix affinity is learned from what this gateway itself sent where,
with no round trip: each placed prompt's blocks are remembered against its replica, a bounded
LRU per replica, and a later prompt's expected cache hit on a replica is its leading run of
blocks found there. A replica that went dark restarts with an empty cache, so it is forgotten.
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
BLOCK_TOKENS = BLOCK_CHARS // CHARS_PER_TOKEN
# Hash at most this many leading blocks (256 KiB of prompt): bounded work per request.
MAX_PROMPT_BLOCKS = 4096
# Remembered per replica: ~512k tokens of prompt, a few MB; the oldest go first.
BLOCKS_PER_REPLICA = 32768


@dataclass(frozen=True)
class RequestShape:
    """A request as placement prices it."""

    prompt_tokens: int = 0
    max_tokens: int | None = None
    blocks: tuple[int, ...] = ()

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


def _chat_text(messages: list) -> tuple[str, int]:
    """The chat as one text (role and content of each message) and its estimated tokens."""
    parts: list[str] = []
    tokens = TEMPLATE_TOKENS
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
        parts += [str(message.get("role")), "\x1f", text, "\x1e"]
        tokens += TOKENS_PER_MESSAGE + -(-len(text) // CHARS_PER_TOKEN)
    return "".join(parts), tokens


def _prompt_text(prompt: object) -> tuple[str, int]:
    if isinstance(prompt, str):
        return prompt, -(-len(prompt) // CHARS_PER_TOKEN)
    if isinstance(prompt, list) and all(isinstance(item, int) for item in prompt):
        return ",".join(map(str, prompt)), len(prompt)
    text = json.dumps(prompt)
    return text, -(-len(text) // CHARS_PER_TOKEN)


def chained_blocks(text: str) -> tuple[int, ...]:
    """Hashes of the text's full BLOCK_CHARS blocks, each chained to the one before it."""
    hashes: list[int] = []
    parent = 0
    end = min(len(text) // BLOCK_CHARS, MAX_PROMPT_BLOCKS) * BLOCK_CHARS
    for start in range(0, end, BLOCK_CHARS):
        parent = hash((parent, text[start:start + BLOCK_CHARS]))
        hashes.append(parent)
    return tuple(hashes)


def request_shape(payload: dict | None, with_blocks: bool) -> RequestShape:
    """The shape of a chat or text completion payload; blocks only when asked (they cost)."""
    if not payload:
        return RequestShape()
    messages = payload.get("messages")
    if isinstance(messages, list):
        text, tokens = _chat_text(messages)
    elif "prompt" in payload:
        text, tokens = _prompt_text(payload["prompt"])
    else:
        return RequestShape(max_tokens=_max_tokens(payload))
    blocks = chained_blocks(text) if with_blocks else ()
    return RequestShape(tokens, _max_tokens(payload), blocks)


class PrefixAffinity:
    """The prompt blocks this gateway sent to each replica, most recent last, bounded."""

    def __init__(self, origins: Iterable[str], capacity: int = BLOCKS_PER_REPLICA) -> None:
        self.capacity = capacity
        self._held: dict[str, OrderedDict[int, None]] = {o: OrderedDict() for o in origins}

    def cached_tokens(self, origin: str, blocks: tuple[int, ...]) -> int:
        """Prompt tokens the replica likely holds: its leading run of this prompt's blocks."""
        held = self._held[origin]
        run = 0
        for block in blocks:
            if block not in held:
                break
            run += 1
        return run * BLOCK_TOKENS

    def remember(self, origin: str, blocks: tuple[int, ...]) -> None:
        """The replica will hold these blocks. Tail first, so a prompt's head is the most
        recent and goes last, as vLLM frees a request's blocks tail first."""
        held = self._held[origin]
        for block in reversed(blocks):
            held[block] = None
            held.move_to_end(block)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def forget(self, origin: str) -> None:
        """The replica went dark: whatever it held is gone."""
        self._held[origin].clear()

    def size(self, origin: str) -> int:
        return len(self._held[origin])
