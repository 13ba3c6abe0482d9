"""Owner forwarding (seed 003): a role this box does not host is answered by a box that does.

Armed by GATEWAY_FLEET_KEY on a role declared infeasible with peer origins and no
P_PEER_PROXY (routing's OwnerRoute). The whole request goes to the owners in routing order
(P_PEER_ORIGINS, else P_PEER_ORIGIN; a box declared twice is asked once) under the fleet key,
marked X-Lobes-Forwarded-By: <this box>. A transport error, a timeout, a 5xx or a
401/403/404 moves on to the next owner; any other status is the owner's answer, relayed as
it came. A marked arrival is answered where it lands and never forwarded again. When no
owner answers, the route's fall-through serves (this box's own backend), or the answer is
a 404 naming the owners when every one declined, a retryable 503 otherwise.
"""

from __future__ import annotations

import socket

from .channel import Channel
from .config import GatewayConfig
from .forward import Forwarder, encode_for, peer_headers
from .http import Request, error_bytes
from .pool import Failure, FallThrough, dial, exhausted, moves_on
from .relay import relay
from .routing import LocalRoute, OwnerRoute
from .upstream import Pool as Connections

FORWARDED_BY = "X-Lobes-Forwarded-By"
_MARKERS = ("x-lobes-forwarded-by", "x-lobes-proxied")


def distinct_boxes(origins: tuple[str, ...]) -> list[str]:
    """Owners in routing order, each box once (two replicas on one box are asked once)."""
    return list(dict.fromkeys(origins))


def this_box(config: GatewayConfig) -> str:
    """The origin this box names itself by: GATEWAY_SELF_ORIGIN, else host name and port."""
    return config.self_origin or f"http://{socket.gethostname()}:{config.port}"


class Owners:
    """Forwards owner-routed requests under the fleet key."""

    def __init__(self, config: GatewayConfig, connections: Connections,
                 forwarder: Forwarder) -> None:
        self._connections = connections
        self._forwarder = forwarder
        self._fleet_key = config.fleet_key
        self._me = this_box(config)
        self._timeout = config.limits.upstream_timeout_s
        self._retry_after = config.pressure.retry_after_s

    async def serve(self, req: Request, route: OwnerRoute, payload: dict | None,
                    client: Channel, fall_through: FallThrough) -> bool:
        """Ask each owner in turn; returns whether the client connection stays usable."""
        if any(marker in req.headers for marker in _MARKERS):
            return await fall_through()
        headers = peer_headers(req, self._fleet_key, [(FORWARDED_BY, self._me)])
        # The body names the role this box resolved, so a request without a model is
        # answered for the same role on the owner.
        body = encode_for(req.body, payload, route.role if payload is not None else None, False)
        failures: list[Failure] = []
        for owner in distinct_boxes(route.owners):
            response = await dial(self._connections, self._forwarder.origin(owner), req.target,
                                  headers, body, self._timeout)
            if response is None or moves_on(response.status):
                if response is not None:
                    response.conn.close()
                failures.append(Failure(owner, None if response is None else response.status))
                continue
            attribution = [b"X-Lobes-Proxied-By: " + owner.encode()]
            return await relay(self._connections, response, client, attribution, req.keep_alive)
        if isinstance(route.fall_through, LocalRoute):
            return await fall_through()
        who = f"every owner of {route.role}"
        error = exhausted(who, failures, self._retry_after)
        client.write(error_bytes(error, keep_alive=req.keep_alive))
        return req.keep_alive
