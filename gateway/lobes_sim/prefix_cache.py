"""vLLM's automatic prefix caching, per simulated replica: full blocks, chained, LRU.

vLLM hashes a sequence in blocks of its block size (16 tokens on GPU builds, 128 on the CPU
build; the profile's `block_size`), each hash chained to its parent's, so
a block matches only when everything before it matches too. A new request reuses the longest
run of leading blocks the cache still holds and prefills only the rest; at least its last
token is always computed (the engine needs its logits), and a hit is counted in whole blocks.
The full blocks of the output are hashed on the same chain, so the next turn of a
conversation, whose prompt carries the answer, finds those too. Freed blocks stay cached
until the KV capacity is needed again, least recently used first (a sequence's tail before
its head).

Simplifications, stated: output blocks enter the cache when the sequence ends (vLLM hashes
each as it fills: the same for a next turn, which comes after the answer), and the capacity
is the profile's whole KV cache, not what the running sequences leave free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_SIZE = 16  # vLLM's default --block-size on a GPU
CPU_BLOCK_SIZE = 128  # the CPU build's default (vllm:cache_config_info{block_size="128"})


def block_hashes(units: Sequence[object], parent: int = 0,
                 block_size: int = BLOCK_SIZE) -> tuple[int, ...]:
    """The chained hashes of the full blocks of token stand-ins (after the block `parent`)."""
    hashes: list[int] = []
    for start in range(0, len(units) - block_size + 1, block_size):
        parent = hash((parent, tuple(units[start:start + block_size])))
        hashes.append(parent)
    return tuple(hashes)


class PrefixCache:
    """Cached blocks of one replica, and vLLM's query and hit counters (in tokens)."""

    def __init__(self, capacity_blocks: int, block_size: int = BLOCK_SIZE) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
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
        # The last prompt token is always computed: a prompt of whole blocks reads one fewer.
        cached = min(hit_blocks, max(0, prompt_tokens - 1) // self.block_size) * self.block_size
        self.queries_total += prompt_tokens
        self.hits_total += cached
        self._remember(hashes)
        return cached

    def keep(self, hashes: Sequence[int]) -> None:
        """A sequence ended: its full blocks, prompt and output, stay cached (and recent)."""
        self._remember(hashes)

    def _remember(self, hashes: Sequence[int]) -> None:
        """Every block becomes recently used, the head most: vLLM frees a request's blocks
        tail first, so a shared head outlives the tails behind it."""
        for block in reversed(hashes):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)


@dataclass(frozen=True)
class PromptBlocks:
    """A prompt's token stand-ins and the chained hashes of their full blocks."""

    units: tuple[object, ...] = ()
    hashes: tuple[int, ...] = ()
    block_size: int = BLOCK_SIZE

    @classmethod
    def of(cls, units: Sequence[object], block_size: int = BLOCK_SIZE) -> PromptBlocks:
        return cls(tuple(units), block_hashes(units, 0, block_size), block_size)

    def with_output(self, output_units: Sequence[object]) -> tuple[int, ...]:
        """The hashes of the whole sequence's full blocks: the prompt's, then those its
        output completes, on the same chain."""
        parent = self.hashes[-1] if self.hashes else 0
        rest = [*self.units[len(self.hashes) * self.block_size:], *output_units]
        return self.hashes + block_hashes(rest, parent, self.block_size)


NO_PROMPT = PromptBlocks()
