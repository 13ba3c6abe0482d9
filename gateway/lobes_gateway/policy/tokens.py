"""A role's characters per prompt token, learned online from the usage its answers report.

Placement prices a prompt in tokens before sending it, from its text: four characters a token
until told otherwise. Tokenizers differ (code and non-English text run finer, some vocabularies
coarser), and a wrong grain misprices every prefill and the window check. Every non-streamed
answer, and a stream with stream_options.include_usage, reports usage.prompt_tokens; the
relay already finds that usage by pattern (app/meter.py, no JSON parsing, nothing per chunk),
so the grain is learned from it: the prompt's text characters over its reported tokens less
those that do not scale with text (the chat template's markers, token ids).
"""

from __future__ import annotations

import re

from .estimate import Estimate
from .prefix import CHARS_PER_TOKEN

# A sample from a prompt this short is mostly template and rounding: it teaches nothing.
MIN_SAMPLE_CHARS = 256
# Bounds of a believable grain: a byte-level tokenizer at worst, a very coarse one at best.
MIN_CHARS_PER_TOKEN = 1.0
MAX_CHARS_PER_TOKEN = 16.0
# In JSON text a key's closing quote is never escaped: only real "prompt_tokens" keys match.
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


def reported_prompt_tokens(usage: bytes | None) -> int | None:
    """usage.prompt_tokens in an answer's bytes (its last such key), None when absent."""
    if not usage:
        return None
    found = _PROMPT_TOKENS.findall(usage)
    return int(found[-1]) if found else None


class CharsPerToken:
    """An average (Estimate) of the characters per prompt token a role's backends count."""

    def __init__(self, smoothing: float, prior: float = CHARS_PER_TOKEN) -> None:
        self._grain = Estimate(prior, smoothing)

    @property
    def value(self) -> float:
        """Characters per token, as learned so far (the prior until the first sample)."""
        grain = self._grain.value
        assert grain is not None  # seeded with a prior, never unset
        return grain

    @property
    def samples(self) -> int:
        return self._grain.samples

    def observe(self, text_chars: int, fixed_tokens: int, prompt_tokens: int) -> None:
        """A backend counted `prompt_tokens` for a prompt of `text_chars` plain text
        characters and `fixed_tokens` that do not scale with text (RequestShape's)."""
        text_tokens = prompt_tokens - fixed_tokens
        if text_chars < MIN_SAMPLE_CHARS or text_tokens <= 0:
            return
        sample = min(MAX_CHARS_PER_TOKEN, max(MIN_CHARS_PER_TOKEN, text_chars / text_tokens))
        self._grain.observe(sample)

    def tokens(self, chars: int) -> float:
        """Tokens of `chars` characters of prompt text."""
        return chars / self.value
