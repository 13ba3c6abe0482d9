"""Placing a request on one replica of a pool: in-flight accounting, rates and policies.

Every dispatch is counted in flight before the gateway dials and released after the answer
ends, so concurrent arrivals see each other and spread instead of stampeding one replica
(seed 000, defect 1). Choosing and counting happen in one synchronous step: on the event
loop nothing can interleave between them.

Policies (GATEWAY_POOL_POLICY):
  prefix  (default) earliest expected completion of this request, priced by its own shape:
          the wait for a slot (the remaining work of what is in flight there, in seconds),
          its prefill (its prompt less the prefix the replica likely holds, learned from
          what this gateway sent where: policy/prefix.py) and its decode (its max_tokens at
          the share of it the pool's answers take, AnswerFill, or the pool's learned
          answer length when it names none). Each replica's decode and prefill rates are
          learned apart from its answers (Placer.learn); a replica's first answer replaces
          its prior (P_PEER_RATES), so a prior that was optimistic prices it once. A queued
          request's prefill holds up every busy slot of its replica in the wait, and a
          prefill under way holds up a request placed there even with a slot free. A turn
          of a session (a prompt that continues one this pool answered) also pays the wait
          its session adds to the sessions bound to a replica (policy/sessions.py).
  rate    earliest expected completion: the waves of work queued ahead of the
          request on a replica's slots, plus its own, each taking expected tokens / rate.
          prefix and rate: never slower than the best replica. A slower replica is priced
          pessimistically (its forecast over 1 - SLOWER_REPLICA_MARGIN) and takes a request
          only when it finishes it, so priced, no later than the fastest replica would,
          wait for a slot there included.
          Rates are learned online (EWMA of completed responses) from declared priors.
  queue   seed 000's baseline: least in flight relative to slots, a full replica is not
          selectable, ties by origin. Kept to measure against.
  pinned  the first selectable replica in declaration order, always.

X-Lobes-Route-Reason vocabulary (closed; RouteReason):
  sole-ready          exactly one replica was selectable when the request was placed
  peer-less-loaded    queue: the selectable replica with the least in flight per slot
  earliest-completion prefix, rate: the replica with the earliest expected completion
  pinned              pinned: the first selectable replica in declaration order
  none                the policy placed nothing: every replica full (queue), taken by the
                      pool's fall-through replica or the first selectable one (PooledRole.
                      overflow); or nothing selectable, fell through to the singular forward
                      or the local path; or every replica tried failed
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from lobes_contract import POOL_POLICIES

from .estimate import Estimate
from .prefix import PrefixAffinity, RequestShape, request_shape
from .sessions import Conversations, TurnCost, is_chat_turn, join_cost_s
from .tokens import CharsPerToken

DEFAULT_EXPECTED_TOKENS = 256
DEFAULT_SMOOTHING = 0.3
# A slower replica's forecast is taken as this share too short (its forecast over 1 - the
# margin) against the fastest replica's: a request goes there only when, so priced, it finishes
# no later than on the fastest replica, its wait for a slot included. So a slower replica is
# never given a request it would finish later than the best replica, as long as its forecast
# errs by less than the margin; and an estimate off by more (a prior that was optimistic) is
# corrected by its first answer (Estimate.measured_replaces_prior).
# Why a margin and not a sharper formula: the wave model prices every stream at one rate per
# replica, but a replica's per-stream rate depends on its batch (Spark 48.9 tok/s alone, 44.05
# with 2 running: 11%), so the learned EWMA is a blend of solo and batched samples that moves
# by that much. Seed 000's burst 8 is the near-tie: Spark's 4th wave 4 x 155/44.05 = 14.07 s
# against Thor alone 155/11.0 = 14.09 s. Even a batch-aware estimate decides it on 0.1%, far
# inside the estimate's own error, while a request wrongly sent to the slow replica sets the
# burst's makespan. The margin is that error bound: a slower replica must win by more than the
# spread between its rivals' solo and batched rates. Measured: docs/benchmarks.md.
SLOWER_REPLICA_MARGIN = 0.1
# Until a replica's prefill rate is learned, prefill is priced this many times faster than
# one stream decodes: a GB10 prefills a 27B NVFP4 at ~2,575 tok/s and decodes it at 48.9
# (docs/simulator.md). Boxes differ (compute-bound prefill against bandwidth-bound decode),
# so each replica's own ratio is then learned from its answers (Placer.learn).
PREFILL_SPEEDUP = 50.0
# An in-flight request past its expected end still holds its slot: at least this share of
# its expected work is taken as left.
MIN_REMAINING_SHARE = 0.05
# A rate sample's decode time is at least this share of the elapsed time, so an overrated
# wait or prefill never turns into an absurd rate.
MIN_DECODE_SHARE = 0.25
# A stream forecast to start within this share of its first token's time started about at
# once: its first token timed its prefill, which teaches the prefill rate. One forecast to
# wait teaches nothing of it: its wait is a forecast, and an overrated one (the work ahead
# ended sooner) left a prefill too short to be true, which taught seed 000's Spark 2.5x its
# real prefill rate (issue 13, agent sessions with tool outputs) and priced its queue short.
# An answer that is not a stream, forecast to wait, teaches no rate at all, for that reason.
STARTED_AT_ONCE_SHARE = 0.1
# Ends of this box's requests remembered per replica, to tell them from other boxes' work in
# a probe's load: more than end on one replica during one probe pass.
RELEASES_KEPT = 256
# Other boxes' running requests a probe saw are at an unknown point of their answers: this
# share of a typical answer is taken as done (the mean of a point seen at random).
EXTERNAL_DONE_WHEN_SEEN = 0.5


class RouteReason(str, Enum):
    """Why a pooled request went where it went (the X-Lobes-Route-Reason header value)."""

    SOLE_READY = "sole-ready"
    PEER_LESS_LOADED = "peer-less-loaded"
    EARLIEST_COMPLETION = "earliest-completion"
    PINNED = "pinned"
    # An earlier replica failed; the next one takes the request even where the policy would
    # have found it full: the request is already admitted, never sent back to wait.
    FAILOVER = "failover"
    NONE = "none"


@dataclass(frozen=True)
class Candidate:
    """A selectable replica offered to a policy: its origin, how many requests it runs, and
    its served window (None when it publishes none)."""

    origin: str
    slots: int
    window: int | None = None


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
        queue of long prompts looked ~40% shorter than it is: issue 13, 16 agent sessions
        over a 6k-token prompt on seed 000's pair), and a replica still prefilling is not
        free with a slot open (priced free, one busy with a session's 4k-token first prompt
        took the next two sessions too, each waiting unforecast, and learned from that a
        decode rate 20-30% below its identical twin's: issue 13's 4 sessions on the
        homogeneous pair, split 12/20 with 4-5% less throughput than `rate`)."""
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


class Policy(Protocol):
    name: str
    # A forecasting policy prices each request by its Forecast (slot wait, uncached prefill,
    # decode): the placer then hashes prompts for it and learns rates net of the forecast
    # wait and prefill.
    forecasts: bool

    def choose(
        self, views: Sequence[ReplicaView], request: RequestShape
    ) -> tuple[ReplicaView, RouteReason] | None: ...


def _reason(selectable: Sequence[ReplicaView], reason: RouteReason) -> RouteReason:
    return RouteReason.SOLE_READY if len(selectable) == 1 else reason


class PinnedPolicy:
    """Always the first selectable replica in declaration order."""

    name = "pinned"
    forecasts = False

    def choose(
        self, views: Sequence[ReplicaView], request: RequestShape
    ) -> tuple[ReplicaView, RouteReason] | None:
        if not views:
            return None
        return min(views, key=lambda v: v.order), _reason(views, RouteReason.PINNED)


class QueuePolicy:
    """Least in flight relative to slots; a full replica is not selectable."""

    name = "queue"
    forecasts = False

    def choose(
        self, views: Sequence[ReplicaView], request: RequestShape
    ) -> tuple[ReplicaView, RouteReason] | None:
        open_views = [v for v in views if v.in_flight < v.slots]
        if not open_views:
            return None
        best = min(open_views, key=lambda v: (v.in_flight / v.slots, v.origin))
        return best, _reason(open_views, RouteReason.PEER_LESS_LOADED)


class RatePolicy:
    """Earliest expected completion, a slower replica priced pessimistically (_earliest).

    The wave model ignores the slowdown a new stream causes on a batch already running, and a
    request on a slow replica sets the burst's makespan: a slower replica gets the request
    only when it finishes it no later than the fastest even so priced, never within
    estimation noise.
    """

    name = "rate"
    forecasts = False

    def choose(
        self, views: Sequence[ReplicaView], request: RequestShape
    ) -> tuple[ReplicaView, RouteReason] | None:
        tokens = request.max_tokens or DEFAULT_EXPECTED_TOKENS
        return _earliest(views, lambda view: view.expected_completion_s(tokens))


class PrefixPolicy:
    """Earliest expected completion of this request: slot wait, uncached prefill, decode;
    a session's turn also pays what its session adds to the others bound where it goes.

    Affinity only lowers the prefill term; the wait term grows with the work in flight, so
    a saturated replica that holds the prefix loses to one that finishes the request sooner.
    """

    name = "prefix"
    forecasts = True

    def choose(
        self, views: Sequence[ReplicaView], request: RequestShape
    ) -> tuple[ReplicaView, RouteReason] | None:
        # Its rates are learned per replica from each answer, so identical replicas differ
        # by noise (0.1-4% in issue 13's 4 sessions on the homogeneous pair): one is slower
        # only by more than the margin, else a hair's rate took a conversation off the
        # replica holding its prefix, 1-9% sooner there, and stacked sessions on the other.
        return _earliest(
            views, lambda view: forecast(view, request).completion_s + view.balance_s,
            slower_by=SLOWER_REPLICA_MARGIN)


def _earliest(
    views: Sequence[ReplicaView], completion: Callable[[ReplicaView], float],
    slower_by: float = 0.0,
) -> tuple[ReplicaView, RouteReason] | None:
    """The earliest completion, a slower replica (a rate below the fastest's by more than
    `slower_by`) priced pessimistically: its completion over 1 - SLOWER_REPLICA_MARGIN. So
    it wins only when it finishes no later than the fastest replica, even were it slower
    than its estimate by the margin; a tie goes to the faster replica."""
    if not views:
        return None
    fastest = min(views, key=lambda v: (-v.rate, completion(v), v.order))

    def pessimistic(view: ReplicaView) -> float:
        if view.rate < fastest.rate * (1 - slower_by):
            return completion(view) / (1 - SLOWER_REPLICA_MARGIN)
        return completion(view)

    best = min(views, key=lambda v: (pessimistic(v), -v.rate, v.order))
    return best, _reason(views, RouteReason.EARLIEST_COMPLETION)


# Each policy the contract names (POOL_POLICIES, the first the default), by its name.
POLICIES: dict[str, type[Policy]] = {
    "prefix": PrefixPolicy,
    "rate": RatePolicy,
    "queue": QueuePolicy,
    "pinned": PinnedPolicy,
}


def policy_named(name: str | None) -> Policy:
    """GATEWAY_POOL_POLICY -> a policy; unset means the contract's default (prefix)."""
    key = (name or POOL_POLICIES[0]).strip().lower()
    if key not in POLICIES:
        raise ValueError(
            f"GATEWAY_POOL_POLICY={name!r} is not a pool policy; use one of "
            f"{', '.join(POOL_POLICIES)} ({POOL_POLICIES[0]} is the default)"
        )
    return POLICIES[key]()


# A max_tokens of 2**k - 2**(k+1) - 1 is one bucket: clients ask a few fixed budgets (4,096 for
# any reply, 32 for a label), each answered at its own fill. Beyond 2**40 it is one bucket.
MAX_FILL_BUCKET = 40


class AnswerFill:
    """The share of a named max_tokens a role's answers take, learned per bucket of max_tokens.

    Clients often ask far more than they get (max_tokens 4,096 for a ~155-token reply): priced
    at its max_tokens, such a request looked 26x its length, and work in flight on a fast
    replica looked so long that the default policy left a slow one idle and ran 1.35x slower
    than `rate` (issue 13, docs/benchmarks.md, loose max_tokens). A bucket with no answer yet
    is priced at its max_tokens (a fill of 1); its first answer replaces that guess.
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


class Placement:
    """One request counted in flight on one replica until released (a context manager).

    It carries what was expected of it at dispatch (the waves ahead, the forecast), so its
    completion can teach the replica's rate and its remaining work can price later requests.
    """

    def __init__(self, placer: Placer, origin: str, reason: RouteReason,
                 waves_at_dispatch: int, forecast: Forecast, placed_at: float,
                 shape: RequestShape) -> None:
        self.placer = placer
        self.origin = origin
        self.reason = reason
        self.waves_at_dispatch = waves_at_dispatch
        self.forecast = forecast
        # What its reported prompt tokens teach of the grain (not the prompt: it may be long).
        self.text_chars, self.fixed_tokens = shape.text_chars, shape.fixed_tokens
        # The max_tokens it named, whose share its answer takes teaches the pool's fill.
        self.named_max_tokens = shape.max_tokens if shape.answer_tokens is not None else None
        self.choices = shape.choices  # sequences it runs there side by side (n)
        self.starts_at = placed_at + forecast.wait_s
        self.released = False
        # Its session's key in the pool's conversations (None: no session's turn).
        self.conversation: int | None = None

    def remaining_s(self, now: float) -> float:
        """Expected seconds of work left: its prefill and decode less the time it has run."""
        work = self.forecast.prefill_s + self.forecast.decode_s
        return max(work * MIN_REMAINING_SHARE, work - max(0.0, now - self.starts_at))

    def prefill_left_s(self, now: float) -> float:
        """Expected seconds of its prefill not yet done (all of it while it waits)."""
        return max(0.0, self.forecast.prefill_s - max(0.0, now - self.starts_at))

    def record_completion(self, tokens: int, elapsed_s: float,
                          answer_tokens: int | None = None,
                          prompt_tokens: int | None = None,
                          first_token_s: float | None = None) -> None:
        """Teach the replica's rate from a completed response of `tokens` in `elapsed_s` (a
        stream's first event `first_token_s` in), and the pool's answer length from it, or
        from `answer_tokens` when the response was the last part of a longer answer (a
        resumed stream's continuation); and the role's characters per token from the
        `prompt_tokens` the response reported."""
        if prompt_tokens is not None:
            self.placer.chars_per_token.observe(self.text_chars, self.fixed_tokens,
                                                prompt_tokens)
        if tokens <= 0 or elapsed_s <= 0:
            return
        self.placer.learn(self, tokens, elapsed_s, answer_tokens, first_token_s)

    def release(self) -> None:
        """Stop counting this request; safe to call more than once."""
        if not self.released:
            self.released = True
            self.placer.release(self)

    def __enter__(self) -> Placement:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class Placer:
    """The in-flight requests, learned rates and prefix affinity of one pool, and its policy."""

    def __init__(
        self,
        policy: Policy,
        priors: dict[str, float | None],
        *,
        smoothing: float = DEFAULT_SMOOTHING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._active: dict[str, list[Placement]] = {origin: [] for origin in priors}
        # Work other boxes have on a replica, from its probed running + waiting, and when
        # the probe that saw it started (the work is aged from then: _external_left_s).
        self._external: dict[str, int] = {origin: 0 for origin in priors}
        self._external_seen_at: dict[str, float] = {origin: 0.0 for origin in priors}
        # When this box's latest requests on each replica ended (a probe may have seen them).
        self._released_at: dict[str, deque[float]] = {
            origin: deque(maxlen=RELEASES_KEPT) for origin in priors}
        self._rates = {o: Estimate(prior, smoothing, policy.forecasts)
                       for o, prior in priors.items()}
        # Prompt tok/s of each replica's prefill, learned apart from its decode (forecasting
        # policies only); None until its first answer with a prefill to learn from.
        self._prefill = {o: Estimate(None, smoothing) for o in priors}
        self._affinity = PrefixAffinity(priors)
        self._conversations = Conversations(smoothing)
        # The role's prompt characters per token, learned from the usage its answers report.
        self.chars_per_token = CharsPerToken(smoothing)
        # The pool's typical answer, tokens: the size of a request that names no max_tokens.
        self._typical_answer = Estimate(DEFAULT_EXPECTED_TOKENS, smoothing)
        # And the share of a named max_tokens its answers take.
        self.answer_fill = AnswerFill(smoothing)
        # Called when a replica may have room again (a placement released, a probe's load
        # noted): the pool's admission queue (mesh/pool_queue.py) releases what now fits.
        self.on_room: Callable[[], None] | None = None

    @property
    def prices_prefix(self) -> bool:
        """Whether requests should carry their prompt's block hashes (they cost to make)."""
        return self.policy.forecasts

    def shape_of(self, payload: dict | None) -> RequestShape:
        """A payload's shape as this pool prices it: blocks when the policy prices prefixes,
        text at the characters per token the pool has learned."""
        return request_shape(payload, self.prices_prefix, self.chars_per_token.value)

    def in_flight(self, origin: str) -> int:
        return len(self._active[origin])

    def _sequences(self, origin: str) -> int:
        """This box's sequences on the replica: a request of n choices runs n (as a probe's
        load counts them)."""
        return sum(p.choices for p in self._active[origin])

    def rate(self, origin: str) -> float | None:
        """The learned (or prior) rate; None while neither exists."""
        return self._rates[origin].value

    def knows_a_rate(self) -> bool:
        """Whether any replica has a rate (prior or learned): else forecasts are guesses."""
        return any(r.value is not None for r in self._rates.values())

    def room_changed(self) -> None:
        """Tell the pool's admission queue a replica may have room."""
        if self.on_room is not None:
            self.on_room()

    def typical_answer_tokens(self) -> int:
        return max(1, round(self._typical_answer.value))

    def _effective_rate(self, origin: str) -> float:
        """An unknown rate borrows the pool's best known one: neither starved nor stampeded."""
        known = [r.value for r in self._rates.values() if r.value is not None]
        own = self._rates[origin].value
        if own is not None:
            return own
        return max(known) if known else 1.0

    def note_load(self, origin: str, load: int | None, probed_at: float | None = None) -> None:
        """A probe that started at `probed_at` saw `load` requests running + waiting on the
        replica.

        Those include this box's own in-flight requests there; the rest is other boxes'
        work, counted (and aged: _external_left_s) so a shared replica is not taken for idle
        until the next probe says otherwise. This
        box's requests that ended since the probe started may be in `load` too: they are
        not taken for other boxes' work. Taken so, two turns that ended while a probe pass
        was on stayed on their replica as two phantom requests for a whole probe interval
        (issue 13's 4 sessions: a session was moved off its prefix, and the one that waited
        for the phantoms taught its replica a decode rate twice the real one).
        """
        ended = 0
        if probed_at is not None:
            ended = sum(1 for at in self._released_at[origin] if at >= probed_at)
        self._external[origin] = max(0, (load or 0) - self._sequences(origin) - ended)
        self._external_seen_at[origin] = self._clock() if probed_at is None else probed_at

    def forget_prefixes(self, origin: str) -> None:
        """The replica went dark; when it is back its cache is empty."""
        self._affinity.forget(origin)

    def external_load(self, origin: str) -> int:
        return self._external[origin]

    def _external_left_s(self, origin: str, slots: int, rate: float,
                         now: float) -> tuple[float, ...]:
        """Seconds left of each of other boxes' requests on the replica, aged since the probe
        that saw them: priced at the typical answer, the running ones part done then
        (EXTERNAL_DONE_WHEN_SEEN), the waiting ones through the slots after them; those
        forecast done are gone. Unaged, work that had ended kept the replica full until the
        next probe (up to GATEWAY_PROBE_INTERVAL_S): the mesh's Orin held a burst back for
        the Spark's phantoms 1.4 s after another box's burst there ended."""
        count = self._external[origin]
        if not count:
            return ()
        each = self._typical_answer.value / rate
        ran = now - self._external_seen_at[origin] + each * EXTERNAL_DONE_WHEN_SEEN
        waves_done = int(ran // each)
        left = count - waves_done * slots
        if left <= 0:
            return ()
        running = min(slots, left)
        return ((waves_done + 1) * each - ran,) * running + (each,) * (left - running)

    def external_ends_in_s(self, candidates: Sequence[Candidate]) -> float | None:
        """Seconds until other boxes' work on a candidate is next forecast to free a slot;
        None when none is counted."""
        now = self._clock()
        ends = [left[0] for c in candidates
                if (left := self._external_left_s(c.origin, max(1, c.slots),
                                                  self._effective_rate(c.origin), now))]
        return min(ends, default=None)

    def views(self, candidates: Sequence[Candidate],
              request: RequestShape | None = None) -> list[ReplicaView]:
        request = request or RequestShape()
        order = {origin: i for i, origin in enumerate(self._active)}
        now = self._clock()
        views = []
        for c in candidates:
            rate = self._effective_rate(c.origin)
            slots = max(1, c.slots)
            own = self._active[c.origin]
            # Other boxes' work first, then this box's own in dispatch order, a request of n
            # choices as n sequences (one prefill: they share the prompt); other boxes' is
            # priced as decode only (their prompts are unknown here).
            external = self._external_left_s(c.origin, slots, rate, now)
            work = tuple(left for p in own for left in (p.remaining_s(now),) * p.choices)
            views.append(ReplicaView(
                origin=c.origin,
                order=order[c.origin],
                slots=slots,
                in_flight=len(external) + len(work),
                rate=rate,
                work_s=external + work,
                prefill_left_s=(0.0,) * len(external) + tuple(
                    stall for p in own
                    for stall in (p.prefill_left_s(now), *(0.0,) * (p.choices - 1))),
                cached_tokens=round(self.chars_per_token.tokens(
                    self._affinity.cached_chars(c.origin, request))),
                prefill_rate=self._prefill[c.origin].value or 0.0,
            ))
        return self._balanced(views, request, now)

    def _balanced(self, views: list[ReplicaView], request: RequestShape,
                  now: float) -> list[ReplicaView]:
        """The views with what the request's session would add to each replica's bound
        sessions over the rounds it is expected to go on; unchanged until the pool has seen
        a session (policy/sessions.py)."""
        sessions = self._conversations
        sessions.expire(now)
        rounds = sessions.rounds_ahead()
        if rounds <= 0 or not views or not is_chat_turn(request):
            return views
        found = sessions.continued(request)
        own = found[1] if found else None
        think_s = sessions.think_s()
        # The session's next turns bring what no replica holds now (its new message) and
        # an answer like this one.
        new_tokens = max(0, request.prompt_tokens - max(v.cached_tokens for v in views))
        balanced = []
        for view in views:
            decode_s = answer_tokens(request) / view.rate
            turn = TurnCost(engine_s=new_tokens / view.prompt_rate + decode_s / view.slots,
                            overlap_s=decode_s - decode_s / view.slots)
            cost = join_cost_s(turn, think_s, sessions.bound(view.origin, excluding=own))
            balanced.append(replace(view, balance_s=rounds * cost))
        return balanced

    def place(
        self,
        candidates: Sequence[Candidate],
        expected_tokens: int = DEFAULT_EXPECTED_TOKENS,
        request: RequestShape | None = None,
    ) -> Placement | None:
        """Choose a replica and count the request on it, in one step; None if none fits.

        request is the request's shape; without one, a request of expected_tokens."""
        shape = self.priced(request or RequestShape(max_tokens=max(1, expected_tokens)))
        views = self.views(candidates, shape)
        choice = self.policy.choose(views, shape)
        if choice is None:
            return None
        return self.commit(choice, shape)

    def arrived(self, shape: RequestShape) -> None:
        """A request arrived that may wait in the pool's queue before it is placed."""
        self._conversations.returned(shape, self._clock())

    def priced(self, shape: RequestShape) -> RequestShape:
        """The shape as placement prices it: an unnamed max_tokens is the typical answer, a
        named one expects the answer the pool's fill predicts."""
        if shape.max_tokens is None:
            return shape.with_max_tokens(self.typical_answer_tokens())
        return replace(shape, answer_tokens=self.answer_fill.expected(shape.max_tokens))

    def commit(self, choice: tuple[ReplicaView, RouteReason],
               shape: RequestShape) -> Placement:
        """Count the request on the policy's choice: the placement, in flight from now."""
        view, reason = choice
        return self._count(view, reason, shape)

    def _count(self, view: ReplicaView, reason: RouteReason,
               request: RequestShape) -> Placement:
        # Waves ahead at dispatch (own and other boxes' work): the rate policy's sample divisor.
        placement = Placement(self, view.origin, reason, view.in_flight // view.slots + 1,
                              forecast(view, request), self._clock(), request)
        self._active[view.origin].append(placement)
        placement.conversation = self._conversations.placed(request, view.origin,
                                                            self._clock())
        self._affinity.remember(view.origin, request)
        return placement

    def occupy(self, origin: str, slots: int,
               reason: RouteReason = RouteReason.NONE) -> Placement:
        """Count a request the policy did not place (a marked arrival served locally, or a
        failover past the policy's fullness), priced as the pool's typical request."""
        view = self.views([Candidate(origin, slots)])[0]
        return self._count(view, reason, RequestShape(max_tokens=self.typical_answer_tokens()))

    def release(self, placement: Placement) -> None:
        self._active[placement.origin].remove(placement)
        self._released_at[placement.origin].extend((self._clock(),) * placement.choices)
        self._conversations.ended(placement.conversation, self._clock())
        self.room_changed()

    def learn(self, placement: Placement, tokens: int, elapsed_s: float,
              answer_tokens: int | None = None, first_token_s: float | None = None) -> None:
        """A completed answer: the pool's typical answer length (`answer_tokens`, else
        `tokens`), the share of its named max_tokens it took, and the replica's rate.

        The rate policy's sample is tokens x waves / elapsed (the elapsed time covered the
        waves ahead). A forecasting policy's answer teaches the replica's decode and prefill
        rates apart: the time it took past its forecast wait, against the forecast prefill
        plus its tokens' decode, is a factor off, and each rate takes the part of that factor
        its share of the forecast predicts. An answer that was nearly all decode teaches the
        decode rate; a long uncached prompt mostly the prefill rate; over many answers of
        different mixes both settle where the forecasts come true; one forecast to wait for a
        slot teaches neither (STARTED_AT_ONCE_SHARE). A stream times its decode
        itself: its tokens after the first over the time from its first event to its end
        teach the decode rate with no forecast in it (the forecast wait, priced at what the
        requests ahead were expected to take, no longer moves it), and when it started at
        once, its first event times its prefill; a stream forecast to wait teaches no
        prefill rate (STARTED_AT_ONCE_SHARE).
        """
        if placement.choices > 1:
            # Its tokens are its choices' together, decoded side by side, each of its own
            # length: they tell neither one answer's length nor one stream's rate (taken as
            # one, a 32-token answer of n=4 taught 1.8x the true rate; a stream would 4x).
            return
        self._typical_answer.observe(tokens if answer_tokens is None else answer_tokens)
        if placement.named_max_tokens is not None:  # a continuation's own part and budget
            self.answer_fill.observe(placement.named_max_tokens, tokens)
        if not self.policy.forecasts:
            self.observe_rate(placement.origin, tokens * placement.waves_at_dispatch / elapsed_s)
            return
        priced = placement.forecast
        if tokens > 1 and first_token_s is not None and elapsed_s > first_token_s:
            self.observe_rate(placement.origin, (tokens - 1) / (elapsed_s - first_token_s))
            if (priced.prefill_s > 0 and first_token_s > 0
                    and priced.wait_s <= first_token_s * STARTED_AT_ONCE_SHARE):
                prefill_s = first_token_s - priced.wait_s
                self.observe_prefill_rate(placement.origin,
                                          priced.prefill_rate * priced.prefill_s / prefill_s)
            return
        if priced.wait_s > elapsed_s * STARTED_AT_ONCE_SHARE:
            # Its wait is a forecast, priced at what the work ahead was expected to take: the
            # time past it is off by as much as that was, and taught seed 000's Thor 1.6x its
            # true rate and the Spark 0.75x in a mixed burst, enough to send the Thor a request
            # it finished later than the Spark would have. Answers that started at once teach.
            return
        service_s = max(elapsed_s - priced.wait_s, elapsed_s * MIN_DECODE_SHARE)
        expected_s = priced.prefill_s + tokens / priced.rate
        factor = service_s / expected_s
        prefill_share = priced.prefill_s / expected_s
        self.observe_rate(placement.origin, priced.rate / factor ** (1 - prefill_share))
        if priced.prefill_s > 0:
            self.observe_prefill_rate(placement.origin,
                                      priced.prefill_rate / factor ** prefill_share)

    @property
    def conversations(self) -> Conversations:
        """The sessions this pool follows (read-only use: placement keeps them)."""
        return self._conversations

    def observe_prefill_rate(self, origin: str, tokens_per_second: float) -> None:
        self._prefill[origin].observe(tokens_per_second)

    def prefill_rate(self, origin: str) -> float | None:
        """The learned prompt tok/s of the replica's prefill; None before its first sample."""
        return self._prefill[origin].value

    def observe_rate(self, origin: str, tokens_per_second: float) -> None:
        self._rates[origin].observe(tokens_per_second)
