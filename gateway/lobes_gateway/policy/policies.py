"""The pool policies: which replica of a pool a request goes to, and the reason given.

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
  queue   the baseline the acceptance run measured: least in flight relative to slots, a
          full replica is not selectable, ties by origin. Kept to measure against.
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

from collections.abc import Callable, Sequence
from enum import Enum
from typing import Protocol

from lobes_contract import POOL_POLICIES

from .answer_size import DEFAULT_EXPECTED_TOKENS
from .forecast import ReplicaView, forecast
from .prefix import RequestShape

# A slower replica's forecast is taken as this share too short (its forecast over 1 - the
# margin) against the fastest replica's: a request goes there only when, so priced, it finishes
# no later than on the fastest replica, its wait for a slot included. So a slower replica is
# never given a request it would finish later than the best replica, as long as its forecast
# errs by less than the margin; and an estimate off by more (a prior that was optimistic) is
# corrected by its first answer (Estimate.measured_replaces_prior).
# Why a margin and not a sharper formula: the wave model prices every stream at one rate per
# replica, but a replica's per-stream rate depends on its batch (Spark 48.9 tok/s alone, 44.05
# with 2 running: 11%), so the learned EWMA is a blend of solo and batched samples that moves by
# that much. The acceptance run's burst of 8 on its Spark and Thor pair is the near-tie: Spark's
# 4th wave 4 x 155/44.05 = 14.07 s against Thor alone 155/11.0 = 14.09 s. Even a batch-aware
# estimate decides it on 0.1%, far inside the estimate's own error, while a request wrongly sent
# to the slow replica sets the burst's makespan. The margin is that error bound: a slower
# replica must win by more than the spread between its rivals' solo and batched rates. Measured:
# docs/benchmarks.md.
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
        # by noise (0.1-4% in 4 agent sessions on the homogeneous pair): one is slower
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
