"""Request (lane, model) -> a typed route: local backend(s), peer(s), or a refusal.

A route is the plan of a request: who may answer it, in what order, and what to answer when
none can; the role's mode (P_ROUTE) decides which kind. app/dispatch.py turns a route into
attempts and runs them. Routes depend only on the static configuration, so every route is
computed once at start-up and a request costs one or two dict look-ups.
"""

from __future__ import annotations

from dataclasses import dataclass

from lobes_contract import (
    AUDIO_TASKS,
    EMBED,
    FALLBACK_ROLE,
    GENERATE,
    OWNERS,
    POOL,
    PRIMARY_ROLE,
    PROXY,
    RERANK,
)

from ..transport import errors
from ..transport.upstream import Origin
from .config import ConfigError, GatewayConfig, RoleConfig

# Lanes: the generate lane is model-routed, the others are routed by path.
CHAT = "chat"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
RERANKING = "rerank"
TRANSCRIPTION = "transcriptions"
SPEECH = "speech"
REALTIME = "realtime"

GENERATE_LANES = frozenset({CHAT, COMPLETIONS})
_LANE_ROLE = {EMBEDDINGS: "embedder", RERANKING: "reranker", TRANSCRIPTION: "stt",
              SPEECH: "tts", REALTIME: "stt"}
# Generate roles that fall upward to the primary when their own gear is not wired.
_UPWARD_TO_PRIMARY = frozenset({"minor", "senses", "middle", FALLBACK_ROLE})


@dataclass(frozen=True)
class Target:
    """One local backend a request can be sent to."""

    name: str
    origin: Origin
    served_name: str
    # The gear runs vLLM's priority scheduling: a request's class goes with it as `priority`.
    priority_scheduling: bool = False


@dataclass(frozen=True)
class LocalRoute:
    """Serve on this box: targets in failover order; the model is rewritten unless verbatim."""

    role: str
    tier: str | None
    targets: tuple[Target, ...]
    rewrite_model: bool
    strict_lane: bool


@dataclass(frozen=True)
class Refusal:
    """Answer with an error and dial nothing (role_infeasible, not wired)."""

    role: str
    error: errors.ApiError


@dataclass(frozen=True)
class ProxyRoute:
    """Forward to the one declared peer (P_ROUTE=proxy)."""

    role: str
    tier: str | None
    origin: str
    api_key: str | None
    peer_model: str | None


@dataclass(frozen=True)
class PoolRoute:
    """Place across the declared replicas (P_ROUTE=pool, P_PEER_ORIGINS)."""

    role: str
    tier: str | None
    config: RoleConfig
    fall_through: ProxyRoute | LocalRoute | Refusal


@dataclass(frozen=True)
class OwnerRoute:
    """Forward to the owners of a model in routing order (P_ROUTE=owners)."""

    role: str
    owners: tuple[str, ...]
    refusal: Refusal  # a marked arrival is answered with it: never forwarded twice


Route = LocalRoute | Refusal | ProxyRoute | PoolRoute | OwnerRoute
# A role answered by other boxes.
PeerRoute = ProxyRoute | PoolRoute | OwnerRoute


@dataclass(frozen=True)
class Resolved:
    """A generate-lane resolution: the route plus the tier the caller asked for."""

    route: Route
    requested_tier: str | None


class Router:
    """Precomputed routing tables for one configuration."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._roles = config.roles
        self._names = self._model_names()
        self._default_role = self._resolve_default()
        self.generate_routes = {name: self._generate_route(name, CHAT)
                                for name, rc in self._roles.items() if rc.role.task == GENERATE}
        self.completion_routes = {name: self._generate_route(name, COMPLETIONS)
                                  for name in self.generate_routes}
        self.lane_routes = {lane: self._lane_route(lane) for lane in _LANE_ROLE}
        self._resolved = {
            lane: {name: Resolved(route, self._roles[name].role.tier)
                   for name, route in table.items()}
            for lane, table in ((CHAT, self.generate_routes),
                                (COMPLETIONS, self.completion_routes))
        }

    def routes(self) -> list[Route]:
        """Every precomputed route (a role's chat and completion routes both)."""
        return [*self.generate_routes.values(), *self.completion_routes.values(),
                *self.lane_routes.values()]

    @property
    def default_role(self) -> str:
        return self._default_role

    def _model_names(self) -> dict[str, str]:
        names: dict[str, str] = {}
        for rc in self._roles.values():
            if rc.role.task != GENERATE:
                continue
            names.setdefault(rc.role.checkpoint, rc.name)
            names.setdefault(rc.name, rc.name)
        for rc in self._roles.values():
            if rc.role.task == GENERATE and rc.wired:
                names[rc.served_name] = rc.name  # a live served name outranks a catalog default
        for rc in self._roles.values():
            for alias in rc.role.aliases:
                names[alias] = rc.name
        for alias, target in self._config.aliases.items():
            if target not in names:
                raise ConfigError("GATEWAY_ALIASES", f"{alias}={target} names no generate role",
                                  "target a tier alias, role name or served model name")
            names[alias] = names[target]
        return names

    def _resolve_default(self) -> str:
        default = self._config.default_model
        if default is None:
            return PRIMARY_ROLE
        if default not in self._names:
            raise ConfigError("GATEWAY_DEFAULT_MODEL", f"{default!r} names no generate role",
                              "use a tier alias (main), a role name or a served model name")
        return self._names[default]

    def role_for_model(self, model: object) -> str:
        """The generate role a model name selects; missing or unknown -> the default."""
        if isinstance(model, str):
            return self._names.get(model, self._default_role)
        return self._default_role

    def resolve(self, lane: str, model: object) -> Resolved:
        """The route of a generate-lane request by its model name."""
        return self._resolved[lane][self.role_for_model(model)]

    def _generate_route(self, name: str, lane: str) -> Route:
        rc = self._roles[name]
        if not rc.feasible:
            return self._elsewhere(rc)
        if rc.wired:
            local = self._local(rc, lane)
            # A hosted pool: this box's own backend and its peers' (P_PEER_ORIGINS).
            return PoolRoute(name, rc.role.tier, rc, local) if rc.route == POOL else local
        if name in _UPWARD_TO_PRIMARY and name != PRIMARY_ROLE:
            return self._generate_route(PRIMARY_ROLE, lane)
        return Refusal(name, errors.not_wired(name, f"{rc.role.prefix}_BASE_URL"))

    def _local(self, rc: RoleConfig, lane: str) -> LocalRoute:
        targets = ([Target(rc.name, rc.base_url, rc.served_name, rc.priority_scheduling)]
                   if rc.base_url else [])
        fallback = self._roles[FALLBACK_ROLE]
        if rc.name == PRIMARY_ROLE and fallback.wired and fallback.feasible:
            targets.append(Target(fallback.name, fallback.base_url, fallback.served_name))
        strict = lane == CHAT and rc.name == PRIMARY_ROLE and self._config.force_strict_tools
        return LocalRoute(rc.name, rc.role.tier, tuple(targets), True, strict)

    def _elsewhere(self, rc: RoleConfig, proxiable: bool = True) -> Route:
        """An infeasible role by its route mode: pool, proxy, owners, or a refusal (a referral
        names hosted_by)."""
        refusal = Refusal(rc.name, errors.role_infeasible(rc.name, rc.peer_origin))
        if not proxiable:
            return refusal
        single: ProxyRoute | Refusal = refusal
        if rc.route in (PROXY, POOL) and rc.peer_origin:
            single = ProxyRoute(rc.name, rc.role.tier, rc.peer_origin, rc.peer_api_key,
                                _peer_model(rc))
        elif rc.route == POOL:
            # No singular peer declared: the first replica takes what placement cannot place
            # (every replica full under the queue policy), never a refusal.
            first = rc.peers[0]
            single = ProxyRoute(rc.name, rc.role.tier, first.origin, first.api_key,
                                _peer_model(rc))
        if rc.route == POOL:
            return PoolRoute(rc.name, rc.role.tier, rc, single)
        if rc.route == OWNERS:
            owners = tuple(p.origin for p in rc.peers) or (rc.peer_origin,)
            return OwnerRoute(rc.name, owners, refusal)
        return single

    def _lane_route(self, lane: str) -> Route:
        rc = self._roles[_LANE_ROLE[lane]]
        if not rc.feasible:
            return self._elsewhere(rc, proxiable=lane != REALTIME)
        if rc.role.task in AUDIO_TASKS:
            origin = rc.base_url or self._config.audio_url
            if origin is None:
                return Refusal(rc.name, errors.not_wired(rc.name, "AUDIO_URL"))
            return LocalRoute(rc.name, None, (Target(rc.name, origin, rc.served_name),),
                              False, False)
        if rc.base_url is None:
            return Refusal(rc.name, errors.not_wired(rc.name, f"{rc.role.prefix}_BASE_URL"))
        assert rc.role.task in (EMBED, RERANK)
        return LocalRoute(rc.name, None, (Target(rc.name, rc.base_url, rc.served_name),),
                          True, False)


def _peer_model(rc: RoleConfig) -> str | None:
    """The model name a proxied generate request carries: the role name the peer resolves."""
    if rc.role.task != GENERATE:
        return None
    return rc.name if rc.name in rc.role.aliases else (rc.role.tier or rc.served_name)
