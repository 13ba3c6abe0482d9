"""vLLM's automatic prefix caching, per simulated replica: full prompt blocks, chained, LRU.

vLLM hashes a prompt in blocks of BLOCK_SIZE tokens, each hash chained to its parent's, so a
block matches only when everything before it matches too. A new request reuses the longest
run of leading blocks the cache still holds and prefills only the rest; at least its last
token is always computed (the engine needs its logits). Freed blocks stay cached until the
KV capacity is needed again, least recently used first (a prompt's tail before its head).

Simplifications, stated: only prompt blocks are cached (vLLM also caches the full blocks of
the output, so a following turn re-reads a reply's blocks here at full price), and the
capacity is the profile's whole KV cache, not what the running sequences leave free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_SIZE = 16  # vLLM's default --block-size


def block_hashes(units: Sequence[object]) -> tuple[int, ...]:
    """The chained hashes of the full blocks of a prompt's token stand-ins."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(units) - BLOCK_SIZE + 1, BLOCK_SIZE):
        parent = hash((parent, tuple(units[start:start + BLOCK_SIZE])))
        hashes.append(parent)
    return tuple(hashes)


class PrefixCache:
    """Cached blocks of one replica, and vLLM's query and hit counters (in tokens)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries_total = 0
        self.hits_total = 0

    def admit(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Look a prompt up and cache its blocks; the prompt tokens it need not prefill."""
        hit_blocks = 0
        for block in hashes:
            if block not in self._blocks:
                break
            hit_blocks += 1
        cached = min(hit_blocks * BLOCK_SIZE, max(0, prompt_tokens - 1))
        self.queries_total += prompt_tokens
        self.hits_total += cached
        self._remember(hashes)
        return cached

    def _remember(self, hashes: Sequence[int]) -> None:
        """Every block of the prompt becomes recently used, its head most: vLLM frees a
        request's blocks tail first, so a shared head outlives the tails behind it."""
        for block in reversed(hashes):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
