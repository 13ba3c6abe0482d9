"""Deterministic stand-ins for a tokenizer and a model: token counts, output text, vectors."""

from __future__ import annotations

import hashlib
import math
import random
import re
import struct
from typing import Any

# A rough tokenizer: one token per four characters of text, as BPE vocabularies average.
CHARS_PER_TOKEN = 4
# Chat templates wrap each message in role markers; vLLM counts those as prompt tokens.
TOKENS_PER_MESSAGE = 4
# The generation prompt is an assistant message's opening marker (half of its four): an answer
# and the assistant message that later carries it start alike, as real chat templates do.
GENERATION_PROMPT_TOKENS = 2
TOKENS_PER_NON_TEXT_PART = 64

_WORDS = (
    "the", "model", "answers", "with", "measured", "care", "and", "names", "each", "step", "it",
    "takes", "while", "the", "mesh", "routes", "every", "request", "to", "a", "box", "that",
    "holds", "the", "role", "and", "the", "gateway", "keeps", "the", "stream", "open", "until",
    "the", "last", "token", "arrives", "so", "callers", "read", "a", "steady", "flow", "of",
    "words", "about", "placement", "queues", "slots", "windows", "budgets", "replicas", "peers",
    "rates", "and", "the", "time", "each", "takes",
)
_WORD_RE = re.compile(r"[a-z0-9]+")


def count_text_tokens(text: str, chars: int = CHARS_PER_TOKEN) -> int:
    """Prompt tokens of a plain text at `chars` characters a token (at least one for a
    non-empty text)."""
    if not text:
        return 0
    return max(1, math.ceil(len(text) / chars))


def _content_tokens(content: Any, chars: int) -> int:
    if isinstance(content, str):
        return count_text_tokens(content, chars)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                total += count_text_tokens(str(part.get("text", "")), chars)
            else:
                total += TOKENS_PER_NON_TEXT_PART
        return total
    return 0


def count_chat_tokens(messages: list[dict[str, Any]], chars: int = CHARS_PER_TOKEN) -> int:
    """Prompt tokens of a chat: message contents plus the template's per-message markers."""
    return sum(_content_tokens(m.get("content"), chars) + TOKENS_PER_MESSAGE
               for m in messages) + GENERATION_PROMPT_TOKENS


def count_prompt_tokens(prompt: Any, chars: int = CHARS_PER_TOKEN) -> int:
    """Prompt tokens of a /v1/completions prompt: a text, a token-id list, or a list of texts."""
    if isinstance(prompt, str):
        return count_text_tokens(prompt, chars)
    if isinstance(prompt, list):
        if all(isinstance(item, int) for item in prompt):
            return len(prompt)
        return sum(count_prompt_tokens(item, chars) for item in prompt)
    return 0


def digest_seed(*parts: object) -> int:
    """A stable 64-bit seed from any printable parts (Python's hash() is salted per process)."""
    raw = "\x1f".join(repr(part) for part in parts).encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")


def natural_length(seed: int, bounds: tuple[int, int]) -> int:
    """Where the model would stop on its own for this seed, within the profile's bounds."""
    low, high = bounds
    return low + seed % (high - low + 1)


class TokenStream:
    """The deterministic output words of one sequence; token i is always the same text."""

    __slots__ = ("_rng", "_words")

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._words: list[str] = []

    def token(self, index: int) -> str:
        """Text of output token ``index`` (0-based)."""
        while len(self._words) <= index:
            word = self._rng.choice(_WORDS)
            self._words.append(word if not self._words else " " + word)
        return self._words[index]

    def text(self, count: int, start: int = 0) -> str:
        """``count`` tokens from token ``start`` on, joined."""
        return "".join(self.token(i) for i in range(start, start + count))


def embedding(text: str, dim: int, seed: int) -> list[float]:
    """A unit vector of ``dim`` floats that depends only on ``text`` and ``seed``."""
    rng = random.Random(digest_seed("embed", seed, text))
    vector = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def pack_base64_floats(vector: list[float]) -> bytes:
    """The little-endian float32 bytes vLLM base64-encodes for encoding_format=base64."""
    return struct.pack(f"<{len(vector)}f", *vector)


def relevance(query: str, document: str) -> float:
    """A deterministic relevance in (0, 1): word overlap, so related texts rank higher."""
    query_words = set(_WORD_RE.findall(query.lower()))
    doc_words = set(_WORD_RE.findall(document.lower()))
    union = query_words | doc_words
    overlap = len(query_words & doc_words) / len(union) if union else 0.0
    # A small text-dependent jitter breaks ties between equally overlapping documents.
    jitter = (digest_seed("score", query, document) % 1000) / 100000.0
    return 1.0 / (1.0 + math.exp(-(8.0 * overlap - 3.0))) * 0.99 + jitter


def _content_units(content: Any, chars: int) -> list[object]:
    """The token stand-ins of one message's content: its text in `chars`-character slices."""
    if isinstance(content, str):
        return [content[i:i + chars] for i in range(0, len(content), chars)]
    units: list[object] = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and part.get("type") == "text":
            units += _content_units(str(part.get("text", "")), chars)
        else:
            part_key = digest_seed(part)
            units += [(part_key, i) for i in range(TOKENS_PER_NON_TEXT_PART)]
    return units


def _opening(role: str) -> list[object]:
    """A message's opening marker: the role's header (the generation prompt's, for the
    assistant)."""
    return [("open", role, i) for i in range(GENERATION_PROMPT_TOKENS)]


def _closing() -> list[object]:
    return [("close", i) for i in range(TOKENS_PER_MESSAGE - GENERATION_PROMPT_TOKENS)]


def chat_token_units(messages: list[dict[str, Any]], chars: int = CHARS_PER_TOKEN) -> list[object]:
    """One stand-in per prompt token of a chat, as many as count_chat_tokens counts.

    Equal leading messages give equal leading units, so a conversation that grows by
    appending messages shares its earlier blocks, as real token ids do; and a prompt's
    stand-ins followed by its answer's (answer_token_units) are those of the next turn's
    prompt that carries that answer as an assistant message.
    """
    units: list[object] = []
    for message in messages:
        units += _opening(str(message.get("role")))
        units += _content_units(message.get("content"), chars)
        units += _closing()
    return [*units, *_opening("assistant")]


def answer_token_units(text: str, chars: int = CHARS_PER_TOKEN) -> list[object]:
    """The stand-ins of a generated answer as a following prompt re-reads them: its text,
    sliced as prompt content is (the closing marker is never computed by the engine)."""
    return _content_units(text, chars)


def prompt_token_units(prompt: Any, chars: int = CHARS_PER_TOKEN) -> list[object]:
    """One stand-in per prompt token of a /v1/completions prompt."""
    if isinstance(prompt, str):
        return list(_content_units(prompt, chars))
    if isinstance(prompt, list) and all(isinstance(item, int) for item in prompt):
        return list(prompt)
    if isinstance(prompt, list):
        return [unit for item in prompt for unit in prompt_token_units(item, chars)]
    return []
