"""What a policy sees of a replica when it places a request, and what the request is
expected to take there: its wait for a slot, its prefill and its decode."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .answer_size import DEFAULT_EXPECTED_TOKENS
from .prefix import RequestShape

# Until a replica's prefill rate is learned, prefill is priced this many times faster than
# one stream decodes: a GB10 prefills a 27B NVFP4 at ~2,575 tok/s and decodes it at 48.9
# (docs/simulator.md). Boxes differ (compute-bound prefill against bandwidth-bound decode),
# so each replica's own ratio is then learned from its answers (Placer.learn).
PREFILL_SPEEDUP = 50.0


@dataclass(frozen=True)
class ReplicaView:
    """What a policy sees of one candidate at the instant of placement."""

    origin: str
    order: int
    slots: int
    in_flight: int  # this box's dispatches plus other boxes' probed work
    rate: float
    # Seconds of work left of each request in flight there, in dispatch order (other
    # boxes' first, priced at the pool's typical request), and of that its prefill left.
    work_s: tuple[float, ...] = ()
    prefill_left_s: tuple[float, ...] = ()
    cached_tokens: int = 0  # of this request's prompt, likely held there
    prefill_rate: float = 0.0  # prompt tok/s; 0 while unknown: PREFILL_SPEEDUP x rate
    # Seconds the request's session, bound here, is expected to add to the round of the
    # sessions bound here (policy/sessions.py); 0 for a request that is no session's turn.
    balance_s: float = 0.0

    def expected_completion_s(self, expected_tokens: int) -> float:
        """Seconds until a request placed now would finish on this replica (waves)."""
        waves = self.in_flight // self.slots + 1
        return waves * expected_tokens / self.rate

    def slot_wait_s(self, choices: int = 1) -> float:
        """Seconds until a request placed now starts its prefill: the work in flight run
        through the slots in order, each taking the first slot to free, and the engine done
        with the prefills ahead of it. A request of several choices waits for as many slots
        (at most all of them: the rest run after its own).

        Prefill is compute-bound and holds up the whole engine: a step prefills what it
        admitted before the running sequences get their next token (vLLM, chunked or not,
        spends the step's time on both), and a newcomer's prefill waits for those ahead.
        So a queued request's prefill delays every slot busy when it starts (without that, a
        queue of long prompts looked ~40% shorter than it is: 16 agent sessions over a 6k-token
        prompt on the acceptance run's Spark and Thor pair), and a replica still prefilling is
        not free with a slot open (priced free, one busy with a session's 4k-token first prompt
        took the next two sessions too, each waiting unforecast, and learned from that a decode
        rate 20-30% below its identical twin's: 4 agent sessions on the homogeneous pair, split
        12/20 with 4-5% less throughput than `rate`)."""
        stalls = self.prefill_left_s or (0.0,) * len(self.work_s)
        running = min(self.slots, len(self.work_s))
        # The prefills under way: until they are done nothing decodes and nothing starts.
        engine = sum(stalls[:running])
        free_at = [engine + work - stall
                   for work, stall in zip(self.work_s[:running], stalls[:running], strict=True)]
        # Free slots past the waiting work and the request's own choices are never reached:
        # the cost follows the work in flight, not the slots a replica advertises.
        free_at += [0.0] * (min(self.slots, len(self.work_s) + choices) - running)
        heapq.heapify(free_at)
        for work, stall in zip(self.work_s[running:], stalls[running:], strict=True):
            start = max(heapq.heappop(free_at), engine)
            if stall:
                free_at = [at + stall if at > start else at for at in free_at]
                heapq.heapify(free_at)
                engine = start + stall
            heapq.heappush(free_at, start + work)
        return max(heapq.nsmallest(min(choices, self.slots), free_at)[-1], engine)

    @property
    def prompt_rate(self) -> float:
        """Prompt tok/s of its prefill: learned, else guessed from its decode rate."""
        return self.prefill_rate or self.rate * PREFILL_SPEEDUP

    def prefill_s(self, prompt_tokens: int) -> float:
        """Seconds of prefill for the part of the prompt the replica likely lacks."""
        return max(0, prompt_tokens - self.cached_tokens) / self.prompt_rate


@dataclass(frozen=True)
class Forecast:
    """What the prefix policy expects of a request on one replica, in seconds, and the
    replica's rates it was priced at."""

    wait_s: float
    prefill_s: float
    decode_s: float
    rate: float
    prefill_rate: float

    @property
    def completion_s(self) -> float:
        return self.wait_s + self.prefill_s + self.decode_s


def answer_tokens(request: RequestShape) -> int:
    """The answer a request is priced at: as Placer.priced expects it, else its max_tokens,
    else DEFAULT_EXPECTED_TOKENS."""
    return request.answer_tokens or request.max_tokens or DEFAULT_EXPECTED_TOKENS


def forecast(view: ReplicaView, request: RequestShape) -> Forecast:
    """The request's wait, prefill and decode on the replica (its answer already priced:
    Placer.priced); choices beyond the replica's slots decode in waves after the first."""
    tokens = answer_tokens(request)
    waves = -(-request.choices // view.slots)
    return Forecast(view.slot_wait_s(request.choices), view.prefill_s(request.prompt_tokens),
                    waves * tokens / view.rate, view.rate, view.prompt_rate)
