"""Send a routed request upstream: local targets with failover, or the one declared peer."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Coroutine

from . import errors
from .channel import Channel
from .config import GatewayConfig, Origin, parse_origin
from .errors import ApiError
from .http import Request, error_bytes, header_block, header_names, response_bytes
from .relay import Pending
from .routing import LocalRoute, ProxyRoute, Target
from .upstream import Pool, Response, UpstreamError, exchange, finish, read_body, request_head

# Request header lines that describe the client hop; the gateway sets its own.
_REQUEST_HOP = header_names("connection", "keep-alive", "proxy-connection", "te", "trailer",
                            "transfer-encoding", "upgrade", "host", "content-length", "expect")
# Markers of vLLM's 400 when strict tool schemas cannot be compiled into a grammar.
_COMPILE_FAILURE = (b"grammar", b"schema")


# What a peer must not see of the caller's headers: its key and the markers of earlier hops
# (a proxy keeps X-Lobes-Forwarded-By, so an owner-forwarded request stays marked).
TO_PROXY_PEER = header_names("authorization", prefixes=("x-lobes-proxied",))
TO_PEER = header_names("authorization", prefixes=("x-lobes-proxied", "x-lobes-forwarded"))


def forward_headers(req: Request) -> str:
    """The caller's end-to-end header lines, as forwarded to a local backend."""
    return _REQUEST_HOP.sub("", req.header_block)


def peer_headers(req: Request, api_key: str | None, markers: list[tuple[str, str]],
                 strip: re.Pattern[str] = TO_PEER) -> str:
    """The caller's header lines for a peer: `strip`ped of its key and markers, ours attached."""
    block = strip.sub("", forward_headers(req))
    if api_key:
        block += f"Authorization: Bearer {api_key}\r\n"
    return block + header_block(markers)


def inject_strict(payload: dict) -> dict | None:
    """A copy with strict:true on each function tool lacking its own strict; None if unchanged."""
    tools = payload.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    changed = False
    new_tools = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and "strict" not in function:
            tool = {**tool, "function": {**function, "strict": True}}
            changed = True
        new_tools.append(tool)
    return {**payload, "tools": new_tools} if changed else None


def encode_for(raw: bytes, payload: dict | None, model: str | None, modified: bool) -> bytes:
    """The body to send: the caller's bytes unless the model or the payload must change."""
    if payload is None:
        return raw
    if model is not None and payload.get("model") != model:
        payload = {**payload, "model": model}
        modified = True
    if not modified:
        return raw
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def is_compile_failure(status: int, body: bytes) -> bool:
    lowered = body.lower()
    return status == 400 and any(marker in lowered for marker in _COMPILE_FAILURE)


class Forwarder:
    """Dials upstream for routed requests and relays what comes back."""

    def __init__(self, config: GatewayConfig, pool: Pool) -> None:
        self._pool = pool
        self._timeout = config.limits.upstream_timeout_s
        self._retry_after = config.pressure.retry_after_s
        self._origins: dict[str, Origin] = {}

    def origin(self, url: str) -> Origin:
        origin = self._origins.get(url)
        if origin is None:
            origin = self._origins[url] = parse_origin("peer origin", url)
        return origin

    def _send(self, req: Request, origin: Origin, headers: str,
              body: bytes) -> Coroutine[object, object, Response]:
        """The exchange to await (returned, not awaited here: one coroutine frame less)."""
        head = request_head("POST", req.target, origin, headers, len(body))
        return exchange(self._pool, origin, head, body, self._timeout)

    async def local(self, req: Request, route: LocalRoute, payload: dict | None,
                    headers: str, extra: list[bytes],
                    client: Channel) -> bool | Pending:
        """Try the targets in order: refused or 5xx-before-body moves on; a 4xx is final."""
        strict = inject_strict(payload) if route.strict_lane and payload is not None else None
        targets = route.targets
        for index, target in enumerate(targets):
            model = target.served_name if route.rewrite_model else None
            try:
                if strict is None:
                    body = encode_for(req.body, payload, model, False)
                    response = await self._send(req, target.origin, headers, body)
                else:
                    response = await self._attempt_strict(req, target, payload, strict, model,
                                                          headers, client, extra)
            except UpstreamError:
                continue
            if isinstance(response, bool):
                return response
            if response.status >= 500 and index + 1 < len(targets):
                response.conn.close()
                continue
            return Pending(response, extra)
        if len(targets) == 1:
            error = errors.backend_unavailable(f"the {route.role} backend", self._retry_after)
        else:
            error = errors.upstream_unavailable(route.role)
        client.write(error_bytes(error, keep_alive=req.keep_alive))
        return req.keep_alive

    async def _attempt_strict(self, req: Request, target: Target, payload: dict,
                              strict: dict, model: str | None, headers: str, client: Channel,
                              extra: list[bytes]) -> Response | bool:
        """Injected strict first; a schema compile failure is retried once without it.

        Returns the response to relay, or whether the client connection stays usable when the
        400 was answered here.
        """
        body = encode_for(req.body, strict, model, True)
        response = await self._send(req, target.origin, headers, body)
        if response.status != 400:
            return response
        error_body = await read_body(response)
        finish(self._pool, response)
        if not is_compile_failure(response.status, error_body):
            client.write(_buffered(response, error_body, extra, req.keep_alive))
            return req.keep_alive
        plain = encode_for(req.body, payload, model, False)
        return await self._send(req, target.origin, headers, plain)

    async def proxy(self, req: Request, route: ProxyRoute, payload: dict | None,
                    client: Channel) -> bool | Pending:
        """Forward to the declared peer: single hop, pairwise key, attributed answers."""
        arrived = req.headers.get("x-lobes-proxied")
        if arrived is not None:
            error = errors.proxy_loop(route.role, arrived, route.origin)
            client.write(error_bytes(error, keep_alive=req.keep_alive))
            return req.keep_alive
        attribution = [b"X-Lobes-Proxied-By: " + route.origin.encode()]
        headers = peer_headers(req, route.api_key, [("X-Lobes-Proxied", route.role)],
                               TO_PROXY_PEER)
        body = encode_for(req.body, payload, route.peer_model, False)
        try:
            response = await self._send(req, self.origin(route.origin), headers, body)
        except UpstreamError:
            return self._peer_down(req, route, client)
        # A peer's 508 proxy_loop is a misdeclaration, not an outage: relayed, never retried.
        if response.status >= 500 and response.status != 508:
            response.conn.close()
            return self._peer_down(req, route, client)
        if response.status == 404:
            return await self._peer_404(req, route, response, attribution, client)
        return Pending(response, attribution)

    def _peer_down(self, req: Request, route: ProxyRoute, client: Channel) -> bool:
        error = errors.backend_unavailable(f"peer {route.origin} (role {route.role})",
                                           self._retry_after)
        client.write(error_bytes(error, (("X-Lobes-Proxied-By", route.origin),),
                                 keep_alive=req.keep_alive))
        return req.keep_alive

    async def _peer_404(self, req: Request, route: ProxyRoute, response: Response,
                        attribution: list[bytes], client: Channel) -> bool:
        try:
            body = await read_body(response)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            response.conn.close()
            return self._peer_down(req, route, client)
        finish(self._pool, response)
        if b"role_infeasible" in body:
            error: ApiError = errors.peer_declined(route.role, route.origin)
            client.write(error_bytes(error, (("X-Lobes-Proxied-By", route.origin),),
                                     keep_alive=req.keep_alive))
        else:
            client.write(_buffered(response, body, attribution, req.keep_alive))
        return req.keep_alive


def _buffered(response: Response, body: bytes, extra: list[bytes], keep_alive: bool) -> bytes:
    """An already-read upstream response, relayed verbatim with the gateway's headers."""
    lines = response.relayed.decode("latin-1").split("\r\n")[:-1]
    headers = [tuple(line.split(":", 1)) for line in lines]
    headers = [(name.strip(), value.strip()) for name, value in headers]
    headers += [tuple(h.decode().split(": ", 1)) for h in extra]
    content_type = next((v for n, v in headers if n.lower() == "content-type"), "application/json")
    headers = [(n, v) for n, v in headers if n.lower() != "content-type"]
    return response_bytes(response.status, body, content_type=content_type, headers=headers,
                          keep_alive=keep_alive)
