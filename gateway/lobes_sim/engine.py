"""The continuous-batching engine: one scheduler loop of steps, like vLLM's engine core.

Each step admits waiting sequences into free slots (up to ``max_num_seqs``), then advances every
running sequence by one token. A step lasts the profile's decode time for the batch size, plus
the prefill time of the sequences it admitted, stretched by the slow fault and shrunk by the
time scale. Sequences never sleep on their own: only the loop keeps time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Callable
from collections.abc import Sequence as Units

from .prefix_cache import NO_PROMPT, PrefixCache, PromptBlocks
from .profiles import Profile

# If the loop falls behind its schedule (CPU saturated), it catches up at most this much, so a
# stall does not turn into a burst of zero-length steps.
MAX_CATCH_UP_S = 0.25

PRIORITY = "priority"  # the scheduling policy that orders the waiting queue
STOP = "stop"
LENGTH = "length"
ABORT = "abort"
# The engine died under the sequence (its core killed, the server stopped): not counted.
DEAD = "dead"
# vLLM's request_success_total series, each exported from the start.
FINISH_REASONS = (STOP, LENGTH, ABORT, "error", "repetition")


class Sequence:
    """One request inside the engine: its prompt, its output budget, and how far it got."""

    __slots__ = (
        "_waiter",
        "answer_units",
        "cached_tokens",
        "finish_reason",
        "generated",
        "max_tokens",
        "priority",
        "prompt",
        "prompt_tokens",
        "stop_at",
        "stops_naturally",
    )

    def __init__(self, prompt_tokens: int, max_tokens: int, natural: int | None,
                 priority: int = 0, prompt: PromptBlocks = NO_PROMPT,
                 answer_units: Callable[[int], Units[object]] | None = None) -> None:
        self.priority = priority
        self.prompt_tokens = prompt_tokens
        self.prompt = prompt
        # The stand-ins of the first n output tokens, as a next turn's prompt re-reads them.
        self.answer_units = answer_units
        self.cached_tokens = 0  # of the prompt, found in the prefix cache at admission
        self.max_tokens = max_tokens
        # natural=None: generate until max_tokens (ignore_eos, or a pooling request with 0).
        self.stops_naturally = natural is not None and natural <= max_tokens
        self.stop_at = natural if natural is not None and self.stops_naturally else max_tokens
        self.generated = 0
        self.finish_reason: str | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    async def progress(self) -> None:
        """Wait until the sequence gains a token or finishes (returns at once if finished)."""
        if self.finished:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _notify(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Engine:
    """The scheduler: a waiting queue, ``max_num_seqs`` running slots, and one stepping loop."""

    def __init__(
        self, profile: Profile, time_scale: float, slowdown: Callable[[], float]
    ) -> None:
        self.profile = profile
        self.time_scale = time_scale
        self._slowdown = slowdown
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._wake = asyncio.Event()
        self.dead = False
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished_total: Counter[str] = Counter()
        self.prefix_cache = PrefixCache(profile.kv_cache_tokens // profile.block_size,
                                        profile.block_size)

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence; the loop admits it when a slot is free. Under the priority
        policy it goes after every waiting sequence of a lower or equal priority value."""
        if self.dead:
            sequence.finish_reason = DEAD
            return
        if self.profile.scheduling_policy == PRIORITY:
            after = sum(1 for waiting in self.waiting if waiting.priority <= sequence.priority)
            self.waiting.insert(after, sequence)
        else:
            self.waiting.append(sequence)
        self._wake.set()

    def submit_all(self, sequences: list[Sequence]) -> Callable[[], None]:
        """Queue each of one request's sequences; the function that aborts them all (for
        when its client goes away)."""
        for sequence in sequences:
            self.submit(sequence)

        def abort_all() -> None:
            for sequence in sequences:
                self.abort(sequence)

        return abort_all

    def abort(self, sequence: Sequence) -> None:
        """Drop a sequence whose client went away, freeing its slot (vLLM aborts on disconnect)."""
        if sequence.finished:
            return
        if sequence in self.running:
            self.running.remove(sequence)
            self._cache_blocks(sequence)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(sequence)
        self._finish(sequence, ABORT)

    def die(self) -> None:
        """The engine core is gone (killed, or the server stops): every sequence, running or
        waiting, ends at once and is counted nowhere, as the process is about to exit."""
        self.dead = True
        ended = [*self.running, *self.waiting]
        self.running.clear()
        self.waiting.clear()
        for sequence in ended:
            sequence.finish_reason = DEAD
            sequence._notify()

    def kv_cache_usage(self) -> float:
        """Fraction of the KV cache the running sequences hold (vllm:kv_cache_usage_perc)."""
        capacity = self.profile.kv_cache_tokens
        if capacity <= 0:
            return 0.0
        held = sum(seq.prompt_tokens + seq.generated for seq in self.running)
        return min(1.0, held / capacity)

    async def run(self) -> None:
        """The engine loop; runs until cancelled."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                deadline = None
            admitted_tokens = self._admit()
            now = loop.time()
            if deadline is None or deadline < now - MAX_CATCH_UP_S:
                deadline = now
            deadline += self._step_seconds(admitted_tokens)
            # sleep(0) still yields, so clients can read between zero-length steps.
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            self._advance()

    def _admit(self) -> int | None:
        """Move waiting sequences into free slots; the prompt tokens they must prefill (their
        cached prefix is skipped), None if none was admitted."""
        admitted: int | None = None
        while self.waiting and len(self.running) < self.profile.max_num_seqs:
            sequence = self.waiting.popleft()
            self.running.append(sequence)
            self.prompt_tokens_total += sequence.prompt_tokens
            sequence.cached_tokens = self.prefix_cache.admit(sequence.prompt.hashes,
                                                             sequence.prompt_tokens)
            admitted = (admitted or 0) + sequence.prompt_tokens - sequence.cached_tokens
        return admitted

    def _step_seconds(self, admitted_tokens: int | None) -> float:
        seconds = self.profile.step_seconds(len(self.running))
        if admitted_tokens is not None:
            seconds += self.profile.prefill_seconds(admitted_tokens)
        return seconds * self._slowdown() / self.time_scale

    def _advance(self) -> None:
        """One token for every running sequence; finished ones leave their slot."""
        still_running: list[Sequence] = []
        for sequence in self.running:
            if sequence.generated < sequence.stop_at:
                sequence.generated += 1
                self.generation_tokens_total += 1
            if sequence.generated >= sequence.stop_at:
                self._cache_blocks(sequence)
                self._finish(sequence, STOP if sequence.stops_naturally else LENGTH)
            else:
                still_running.append(sequence)
                sequence._notify()
        self.running = still_running

    def _cache_blocks(self, sequence: Sequence) -> None:
        """A running sequence leaves: the full blocks of its prompt and output stay cached."""
        if sequence.answer_units is None:
            return
        output = sequence.answer_units(sequence.generated)
        self.prefix_cache.keep(sequence.prompt.with_output(output))

    def _finish(self, sequence: Sequence, reason: str) -> None:
        sequence.finish_reason = reason
        # vLLM counts a request its client abandoned in no request_success series (its
        # finished_reason="abort" one included); its tokens count as generated all the same.
        if reason != ABORT:
            self.finished_total[reason] += 1
        sequence._notify()
