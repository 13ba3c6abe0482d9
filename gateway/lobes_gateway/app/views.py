"""The gateway's own answers: /health, /status, /capabilities, /v1/models(/supported)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lobes_contract import AUDIO_TASKS, CANDIDATES, GENERATE, OFF, ROLES, SERVE

from .. import __version__
from ..mesh.peers import PeerView
from ..mesh.windows import BackendWindows
from ..policy.config import GatewayConfig, RoleConfig
from ..policy.pressure import PressureMonitor
from ..policy.routing import (
    LocalRoute,
    OwnerRoute,
    PoolRoute,
    ProxyRoute,
    Refusal,
    Route,
    Router,
)
from ..transport.upstream import Connections, Origin, UpstreamError, fetch
from .live import Live, box_block

_METRICS = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage_perc",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:request_success_total": "request_success_total",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits_total",
}

PeerViews = Callable[[str], PeerView | None]


def parse_metrics(text: str) -> dict[str, float]:
    """Sum the vLLM metrics the status aggregate reports across their label sets."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = _METRICS.get(name)
        if key is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        totals[key] = totals.get(key, 0.0) + value
    return totals


@dataclass(frozen=True)
class Backend:
    """A local backend the status fan-out visits."""

    name: str
    task: str
    served_name: str
    origin: Origin


def _serving(rc: RoleConfig | None) -> dict[str, object]:
    """What a pooling peer reads of a role served here: its slots and quantization."""
    if rc is None:
        return {}
    known = {"max_active": rc.max_active, "quantization": rc.quantization}
    return {key: value for key, value in known.items() if value is not None}


class Views:
    """Builds the JSON of the gateway's own endpoints."""

    def __init__(self, config: GatewayConfig, router: Router, connections: Connections,
                 pressure: PressureMonitor, peer_views: PeerViews,
                 peer_in_flight: Mapping[str, int],
                 admission: Callable[[], dict[str, dict[str, object]]], live: Live) -> None:
        self._config = config
        self._live = live
        self._admission = admission
        self._peer_in_flight = peer_in_flight
        self._router = router
        self._connections = connections
        self._pressure = pressure
        self._peer_views = peer_views
        self._created = int(time.time())
        self.health_body = json.dumps({"status": "ok", "version": __version__}).encode()
        self._backends = self._local_backends()
        self.windows = BackendWindows(config, connections)

    def _local_backends(self) -> list[Backend]:
        backends = [Backend(rc.name, rc.role.task, rc.served_name, rc.base_url)
                    for rc in self._config.roles.values() if rc.feasible and rc.base_url]
        if self._config.audio_url is not None:
            backends.append(Backend("audio", "audio", "audio", self._config.audio_url))
        return backends

    def _model_entry(self, model_id: str, role: str, context: int | None,
                     **extra: object) -> dict[str, object]:
        entry: dict[str, object] = {"id": model_id, "object": "model", "created": self._created,
                                    "owned_by": "lobes", "root": model_id, "lobes_role": role}
        if context:
            entry["max_model_len"] = context
        entry.update(extra)
        return entry

    def models(self) -> bytes:
        """/v1/models: the local backends that answered their last probe (advertised implies
        reachable), plus peer-served roles a peer now lists."""
        data = [self._model_entry(rc.served_name, rc.name,
                                  self.windows.get(rc.base_url, rc.served_name))
                for rc in self._config.roles.values()
                if rc.feasible and rc.base_url and rc.role.task not in AUDIO_TASKS
                and self.windows.serves(rc.base_url, rc.served_name)]
        for rc in self._config.roles.values():
            route = self._role_route(rc.name)
            if (isinstance(route, ProxyRoute | PoolRoute | OwnerRoute)
                    and rc.role.task not in ("stt", "tts")):
                view = self._peer_views(rc.name)
                if view is not None and view.listed:
                    data.append(self._model_entry(rc.name, rc.name, view.context, proxied=True))
        return json.dumps({"object": "list", "data": data}).encode()

    def supported(self) -> bytes:
        """/v1/models/supported: the static catalog with loaded/default flags."""
        loaded = {rc.served_name for rc in self._config.roles.values()
                  if rc.feasible and rc.base_url}
        default_rc = self._config.roles[self._router.default_role]
        default_ids = {default_rc.served_name, default_rc.role.checkpoint}
        data = []
        for role in ROLES:
            rc = self._config.roles[role.name]
            ids = {role.checkpoint, rc.served_name}
            data.append({"id": role.checkpoint, "object": "model", "role": role.name,
                         "task": role.task, "tier": role.tier, "status": role.status,
                         "tags": [role.status], "context": role.context,
                         "gpu_util": role.gpu_memory_utilization, "loaded": bool(ids & loaded),
                         "default": role.checkpoint in default_ids})
        for checkpoint, status in CANDIDATES:
            data.append({"id": checkpoint, "object": "model", "role": None, "task": GENERATE,
                         "tier": None, "status": status, "tags": [status], "context": None,
                         "gpu_util": None, "loaded": checkpoint in loaded, "default": False})
        return json.dumps({"object": "list", "data": data}).encode()

    def _role_route(self, name: str) -> Route:
        rc = self._config.roles[name]
        if rc.role.task == GENERATE:
            return self._router.generate_routes[name]
        lane = {"embed": "embeddings", "rerank": "rerank", "stt": "transcriptions",
                "tts": "speech"}[rc.role.task]
        return self._router.lane_routes[lane]

    async def _health_of(self, origins: set[Origin]) -> dict[Origin, bool]:
        timeout = self._config.limits.probe_timeout_s

        async def probe(origin: Origin) -> bool:
            try:
                status, _ = await fetch(self._connections, origin, "/health", [], timeout)
            except UpstreamError:
                return False
            return status == 200

        results = await asyncio.gather(*(probe(o) for o in origins))
        return dict(zip(origins, results, strict=True))

    async def capabilities(self) -> bytes:
        """/capabilities: per role feasible, ready, context, proxied, hosted_by (keyless)."""
        routes = {rc.name: self._role_route(rc.name) for rc in self._config.roles.values()}
        origins = {r.targets[0].origin for r in routes.values()
                   if isinstance(r, LocalRoute) and r.targets}
        health = await self._health_of(origins)
        roles = {name: self._capability(name, route, health) for name, route in routes.items()}
        answer: dict[str, object] = {"object": "lobes.capabilities", "version": __version__,
                                     "self_origin": self._config.self_origin, "roles": roles}
        if self._config.box.hardware:  # what peers' live pages show of this box
            answer["box"] = {"hardware": self._config.box.hardware}
        return json.dumps(answer).encode()

    def _capability(self, name: str, route: Route,
                    health: dict[Origin, bool]) -> dict[str, object]:
        rc = self._config.roles[name]
        entry: dict[str, object] = {
            "task": rc.role.task, "tier": rc.role.tier, "route": rc.route,
            "feasible": rc.feasible, "ready": False, "context": rc.max_model_len, "proxied": False,
            "hosted_by": rc.peer_origin if not rc.feasible else None,
            "served_name": rc.served_name,
        }
        if isinstance(route, LocalRoute) and route.targets:
            target = route.targets[0]
            entry["ready"] = health.get(target.origin, False)
            if rc.role.task not in AUDIO_TASKS:
                # Ready means a request for the role is answered: the gear serves its name.
                unserved = self.windows.not_serving(target.origin, target.served_name)
                if unserved is not None or not self.windows.serves(target.origin,
                                                                   target.served_name):
                    entry["ready"] = False
                if unserved is not None:
                    entry["reason"] = unserved
            entry["served_by"] = target.name
            # An unwired tier answered upward (minor -> cortex) is served under that backend's name.
            entry["served_name"] = target.served_name
            entry["context"] = self.windows.get(target.origin, target.served_name)
            entry.update(self._engine(target.origin, target.served_name))
            entry.update(_serving(self._config.roles.get(target.name)))
        elif isinstance(route, ProxyRoute | PoolRoute | OwnerRoute):
            # An unwired tier answered upward (minor -> cortex) is as ready as the role that
            # answers it: that role's peers are the ones probed.
            view = self._peer_views(route.role)
            entry["proxied"] = True
            if route.role != name:
                entry["served_by"] = route.role
            entry["in_flight"] = self._peer_in_flight.get(route.role, 0)
            entry["ready"] = bool(view and view.ready)
            entry["context"] = view.context if view else None
            if view and view.extra:
                entry.update(view.extra)
            if rc.feasible and rc.base_url is not None:  # a hosted pool's own replica
                entry.update(_serving(rc))
                entry.update(self._engine(rc.base_url, rc.served_name))
            if isinstance(route, PoolRoute):  # how it places, and whether streams survive
                entry["policy"] = self._config.pool_policy
                entry["stream_resume"] = rc.stream_resume
        elif isinstance(route, Refusal):
            entry["reason"] = json.loads(route.error.body())["error"]["code"]
        if rc.route == SERVE and rc.base_url is None and entry.get("served_by") != name:
            self._undeclared(entry)
        return entry

    def _undeclared(self, entry: dict[str, object]) -> None:
        """A role nothing is configured for here (the inventory never declared it): routed as
        the role that answers it upward is (a peer asking for it gets that answer), or, with
        none, off and not feasible."""
        answering = entry.get("served_by")
        if answering:
            entry["route"] = self._config.roles[answering].route
        else:
            entry["feasible"], entry["route"] = False, OFF

    async def status(self) -> bytes:
        """/status: fan out to each backend's /health, /metrics and /version, and add what the
        live page shows (rates since the last call, recent TTFT, peer links, the box)."""
        rows = await asyncio.gather(*(self._backend_status(b) for b in self._backends))
        now = time.monotonic()
        for row in rows:
            self._add_live(row, now)
        running = sum(row["metrics"].get("running", 0) for row in rows)
        waiting = sum(row["metrics"].get("waiting", 0) for row in rows)
        default_rc = self._config.roles[self._router.default_role]
        return json.dumps({
            "object": "lobes.fleet_status", "version": __version__,
            "default_model": default_rc.served_name,
            "busy": {"running": int(running), "waiting": int(waiting)},
            "backends": rows, "endpoints": self.endpoints(),
            "pressure": self._pressure.block(self._floor_model()),
            "admission": self._admission(),
            "ttft": self._live.ttft(now),
            "links": self._live.links(),
            "box": box_block(self._config.self_origin, self._config.pressure.proc_root,
                             self._config.box),
        }).encode()

    def _add_live(self, row: dict, now: float) -> None:
        """A backend row's ready verdict, its engine's counters as rates, its last error."""
        name, metrics = row["name"], row["metrics"]
        if row["health"] != "ok":
            row["ready"], row["reason"] = False, f"/health: {row['health']}"
            self._live.gear_down(name)
        else:
            row["ready"], row["reason"] = True, None
            rc = self._config.roles.get(name)
            if rc is not None and rc.base_url is not None and rc.role.task not in AUDIO_TASKS:
                unserved = self.windows.not_serving(rc.base_url, rc.served_name)
                if unserved is not None:
                    row["ready"], row["reason"] = False, unserved
        for key in ("running", "waiting", "kv_cache_usage_perc"):
            row[key] = metrics.get(key)
        row.update(self._live.gear(name, metrics, now))

    def _engine(self, origin: Origin, served_name: str) -> dict[str, object]:
        """A local gear's engine version and model root, and how old that reading is."""
        return {"engine_version": self.windows.engine_version(origin, served_name),
                "model_root": self.windows.model_root(origin, served_name),
                "engine_version_age_s": self.windows.engine_age(origin, served_name)}

    def _floor_model(self) -> str | None:
        """The served name a minor request reaches (its own gear, or the primary it falls to)."""
        route = self._router.resolve("chat", "minor").route
        return route.targets[0].served_name if isinstance(route, LocalRoute) else None

    async def _backend_status(self, backend: Backend) -> dict:
        timeout = self._config.limits.probe_timeout_s
        row: dict = {"name": backend.name, "task": backend.task,
                     "served_name": backend.served_name, "url": backend.origin.url,
                     "health": "down", "metrics": {}, "engine_version": None}
        try:
            status, _ = await fetch(self._connections, backend.origin, "/health", [], timeout)
            row["health"] = "ok" if status == 200 else f"http {status}"
            if backend.task != "audio":
                status, body = await fetch(self._connections, backend.origin, "/metrics", [],
                                           timeout)
                if status == 200:
                    row["metrics"] = parse_metrics(body.decode("utf-8", "replace"))
                if row["health"] == "ok":
                    row["engine_version"] = self.windows.engine_version(backend.origin,
                                                                        backend.served_name)
        except UpstreamError:
            pass
        return row

    def gear_roles(self) -> list[str]:
        """The roles whose own gear runs on this box (their /metrics are relayed)."""
        return [backend.name for backend in self._backends if backend.task != "audio"]

    async def gear_metrics(self, role: str) -> tuple[int, bytes] | None:
        """The /metrics of this box's own gear for `role`, fetched now: (status, body), or
        None when no such gear runs here. An unreachable gear is a 502 naming it."""
        for backend in self._backends:
            if backend.name == role and backend.task != "audio":
                break
        else:
            return None
        try:
            return await fetch(self._connections, backend.origin, "/metrics", [],
                               self._config.limits.probe_timeout_s)
        except UpstreamError as exc:
            return 502, f"gear {role} at {backend.origin.url} did not answer: {exc}\n".encode()

    def endpoints(self) -> list[str]:
        """The data-plane paths this box answers (not refusals)."""
        paths = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/supported"]
        lane_paths = {"embeddings": ["/v1/embeddings"], "rerank": ["/v1/rerank", "/v1/score"],
                      "transcriptions": ["/v1/audio/transcriptions"],
                      "speech": ["/v1/audio/speech"], "realtime": ["/v1/realtime"]}
        for lane, route in self._router.lane_routes.items():
            if not isinstance(route, Refusal):
                paths.extend(lane_paths[lane])
        return paths
