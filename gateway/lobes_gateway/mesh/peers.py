"""What this box knows of the boxes that answer for its roles, kept by one background prober.

Routing names, per role, the peers that may answer it: a pool's replicas, the one proxied peer,
or the owners a request is forwarded to. PeerWatch holds a ReplicaSet for each, probes them all
in one loop, and publishes what it saw as PeerViews for /capabilities and /v1/models: a role
appears there, and reports ready, only while the latest probe saw a peer host it. A pool also
gets a Placer (policy/placer.py) that places each request on its selectable replicas.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from lobes_contract import AUDIO_TASKS

from ..policy.config import GatewayConfig, RoleConfig, parse_origin
from ..policy.placer import Candidate, Placement, Placer
from ..policy.policies import Policy, RouteReason, policy_named
from ..policy.prefix import RequestShape
from ..policy.routing import OwnerRoute, PoolRoute, ProxyRoute, Route, Router
from ..transport import errors
from ..transport.errors import ApiError
from ..transport.upstream import Connections, Origin, UpstreamError, fetch
from .replicas import (
    MAX_PROBE_BYTES,
    Fingerprint,
    Prober,
    ProbeTarget,
    ReplicaSet,
    ReplicaSpec,
    ReplicaState,
    log,
    with_local_replica,
)

# The loop's timers may fire up to its clock resolution early: the wake waits this much past
# the forecast end so the forecast has freed the slot when the queue looks.
EXTERNAL_WAKE_MARGIN_S = 0.005


@dataclass(frozen=True)
class PeerView:
    """What the background prober last saw of a role answered by peers."""

    ready: bool
    listed: bool
    context: int | None
    extra: dict[str, object] | None = None


@dataclass
class PooledRole:
    """One pooled role: its replicas' state, its placer, and the slots each replica runs."""

    role: str
    replicas: ReplicaSet
    placer: Placer
    default_slots: int
    # The replica a peer-only pool's fall-through names (P_PEER_ORIGIN, else the first one).
    singular: str | None = None
    # Wakes the pool's queue when other boxes' probed work is forecast to free a slot.
    _external_wake: asyncio.TimerHandle | None = field(default=None, repr=False)

    def candidates(self, exclude: set[str],
                   request: RequestShape | None = None) -> list[Candidate]:
        """The selectable replicas not tried yet whose window the request fits."""
        return [Candidate(s.origin, s.slots or self.default_slots, s.window)
                for s in self.replicas.selectable()
                if s.origin not in exclude and (request is None or request.fits(s.window))]

    def too_long(self, request: RequestShape) -> ApiError | None:
        """A 400 naming the largest window when replicas are selectable but the request fits
        none of them; None otherwise (it fits one, or nothing is selectable to judge by)."""
        windows = [s.window for s in self.replicas.selectable()]
        if not windows or any(request.fits(window) for window in windows):
            return None
        largest = max(w for w in windows if w is not None)
        return errors.context_length_exceeded(self.role, request.prompt_tokens,
                                              request.max_tokens, largest)

    def failover(self, tried: set[str], request: RequestShape | None = None) -> Placement | None:
        """After a replica failed: the first selectable replica not tried yet that the
        request fits, counted even when the policy finds it full (None when there is none)."""
        left = self.candidates(tried, request)
        if not left:
            return None
        return self.placer.occupy(left[0].origin, left[0].slots, RouteReason.FAILOVER)

    def overflow(self, tried: set[str], request: RequestShape | None = None) -> Placement | None:
        """When the policy finds every selectable replica full (queue): the replica the pool
        falls through to (this box's own, else the singular peer) while it is selectable, else
        the first selectable one, counted there; None when none is selectable. A request is
        never sent to a replica the prober judged down while another one is up."""
        left = self.candidates(tried, request)
        if not left:
            return None
        preferred = self.local_origin or self.singular
        chosen = next((c for c in left if c.origin == preferred), left[0])
        return self.placer.occupy(chosen.origin, chosen.slots, RouteReason.NONE)

    @property
    def local_origin(self) -> str | None:
        """The origin of this box's own backend when it is one of the replicas."""
        return next((spec.origin for spec in self.replicas.specs if spec.is_local), None)

    @property
    def hosted(self) -> bool:
        return self.local_origin is not None

    def spec(self, origin: str) -> ReplicaSpec:
        return next(s for s in self.replicas.specs if s.origin == origin)

    def note_loads(self) -> None:
        """Hand each peer's probed load to placement (a dark peer's is forgotten, and so is
        the prefix it held: it comes back with an empty cache)."""
        for state in self.replicas.states:
            self.placer.note_load(state.origin, state.load if state.ready else None,
                                  state.judged_at)
            if not state.ready:
                self.placer.forget_prefixes(state.origin)
        self.placer.room_changed()
        self._wake_when_external_work_ends()

    def _wake_when_external_work_ends(self) -> None:
        """Tell the queue when other boxes' work is forecast to free a slot, not only at the
        next probe: requests held for it would otherwise wait a probe interval for nothing."""
        if self._external_wake is not None:
            self._external_wake.cancel()
            self._external_wake = None
        delay = self.placer.external_ends_in_s(self.candidates(set()))
        if delay is not None:
            self._external_wake = asyncio.get_running_loop().call_later(
                delay + EXTERNAL_WAKE_MARGIN_S, self._external_work_ended)

    def _external_work_ended(self) -> None:
        self._external_wake = None
        self.placer.room_changed()
        self._wake_when_external_work_ends()

    def _row(self, state: ReplicaState) -> dict[str, object]:
        """A replica's /capabilities row: its verdict plus the rates placement now uses and
        the sessions it counts as bound there (forecasting policies only)."""
        row = state.snapshot()
        rate = self.placer.rate(state.origin)
        if rate is not None:
            row["rate"] = round(rate, 2)
        if self.placer.policy.forecasts:
            prefill_rate = self.placer.prefill_rate(state.origin)
            if prefill_rate is not None:
                row["prefill_rate"] = round(prefill_rate, 1)
            row["sessions"] = self.placer.conversations.bound(state.origin)
        return row

    def view(self) -> PeerView:
        """What /capabilities and /v1/models publish for the role."""
        served = self.replicas.served_id
        extra: dict[str, object] = {"replicas": [self._row(s) for s in self.replicas.states]}
        if served is not None:
            extra["served_name"] = served
        if self.hosted:
            extra["proxied"] = False
        # A hosted pool's model is listed as this box's own backend already.
        listed = not self.hosted and served is not None and self.replicas.peer_lists(served)
        return PeerView(ready=self.replicas.ready, listed=listed, context=self.replicas.context,
                        extra=extra)


def replica_specs(rc: RoleConfig) -> tuple[ReplicaSpec, ...]:
    """The pool's replicas as config declared them (keys already inherited)."""
    return tuple(ReplicaSpec(origin=p.origin, api_key=p.api_key, prior_rate=p.rate)
                 for p in rc.peers)


def planned_fingerprint(rc: RoleConfig) -> Fingerprint | None:
    """What the plan says every peer of the role serves (its served name and runtime), the
    reference they are judged by; None when this box's .env declares no served name (the
    first ready peer is then the reference), and for the audio lanes, which list no model."""
    if not rc.served_name_declared or rc.role.task in AUDIO_TASKS:
        return None
    return Fingerprint(rc.served_name, None, rc.quantization)


def _pooled_role(route: PoolRoute, policy: Policy, self_origin: str | None) -> PooledRole:
    rc = route.config
    specs = replica_specs(rc)
    if rc.base_url is not None:
        specs = with_local_replica(specs, local_url=rc.base_url.url, self_origin=self_origin)
    placer = Placer(policy, {s.origin: s.prior_rate for s in specs})
    singular = route.fall_through.origin if isinstance(route.fall_through, ProxyRoute) else None
    replicas = ReplicaSet(route.role, specs, planned_fingerprint(rc))
    return PooledRole(route.role, replicas, placer, rc.max_active or 1, singular)


def _probe_target(config: GatewayConfig, role: str) -> ProbeTarget:
    """Audio roles are judged from /capabilities alone: they have no /v1/models entry.

    served_id is what this box's own backend must list when it is one of the replicas.
    """
    rc = config.roles[role]
    return ProbeTarget(role, served_id=rc.served_name, audio=rc.role.task in AUDIO_TASKS)


def _set_view(replicas: ReplicaSet, extra: dict[str, object]) -> PeerView:
    """The view of a proxied peer or of owners: listed while a ready one lists the model."""
    served = replicas.served_id
    return PeerView(ready=replicas.ready,
                    listed=served is not None and replicas.peer_lists(served),
                    context=replicas.context, extra=extra)


class PeerWatch:
    """Every peer route's replica set, the one prober that judges them, and their views."""

    def __init__(self, config: GatewayConfig, router: Router, connections: Connections) -> None:
        self._connections = connections
        self._timeout = config.limits.probe_timeout_s
        self._origins: dict[str, Origin] = {}
        # The proxied and owner routes' views as of the last probe pass (a pool's is live).
        self._views: dict[str, PeerView] = {}
        self.pooled: dict[str, PooledRole] = {}
        self._proxied: dict[str, ReplicaSet] = {}
        self._owned: dict[str, ReplicaSet] = {}
        self._targets: list[tuple[ReplicaSet, ProbeTarget]] = []
        self._audio = frozenset(name for name, rc in config.roles.items()
                                if rc.role.task in AUDIO_TASKS)
        policy = policy_named(config.pool_policy)
        for route in router.routes():
            self._watch(route, config, policy)
        self._prober = Prober(self._targets, self._fetch, interval_s=config.limits.probe_interval_s,
                              timeout_s=self._timeout, on_pass=self._publish)
        self._publish()

    def _watch(self, route: Route, config: GatewayConfig, policy: Policy) -> None:
        """Keep the replica set of a peer route (a role's chat and completion routes share it)."""
        if isinstance(route, PoolRoute) and route.role not in self.pooled:
            pooled = self.pooled[route.role] = _pooled_role(route, policy, config.self_origin)
            self._targets.append((pooled.replicas, _probe_target(config, route.role)))
        elif isinstance(route, ProxyRoute) and route.role not in self._proxied:
            peer = ReplicaSet(route.role, (ReplicaSpec(route.origin, route.api_key),),
                              planned_fingerprint(config.roles[route.role]))
            self._proxied[route.role] = peer
            # This box expects no served id of its own for a proxied role: the role alone.
            audio = config.roles[route.role].role.task in AUDIO_TASKS
            self._targets.append((peer, ProbeTarget(route.role, audio=audio)))
        elif isinstance(route, OwnerRoute) and route.role not in self._owned:
            specs = tuple(ReplicaSpec(origin=o, api_key=config.fleet_key)
                          for o in dict.fromkeys(route.owners))
            owners = self._owned[route.role] = ReplicaSet(
                route.role, specs, planned_fingerprint(config.roles[route.role]))
            self._targets.append((owners, _probe_target(config, route.role)))

    def origin(self, url: str) -> Origin:
        """A peer's origin as dialled (parsed once; config validated every declared one)."""
        origin = self._origins.get(url)
        if origin is None:
            origin = self._origins[url] = parse_origin("peer origin", url)
        return origin

    async def _fetch(self, url: str, path: str, api_key: str | None) -> tuple[int, bytes]:
        headers = [("Authorization", f"Bearer {api_key}")] if api_key else []
        try:
            return await fetch(self._connections, self.origin(url), path, headers,
                               self._timeout, MAX_PROBE_BYTES)
        except UpstreamError as exc:
            raise ConnectionError(str(exc)) from None

    def peer_states(self) -> list[tuple[str, ReplicaState]]:
        """(role, state) of every proxied peer and owner, as the last probe pass judged it
        (a pool's replicas have their own families)."""
        return [(role, state) for sets in (self._proxied, self._owned)
                for role, replicas in sorted(sets.items()) for state in replicas.states]

    def proxied_roles(self) -> list[str]:
        """The roles answered by one proxied peer."""
        return sorted(self._proxied)

    def owners_in_order(self, role: str, owners: list[str]) -> list[str]:
        """The owners to try, in routing order: those the prober judged selectable first, the
        others after them (a probe may be stale; a peer judged bad is asked last, never
        first)."""
        judged = self._owned.get(role)
        if judged is None:
            return owners
        good = {state.origin for state in judged.selectable()}
        return [o for o in owners if o in good] + [o for o in owners if o not in good]

    def served_id(self, role: str) -> str | None:
        """The model a peer's answer for `role` must name: the plan's, else what the peers
        advertise (None while nothing is known, and for an audio lane, whose answers name no
        model: the answer is then not checked)."""
        if role in self._audio:
            return None
        replicas = (self._proxied.get(role) or self._owned.get(role)
                    or (self.pooled[role].replicas if role in self.pooled else None))
        return replicas.served_id if replicas is not None else None

    def view(self, role: str) -> PeerView | None:
        """A peer route's view: a pool's is built now, so the rates it shows are the ones
        placement uses this moment; the others are as the last probe pass saw them."""
        pooled = self.pooled.get(role)
        return pooled.view() if pooled is not None else self._views.get(role)

    def note_failed(self, role: str, origin: str, reason: str) -> None:
        """A request to `origin` for `role` failed as a down peer fails: the role's replica
        there is not ready (placed last, published so) until the next probe pass."""
        sets = [self._proxied.get(role), self._owned.get(role)]
        if role in self.pooled:
            sets.append(self.pooled[role].replicas)
        changed = [replicas.note_failed(origin, reason) for replicas in sets if replicas]
        if any(changed):
            log(f"{role} replica {origin} is not selectable: {reason}")
            self._publish()

    def _publish(self) -> None:
        for role in self.pooled.values():
            role.note_loads()
        for name, peer in self._proxied.items():
            extra: dict[str, object] = {"peer": peer.states[0].snapshot()}
            if peer.served_id is not None:
                extra["served_name"] = peer.served_id
            self._views[name] = _set_view(peer, extra)
        for name, owners in self._owned.items():
            self._views[name] = _set_view(owners, {"owners": owners.capabilities()["replicas"]})

    async def run(self) -> None:
        """Probe forever (a background task); nothing to do without peer routes."""
        if self._prober.replica_sets:
            await self._prober.run()
