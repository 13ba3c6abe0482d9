"""Replica-pool dispatch: probe the replicas, place each request, forward, fail over, relay.

Two kinds of pool reach here as routing's PoolRoute:
  peer-only  the role is not hosted here (P_FEASIBLE=false), P_PEER_ORIGINS lists its
             replicas and P_PEER_PROXY=true arms forwarding to them (seed 000's Orin);
  hosted     the role has a local backend and P_PEER_ORIGINS adds peers (seed 000's Thor);
             the local replica is GATEWAY_SELF_ORIGIN's slot among the origins (with its
             rate prior) or else comes first, and a request placed on it takes the local
             path (pressure, tier headers, X-Lobes-Served-By, failover).
Each request is placed by the pool policy on a selectable replica (ready and
fingerprint-compatible), counted in flight before the dial and released when the answer
ends. A transport error, a timeout, a 5xx or a 401/403/404 before any body moves on to the
next replica (seed 003's rule); nothing selectable falls through to the singular forward
(peer-only) or the local path (hosted). Answers from peers carry X-Lobes-Proxied-By and
X-Lobes-Route-Reason, local ones X-Lobes-Route-Reason (`none` on a fall-through); every 200
answer, sized or streamed, from a peer or the local replica, teaches that replica's rate.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lobes_contract import AUDIO_TASKS

from . import errors
from .channel import Channel
from .config import GatewayConfig, Origin, RoleConfig
from .errors import ApiError
from .forward import Forwarder, encode_for, peer_headers
from .http import Request, error_bytes
from .meter import CountingWriter
from .peers import Pool, Prober, ProbeTarget, ReplicaSpec, ReplicaState, with_local_replica
from .placement import (
    DEFAULT_EXPECTED_TOKENS,
    Candidate,
    Placement,
    Placer,
    Policy,
    policy_named,
)
from .relay import Pending, head_bytes, relay
from .routing import OwnerRoute, PoolRoute, Router
from .upstream import Pool as Connections
from .upstream import Response, UpstreamError, exchange, fetch, finish, read_body, request_head
from .views import PeerView

_DECLINES = frozenset({401, 403, 404})
_BROKEN = (asyncio.IncompleteReadError, ConnectionError, ValueError)


def replica_specs(rc: RoleConfig) -> tuple[ReplicaSpec, ...]:
    """The pool's replicas as config declared them (keys already inherited)."""
    return tuple(ReplicaSpec(origin=p.origin, api_key=p.api_key, prior_rate=p.rate)
                 for p in rc.peers)


async def dial(connections: Connections, origin: Origin, target: str,
               headers: str, body: bytes, timeout_s: float) -> Response | None:
    """POST to a peer on the caller's path; None when no response head came back."""
    head = request_head("POST", target, origin, headers, len(body))
    try:
        return await exchange(connections, origin, head, body, timeout_s)
    except UpstreamError:
        return None


def moves_on(status: int) -> bool:
    """Seed 003: a 5xx or a 401/403/404 sends the request to the next replica or owner."""
    return status >= 500 or status in _DECLINES


def expected_tokens(payload: dict | None) -> int:
    """The tokens a request asks for (max_tokens), the unit of expected completion time."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key) if payload else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_EXPECTED_TOKENS


def completion_tokens(body: bytes) -> int:
    """usage.completion_tokens of a JSON answer, 0 when it carries none."""
    try:
        usage = json.loads(body).get("usage") or {}
    except (ValueError, AttributeError, UnicodeDecodeError):
        return 0
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else 0


@dataclass
class PooledRole:
    """One pooled role: its replicas' state, its placer, and the slots each replica runs."""

    role: str
    pool: Pool
    placer: Placer
    default_slots: int

    def candidates(self, exclude: set[str]) -> list[Candidate]:
        return [Candidate(s.origin, s.slots or self.default_slots)
                for s in self.pool.selectable() if s.origin not in exclude]

    @property
    def local_origin(self) -> str | None:
        """The origin of this box's own backend when it is one of the replicas."""
        return next((spec.origin for spec in self.pool.specs if spec.is_local), None)

    @property
    def hosted(self) -> bool:
        return self.local_origin is not None

    def note_loads(self) -> None:
        """Hand each peer's probed load to placement (a dark peer's is forgotten)."""
        for state in self.pool.states:
            self.placer.note_load(state.origin, state.load if state.ready else None)

    def _row(self, state: ReplicaState) -> dict[str, object]:
        """A replica's /capabilities row: its verdict plus the rate placement now uses."""
        row = state.snapshot()
        rate = self.placer.rate(state.origin)
        if rate is not None:
            row["rate"] = round(rate, 2)
        return row

    def view(self) -> PeerView:
        """What /capabilities and /v1/models publish for the role."""
        served = self.pool.served_id
        extra: dict[str, object] = {"replicas": [self._row(state) for state in self.pool.states]}
        if served is not None:
            extra["served_name"] = served
        if self.hosted:
            extra["proxied"] = False
        # A hosted pool's model is listed as this box's own backend already.
        listed = not self.hosted and served is not None and self.pool.peer_lists(served)
        return PeerView(ready=self.pool.ready, listed=listed, context=self.pool.context,
                        extra=extra)


@dataclass
class Failure:
    """A replica or owner that did not answer the request: unreachable or the status."""

    origin: str
    status: int | None  # None: no answer at all

    def describe(self) -> str:
        return f"{self.origin} ({'unreachable' if self.status is None else self.status})"


# The local path or the singular forward: an answer already written (bool) or one to relay.
FallThrough = Callable[[], Awaitable["bool | Pending"]]


def _pooled_role(route: PoolRoute, policy: Policy, self_origin: str | None) -> PooledRole:
    rc = route.config
    specs = replica_specs(rc)
    if rc.base_url is not None:
        specs = with_local_replica(specs, local_url=rc.base_url.url, self_origin=self_origin)
    placer = Placer(policy, {s.origin: s.prior_rate for s in specs})
    return PooledRole(route.role, Pool(route.role, specs), placer, rc.max_active or 1)


def _probe_target(config: GatewayConfig, role: str) -> ProbeTarget:
    """Audio roles are judged from /capabilities alone: they have no /v1/models entry.

    served_id is what this box's own backend must list when it is one of the replicas.
    """
    rc = config.roles[role]
    return ProbeTarget(role, served_id=rc.served_name,
                       audio=rc.role.task in AUDIO_TASKS)


class Pools:
    """Every pooled role of this gateway, the prober that keeps them (and the owners of
    owner-routed roles) judged, and dispatch."""

    def __init__(self, config: GatewayConfig, router: Router, connections: Connections,
                 forwarder: Forwarder, views: dict[str, PeerView]) -> None:
        self._connections = connections
        self._forwarder = forwarder
        self._views = views
        self._limits = config.limits
        self._timeout = config.limits.upstream_timeout_s
        self._retry_after = config.pressure.retry_after_s
        self.roles: dict[str, PooledRole] = {}
        routes = [*router.generate_routes.values(), *router.lane_routes.values()]
        policy = policy_named(config.pool_policy)
        for route in routes:
            if isinstance(route, PoolRoute) and route.role not in self.roles:
                self.roles[route.role] = _pooled_role(route, policy, config.self_origin)
        # Owner-routed roles are probed too (fleet key), for /capabilities and /v1/models only:
        # requests still ask the owners in routing order (seed 003).
        self.owned: dict[str, Pool] = {}
        for route in routes:
            if isinstance(route, OwnerRoute) and route.role not in self.owned:
                specs = tuple(ReplicaSpec(origin=o, api_key=config.fleet_key)
                              for o in dict.fromkeys(route.owners))
                self.owned[route.role] = Pool(route.role, specs)
        pools = [r.pool for r in self.roles.values()] + list(self.owned.values())
        targets = [(pool, _probe_target(config, pool.role)) for pool in pools]
        self._prober = Prober(targets, self._fetch, interval_s=config.limits.probe_interval_s,
                              timeout_s=config.limits.probe_timeout_s, on_pass=self._publish)
        self._publish()

    async def _fetch(self, url: str, path: str, api_key: str | None) -> tuple[int, bytes]:
        headers = [("Authorization", f"Bearer {api_key}")] if api_key else []
        try:
            return await fetch(self._connections, self._forwarder.origin(url), path, headers,
                               self._limits.probe_timeout_s)
        except UpstreamError as exc:
            raise ConnectionError(str(exc)) from None

    def _publish(self) -> None:
        for name, role in self.roles.items():
            role.note_loads()
            self._views[name] = role.view()
        for name, pool in self.owned.items():
            served = pool.served_id
            self._views[name] = PeerView(
                ready=pool.ready, listed=served is not None and pool.peer_lists(served),
                context=pool.context, extra={"owners": pool.capabilities()["replicas"]})

    async def run(self) -> None:
        """Probe forever (a background task); nothing to do without pools or owners."""
        if self._prober.pools:
            await self._prober.run()

    async def serve(self, req: Request, route: PoolRoute, payload: dict | None,
                    client: Channel, fall_through: FallThrough) -> bool:
        """Place, forward and relay one request; returns whether the connection stays usable."""
        role = self.roles[route.role]
        arrived = req.headers.get("x-lobes-proxied")
        if arrived is not None and role.hosted and role.local_origin is not None:
            # Single hop: served locally, and counted there, so another box's share of the
            # local replica is not mistaken for idle capacity by this box's own placements.
            with role.placer.occupy(role.local_origin, role.default_slots) as placement:
                return await self._local(req, placement, [], fall_through, client)
        if arrived is not None:
            error = errors.proxy_loop(route.role, arrived, f"the {route.role} replica pool")
            client.write(error_bytes(error, keep_alive=req.keep_alive))
            return req.keep_alive
        tried: set[str] = set()
        failures: list[Failure] = []
        want = expected_tokens(payload)
        while (placement := role.placer.place(role.candidates(tried), want)) is not None:
            tried.add(placement.origin)
            with placement:
                if placement.origin == role.local_origin:  # the local path: pressure, tiers
                    reason = [b"X-Lobes-Route-Reason: " + placement.reason.value.encode()]
                    return await self._local(req, placement, reason, fall_through, client)
                kept = await self._attempt(req, role, placement, payload, client, failures)
            if kept is not None:
                return kept
        if not tried:
            return await self._local(req, None, [b"X-Lobes-Route-Reason: none"], fall_through,
                                     client)
        who = f"every replica of the {route.role} pool"
        return self._answer(req, client, exhausted(who, failures, self._retry_after))

    async def _attempt(self, req: Request, role: PooledRole, placement: Placement,
                       payload: dict | None, client: Channel,
                       failures: list[Failure]) -> bool | None:
        """One replica: None when it failed before answering (recorded), else the relay."""
        spec = next(s for s in role.pool.specs if s.origin == placement.origin)
        headers = peer_headers(req, spec.api_key, [("X-Lobes-Proxied", role.role)])
        body = encode_for(req.body, payload, role.pool.served_id if payload else None, False)
        started = time.monotonic()
        response = await self._dial(req, spec.origin, headers, body)
        if response is None:
            failures.append(Failure(spec.origin, None))
            return None
        if moves_on(response.status):
            response.conn.close()
            failures.append(Failure(spec.origin, response.status))
            return None
        extra = [b"X-Lobes-Proxied-By: " + spec.origin.encode(),
                 b"X-Lobes-Route-Reason: " + placement.reason.value.encode()]
        return await self._relay_metered(req, response, placement, started, extra, client)

    async def _local(self, req: Request, placement: Placement | None, extra: list[bytes],
                     fall_through: FallThrough, client: Channel) -> bool:
        """Follow the fall-through and relay its answer with extra headers; a placement on
        the local replica learns its rate from it."""
        started = time.monotonic()
        outcome = await fall_through()
        if not isinstance(outcome, Pending):
            return outcome  # answered already (a refusal, a shed, a failure)
        response, headers = outcome.response, [*outcome.extra, *extra]
        if placement is None:
            return await relay(self._connections, response, client, headers, req.keep_alive)
        return await self._relay_metered(req, response, placement, started, headers, client)

    async def _relay_metered(self, req: Request, response: Response, placement: Placement,
                             started: float, extra: list[bytes],
                             client: Channel) -> bool:
        """Relay a replica's answer; a 200 teaches the replica's rate, streamed or not."""
        if response.status != 200:
            return await relay(self._connections, response, client, extra, req.keep_alive)
        if response.length is not None:
            return await self._relay_learning(req, response, placement, started, extra, client)
        counted = CountingWriter(client)
        kept = await relay(self._connections, response, counted, extra,  # type: ignore[arg-type]
                           req.keep_alive)
        if counted.done or counted.usage_tokens is not None:  # only a stream that ended whole
            placement.record_completion(counted.completion_tokens, time.monotonic() - started)
        return kept

    async def _dial(self, req: Request, url: str, headers: str,
                    body: bytes) -> Response | None:
        return await dial(self._connections, self._forwarder.origin(url), req.target, headers,
                          body, self._timeout)

    async def _relay_learning(self, req: Request, response: Response, placement: Placement,
                              started: float, extra: list[bytes],
                              client: Channel) -> bool:
        """A sized 200 answer: read whole, teach the replica's rate, then relay it."""
        try:
            body = await read_body(response)
        except _BROKEN:
            response.conn.close()
            return False
        finish(self._connections, response)
        placement.record_completion(completion_tokens(body), time.monotonic() - started)
        framing = b"Content-Length: %d" % len(body)
        client.write(head_bytes(response, extra, framing, req.keep_alive) + body)
        return req.keep_alive

    @staticmethod
    def _answer(req: Request, client: Channel, error: ApiError) -> bool:
        client.write(error_bytes(error, (("X-Lobes-Route-Reason", "none"),),
                                 keep_alive=req.keep_alive))
        return req.keep_alive


def exhausted(who: str, failures: list[Failure], retry_after: int) -> ApiError:
    """Everyone tried failed: 404 when all declined (401/403/404), else a retryable 503.

    who names them, e.g. "every replica of the cortex pool".
    """
    named = ", ".join(f.describe() for f in failures)
    if all(f.status in _DECLINES for f in failures):
        return ApiError(404, "role_infeasible", "role_infeasible",
                        f"{who} declined the request: {named}; check the keys "
                        "(P_PEER_API_KEYS, GATEWAY_FLEET_KEY) and that each one hosts the role")
    return errors.backend_unavailable(f"{who} ({named})", retry_after)
