"""Admission: the gateway's own queue in front of a role's gear or a pool, when it is at its slots.

A saturated gear would otherwise queue requests in arrival order inside vLLM, so one client's
burst makes everyone else wait behind all of it. Here requests wait at the gateway and are
released as slots free:

  by class   interactive, then standard, then batch (strict priority between classes);
  by key     within a class, fair across client keys: start-time fair queueing on expected
             tokens, so a key with many queued requests takes its share and no more, and a
             key that just arrived is not stuck behind another key's backlog.

Deadlines are judged by the queue's own estimate of when a request would start: the running
requests' expected ends and the requests ahead of it, each taking expected tokens / the learned
per-stream rate. Pure bookkeeping: no I/O and no clock of its own (callers pass `now`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Mapping

from lobes_contract import PRIORITY_CLASSES

from .estimate import Estimate
from .placer import DEFAULT_SMOOTHING, Placement
from .prefix import RequestShape

CLASSES = PRIORITY_CLASSES  # strongest first
INTERACTIVE, STANDARD, BATCH = CLASSES
_RANK = {name: rank for rank, name in enumerate(CLASSES)}


def class_of_priority(priority: int) -> str:
    """The class a vLLM `priority` in a request body asks for (lower runs first)."""
    return INTERACTIVE if priority < 0 else STANDARD if priority == 0 else BATCH


def effective_class(key_class: str, requested: str | None) -> str:
    """The class a request runs in: its key's, or a weaker one it asked for; never stronger."""
    if requested is None or _RANK[requested] < _RANK[key_class]:
        return key_class
    return requested


class Ticket:
    """One request before the queue: who sent it, its class and expected tokens, and once
    admitted, when it started. `waiter` belongs to whoever waits for the admission; a pool's
    ticket also carries its request's shape and, once released, the placement made for it."""

    __slots__ = ("client", "klass", "placement", "shape", "started", "tokens", "waiter")

    def __init__(self, client: str, klass: str, tokens: int,
                 shape: RequestShape | None = None) -> None:
        self.client = client
        self.klass = klass
        self.tokens = max(1, tokens)
        self.shape = shape
        self.started: float | None = None
        self.waiter: object = None
        self.placement: Placement | None = None


def _started(ticket: Ticket, now: float) -> float:
    return now if ticket.started is None else ticket.started


class _ClassQueue:
    """One class's waiting tickets: a queue per client key and each key's virtual time."""

    def __init__(self) -> None:
        self.waiting: dict[str, deque[Ticket]] = {}  # keys with tickets waiting
        self.virtual: dict[str, float] = {}  # tokens admitted per key, fair-queueing time
        self.clock = 0.0  # where the ticket admitted last ended, in virtual time

    def __len__(self) -> int:
        return sum(len(tickets) for tickets in self.waiting.values())

    def push(self, ticket: Ticket) -> None:
        tickets = self.waiting.get(ticket.client)
        if tickets is None:
            self.virtual[ticket.client] = self._joining(ticket.client, self.waiting)
            tickets = self.waiting[ticket.client] = deque()
        tickets.append(ticket)

    def _joining(self, client: str, waiting: Mapping[str, object]) -> float:
        """The virtual time of a key that starts waiting: the least of the keys waiting (or
        where the last admitted one ended), so it neither jumps ahead on credit saved while
        idle nor queues behind the others' backlogs."""
        now = min((self.virtual[name] for name in waiting), default=self.clock)
        return max(self.virtual.get(client, 0.0), now)

    def pop(self) -> Ticket:
        client = min(self.waiting, key=lambda name: self.virtual[name])
        ticket = self.waiting[client][0]
        self.take(ticket)
        return ticket

    def take(self, ticket: Ticket) -> None:
        """Admit a waiting ticket (the head of the order, or one placement let go ahead of
        it): out of its key's queue, its tokens charged to its key's share."""
        client = ticket.client
        tickets = self.waiting[client]
        tickets.remove(ticket)
        if not tickets:
            del self.waiting[client]
        self.virtual[client] += ticket.tokens
        self.clock = self.virtual[client]
        if not self.waiting:
            # Nobody waits in the class: shares start over, so no key carries a debt from an
            # earlier backlog into the next one.
            self.virtual.clear()
            self.clock = 0.0
        return ticket

    def remove(self, ticket: Ticket) -> bool:
        tickets = self.waiting.get(ticket.client)
        if tickets is None or ticket not in tickets:
            return False
        tickets.remove(ticket)
        if not tickets:
            del self.waiting[ticket.client]
        return True

    def order_until(self, ticket: Ticket) -> Iterator[Ticket]:
        """The tickets this class would admit before `ticket` (not queued yet), in order."""
        for head in self.order(ticket):
            if head is ticket:
                return
            yield head

    def order(self, joining: Ticket | None = None) -> Iterator[Ticket]:
        """Every waiting ticket (and `joining`, not queued yet) in the order this class would
        admit them if nothing else arrived."""
        virtual = dict(self.virtual)
        waiting = {client: deque(tickets) for client, tickets in self.waiting.items()}
        if joining is not None:
            if joining.client not in waiting:
                virtual[joining.client] = self._joining(joining.client, waiting)
            waiting.setdefault(joining.client, deque()).append(joining)
        while waiting:
            client = min(waiting, key=lambda name: virtual[name])
            head = waiting[client].popleft()
            if not waiting[client]:
                del waiting[client]
            virtual[client] += head.tokens
            yield head


class Waiting:
    """The requests waiting for a gear or a pool: a queue per class, fair across keys."""

    def __init__(self) -> None:
        self.running: set[Ticket] = set()
        self._classes = {name: _ClassQueue() for name in CLASSES}

    def queued(self) -> int:
        return sum(len(queue) for queue in self._classes.values())

    def depth_by_class(self) -> dict[str, int]:
        return {name: len(queue) for name, queue in self._classes.items()}

    def depth_by_client(self) -> dict[str, int]:
        depth: dict[str, int] = {}
        for queue in self._classes.values():
            for client, tickets in queue.waiting.items():
                depth[client] = depth.get(client, 0) + len(tickets)
        return depth

    def in_order(self, joining: Ticket | None = None) -> Iterator[Ticket]:
        """Every waiting ticket (and `joining`, not queued yet), strongest class first, each
        class in its fair order."""
        for name in CLASSES:
            mine = joining if joining is not None and joining.klass == name else None
            yield from self._classes[name].order(mine)

    def _ahead_of(self, ticket: Ticket) -> Iterator[Ticket]:
        for name in CLASSES:
            queue = self._classes[name]
            if name == ticket.klass:
                yield from queue.order_until(ticket)
                return
            for tickets in queue.waiting.values():
                yield from tickets

    def push(self, ticket: Ticket) -> None:
        self._classes[ticket.klass].push(ticket)

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a waiting ticket out (its client left, or its deadline passed)."""
        return self._classes[ticket.klass].remove(ticket)

    def start(self, ticket: Ticket, now: float) -> None:
        """Admit a waiting ticket: out of its class's queue, counted running."""
        self._classes[ticket.klass].take(ticket)
        self.occupy(ticket, now)

    def occupy(self, ticket: Ticket, now: float) -> None:
        """Count a request that does not wait (one another box already admitted)."""
        ticket.started = now
        self.running.add(ticket)


class AdmissionQueue(Waiting):
    """The slots of one role's gear and the requests waiting for them."""

    def __init__(self, slots: int, prior: float | None = None,
                 smoothing: float = DEFAULT_SMOOTHING) -> None:
        super().__init__()
        self.slots = slots
        # Tokens/s per stream: the declared prior (P_RATE) until the first finished request
        # replaces it, then learned.
        self.rate = Estimate(prior, smoothing, measured_replaces_prior=True)

    def expected_wait_s(self, ticket: Ticket, now: float) -> float | None:
        """Seconds until `ticket` would start if it arrived now: 0 when a slot is free and
        nobody waits, None when it must wait and no rate is known (declared or learned)."""
        if len(self.running) < self.slots and not self.queued():
            return 0.0
        rate = self.rate.value
        if rate is None:
            return None
        ends = sorted(max(now, _started(t, now) + t.tokens / rate) for t in self.running)
        # Slots free now count as ending now; beyond the slots (requests counted without
        # waiting), a slot frees only at the later ends.
        free = [now] * max(0, self.slots - len(ends)) + ends[max(0, len(ends) - self.slots):]
        heapq.heapify(free)
        for ahead in self._ahead_of(ticket):
            heapq.heappush(free, heapq.heappop(free) + ahead.tokens / rate)
        return max(0.0, free[0] - now) if free else None

    def arrive(self, ticket: Ticket, now: float) -> list[Ticket]:
        """Queue a ticket and admit what the free slots allow; the tickets admitted now (this
        one among them when it need not wait)."""
        self.push(ticket)
        return self.admit(now)

    def finish(self, ticket: Ticket, now: float, tokens: int) -> list[Ticket]:
        """A running request ended after `tokens` tokens: free its slot, learn the rate, and
        return the tickets admitted into the freed slots."""
        self.running.discard(ticket)
        elapsed = now - _started(ticket, now)
        if tokens > 0 and elapsed > 0:
            self.rate.observe(tokens / elapsed)
        return self.admit(now)

    def admit(self, now: float) -> list[Ticket]:
        """Admit waiting tickets, strongest class first, while slots are free."""
        admitted = []
        while len(self.running) < self.slots:
            queue = next((q for q in self._classes.values() if q.waiting), None)
            if queue is None:
                break
            ticket = queue.pop()
            self.occupy(ticket, now)
            admitted.append(ticket)
        return admitted
