"""How long a pool's answers are: the share of a named max_tokens they take, and the
max_tokens a request names."""

from __future__ import annotations

import math

from .estimate import Estimate

DEFAULT_EXPECTED_TOKENS = 256
# A max_tokens of 2**k - 2**(k+1) - 1 is one bucket: clients ask a few fixed budgets (4,096 for
# any reply, 32 for a label), each answered at its own fill. Beyond 2**40 it is one bucket.
MAX_FILL_BUCKET = 40


class AnswerFill:
    """The share of a named max_tokens a role's answers take, learned per bucket of max_tokens.

    Clients often ask far more than they get (max_tokens 4,096 for a ~155-token reply): priced
    at its max_tokens, such a request looked 26x its length, and work in flight on a fast
    replica looked so long that the default policy left a slow one idle and ran 1.35x slower
    than `rate` (docs/benchmarks.md, loose max_tokens). A bucket with no answer yet is priced at
    its max_tokens (a fill of 1); its first answer replaces that guess.
    """

    def __init__(self, smoothing: float) -> None:
        self._smoothing = smoothing
        self._fill: dict[int, Estimate] = {}

    @staticmethod
    def _bucket(max_tokens: int) -> int:
        return min(max_tokens.bit_length(), MAX_FILL_BUCKET)

    def expected(self, max_tokens: int) -> int:
        """The answer tokens a request naming `max_tokens` is expected to take."""
        estimate = self._fill.get(self._bucket(max_tokens))
        fill = 1.0 if estimate is None or estimate.value is None else estimate.value
        return max(1, min(max_tokens, math.ceil(max_tokens * fill)))

    def observe(self, max_tokens: int, answer_tokens: int) -> None:
        """A request that named `max_tokens` was answered with `answer_tokens`."""
        bucket = self._bucket(max_tokens)
        if bucket not in self._fill:
            self._fill[bucket] = Estimate(1.0, self._smoothing, measured_replaces_prior=True)
        self._fill[bucket].observe(min(1.0, answer_tokens / max_tokens))


def expected_tokens(payload: dict | None) -> int:
    """The tokens a request asks for (max_tokens), the unit of expected completion time."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key) if payload else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_EXPECTED_TOKENS
