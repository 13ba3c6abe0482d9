"""Wires the rooms: connection loop, auth gate, routing, pressure, dispatch to upstream."""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from collections import Counter

from . import errors
from .advert import ProxyAdverts
from .auth import Caller, Gate, InflightLimits
from .config import GatewayConfig
from .errors import ApiError
from .forward import Forwarder, forward_headers
from .http import (
    MAX_HEAD_BYTES,
    HttpError,
    Request,
    error_bytes,
    parse_head,
    read_body,
    response_bytes,
)
from .owner import Owners
from .pool import Pools
from .pressure import PressureMonitor
from .realtime import tunnel
from .relay import Pending, relay
from .routing import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GENERATE_LANES,
    REALTIME,
    RERANKING,
    SPEECH,
    TRANSCRIPTION,
    LocalRoute,
    PeerRoute,
    PoolRoute,
    ProxyRoute,
    Refusal,
    Route,
    Router,
)
from .upstream import Pool, set_nodelay
from .views import PeerView, Views
from .watchdog import Watchdog

POST_LANES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/rerank": RERANKING,
    "/v1/score": RERANKING,
    "/v1/audio/transcriptions": TRANSCRIPTION,
    "/v1/audio/speech": SPEECH,
}
_JSON_LANES = GENERATE_LANES | {EMBEDDINGS, RERANKING}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _has_body(req: Request) -> bool:
    return "transfer-encoding" in req.headers or req.headers.get("content-length", "0") != "0"


class Gateway:
    """One gateway: the configuration and every room it wires together."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.router = Router(config)
        self.pool = Pool(config.limits.connect_timeout_s)
        self.gate = Gate(config.api_key, config.fleet_key)
        self.inflight = InflightLimits(config.limits.max_inflight_per_key)
        self.pressure = PressureMonitor(config.pressure)
        self.peer_views: dict[str, PeerView] = {}
        # Requests this box has out at peers, per role (proxied, pooled, owner-forwarded).
        self.peer_in_flight: Counter[str] = Counter()
        self.views = Views(config, self.router, self.pool, self.pressure, self.peer_views.get,
                           self.peer_in_flight)
        self.forwarder = Forwarder(config, self.pool)
        self.pools = Pools(config, self.router, self.pool, self.forwarder, self.peer_views)
        self.owners = Owners(config, self.pool, self.forwarder)
        self.adverts = ProxyAdverts(config, self.router, self.pool, self.forwarder,
                                    self.peer_views)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: list[asyncio.Task] = []

    async def start_background(self) -> None:
        """Start the samplers; the first pressure sample is taken before serving."""
        self._loop = asyncio.get_running_loop()
        self.pressure.take_sample()
        await self.views.windows.probe_once()  # before listening: advertise served windows
        self._background.append(asyncio.create_task(self.views.windows.run()))
        self._background.append(asyncio.create_task(self.pressure.run()))
        self._background.append(asyncio.create_task(self.pools.run()))
        self._background.append(asyncio.create_task(self.adverts.run()))

    async def serve_connection(self, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        """Serve requests on one client connection until it closes or may not be kept."""
        set_nodelay(writer)
        watchdog = Watchdog(asyncio.get_running_loop())
        header_timeout = self.config.limits.header_timeout_s
        abort = writer.transport.abort
        try:
            while True:
                watchdog.arm(header_timeout, abort)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    writer.write(error_bytes(errors.head_too_large(MAX_HEAD_BYTES),
                                             keep_alive=False))
                    return
                finally:
                    watchdog.disarm()
                try:
                    request = parse_head(head)
                except HttpError as exc:
                    writer.write(error_bytes(exc.error, keep_alive=False))
                    return
                request.watchdog = watchdog
                if not await self.handle(request, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except Exception:  # a gateway bug: drop this connection, never the process
            traceback.print_exc(file=sys.stderr)
            return
        finally:
            watchdog.close()
            writer.transport.close()

    async def handle(self, req: Request, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        """Answer one request; returns whether the connection may serve another."""
        method, path = req.method, req.path
        if method == "GET" and path in ("/health", "/status", "/capabilities"):
            return await self._keyless(req, writer)
        caller = self.gate.identify(req.headers.get("authorization"))
        if caller is None and (method == "POST" or path.startswith("/v1/")):
            return self._refuse(req, writer, errors.invalid_api_key())
        if caller is None:
            return self._refuse(req, writer, errors.not_found(path))
        if method == "POST":
            lane = POST_LANES.get(path)
            if lane is None:
                return self._refuse(req, writer, errors.not_found(path))
            return await self._post(req, lane, caller, reader, writer)
        if method == "GET":
            return await self._get(req, caller, reader, writer)
        if path in POST_LANES:
            return self._refuse(req, writer, errors.method_not_allowed(method, path, "POST"))
        return self._refuse(req, writer, errors.not_found(path))

    def _refuse(self, req: Request, writer: asyncio.StreamWriter, error: ApiError) -> bool:
        """Answer an error without reading the body; a pending body forces a close."""
        keep = req.keep_alive and not _has_body(req)
        writer.write(error_bytes(error, keep_alive=keep))
        return keep

    async def _keyless(self, req: Request, writer: asyncio.StreamWriter) -> bool:
        if req.path == "/health":
            body = self.views.health_body
        elif req.path == "/status":
            body = await self.views.status()
        else:
            body = await self.views.capabilities()
        writer.write(response_bytes(200, body, keep_alive=req.keep_alive))
        return req.keep_alive

    async def _get(self, req: Request, caller: Caller, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> bool:
        if req.path == "/v1/models":
            body = self.views.models()
        elif req.path == "/v1/models/supported":
            body = self.views.supported()
        elif req.path == "/v1/realtime":
            return await self._realtime(req, reader, writer)
        elif req.path in POST_LANES:
            return self._refuse(req, writer, errors.method_not_allowed("GET", req.path, "POST"))
        else:
            return self._refuse(req, writer, errors.not_found(req.path))
        writer.write(response_bytes(200, body, keep_alive=req.keep_alive))
        return req.keep_alive

    async def _realtime(self, req: Request, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> bool:
        if "websocket" not in req.headers.get("upgrade", "").lower():
            return self._refuse(req, writer, errors.upgrade_required())
        route = self.router.lane_routes[REALTIME]
        if not isinstance(route, LocalRoute):
            assert isinstance(route, Refusal)  # the realtime lane is never proxied
            return self._refuse(req, writer, route.error)
        await tunnel(self.pool, route.targets[0].origin, req, reader, writer,
                     self.config.limits.upstream_timeout_s)
        return False

    async def _read_body(self, req: Request, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> bytes:
        if req.headers.get("expect", "").lower() == "100-continue":
            writer.write(_CONTINUE)
        watchdog = req.watchdog
        if watchdog is None:
            return await read_body(reader, req.headers, self.config.limits.max_body_bytes)
        watchdog.arm(self.config.limits.body_timeout_s, lambda: self._body_timed_out(writer))
        try:
            return await read_body(reader, req.headers, self.config.limits.max_body_bytes)
        finally:
            watchdog.disarm()

    @staticmethod
    def _body_timed_out(writer: asyncio.StreamWriter) -> None:
        writer.write(error_bytes(errors.request_timeout(), keep_alive=False))
        writer.transport.close()

    async def _post(self, req: Request, lane: str, caller: Caller,
                    reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if not self.inflight.acquire(caller):
            return self._refuse(req, writer, errors.rate_limited(self.inflight.limit))
        try:
            try:
                req.body = await self._read_body(req, reader, writer)
            except HttpError as exc:
                writer.write(error_bytes(exc.error, keep_alive=False))
                return False
            if writer.transport.is_closing():
                return False
            outcome = await self._dispatch(req, lane, caller, writer)
            if isinstance(outcome, Pending):
                keep_alive = req.keep_alive
                # A stream may be held for minutes: keep only what the relay needs.
                req.body, req.headers = b"", {}
                return await relay(self.pool, outcome.response, writer, outcome.extra,
                                   keep_alive)
            return outcome
        finally:
            self.inflight.release(caller)

    async def _dispatch(self, req: Request, lane: str, caller: Caller,
                        writer: asyncio.StreamWriter) -> bool | Pending:
        payload = None
        if lane in _JSON_LANES:
            try:
                payload = json.loads(req.body)
            except (ValueError, UnicodeDecodeError) as exc:
                return self._answer(req, writer, errors.invalid_json(str(exc)))
            if not isinstance(payload, dict):
                return self._answer(req, writer, errors.invalid_json("expected a JSON object"))
        requested_tier = None
        if lane in GENERATE_LANES:
            resolved = self.router.resolve(lane, payload.get("model"))
            route, requested_tier = resolved.route, resolved.requested_tier
        else:
            route = self.router.lane_routes[lane]
        if isinstance(route, PeerRoute):
            return await self._counted(req, lane, route, requested_tier, payload, caller, writer)
        return await self._follow(req, lane, route, requested_tier, payload, caller, writer)

    async def _follow(self, req: Request, lane: str, route: Route, requested_tier: str | None,
                      payload: dict | None, caller: Caller,
                      writer: asyncio.StreamWriter) -> bool | Pending:
        if isinstance(route, Refusal):
            return self._answer(req, writer, route.error)
        if isinstance(route, LocalRoute):
            return await self._local(req, lane, route, requested_tier, payload, writer)
        if isinstance(route, PoolRoute):
            # The pool relays the fall-through itself: it adds its headers and meters the rate.
            return await self.pools.serve(req, route, payload, writer, lambda: self._follow(
                req, lane, route.fall_through, requested_tier, payload, caller, writer))
        if isinstance(route, ProxyRoute):
            return await self.forwarder.proxy(req, route, payload, writer)
        return await self.owners.serve(req, route, payload, writer, lambda: self._relayed(
            req, lane, route.fall_through, requested_tier, payload, caller, writer))

    async def _counted(self, req: Request, lane: str, route: PeerRoute,
                       requested_tier: str | None, payload: dict | None, caller: Caller,
                       writer: asyncio.StreamWriter) -> bool:
        """A role answered by peers, relayed here so its in-flight count spans the answer."""
        self.peer_in_flight[route.role] += 1
        try:
            return await self._relayed(req, lane, route, requested_tier, payload, caller,
                                       writer)
        finally:
            self.peer_in_flight[route.role] -= 1

    async def _relayed(self, req: Request, lane: str, route: Route, requested_tier: str | None,
                       payload: dict | None, caller: Caller,
                       writer: asyncio.StreamWriter) -> bool:
        """Follow a fall-through route and relay it here, inside the caller's in-flight count."""
        outcome = await self._follow(req, lane, route, requested_tier, payload, caller, writer)
        if isinstance(outcome, Pending):
            return await relay(self.pool, outcome.response, writer, outcome.extra,
                               req.keep_alive)
        return outcome

    async def _local(self, req: Request, lane: str, route: LocalRoute,
                     requested_tier: str | None, payload: dict | None,
                     writer: asyncio.StreamWriter) -> bool | Pending:
        override = req.headers.get("x-lobes-override", "").lower() == "true"
        extra: list[bytes] = []
        if route.tier is not None and lane in GENERATE_LANES:
            if not override and self.pressure.sheds(requested_tier, route.tier):
                error = errors.server_busy(self.pressure.config.retry_after_s, route.tier)
                return self._answer(req, writer, error, (("X-Lobes-Tier", route.tier),))
            reason = b"manual_override" if override else b"default"
            extra = [b"X-Lobes-Tier: " + route.tier.encode(), b"X-Lobes-Tier-Reason: " + reason]
        if self.config.self_origin:
            extra.append(b"X-Lobes-Served-By: " + self.config.self_origin.encode())
        return await self.forwarder.local(req, route, payload, forward_headers(req.headers),
                                          extra, writer)

    def _answer(self, req: Request, writer: asyncio.StreamWriter, error: ApiError,
                extra: tuple[tuple[str, str], ...] = ()) -> bool:
        writer.write(error_bytes(error, extra, keep_alive=req.keep_alive))
        return req.keep_alive

    def close(self) -> None:
        for task in self._background:
            task.cancel()
        self.pool.close_all()
