"""Placing a request on one replica of a pool: in-flight accounting, rates and policies.

Every dispatch is counted in flight before the gateway dials and released after the answer
ends, so concurrent arrivals see each other and spread instead of stampeding one replica
(seed 000, defect 1). Choosing and counting happen in one synchronous step: on the event
loop nothing can interleave between them.

Policies (GATEWAY_POOL_POLICY):
  rate    (default) earliest expected completion: the waves of work queued ahead of the
          request on a replica's slots, plus its own, each taking expected tokens / rate;
          a slower replica must beat the fastest by SLOWER_REPLICA_MARGIN to win.
          Rates are learned online (EWMA of completed responses) from declared priors.
  queue   seed 000's baseline: least in flight relative to slots, a full replica is not
          selectable, ties by origin. Kept to measure against.
  pinned  the first selectable replica in declaration order, always.

X-Lobes-Route-Reason vocabulary (closed; RouteReason):
  sole-ready          exactly one replica was selectable when the request was placed
  peer-less-loaded    queue: the selectable replica with the least in flight per slot
  earliest-completion rate: the replica with the earliest expected completion
  pinned              pinned: the first selectable replica in declaration order
  none                nothing was placed: the request fell through to the singular forward or
                      the local path, or every replica tried failed
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

DEFAULT_EXPECTED_TOKENS = 256
DEFAULT_SMOOTHING = 0.3
# A slower replica must finish a request this much sooner than the fastest one to get it.
# Why a margin and not a sharper formula: the wave model prices every stream at one rate per
# replica, but a replica's per-stream rate depends on its batch (Spark 48.9 tok/s alone, 44.05
# with 2 running: 11%), so the learned EWMA is a blend of solo and batched samples that moves
# by that much. Seed 000's burst 8 is the near-tie: Spark's 4th wave 4 x 155/44.05 = 14.07 s
# against Thor alone 155/11.0 = 14.09 s. Even a batch-aware estimate decides it on 0.1%, far
# inside the estimate's own error, while a request wrongly sent to the slow replica sets the
# burst's makespan. The margin is that error bound: a slower replica must win by more than the
# spread between its rivals' solo and batched rates. Measured: docs/benchmarks.md.
SLOWER_REPLICA_MARGIN = 0.1


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
    """A selectable replica offered to a policy: its origin and how many requests it runs."""

    origin: str
    slots: int


@dataclass(frozen=True)
class ReplicaView:
    """What a policy sees of one candidate at the instant of placement."""

    origin: str
    order: int
    slots: int
    in_flight: int  # this box's dispatches plus other boxes' probed work
    rate: float

    def expected_completion_s(self, expected_tokens: int) -> float:
        """Seconds until a request placed now would finish on this replica."""
        waves = self.in_flight // self.slots + 1
        return waves * expected_tokens / self.rate


class Policy(Protocol):
    name: str

    def choose(
        self, views: Sequence[ReplicaView], expected_tokens: int
    ) -> tuple[ReplicaView, RouteReason] | None: ...


def _reason(selectable: Sequence[ReplicaView], reason: RouteReason) -> RouteReason:
    return RouteReason.SOLE_READY if len(selectable) == 1 else reason


class PinnedPolicy:
    """Always the first selectable replica in declaration order."""

    name = "pinned"

    def choose(
        self, views: Sequence[ReplicaView], expected_tokens: int
    ) -> tuple[ReplicaView, RouteReason] | None:
        if not views:
            return None
        return min(views, key=lambda v: v.order), _reason(views, RouteReason.PINNED)


class QueuePolicy:
    """Least in flight relative to slots; a full replica is not selectable."""

    name = "queue"

    def choose(
        self, views: Sequence[ReplicaView], expected_tokens: int
    ) -> tuple[ReplicaView, RouteReason] | None:
        open_views = [v for v in views if v.in_flight < v.slots]
        if not open_views:
            return None
        best = min(open_views, key=lambda v: (v.in_flight / v.slots, v.origin))
        return best, _reason(open_views, RouteReason.PEER_LESS_LOADED)


class RatePolicy:
    """Earliest expected completion, biased to the fastest replica by SLOWER_REPLICA_MARGIN.

    The wave model ignores the slowdown a new stream causes on a batch already running, and a
    request on a slow replica sets the burst's makespan: a slower replica gets the request
    only when it finishes it clearly sooner, never on a tie or within estimation noise.
    """

    name = "rate"

    def choose(
        self, views: Sequence[ReplicaView], expected_tokens: int
    ) -> tuple[ReplicaView, RouteReason] | None:
        if not views:
            return None

        def completion(view: ReplicaView) -> float:
            return view.expected_completion_s(expected_tokens)

        best = min(views, key=lambda v: (completion(v), -v.rate, v.order))
        fastest = min(views, key=lambda v: (-v.rate, completion(v), v.order))
        if best.rate < fastest.rate and completion(best) > completion(fastest) * (
            1 - SLOWER_REPLICA_MARGIN
        ):
            best = fastest
        return best, _reason(views, RouteReason.EARLIEST_COMPLETION)


POLICIES: dict[str, type[PinnedPolicy] | type[QueuePolicy] | type[RatePolicy]] = {
    "rate": RatePolicy,
    "queue": QueuePolicy,
    "pinned": PinnedPolicy,
}


def policy_named(name: str | None) -> Policy:
    """GATEWAY_POOL_POLICY -> a policy; unset means rate."""
    key = (name or "rate").strip().lower()
    if key not in POLICIES:
        raise ValueError(
            f"GATEWAY_POOL_POLICY={name!r} is not a pool policy; use one of "
            f"{', '.join(POLICIES)} (rate is the default)"
        )
    return POLICIES[key]()


class RateEstimate:
    """A replica's service rate per stream, tok/s: an EWMA seeded by the declared prior."""

    def __init__(self, prior: float | None, smoothing: float) -> None:
        self.value = prior
        self.samples = 0
        self._smoothing = smoothing

    def observe(self, tokens_per_second: float) -> None:
        if self.value is None:
            self.value = tokens_per_second
        else:
            self.value += self._smoothing * (tokens_per_second - self.value)
        self.samples += 1


def expected_tokens(payload: dict | None) -> int:
    """The tokens a request asks for (max_tokens), the unit of expected completion time."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key) if payload else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_EXPECTED_TOKENS


class Placement:
    """One request counted in flight on one replica until released (a context manager)."""

    def __init__(
        self, placer: Placer, origin: str, reason: RouteReason, waves_at_dispatch: int
    ) -> None:
        self.placer = placer
        self.origin = origin
        self.reason = reason
        self.waves_at_dispatch = waves_at_dispatch
        self.released = False

    def record_completion(self, tokens: int, elapsed_s: float) -> None:
        """Teach the replica's rate from a completed response.

        The elapsed time also covered the waves queued ahead of this request on the
        replica, so the per-stream rate is tokens x waves / elapsed.
        """
        if tokens <= 0 or elapsed_s <= 0:
            return
        self.placer.observe_rate(self.origin, tokens * self.waves_at_dispatch / elapsed_s)

    def release(self) -> None:
        """Stop counting this request; safe to call more than once."""
        if not self.released:
            self.released = True
            self.placer.release(self.origin)

    def __enter__(self) -> Placement:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class Placer:
    """The in-flight counts and learned rates of one pool, and its placement policy."""

    def __init__(
        self,
        policy: Policy,
        priors: dict[str, float | None],
        *,
        smoothing: float = DEFAULT_SMOOTHING,
    ) -> None:
        self.policy = policy
        self._in_flight: dict[str, int] = {origin: 0 for origin in priors}
        # Work other boxes have on a replica, from its probed running + waiting.
        self._external: dict[str, int] = {origin: 0 for origin in priors}
        self._rates = {o: RateEstimate(prior, smoothing) for o, prior in priors.items()}

    def in_flight(self, origin: str) -> int:
        return self._in_flight[origin]

    def rate(self, origin: str) -> float | None:
        """The learned (or prior) rate; None while neither exists."""
        return self._rates[origin].value

    def _effective_rate(self, origin: str) -> float:
        """An unknown rate borrows the pool's best known one: neither starved nor stampeded."""
        known = [r.value for r in self._rates.values() if r.value is not None]
        own = self._rates[origin].value
        if own is not None:
            return own
        return max(known) if known else 1.0

    def note_load(self, origin: str, load: int | None) -> None:
        """A probe saw `load` requests running + waiting on the replica.

        Those include this box's own in-flight requests there; the rest is other boxes'
        work, counted until the next probe so a shared replica is not taken for idle.
        """
        self._external[origin] = max(0, (load or 0) - self._in_flight[origin])

    def external_load(self, origin: str) -> int:
        return self._external[origin]

    def views(self, candidates: Sequence[Candidate]) -> list[ReplicaView]:
        order = {origin: i for i, origin in enumerate(self._in_flight)}
        return [
            ReplicaView(
                origin=c.origin,
                order=order[c.origin],
                slots=max(1, c.slots),
                in_flight=self._in_flight[c.origin] + self._external[c.origin],
                rate=self._effective_rate(c.origin),
            )
            for c in candidates
        ]

    def place(
        self, candidates: Sequence[Candidate], expected_tokens: int = DEFAULT_EXPECTED_TOKENS
    ) -> Placement | None:
        """Choose a replica and count the request on it, in one step; None if none fits."""
        choice = self.policy.choose(self.views(candidates), max(1, expected_tokens))
        if choice is None:
            return None
        view, reason = choice
        self._in_flight[view.origin] += 1
        # Waves ahead at dispatch (own and other boxes' work): the rate sample's divisor.
        return Placement(self, view.origin, reason, view.in_flight // view.slots + 1)

    def occupy(self, origin: str, slots: int,
               reason: RouteReason = RouteReason.NONE) -> Placement:
        """Count a request the policy did not place (a marked arrival served locally, or a
        failover past the policy's fullness)."""
        waves = self._in_flight[origin] // max(1, slots) + 1
        self._in_flight[origin] += 1
        return Placement(self, origin, reason, waves)

    def release(self, origin: str) -> None:
        self._in_flight[origin] -= 1

    def observe_rate(self, origin: str, tokens_per_second: float) -> None:
        self._rates[origin].observe(tokens_per_second)
