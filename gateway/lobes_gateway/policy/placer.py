"""Placing a request on one replica of a pool: counting it in flight, and learning the
replicas' rates and the pool's answers from what it took (the policies that choose are
policy/policies.py; what they see of a replica, policy/forecast.py).

Every dispatch is counted in flight before the gateway dials and released after the answer ends,
so concurrent arrivals see each other and spread instead of stampeding one replica (uncounted,
four requests at once in the acceptance run read the same idle probe and all went to the Spark).
Choosing and counting happen in one synchronous step: on the event loop nothing can interleave
between them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .answer_size import DEFAULT_EXPECTED_TOKENS, AnswerFill
from .estimate import Estimate
from .forecast import Forecast, ReplicaView, answer_tokens, forecast
from .policies import Policy, RouteReason
from .prefix import PrefixAffinity, RequestShape, request_shape
from .sessions import Conversations, TurnCost, is_chat_turn, join_cost_s
from .tokens import CharsPerToken

DEFAULT_SMOOTHING = 0.3
# An in-flight request past its expected end still holds its slot: at least this share of
# its expected work is taken as left.
MIN_REMAINING_SHARE = 0.05
# A rate sample's decode time is at least this share of the elapsed time, so an overrated
# wait or prefill never turns into an absurd rate.
MIN_DECODE_SHARE = 0.25
# A stream forecast to start within this share of its first token's time started about at once:
# its first token timed its prefill, which teaches the prefill rate. One forecast to wait
# teaches nothing of it: its wait is a forecast, and an overrated one (the work ahead ended
# sooner) left a prefill too short to be true, which taught the acceptance run's Spark 2.5x its
# real prefill rate (agent sessions with tool outputs) and priced its queue short. An answer
# that is not a stream, forecast to wait, teaches no rate at all, for that reason.
STARTED_AT_ONCE_SHARE = 0.1
# Ends of this box's requests remembered per replica, to tell them from other boxes' work in
# a probe's load: more than end on one replica during one probe pass.
RELEASES_KEPT = 256
# Other boxes' running requests a probe saw are at an unknown point of their answers: this
# share of a typical answer is taken as done (the mean of a point seen at random).
EXTERNAL_DONE_WHEN_SEEN = 0.5


@dataclass(frozen=True)
class Candidate:
    """A selectable replica offered to a policy: its origin, how many requests it runs, and
    its served window (None when it publishes none)."""

    origin: str
    slots: int
    window: int | None = None


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
        (4 agent sessions: a session was moved off its prefix, and the one that waited
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
            # time past it is off by as much as that was, and taught the acceptance run's Thor
            # 1.6x its true rate and the Spark 0.75x in a mixed burst, enough to send the Thor a
            # request it finished later than the Spark would have. Answers that started at once
            # teach.
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
