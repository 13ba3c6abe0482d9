"""Admission for a pool: requests wait at the gateway until placement finds them room.

A pool is not "at its slots" by a count: the rate and prefix policies deliberately queue a
request on a fast replica rather than run it on a slow one, and a pool's replicas free at
different speeds. So the pool's queue asks placement, in the queue's own order (class, then
fair share across keys), where each waiting request would go:

  - each request is priced by the policy as if the requests ahead of it in that order had
    already been placed where the policy sent them (virtual load: their expected work on
    that replica), exactly as arrivals placed one by one would have seen each other;
  - the first request whose choice is a replica with room is released, placed there; one
    whose choice is a full replica keeps waiting, and its virtual load pushes the requests
    behind it towards the other replicas. A replica has room up to its slots plus PREQUEUED
    (not under the rate policy): that one waits in the replica's own queue and starts when a
    slot frees, with no hand-off through the gateway in between.

So a burst spreads as arrival-time placement spreads it (the fast replica's waves, the slow
replica's share where it finishes no later), an interactive request at
the head waits only for the replica the policy would choose for it, and a slow replica is
never left idle while the policy would have used it. A request placement would not place
(none selectable, its prompt fits no window, or the queue policy finds every replica full) is
released without a placement: dispatch answers it as it always did (a 400, the singular peer
or local path the pool falls through to, or the queue policy's overflow replica), so the queue
policy keeps its baseline behaviour.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import islice

from ..policy.admission import Ticket, Waiting
from ..policy.forecast import ReplicaView, forecast
from ..policy.policies import Policy, RatePolicy, RouteReason
from ..policy.prefix import RequestShape
from .peers import PooledRole

# Waiting requests priced per release: the queue's head and those placement may let past it.
MAX_LOOKAHEAD = 64
# Requests a replica is sent beyond its slots: one waits in its own queue and starts the
# moment a slot frees, where a hand-off through the gateway (answer relayed, release, the next
# request dialled through the peer's gateway) would leave the slot idle meanwhile: without it,
# 1-3% of a burst's throughput at bench time-scale 10 (docs/benchmarks.md). An interactive
# request then waits at worst for two slot ends instead of one (on a 2-slot replica, within
# one running request).
# Not under the rate policy: it learns a replica's rate as tokens x the waves ahead at dispatch
# / elapsed, right for requests sent together; one sent to wait behind running requests about
# to end counts a wave it hardly waited and doubles its sample (measured: a homogeneous pair
# split a burst 3/5 and lost 30% of its throughput).
PREQUEUED = 1
# Requests priced to judge a deadline on arrival; a request behind more is not refused early.
MAX_ESTIMATE = 4 * MAX_LOOKAHEAD
_NOTHING = RequestShape()


class VirtualLoad:
    """The work of requests priced ahead in the queue, per replica, as placement would see it
    had they been placed: each counted in flight, with its expected seconds of work and of
    that its prefill (which holds up the replica's busy slots, ReplicaView.slot_wait_s)."""

    def __init__(self) -> None:
        self._work: dict[str, tuple[float, ...]] = {}
        self._prefill: dict[str, tuple[float, ...]] = {}

    def add(self, view: ReplicaView, shape: RequestShape) -> None:
        work = forecast(view, shape)
        self._work[view.origin] = (*self._work.get(view.origin, ()),
                                   work.prefill_s + work.decode_s)
        self._prefill[view.origin] = (*self._prefill.get(view.origin, ()), work.prefill_s)

    def on(self, view: ReplicaView) -> ReplicaView:
        """The replica as a request behind the priced ones sees it."""
        work = self._work.get(view.origin)
        if not work:
            return view
        prefill = view.prefill_left_s or (0.0,) * len(view.work_s)
        return replace(view, in_flight=view.in_flight + len(work), work_s=view.work_s + work,
                       prefill_left_s=prefill + self._prefill[view.origin])


class Priced:
    """One waiting request as the queue priced it: the replicas it saw and the policy's
    choice (None: placement would not place it)."""

    __slots__ = ("choice", "shape", "ticket", "views")

    def __init__(self, ticket: Ticket, shape: RequestShape, views: list[ReplicaView],
                 choice: tuple[ReplicaView, RouteReason] | None) -> None:
        self.ticket = ticket
        self.shape = shape
        self.views = views
        self.choice = choice

    def has_room(self, policy: Policy) -> bool:
        """Whether the chosen replica has room now (a free slot, or the one waiting there)."""
        return self.choice is not None and has_room(self.choice[0], policy)


def has_room(view: ReplicaView, policy: Policy) -> bool:
    """Whether a request sent to the replica now would start at once (or next, PREQUEUED)."""
    beyond = 0 if isinstance(policy, RatePolicy) else PREQUEUED
    return view.in_flight < view.slots + beyond


class PoolQueue(Waiting):
    """The requests waiting for one pool, released by class, fair share and placement."""

    def __init__(self, pooled: PooledRole) -> None:
        super().__init__()
        self.pooled = pooled

    @property
    def slots(self) -> int:
        """The selectable replicas' slots together (what /status reports)."""
        return sum(c.slots for c in self.pooled.candidates(set()))

    def _priced(self, joining: Ticket | None = None) -> Iterator[Priced]:
        """Each waiting request (and `joining`) in the queue's order, priced by placement
        behind the ones before it."""
        placer = self.pooled.placer
        load = VirtualLoad()
        for ticket in self.in_order(joining):
            # The window check takes the request as sent (as dispatch does); the policy prices
            # an unnamed max_tokens as the pool's typical answer.
            candidates = self.pooled.candidates(set(), ticket.shape)
            shape = placer.priced(ticket.shape or _NOTHING)
            views = [load.on(view) for view in placer.views(candidates, shape)]
            choice = placer.policy.choose(views, shape) if views else None
            yield Priced(ticket, shape, views, choice)
            if choice is not None:
                load.add(choice[0], shape)

    def _has_room(self) -> bool:
        """Whether a request might be released now: a selectable replica has room, or
        placement would not place one (nothing selectable, or the policy finds every replica
        full), which dispatch answers as it always did."""
        placer = self.pooled.placer
        views = placer.views(self.pooled.candidates(set()))
        return (not views or any(has_room(view, placer.policy) for view in views)
                or placer.policy.choose(views, placer.priced(_NOTHING)) is None)

    def _next(self) -> Priced | None:
        """The first waiting request (within the lookahead) that may start now."""
        if not self.queued() or not self._has_room():
            return None
        policy = self.pooled.placer.policy
        for priced in islice(self._priced(), MAX_LOOKAHEAD):
            if priced.choice is None or priced.has_room(policy):
                return priced
        return None

    def admit(self, now: float) -> list[Ticket]:
        """Release every waiting request placement finds room for, each placed there."""
        admitted = []
        while (priced := self._next()) is not None:
            ticket = priced.ticket
            self.start(ticket, now)
            if priced.choice is not None:
                ticket.placement = self.pooled.placer.commit(priced.choice, priced.shape)
            admitted.append(ticket)
        return admitted

    def arrive(self, ticket: Ticket, now: float) -> list[Ticket]:
        """Queue a ticket and release what has room; the tickets released now."""
        if ticket.shape is not None:
            self.pooled.placer.arrived(ticket.shape)
        self.push(ticket)
        return self.admit(now)

    def finish(self, ticket: Ticket, now: float, tokens: int) -> list[Ticket]:
        """A released request ended (or gave up before it was sent): its placement is let go
        (the relay has usually done so already) and what now has room is released."""
        self.running.discard(ticket)
        if ticket.placement is not None:
            ticket.placement.release()
        return self.admit(now)

    def expected_wait_s(self, ticket: Ticket, now: float) -> float | None:
        """Seconds until `ticket` would start on the replica placement would give it behind
        the requests ahead of it; None when no rate is known, the policy finds every replica
        full, or too many wait ahead to price."""
        if not self.pooled.placer.knows_a_rate():
            return None
        for priced in islice(self._priced(ticket), MAX_ESTIMATE):
            if priced.ticket is ticket:
                if priced.choice is None:
                    return None if priced.views else 0.0
                return forecast(priced.choice[0], priced.shape).wait_s
        return None
