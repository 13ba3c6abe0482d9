"""Wires the rooms: the connection loop, the auth gate, routing, dispatch and the relay.

A request walks one way: transport (Channel, parse_head) -> auth (Gate, InflightLimits) ->
routing (Router: lane and model to a Route) -> admission (a generate request waits while its
gear is at its slots) -> dispatch (the route's attempts, with pressure and placement on the
way) -> upstream (exchange) -> relay (the Outcome, then settled).
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Awaitable

from ..mesh.peers import PeerWatch
from ..mesh.pool_queue import PoolQueue
from ..policy.admission import AdmissionQueue, Ticket
from ..policy.auth import Caller, Gate, InflightLimits
from ..policy.config import GatewayConfig
from ..policy.pressure import PressureMonitor
from ..policy.routing import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GENERATE_LANES,
    REALTIME,
    RERANKING,
    SPEECH,
    TRANSCRIPTION,
    LocalRoute,
    Refusal,
    Route,
    Router,
)
from ..transport import errors
from ..transport.channel import Channel
from ..transport.errors import ApiError
from ..transport.fiber import Fiber
from ..transport.http import (
    MAX_HEAD_BYTES,
    MAX_TARGET_BYTES,
    HttpError,
    Request,
    buffered_body,
    error_bytes,
    parse_head,
    read_body,
    response_bytes,
)
from ..transport.json_body import BodyError, JsonBody, parse_body
from ..transport.upstream import BodyTimeouts, Connections
from ..transport.watchdog import Watchdog
from .access_log import AccessLog
from .admission_gate import DEADLINE_HEADER, AdmissionGate, requested_class
from .dispatch import Dispatcher
from .exposition import CONTENT_TYPE, process_start_time
from .exposition import render as render_metrics
from .live import Live
from .meter import asking_usage
from .metrics import SHED_KEY_LIMIT, Metrics
from .page import PAGE_PATHS, load_assets
from .realtime import tunnel
from .relay import Outcome, Relayed, relay
from .views import Views

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
# The lane label of every path the gateway answers (metrics, access log); any other is "other".
LANES = {**POST_LANES, "/v1/models": "models", "/v1/models/supported": "models",
         "/v1/realtime": REALTIME, "/health": "health", "/status": "status",
         "/capabilities": "capabilities", "/metrics": "metrics",
         **dict.fromkeys(PAGE_PATHS, "ui")}
_KEYLESS = ("/health", "/status", "/capabilities", "/metrics")
# What GATEWAY_PRIVATE_STATUS puts behind a key: the live page's data (the page loads keyless).
_PRIVATE = ("/status", "/capabilities")
# Keyless like /metrics: GEAR_METRICS + <role> relays the box's own gear's /metrics (vLLM serves
# its own keyless too), so a Prometheus elsewhere scrapes gears that listen only inside the box.
GEAR_METRICS = "/metrics/gears/"
# A JSON body larger than this is read on a worker thread, so other callers' requests go on.
_PARSED_ASIDE_BYTES = 1024 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Loop turns a shutdown allows the connections' fibers to see their sockets closed.
SHUTDOWN_TURNS = 10


def _oversized_head(client: Channel) -> ApiError:
    """A head past MAX_HEAD_BYTES: 414 when its request line alone is that long, else 431."""
    if b"\r\n" not in client.peek(MAX_TARGET_BYTES + 64):
        return errors.uri_too_long(MAX_TARGET_BYTES)
    return errors.head_too_large(MAX_HEAD_BYTES)


def _has_body(req: Request) -> bool:
    return "transfer-encoding" in req.headers or req.headers.get("content-length", "0") != "0"


async def _parsed_aside(body: bytes) -> JsonBody | ApiError:
    """A large body parsed on a worker thread: the event loop serves others meanwhile."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, parse_body, body, True)
    except BodyError as exc:
        return exc.error


class Gateway:
    """One gateway: the configuration and every room it wires together."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.router = Router(config)
        limits = config.limits
        self.connections = Connections(limits.connect_timeout_s, BodyTimeouts(
            limits.stream_stall_s, limits.upstream_timeout_s))
        self.gate = Gate(config.api_key, config.fleet_key, config.client_keys)
        self.inflight = InflightLimits(config.limits.max_inflight_per_key)
        self.pressure = PressureMonitor(config.pressure)
        self.peers = PeerWatch(config, self.router, self.connections)
        self.admission = AdmissionGate(config, self.pressure, self.peers.pooled)
        self.access_log = AccessLog(config.access_log) if config.access_log else None
        self.metrics = Metrics(self.access_log)
        self.metrics.unpooled = self.connections.distrusted
        self.started_at = process_start_time()
        self.dispatcher = Dispatcher(config, self.connections, self.peers, self.pressure,
                                     self.metrics)
        self.views = Views(config, self.router, self.connections, self.pressure,
                           self.peers.view, self.dispatcher.peer_in_flight,
                           self.admission.status,
                           Live(self.metrics, self.peers, frozenset(config.roles)))
        self.page = load_assets()
        self._background: list[asyncio.Task] = []
        # Open client connections, ended at shutdown.
        self._clients: set[Channel] = set()

    async def start_background(self) -> None:
        """Start the samplers; the first pressure sample is taken before serving."""
        self.pressure.take_sample()
        if self.access_log is not None:
            self.access_log.start()
        await self.views.windows.probe_once()  # before listening: advertise served windows
        self._background.append(asyncio.create_task(self.views.windows.run()))
        self._background.append(asyncio.create_task(self.pressure.run()))
        self._background.append(asyncio.create_task(self.peers.run()))

    def accept(self) -> Channel:
        """The protocol of a new client connection (the listening server's factory)."""
        return Channel(self._start_serving)

    def _start_serving(self, client: Channel) -> None:
        Fiber(self.serve_connection(client)).step()

    async def serve_connection(self, client: Channel) -> None:
        """Serve requests on one client connection until it closes or may not be kept."""
        self._clients.add(client)
        watchdog = Watchdog(asyncio.get_running_loop())
        header_timeout = self.config.limits.header_timeout_s
        abort = client.abort
        metrics = self.metrics
        try:
            while True:
                watchdog.arm(header_timeout, abort)
                try:
                    head: bytes | None = await client.readuntil(b"\r\n\r\n", MAX_HEAD_BYTES)
                except asyncio.LimitOverrunError:
                    head = None
                finally:
                    watchdog.disarm()
                trace = metrics.begin(client)
                try:
                    if head is None:
                        client.write(error_bytes(_oversized_head(client), keep_alive=False))
                        return
                    try:
                        request = parse_head(head)
                    except HttpError as exc:
                        client.write(error_bytes(exc.error, keep_alive=False))
                        return
                    del head  # parsed: a held stream does not keep it
                    request.watchdog = watchdog
                    trace.identify(request, LANES.get(request.path, "other"))
                    request.trace = trace
                    kept = self.handle(request, client)
                    if not (kept if isinstance(kept, bool) else await kept):
                        return
                finally:
                    metrics.end(trace, client)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except Exception:  # a gateway bug: drop this connection, never the process
            traceback.print_exc(file=sys.stderr)
            return
        finally:
            watchdog.close()
            client.close()
            self._clients.discard(client)

    def handle(self, req: Request, client: Channel) -> bool | Awaitable[bool]:
        """Answer one request: whether the connection may serve another, or what to await for
        it. Not a coroutine itself: each frame a request awaits through costs it CPU, and a held
        stream its memory."""
        method, path = req.method, req.path
        if method != "POST":  # a POST (the usual request) is never one of the keyless answers
            if _has_body(req):
                # Only a POST's body is read: the connection ends with this answer, so the
                # body is never read as another request.
                req.keep_alive = False
            keyless = self._keyless_answer(req, client)
            if keyless is not None:
                return keyless
        caller = self.gate.identify(req.headers.get("authorization"))
        if caller is None:
            error = errors.invalid_api_key() if method == "POST" or path.startswith("/v1/") \
                else errors.not_found(path)
            return self._refuse(req, client, error)
        if req.trace is not None:
            req.trace.client = caller.key_id
        if method == "POST":
            lane = POST_LANES.get(path)
            if lane is None:
                return self._refuse(req, client, errors.not_found(path))
            return self._post(req, lane, caller, client)
        if method == "GET":
            return self._get(req, caller, client)
        if path in POST_LANES:
            return self._refuse(req, client, errors.method_not_allowed(method, path, "POST"))
        return self._refuse(req, client, errors.not_found(path))

    def _keyless_answer(self, req: Request, client: Channel) -> bool | Awaitable[bool] | None:
        """The answer to a GET that needs no key (health, metrics, the live page, a gear's
        metrics), None for any other request."""
        path = req.path
        if req.method != "GET":
            return None
        if path in _KEYLESS:
            if (path in _PRIVATE and self.config.private_status
                    and self.gate.identify(req.headers.get("authorization")) is None):
                return self._refuse(req, client, errors.invalid_api_key())
            return self._keyless(req, client)
        if path in self.page:
            asset = self.page[path]
            client.write(response_bytes(200, asset.body, content_type=asset.content_type,
                                        headers=asset.headers, keep_alive=req.keep_alive))
            return req.keep_alive
        if path.startswith(GEAR_METRICS):
            return self._gear_metrics(req, client)
        return None

    def _refuse(self, req: Request, client: Channel, error: ApiError) -> bool:
        """Answer an error without reading the body; a pending body forces a close."""
        keep = req.keep_alive and not _has_body(req)
        client.write(error_bytes(error, keep_alive=keep))
        return keep

    async def _keyless(self, req: Request, client: Channel) -> bool:
        if req.path == "/health":
            body = self.views.health_body
        elif req.path == "/metrics":
            body = render_metrics(self.metrics, self.peers, self.pressure, self.started_at,
                                  self.admission)
            client.write(response_bytes(200, body, content_type=CONTENT_TYPE,
                                        keep_alive=req.keep_alive))
            return req.keep_alive
        elif req.path == "/status":
            body = await self.views.status()
        else:
            body = await self.views.capabilities()
        client.write(response_bytes(200, body, keep_alive=req.keep_alive))
        return req.keep_alive

    async def _gear_metrics(self, req: Request, client: Channel) -> bool:
        role = req.path[len(GEAR_METRICS):]
        if req.trace is not None:
            req.trace.lane = "metrics"
        answer = await self.views.gear_metrics(role)
        if answer is None:
            return self._refuse(req, client, errors.no_gear_metrics(role, self.views.gear_roles()))
        status, body = answer
        client.write(response_bytes(status, body, content_type=CONTENT_TYPE,
                                    keep_alive=req.keep_alive))
        return req.keep_alive

    async def _get(self, req: Request, caller: Caller, client: Channel) -> bool:
        if req.path == "/v1/models":
            body = self.views.models()
        elif req.path == "/v1/models/supported":
            body = self.views.supported()
        elif req.path == "/v1/realtime":
            return await self._realtime(req, client)
        elif req.path in POST_LANES:
            return self._refuse(req, client, errors.method_not_allowed("GET", req.path, "POST"))
        else:
            return self._refuse(req, client, errors.not_found(req.path))
        client.write(response_bytes(200, body, keep_alive=req.keep_alive))
        return req.keep_alive

    async def _realtime(self, req: Request, client: Channel) -> bool:
        if "websocket" not in req.headers.get("upgrade", "").lower():
            return self._refuse(req, client, errors.upgrade_required())
        if _has_body(req):  # the tunnel's bytes start after the 101, never before it
            return self._refuse(req, client, errors.bad_request(
                "a WebSocket handshake carries no body; send GET without one"))
        route = self.router.lane_routes[REALTIME]
        if req.trace is not None:
            req.trace.role = route.role
        if not isinstance(route, LocalRoute):
            assert isinstance(route, Refusal)  # the realtime lane is never proxied
            return self._refuse(req, client, route.error)
        await tunnel(self.connections, route.targets[0].origin, req, client,
                     self.config.limits.upstream_timeout_s)
        return False

    async def _read_body(self, req: Request, client: Channel) -> bytes:
        """A body that is not all here yet: wait for it, under the body deadline."""
        limit = self.config.limits.max_body_bytes
        if req.headers.get("expect", "").lower() == "100-continue":
            client.write(_CONTINUE)
        watchdog = req.watchdog
        if watchdog is None:
            return await read_body(client, req.headers, limit)
        watchdog.arm(self.config.limits.body_timeout_s, lambda: self._body_timed_out(client))
        try:
            return await read_body(client, req.headers, limit)
        finally:
            watchdog.disarm()

    @staticmethod
    def _body_timed_out(client: Channel) -> None:
        client.write(error_bytes(errors.request_timeout(), keep_alive=False))
        client.close()

    def _post(self, req: Request, lane: str, caller: Caller,
              client: Channel) -> bool | Awaitable[bool]:
        """A POST within its key's in-flight limit, its body read: served by _serve, which
        gives the in-flight slot back when it ends."""
        if not self.inflight.acquire(caller):
            self.metrics.shed[SHED_KEY_LIMIT] += 1
            source = ("GATEWAY_CLIENT_KEYS" if caller.inflight_limit is not None
                      else "GATEWAY_MAX_INFLIGHT_PER_KEY")
            return self._refuse(req, client,
                                errors.rate_limited(self.inflight.limit_of(caller), source))
        try:
            body = buffered_body(client, req.headers, self.config.limits.max_body_bytes)
        except HttpError as exc:
            return self._body_refused(caller, client, exc)
        if body is None:  # not all here with the head: wait (the usual case does not)
            return self._post_arriving(req, lane, caller, client)
        req.body = body
        return self._serve(req, lane, caller, client)

    async def _post_arriving(self, req: Request, lane: str, caller: Caller,
                             client: Channel) -> bool:
        """A POST whose body is still arriving: read, then served (its slot given back)."""
        try:
            req.body = await self._read_body(req, client)
        except HttpError as exc:
            return self._body_refused(caller, client, exc)
        except BaseException:
            self.inflight.release(caller)
            raise
        if client.is_closing():
            self.inflight.release(caller)
            return False
        return await self._serve(req, lane, caller, client)

    def _body_refused(self, caller: Caller, client: Channel, exc: HttpError) -> bool:
        """A body the gateway will not read: its error answered, the connection ended (the
        rest of the body would be read as a request) and the caller's slot given back."""
        self.inflight.release(caller)
        client.write(error_bytes(exc.error, keep_alive=False))
        return False

    async def _serve(self, req: Request, lane: str, caller: Caller, client: Channel) -> bool:
        """Route a request whose body is read, admit it, run its attempts, relay the outcome;
        the caller's in-flight slot is given back at the end."""
        try:
            read = self._read_json(req) if lane in _JSON_LANES else None
            if read is not None and not isinstance(read, (JsonBody, ApiError)):
                read = await read  # a large body, parsed on a worker thread
            routed = self._route(req, lane, client, read)
            del read  # req.json holds it while it is needed: a held stream keeps no body
            if isinstance(routed, bool):
                return routed
            route, requested_tier, payload = routed
            del routed
            klass = requested_class(req, caller, payload)
            if isinstance(klass, ApiError):
                return self._answer(req, client, klass)
            req.priority = klass
            ticket = None
            queue = self.admission.queue_for(route, requested_tier, req)
            # The hot path skips admission's coroutines: nothing to wait for, no deadline to
            # check.
            if queue is not None or DEADLINE_HEADER in req.headers:
                admitted = await self._admit(req, caller, route, queue, payload, client)
                if isinstance(admitted, bool):
                    return admitted
                ticket = admitted
            try:
                outcome = await self.dispatcher.run(req, route, requested_tier, payload, client,
                                                    ticket)
                # A stream may be held for minutes: it keeps neither the parsed nor the raw
                # body.
                del payload
                if not isinstance(outcome, Outcome):
                    return outcome
                try:  # awaited here, not in a frame of its own: a held stream keeps fewer
                    kept = self._relay(req, lane, outcome, client)
                    if not isinstance(kept, bool):
                        kept = await kept
                finally:
                    outcome.settle()
                self._count_relayed(req, outcome)
                return kept
            finally:
                if ticket is not None:
                    tokens = req.trace.tokens if req.trace is not None else None
                    self.admission.leave(route, ticket, tokens or 0)
        finally:
            self.inflight.release(caller)

    async def _admit(self, req: Request, caller: Caller, route: Route,
                     queue: AdmissionQueue | PoolQueue | None, payload: dict | None,
                     client: Channel) -> Ticket | bool | None:
        """Wait for admission in the request's class: its ticket (None: admitted holding none),
        or whether the connection stays usable once it was refused (answered here) or the
        client left while it waited."""
        admitted = await self.admission.enter(req, caller, req.priority, route, queue, payload,
                                              client)
        if isinstance(admitted, ApiError):
            return self._answer(req, client, admitted)
        if admitted is False:  # the client left while it waited
            return False
        return None if admitted is True else admitted

    def _route(self, req: Request, lane: str, client: Channel, read: JsonBody | ApiError | None,
               ) -> bool | tuple[Route, str | None, dict | None]:
        """Route a request by its JSON body as `read` (None on a lane without one): its route,
        the tier it asked for and its payload, or whether the connection stays usable after an
        error answered here."""
        payload = None
        if read is not None:
            if isinstance(read, ApiError):
                return self._answer(req, client, read)
            req.json, payload = read, read.payload
            model = payload.get("model")
            if model is not None and not isinstance(model, str):
                return self._answer(req, client, errors.bad_request(
                    "model must be a string: a served model's name or an alias", "model"))
            if lane in GENERATE_LANES:  # a JSON lane: a generate request always has a payload
                resolved = self.router.resolve(lane, model)
                if payload.get("stream") is True:  # counted by its usage, never by its events
                    payload, req.strip_usage = asking_usage(payload)
                return resolved.route, resolved.requested_tier, payload
        return self.router.lane_routes[lane], None, payload

    @staticmethod
    def _read_json(req: Request) -> JsonBody | ApiError | Awaitable[JsonBody | ApiError]:
        """The body as JSON, or the error it gets; a large one is read on a worker thread (what
        to await for it is returned)."""
        coding = req.headers.get("content-encoding")
        if coding is not None and (coding := coding.strip().lower()) != "identity":
            return errors.unsupported_media_type(coding)
        if len(req.body) > _PARSED_ASIDE_BYTES:
            return _parsed_aside(req.body)
        try:
            return parse_body(req.body)
        except BodyError as exc:
            return exc.error

    def _relay(self, req: Request, lane: str, outcome: Outcome, client: Channel) -> Relayed:
        """Relay the outcome: whether the connection may serve another request, or the
        coroutine to await for it."""
        keep_alive = req.keep_alive
        # Only what the relay needs is kept while it runs.
        req.body, req.json, req.headers, req.header_block = b"", None, {}, ""
        return relay(self.connections, outcome, client, keep_alive, lane in GENERATE_LANES,
                     req.strip_usage)

    def _count_relayed(self, req: Request, outcome: Outcome) -> None:
        """The relayed answer's tokens on its trace, and a cut stream counted."""
        if req.trace is not None:
            req.trace.tokens = outcome.tokens
            if outcome.cut is not None:
                self.metrics.streams_cut[req.trace.role, outcome.cut] += 1

    def _answer(self, req: Request, client: Channel, error: ApiError) -> bool:
        client.write(error_bytes(error, keep_alive=req.keep_alive))
        return req.keep_alive

    async def close(self) -> None:
        """Stop the samplers, end every client connection and drop the upstream pool."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for client in list(self._clients):
            client.abort()
        self.connections.close_all()
        # Each connection's fiber sees its sockets closed and ends on the next turns.
        for _turn in range(SHUTDOWN_TURNS):
            if not self._clients:
                break
            await asyncio.sleep(0)
        if self.access_log is not None:  # after the last request's line was queued
            self.access_log.close()
