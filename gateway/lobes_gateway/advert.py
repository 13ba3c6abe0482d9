"""Honest advertising of single-peer proxied roles: a background prober of each declared peer.

A proxied role appears on /v1/models, and reports ready on /capabilities, only while the
latest probe saw the peer host it: its /capabilities entry ready and (for model-routed roles)
its own /v1/models listing the served id, read with the pairwise key.
"""

from __future__ import annotations

from lobes_contract import AUDIO_TASKS

from .config import GatewayConfig
from .forward import Forwarder
from .peers import Pool, Prober, ProbeTarget, ReplicaSpec
from .routing import ProxyRoute, Router
from .upstream import Pool as Connections
from .upstream import UpstreamError, fetch
from .views import PeerView


class ProxyAdverts:
    """Probes the peer of every ProxyRoute and publishes what it saw as PeerViews."""

    def __init__(self, config: GatewayConfig, router: Router, connections: Connections,
                 forwarder: Forwarder, views: dict[str, PeerView]) -> None:
        self._connections = connections
        self._forwarder = forwarder
        self._views = views
        self._timeout = config.limits.probe_timeout_s
        self.pools: dict[str, Pool] = {}
        targets: list[tuple[Pool, ProbeTarget]] = []
        routes = [*router.generate_routes.values(), *router.lane_routes.values()]
        for route in routes:
            if not isinstance(route, ProxyRoute) or route.role in self.pools:
                continue
            task = config.roles[route.role].role.task
            pool = Pool(route.role, (ReplicaSpec(route.origin, route.api_key),))
            self.pools[route.role] = pool
            targets.append((pool, ProbeTarget(route.role, audio=task in AUDIO_TASKS)))
        self._prober = Prober(targets, self._fetch, interval_s=config.limits.probe_interval_s,
                              timeout_s=self._timeout, on_pass=self._publish)
        self._publish()

    async def _fetch(self, url: str, path: str, api_key: str | None) -> tuple[int, bytes]:
        headers = [("Authorization", f"Bearer {api_key}")] if api_key else []
        try:
            return await fetch(self._connections, self._forwarder.origin(url), path, headers,
                               self._timeout)
        except UpstreamError as exc:
            raise ConnectionError(str(exc)) from None

    def _publish(self) -> None:
        for role, pool in self.pools.items():
            served = pool.served_id
            state = pool.states[0]
            extra: dict[str, object] = {"peer": state.snapshot()}
            if served is not None:
                extra["served_name"] = served
            self._views[role] = PeerView(
                ready=pool.ready, listed=served is not None and pool.peer_lists(served),
                context=pool.context, extra=extra)

    async def run(self) -> None:
        """Probe forever (a background task); nothing to do without proxied roles."""
        if self.pools:
            await self._prober.run()
