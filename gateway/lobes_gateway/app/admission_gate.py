"""Holding generate requests at the gateway while their gear is at its slots.

policy/admission.py decides who goes next; here a request waits for its turn, is woken when a
slot frees, is refused when it cannot start before its deadline, and leaves the queue when its
client goes away (it then never reaches a gear).

Which requests wait: generate-lane requests for a role this box serves with its own gear and
whose P_MAX_ACTIVE gives the gear's slots, and those for a pool (mesh/pool_queue.py: released
where placement finds room, and placed there). They pass straight through when:
  - the role is minor, or the request asked for minor (the floor: always served);
  - pressure would shed the request now (it is answered at once: shedding never waits);
  - it arrived from another box (proxied, pooled or owner-forwarded): that box admitted it,
    so it only occupies a slot here, without waiting again (a pool counts it on its local
    replica);
  - the role is answered by a single proxied peer or by owners: the peer admits it.
For a pool, pressure is judged when the request is placed on this box's own replica.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict

from lobes_contract import GENERATE

from ..mesh.peers import PooledRole
from ..mesh.pool_queue import PoolQueue
from ..policy.admission import (
    CLASSES,
    AdmissionQueue,
    Ticket,
    class_of_priority,
    effective_class,
)
from ..policy.answer_size import expected_tokens
from ..policy.auth import Caller
from ..policy.config import GatewayConfig
from ..policy.pressure import PressureMonitor
from ..policy.routing import LocalRoute, PoolRoute, Route
from ..transport import errors
from ..transport.channel import Channel
from ..transport.errors import ApiError
from ..transport.http import Request

PRIORITY_HEADER = "x-lobes-priority"
DEADLINE_HEADER = "x-lobes-deadline-s"
_MARKERS = ("x-lobes-proxied", "x-lobes-forwarded-by")
MINOR = "minor"
# How a request left admission (lobes_gateway_admission_total{outcome}).
STARTED = "started"  # a slot was free: started at once
RELEASED = "released"  # waited in the queue, then started
DEADLINE_UNMEETABLE = "deadline_unmeetable"  # refused on arrival: would not start in time
DEADLINE_PASSED = "deadline_passed"  # waited until its deadline without starting: refused
CLIENT_GONE = "client_gone"  # the client left while it waited
OUTCOMES = (STARTED, RELEASED, DEADLINE_UNMEETABLE, DEADLINE_PASSED, CLIENT_GONE)


class AdmissionGate:
    """One admission queue per role this box serves with slots and per pool; the waiting and
    waking."""

    def __init__(self, config: GatewayConfig, pressure: PressureMonitor,
                 pooled: dict[str, PooledRole]) -> None:
        self.queues: dict[str, AdmissionQueue | PoolQueue] = {
            name: AdmissionQueue(rc.max_active, rc.rate) for name, rc in config.roles.items()
            if rc.max_active and rc.wired and rc.role.task == GENERATE and name != MINOR
            and name not in pooled}
        for name, role in pooled.items():
            if config.roles[name].role.task == GENERATE and name != MINOR:
                self.queues[name] = self._pool_queue(role)
        self._pressure = pressure
        self._retry_after = config.pressure.retry_after_s
        self.outcomes: defaultdict[tuple[str, str, str], int] = defaultdict(int)

    @staticmethod
    def _pool_queue(role: PooledRole) -> PoolQueue:
        """A pool's queue, woken whenever one of its replicas may have room."""
        queue = PoolQueue(role)
        role.placer.on_room = lambda: _wake(queue.admit(time.monotonic()))
        return queue

    def queue_for(self, route: Route, requested_tier: str | None,
                  req: Request) -> AdmissionQueue | PoolQueue | None:
        """The queue a request waits in; None when it passes straight through."""
        if requested_tier == MINOR:
            return None
        if isinstance(route, PoolRoute):
            marked = any(marker in req.headers for marker in _MARKERS)
            return None if marked else self.queues.get(route.role)
        if not isinstance(route, LocalRoute):
            return None
        queue = self.queues.get(route.role)
        if not isinstance(queue, AdmissionQueue) or any(marker in req.headers
                                                        for marker in _MARKERS):
            return queue
        override = req.headers.get("x-lobes-override", "").lower() == "true"
        if not override and self._pressure.sheds(requested_tier, route.tier):
            return None  # answered at once by the dispatcher's shed
        return queue

    async def enter(self, req: Request, caller: Caller, klass: str, route: Route,
                    queue: AdmissionQueue | PoolQueue | None, payload: dict | None,
                    client: Channel) -> Ticket | ApiError | bool:
        """Wait for a slot of `queue` (queue_for's), in class `klass`. A Ticket: admitted
        (leave() it when the answer ends); True: not queued at all (its deadline header, if
        any, checked); an ApiError: answer it (never started); False: the client left."""
        deadline = _deadline(req)
        if isinstance(deadline, ApiError):
            return deadline
        if queue is None:
            return True
        shape = (queue.pooled.placer.shape_of(payload)
                 if isinstance(queue, PoolQueue) else None)
        ticket = Ticket(caller.key_id, klass, expected_tokens(payload), shape)
        now = time.monotonic()
        if any(marker in req.headers for marker in _MARKERS):
            queue.occupy(ticket, now)
            return ticket
        left = None
        if deadline is not None:
            # Seconds left of the deadline, which counts from the request's head.
            arrived = req.trace.started if req.trace is not None else now
            left = max(0.0, deadline - (now - arrived))
            expected = queue.expected_wait_s(ticket, now)
            if expected is not None and expected > left:
                self._count(route.role, klass, DEADLINE_UNMEETABLE)
                return errors.deadline_unmeetable(route.role, deadline, expected,
                                                  max(1, math.ceil(expected - left)))
        outcome = await self._wait(queue, ticket, route.role, left, client, now)
        if outcome == DEADLINE_PASSED:
            assert deadline is not None
            return errors.deadline_unmeetable(route.role, deadline, None, self._retry_after)
        return ticket if outcome in (STARTED, RELEASED) else False

    async def _wait(self, queue: AdmissionQueue | PoolQueue, ticket: Ticket, role: str,
                    left: float | None, client: Channel, now: float) -> str:
        """Queue the ticket and wait for a slot, the end of its deadline (`left` seconds) or
        its client's leaving; how it left (an outcome)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[str] = loop.create_future()
        ticket.waiter = waiter
        _wake(queue.arrive(ticket, now), skip=ticket)
        if ticket.started is not None:
            self._count(role, ticket.klass, STARTED)
            return STARTED
        timer = (loop.call_later(left, _settle, waiter, DEADLINE_PASSED)
                 if left is not None else None)
        if not client.watch_gone(lambda: _settle(waiter, CLIENT_GONE)):
            _settle(waiter, CLIENT_GONE)
        try:
            outcome = await waiter
        finally:
            if timer is not None:
                timer.cancel()
            client.watch_gone(None)
        self._count(role, ticket.klass, outcome)
        if outcome != RELEASED:
            self._give_up(queue, ticket)
        return outcome

    def _give_up(self, queue: AdmissionQueue | PoolQueue, ticket: Ticket) -> None:
        """A ticket that will not run: out of the queue, or (admitted in the same turn it gave
        up) its slot handed on."""
        if not queue.withdraw(ticket) and ticket.started is not None:
            _wake(queue.finish(ticket, time.monotonic(), 0))

    def leave(self, route: Route, ticket: Ticket, tokens: int) -> None:
        """The admitted request's answer ended after `tokens` tokens: free its slot."""
        queue = self.queues[route.role]
        _wake(queue.finish(ticket, time.monotonic(), tokens))

    def _count(self, role: str, klass: str, outcome: str) -> None:
        self.outcomes[role, klass, outcome] += 1

    def status(self) -> dict[str, dict[str, object]]:
        """The /status admission block: per queued role (or pool), its slots, running and
        queue depths."""
        return {role: {"slots": queue.slots, "running": len(queue.running),
                       "queued": queue.depth_by_class(),
                       "queued_by_client": queue.depth_by_client()}
                for role, queue in self.queues.items()}


def _settle(waiter: asyncio.Future[str], outcome: str) -> None:
    if not waiter.done():
        waiter.set_result(outcome)


def _wake(admitted: list[Ticket], skip: Ticket | None = None) -> None:
    for ticket in admitted:
        if ticket is not skip and isinstance(ticket.waiter, asyncio.Future):
            _settle(ticket.waiter, RELEASED)


def requested_class(req: Request, caller: Caller, payload: dict | None) -> str | ApiError:
    """The class the request runs in: its key's, or a weaker one that X-Lobes-Priority (or,
    without it, the body's vLLM `priority`) asks for; never a stronger one."""
    value = req.headers.get(PRIORITY_HEADER)
    if value is None:
        if not payload or "priority" not in payload:  # the usual request: its key's class
            return caller.priority
        return _body_class(caller, payload)
    requested = value.strip().lower()
    if requested not in CLASSES:
        return errors.invalid_admission_header("X-Lobes-Priority", value,
                                               f"send one of {', '.join(CLASSES)}")
    return effective_class(caller.priority, requested)


def _body_class(caller: Caller, payload: dict | None) -> str | ApiError:
    priority = payload.get("priority") if payload else None
    if priority is None:
        return caller.priority
    if not isinstance(priority, int) or isinstance(priority, bool):
        return errors.bad_request("priority must be an integer (lower runs first), or send "
                                  "X-Lobes-Priority", "priority")
    return effective_class(caller.priority, class_of_priority(priority))


def _deadline(req: Request) -> float | ApiError | None:
    """X-Lobes-Deadline-S: seconds from arrival within which the request must start."""
    value = req.headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        return errors.invalid_admission_header("X-Lobes-Deadline-S", value,
                                               "send a number of seconds greater than 0")
    return seconds
