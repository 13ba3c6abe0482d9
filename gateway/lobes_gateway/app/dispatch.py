"""The one failover loop: a request's route becomes attempts, tried in order until one answers.

Routing (policy/routing.py) gives each request a Route, fixed at start-up: the local targets
(the role's gear, then the fallback), the one proxied peer, a pool's replicas, or the owners,
and what to answer when none of them can. Here a route becomes a plan: a generator of Attempts
(a pool places each one on the replicas not tried yet) that ends in an Answer, the error to
give when every attempt failed. Dispatcher.run sends each attempt, judges its response head by
the attempt's rule, and ends in one outcome: an Outcome for the relay (the response, the
gateway's headers, the placement and peer count it holds) or an error answered here.

Rules for moving on to the next attempt:
  LOCAL    a transport error, or a 5xx when another local target follows (primary, fallback)
  LAST     a transport error only: the last local target's 5xx is the answer
  PEER     the one proxied peer: a transport error or a 5xx other than 508 means the peer is
           down; its 404 role_infeasible is a decline, terminal (it named no box)
  OWNER    owners: a transport error, a 5xx or a 401/403/404; any other status is
           the owner's own answer
  REPLICA  pool replicas: as OWNER, and a 429 (the replica's box sheds the tier, or the key is
           at its limit there): the request never started, another replica may take it
A peer's 200 (PEER, OWNER, REPLICA) that names another model than the role's is a failure
too, read before any byte is relayed (app/claims.py).
A strict-lane attempt whose 400 says the tool schema could not be compiled is retried once on
the same target without the injected strict flag; any other 400 is the answer.
"""

from __future__ import annotations

import functools
import re
import socket
import time
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass

from lobes_contract import DEFAULT_PRIORITY_CLASS, VLLM_PRIORITY

from ..mesh.peers import PeerWatch, PooledRole
from ..policy.admission import Ticket
from ..policy.config import GatewayConfig
from ..policy.placer import Placement
from ..policy.prefix import RequestShape
from ..policy.pressure import PressureMonitor
from ..policy.routing import (
    LocalRoute,
    OwnerRoute,
    PeerRoute,
    PoolRoute,
    ProxyRoute,
    Refusal,
    Route,
)
from ..transport import errors
from ..transport.channel import Channel
from ..transport.errors import ApiError
from ..transport.heads import ShapeMemo
from ..transport.http import Request, error_bytes, header_block, header_names
from ..transport.upstream import (
    Connections,
    Origin,
    Response,
    UpstreamError,
    exchange,
    request_head,
)
from .claims import NOT_CHECKED, claimed_model
from .metrics import (
    ANSWERED,
    BUSY,
    DECLINED,
    SCHEMA_REJECTED,
    SERVER_ERROR,
    SHED_MEMORY,
    SHED_PRESSURE,
    UNREACHABLE,
    WRONG_MODEL,
    Metrics,
)
from .relay import Outcome, read_whole
from .resume import ContinuationTarget, StreamResume, resumable_request

LOCAL, LAST, PEER, REPLICA, OWNER = range(5)
_DECLINES = frozenset({401, 403, 404})
_REPLICA_MOVES_ON = _DECLINES | {429}
# Markers of vLLM's 400 when strict tool schemas cannot be compiled into a grammar.
_COMPILE_FAILURE = (b"grammar", b"schema")
FORWARDED_BY = "X-Lobes-Forwarded-By"
# A request that already crossed a box is answered where it lands (owner forwarding).
_MARKERS = ("x-lobes-forwarded-by", "x-lobes-proxied")

# The end-to-end lines of each header block, per filter (forward_headers).
_END_TO_END: dict[re.Pattern[str], ShapeMemo[str]] = {}
# What a peer must not see of earlier hops' markers (a proxy keeps X-Lobes-Forwarded-By, so an
# owner-forwarded request stays marked).
TO_PROXY_PEER = header_names(prefixes=("x-lobes-proxied",))
TO_PEER = header_names(prefixes=("x-lobes-proxied", "x-lobes-forwarded"))
# The caller's own class header: a peer is told the class the request runs in here instead.
_PRIORITY_LINE = header_names("x-lobes-priority")

_DEFAULT_REASON = b"X-Lobes-Tier-Reason: default"
_MANUAL_OVERRIDE = b"X-Lobes-Tier-Reason: manual_override"
_NO_ROUTE_REASON = b"X-Lobes-Route-Reason: none"
_FAILOVER_REASON = b"X-Lobes-Route-Reason: failover"
# Which of a local route's targets a plan tries: all (the gear, then the fallback), a pool's own
# replica (the gear alone), or the fallback alone (a hosted pool whose replicas all failed).
_ALL_TARGETS, _OWN_GEAR, _FALLBACK = slice(None), slice(0, 1), slice(1, None)
_CHAT_PATH = "/chat/completions"


def _kept_lines(block: str, strip: re.Pattern[str]) -> str:
    return strip.sub("", block)


def forward_headers(req: Request, strip: re.Pattern[str] | None = None) -> str:
    """The caller's end-to-end header lines (http.parse_head wrote them, without its key), as
    forwarded to a local backend (less what `strip` matches), then the request's id. The lines
    are filtered once per header block: a block is one per head shape."""
    if strip is None:
        kept = req.header_block
    else:
        memo = _END_TO_END.get(strip)
        if memo is None:
            memo = _END_TO_END[strip] = ShapeMemo(functools.partial(_kept_lines, strip=strip))
        kept = memo.parsed(req.header_block)
    if req.request_id is None:
        return kept
    return f"{kept}X-Request-Id: {req.request_id}\r\n"


def peer_headers(req: Request, api_key: str | None, markers: list[tuple[str, str]],
                 strip: re.Pattern[str] = TO_PEER) -> str:
    """The caller's header lines for a peer: without its key, `strip`ped of earlier markers,
    with the peer's key, the request's class (when not standard) and our markers attached."""
    block = forward_headers(req, strip)
    if api_key:
        block += f"Authorization: Bearer {api_key}\r\n"
    if req.priority != DEFAULT_PRIORITY_CLASS:
        block = _PRIORITY_LINE.sub("", block) + f"X-Lobes-Priority: {req.priority}\r\n"
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


def encode_for(req: Request, sent: dict | None, model: str | None) -> bytes:
    """The body to send: the caller's bytes, with only the members `sent` changed (and the
    model, named `model` where it differs) written anew."""
    body = req.json
    if body is None or sent is None:
        return req.body
    if model is not None and sent.get("model") != model:
        sent = {**sent, "model": model}
    # The usual body goes on as the caller sent it: no call to find that out.
    return body.raw if sent is body.payload else body.encode(sent)


def with_priority(payload: dict | None, klass: str, scheduled: bool) -> dict | None:
    """The payload with the request's class as vLLM's `priority`: wherever the body names a
    priority (it is clamped to the class its key allows, as X-Lobes-Priority is), and for a
    gear that schedules by priority when the class is not standard (vLLM's default, 0)."""
    if payload is None:
        return payload
    wanted = VLLM_PRIORITY[klass]
    if "priority" in payload:
        return payload if payload["priority"] == wanted else {**payload, "priority": wanted}
    if scheduled and klass != DEFAULT_PRIORITY_CLASS:
        return {**payload, "priority": wanted}
    return payload


def is_compile_failure(status: int, body: bytes) -> bool:
    lowered = body.lower()
    return status == 400 and any(marker in lowered for marker in _COMPILE_FAILURE)


def distinct_boxes(origins: tuple[str, ...]) -> list[str]:
    """Owners in routing order, each box once (two replicas on one box are asked once)."""
    return list(dict.fromkeys(origins))


def this_box(config: GatewayConfig) -> str:
    """The origin this box names itself by: GATEWAY_SELF_ORIGIN, else host name and port."""
    return config.self_origin or f"http://{socket.gethostname()}:{config.port}"


class Attempt:
    """One upstream try: where, what to send, the headers its answer carries, when to move on."""

    __slots__ = ("body", "extra", "headers", "model", "name", "origin", "placement", "resume",
                 "rule", "strict")

    def __init__(self, origin: Origin, name: str, headers: str, body: bytes, extra: list[bytes],
                 rule: int, placement: Placement | None = None, strict: bool = False,
                 resume: StreamResume | None = None, model: str | None = None) -> None:
        self.origin = origin
        self.name = name
        self.headers = headers
        self.body = body
        self.extra = extra
        self.rule = rule
        self.placement = placement
        self.strict = strict
        self.resume = resume  # a pooled stream that may go on on another replica
        self.model = model  # the model a peer's answer must name (app/claims.py)


@dataclass(frozen=True)
class Answer:
    """The end of a plan: the error this box answers itself, with its headers."""

    error: ApiError
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Failure:
    """An attempt that did not answer: unreachable (status None) or the status that moved on."""

    name: str
    status: int | None
    declined: bool = False  # a proxied peer's 404 role_infeasible
    compile_failure: bool = False  # a strict-lane 400: retry without strict
    wrong_model: bool = False  # a peer's 200 naming another model than the role's

    def describe(self) -> str:
        if self.wrong_model:
            return f"{self.name} (answered for another model)"
        return f"{self.name} ({'unreachable' if self.status is None else self.status})"

    @property
    def shown(self) -> str:
        """What the request found, as a reason: "unreachable", "answering 503"."""
        if self.wrong_model:
            return "answering for another model"
        return "unreachable" if self.status is None else f"answering {self.status}"

    @property
    def looks_down(self) -> bool:
        """Failed as a peer that restarted or lost its gear does: unreachable, a 503, or an
        answer for another model (until a probe says otherwise)."""
        return self.status in (None, 503) or self.wrong_model

    @property
    def outcome(self) -> str:
        """The attempt's outcome as /metrics counts it."""
        if self.status is None:
            return UNREACHABLE
        if self.wrong_model:
            return WRONG_MODEL
        if self.compile_failure:
            return SCHEMA_REJECTED
        if self.status == 429:
            return BUSY
        return SERVER_ERROR if self.status >= 500 else DECLINED


# What a plan yields, and what it is sent back after each failed attempt; sent None, it ends
# where it stands (end_plan). A pool's own replica's plan returns its failure instead of
# answering (Dispatcher._local).
Plan = Generator["Attempt | Answer", "Failure | None", "Failure | None"]


def end_plan(plan: Plan) -> None:
    """End a plan whose request is answered or abandoned: sent None, each of its yields returns
    (and its finally blocks run). plan.close() would end it too, by throwing GeneratorExit
    through its frames: a traceback per request, 6% of a request's instructions."""
    step = next(plan, None)
    if step is not None:
        plan.close()
        raise RuntimeError(f"a plan went on after it was ended: {step!r}")


def _overridden(req: Request) -> bool:
    """The caller asked to pass the pressure verdict (X-Lobes-Override: true)."""
    return req.headers.get("x-lobes-override", "").lower() == "true"


def moves_on(rule: int, status: int) -> bool:
    """Whether a response head with `status` sends the request on, under `rule` (the body
    unread: a proxied peer's 404 and a strict-lane 400 are judged by theirs)."""
    if status >= 500:
        return rule != LAST and (rule != PEER or status != 508)
    if rule == REPLICA:
        return status in _REPLICA_MOVES_ON
    return rule == OWNER and status in _DECLINES


def exhausted(who: str, failures: list[Failure], retry_after: int) -> ApiError:
    """Everyone tried failed: 404 when all declined (401/403/404), 429 when all were busy,
    else a retryable 503.

    who names them, e.g. "every replica of the cortex pool".
    """
    named = ", ".join(f.describe() for f in failures)
    if all(f.status == 429 for f in failures):
        return errors.every_replica_busy(who, named, retry_after)
    if all(f.status in _DECLINES for f in failures):
        return ApiError(404, "role_infeasible", "role_infeasible",
                        f"{who} declined the request: {named}; check the keys "
                        "(P_PEER_API_KEYS, GATEWAY_FLEET_KEY) and that each one hosts the role")
    return errors.backend_unavailable(f"{who} ({named})", retry_after)


def _answer_only(answer: Answer) -> Plan:
    yield answer


class Dispatcher:
    """Turns routes into plans and runs them: the gateway's one failover loop."""

    def __init__(self, config: GatewayConfig, connections: Connections, peers: PeerWatch,
                 pressure: PressureMonitor, metrics: Metrics) -> None:
        self._connections = connections
        self._metrics = metrics
        self._peers = peers
        self._pressure = pressure
        self._timeout = config.limits.upstream_timeout_s
        self._stall = config.limits.stream_stall_s
        self._retry_after = config.pressure.retry_after_s
        self._fleet_key = config.fleet_key
        self._me = this_box(config)
        self._served_by = (b"X-Lobes-Served-By: " + config.self_origin.encode()
                           if config.self_origin else None)
        self._header_lines: dict[tuple[str | None, bool], list[bytes]] = {}
        # Requests this box has out at peers, per role (proxied, pooled, owner-forwarded),
        # counted from before the dial until the relay ends.
        self.peer_in_flight: Counter[str] = Counter()

    async def run(self, req: Request, route: Route, requested_tier: str | None,
                  payload: dict | None, client: Channel,
                  admitted: Ticket | None = None) -> bool | Outcome:
        """Try the route's attempts in order; an Outcome to relay, or whether the connection
        stays usable after an error answered here. `admitted`: a pooled request's ticket, with
        the replica admission placed it on (its first attempt) and the shape it priced."""
        trace = req.trace
        if trace is not None:
            trace.role = route.role
        counted = route.role if isinstance(route, PeerRoute) else None
        if counted is not None:
            self.peer_in_flight[counted] += 1
        placed, shape = (None, None) if admitted is None else (admitted.placement, admitted.shape)
        plan = self.plan(req, route, requested_tier, payload, [], placed, shape=shape)
        held: Placement | None = None  # released when the plan moves past it
        handed: Outcome | None = None  # an outcome takes over the placement and the count
        try:
            step = next(plan)
            while isinstance(step, Attempt):
                placement = step.placement
                if held is not placement and held is not None:
                    held.release()
                held = placement
                started = time.monotonic() if placement is not None else 0.0
                head = request_head("POST", req.target, step.origin, step.headers,
                                    len(step.body))
                try:
                    response = await exchange(self._connections, step.origin, head, step.body,
                                              self._timeout, request_id=req.request_id,
                                              client=client)
                except UpstreamError:
                    if client.gone():  # the caller left: its slot and count are given back
                        return False
                    step = self._moved_on(plan, Failure(step.name, None), route.role)
                    continue
                if response.status >= 400:
                    judged = await self._judge(step, response, started)
                elif step.model is not None and response.status == 200:
                    judged = await self._checked(step, response, started, client)
                else:  # the usual answer, relayed as it is: no coroutine to build and await
                    judged = Outcome(response, step.extra, step.placement, started)
                if client.gone():  # the caller left while the answer was read
                    response.conn.close()
                    return False
                if isinstance(judged, Failure):
                    step = self._moved_on(plan, judged, route.role)
                    continue
                self._metrics.attempts[step.name, ANSWERED] += 1
                if trace is not None:
                    trace.served = step.name if placement is None else placement.origin
                    if placement is not None:
                        trace.reason = placement.reason.value
                if counted is not None:
                    judged.count(self.peer_in_flight, counted)
                judged.resume = step.resume
                handed = judged
                return judged
            client.write(error_bytes(step.error, step.headers, keep_alive=req.keep_alive))
            return req.keep_alive
        finally:
            # An error answered here, or a request cancelled or broken on the way: give back
            # what it held.
            end_plan(plan)
            if handed is None:
                if held is not None:
                    held.release()
                if counted is not None:
                    self.peer_in_flight[counted] -= 1

    def _moved_on(self, plan: Plan, failure: Failure, role: str) -> Attempt | Answer:
        """Count a failed attempt, and a failover when the plan goes on to another one; a peer
        that failed as a down one does is not ready for `role` until it is probed again."""
        key = (failure.name, failure.outcome)
        self._metrics.attempts[key] += 1
        self._metrics.failed_at[failure.name] = time.monotonic()
        if failure.looks_down:
            self._peers.note_failed(role, failure.name, f"a request found it {failure.shown}")
        step = plan.send(failure)
        if isinstance(step, Attempt):
            self._metrics.failovers[key] += 1
        return step

    async def _checked(self, attempt: Attempt, response: Response, started: float,
                       client: Channel) -> Outcome | Failure:
        """A 200 from a peer: relayed, but one that names another model than the role's (or
        none) is a failure, before the caller has a byte of it (a caller that leaves meanwhile
        ends the read)."""
        if not client.watch_gone(response.conn.abort):
            response.conn.abort()
        try:
            claimed = await claimed_model(response, self._connections.body_timeouts)
        finally:
            client.watch_gone(None)
        if claimed is not NOT_CHECKED and claimed != attempt.model:
            response.conn.close()
            return Failure(attempt.name, 200, wrong_model=True)
        return Outcome(response, attempt.extra, attempt.placement, started)

    async def _judge(self, attempt: Attempt, response: Response,
                     started: float) -> Outcome | Failure:
        """An error status, by the attempt's rule: move on, or relay it. A peer's 404 and a
        strict-lane 400 are judged by their body: a decline or a schema compile failure
        moves on."""
        status = response.status
        if moves_on(attempt.rule, status):
            response.conn.close()
            return Failure(attempt.name, status)
        if not ((status == 404 and attempt.rule == PEER) or (status == 400 and attempt.strict)):
            return Outcome(response, attempt.extra, attempt.placement, started)
        body = await read_whole(self._connections, response)
        if body is None:
            return Failure(attempt.name, None)
        if attempt.strict and is_compile_failure(status, body):
            return Failure(attempt.name, 400, compile_failure=True)
        if not attempt.strict and b"role_infeasible" in body:
            return Failure(attempt.name, 404, declined=True)
        return Outcome(response, attempt.extra, attempt.placement, started, body)

    def plan(self, req: Request, route: Route, requested_tier: str | None,
             payload: dict | None, tail: list[bytes], placement: Placement | None,
             resume: StreamResume | None = None, shape: RequestShape | None = None) -> Plan:
        """The attempts of a route; `tail` headers join each answer, `placement` counts the
        local ones on the pool replica they serve as (whose stream `resume` may continue),
        or is a pooled request's first placement, made by admission (which priced `shape`)."""
        if isinstance(route, LocalRoute):
            return self._local(req, route, requested_tier, payload, tail, placement, resume)
        if isinstance(route, ProxyRoute):
            return self._proxy(req, route, payload, tail)
        if isinstance(route, PoolRoute):
            return self._pool(req, route, requested_tier, payload, placement, shape)
        if isinstance(route, OwnerRoute):
            return self._owners(req, route, payload)
        assert isinstance(route, Refusal)
        return _answer_only(Answer(route.error))

    def _local(self, req: Request, route: LocalRoute, requested_tier: str | None,
               payload: dict | None, tail: list[bytes], placement: Placement | None,
               resume: StreamResume | None = None, targets: slice = _ALL_TARGETS) -> Plan:
        """This box's gear, then the fallback; pressure sheds the full tiers first.

        A hosted pool tries its own replica as `_OWN_GEAR` (judged as any replica) and, once
        every replica failed, the fallback as `_FALLBACK`: either returns its failure to the
        pool, which goes on to its next replica or answers for them all."""
        override = route.tier is not None and _overridden(req)
        if self._sheds(route, requested_tier, override):
            assert route.tier is not None  # only a tier is shed
            memory = self._pressure.reason == "memory"
            self._metrics.shed[SHED_MEMORY if memory else SHED_PRESSURE] += 1
            if placement is not None:  # placed on the local replica, never dialled
                placement.release()
            error = errors.server_busy(self._retry_after, route.tier,
                                       "memory" if memory else "busy")
            yield Answer(error, (("X-Lobes-Tier", route.tier),))
            return
        extra = self._header_lines.get((route.tier, override))
        if extra is None:
            extra = self._header_lines[route.tier, override] = self._local_headers(route.tier,
                                                                                   override)
        if tail:
            extra = [*extra, *tail]
        headers = forward_headers(req)
        tried = route.targets[targets]
        last = len(tried) - 1
        failure = None
        for index, target in enumerate(tried):
            model = target.served_name if route.rewrite_model else None
            rule = REPLICA if targets is _OWN_GEAR else LOCAL if index < last else LAST
            # A pool replica's own gear is sent the resumable stream's counting request; the
            # fallback serves another model, resumes nothing, and is sent the client's own.
            own = resume if target.name == route.role else None
            sent = payload if own is None else own.payload
            scheduled = target.priority_scheduling
            ranked = with_priority(sent, req.priority, scheduled)
            if route.strict_lane and sent is not None and (strict := inject_strict(sent)):
                strict_ranked = with_priority(strict, req.priority, scheduled)
                failure = yield Attempt(target.origin, target.name, headers,
                                        encode_for(req, strict_ranked, model), extra,
                                        rule, placement, strict=True, resume=own)
                if failure is None:  # ended (end_plan)
                    return None
                if not failure.compile_failure:
                    continue
            failure = yield Attempt(target.origin, target.name, headers,
                                    encode_for(req, ranked, model), extra, rule, placement,
                                    resume=own)
            if failure is None:
                return None
        if targets is not _ALL_TARGETS:
            return failure
        if last == 0:
            yield Answer(errors.backend_unavailable(f"the {route.role} backend",
                                                    self._retry_after))
        else:
            yield Answer(errors.upstream_unavailable(route.role))

    def _sheds(self, route: LocalRoute, requested_tier: str | None, override: bool) -> bool:
        """Whether pressure sheds a request on this box's gear (`override`: the caller's
        X-Lobes-Override passes the verdict)."""
        return (route.tier is not None and not override
                and self._pressure.sheds(requested_tier, route.tier))

    def _local_headers(self, tier: str | None, override: bool) -> list[bytes]:
        """The headers of a local answer: its tier and why, and X-Lobes-Served-By (built once
        per tier and override, kept in _header_lines; never changed by a caller)."""
        lines = []
        if tier is not None:
            lines += [b"X-Lobes-Tier: " + tier.encode(),
                      _MANUAL_OVERRIDE if override else _DEFAULT_REASON]
        if self._served_by is not None:
            lines.append(self._served_by)
        return lines

    def _proxy(self, req: Request, route: ProxyRoute, payload: dict | None,
               tail: list[bytes]) -> Plan:
        """The one declared peer: single hop, pairwise key, attributed answers."""
        arrived = req.headers.get("x-lobes-proxied")
        if arrived is not None:
            yield Answer(errors.proxy_loop(route.role, arrived, route.origin))
            return
        headers = peer_headers(req, route.api_key, [("X-Lobes-Proxied", route.role)],
                               TO_PROXY_PEER)
        body = encode_for(req, with_priority(payload, req.priority, False), route.peer_model)
        extra = [b"X-Lobes-Proxied-By: " + route.origin.encode(), *tail]
        failure = yield Attempt(self._peers.origin(route.origin), route.origin, headers, body,
                                extra, PEER, model=self._peers.served_id(route.role))
        if failure is None:
            return
        if failure.declined:
            error = errors.peer_declined(route.role, route.origin)
        else:
            error = errors.backend_unavailable(f"peer {route.origin} (role {route.role})",
                                               self._retry_after)
        yield Answer(error, (("X-Lobes-Proxied-By", route.origin),))

    def _pool(self, req: Request, route: PoolRoute, requested_tier: str | None,
              payload: dict | None, placed: Placement | None = None,
              shape: RequestShape | None = None) -> Plan:
        """Place on a selectable replica (`placed`: where admission placed it, pricing
        `shape`), then the next untried one after each failure."""
        role = self._peers.pooled[route.role]
        # Placed here by a pooling box, or forwarded here by an entry box: either
        # way answered here, never placed on another replica.
        arrived = req.headers.get("x-lobes-proxied") or req.headers.get("x-lobes-forwarded-by")
        if arrived is not None:
            yield from self._pooled_arrival(req, route, role, arrived, requested_tier, payload)
            return
        tried: set[str] = set()
        failures: list[Failure] = []
        request = shape or role.placer.shape_of(payload)
        too_long = role.too_long(request)
        if too_long is not None:
            yield Answer(too_long, (("X-Lobes-Route-Reason", "none"),))
            return
        # A box shedding the request's tier (pressure) offers the pool none of its own replica:
        # the peers take the request, and only with none to try does the local path answer
        # the shed.
        local = route.fall_through if role.hosted else None
        shedding = isinstance(local, LocalRoute) and self._sheds(local, requested_tier,
                                                                 _overridden(req))
        if shedding:
            tried.add(role.local_origin)
            if placed is not None and placed.origin == role.local_origin:
                placed.release()
                placed = None
        resume = self._resume(req, route, role, payload)
        # Every replica is asked to count a resumable stream's tokens; encoded here once.
        counted = payload if resume is None else resume.payload
        body: bytes | None = None
        while (placement := placed or role.placer.place(role.candidates(tried, request),
                                                        request=request)
               or (role.failover(tried, request) if failures
                   else role.overflow(tried, request))) is not None:
            placed = None
            tried.add(placement.origin)
            reason = b"X-Lobes-Route-Reason: " + placement.reason.value.encode()
            if placement.origin == role.local_origin:  # the local path: pressure, tiers
                assert isinstance(local, LocalRoute)  # a hosted pool's own path
                failure = yield from self._local(req, local, requested_tier, payload, [reason],
                                                 placement, resume, _OWN_GEAR)
                if failure is None:  # answered here (pressure shed it), or ended
                    return
                failures.append(failure)
                continue
            spec = role.spec(placement.origin)
            headers = peer_headers(req, spec.api_key, [("X-Lobes-Proxied", role.role)])
            if body is None:
                body = encode_for(req, with_priority(counted, req.priority, False),
                                  role.replicas.served_id)
            extra = [b"X-Lobes-Proxied-By: " + spec.origin.encode(), reason]
            failure = yield Attempt(self._peers.origin(spec.origin), spec.origin, headers, body,
                                    extra, REPLICA, placement, resume=resume,
                                    model=role.replicas.served_id)
            if failure is None:
                return
            failures.append(failure)
        if not failures and (shedding or not tried):  # no replica tried: the local path
            # (its shed) or, nothing selectable, the singular forward
            yield from self.plan(req, route.fall_through, requested_tier, payload,
                                 [_NO_ROUTE_REASON], None)
            return
        if isinstance(local, LocalRoute) and len(local.targets) > 1:
            # Every replica failed, this box's gear among them or judged down: the fallback
            # (another model) is the last resort, as for a gear of its own.
            failure = yield from self._local(req, local, requested_tier, payload,
                                             [_FAILOVER_REASON], None, None, _FALLBACK)
            if failure is None:
                return
            failures.append(failure)
        error = exhausted(f"every replica of the {route.role} pool", failures,
                          self._retry_after)
        yield Answer(error, (("X-Lobes-Route-Reason", "none"),))

    def _resume(self, req: Request, route: PoolRoute, role: PooledRole,
                payload: dict | None) -> StreamResume | None:
        """A chat stream of a pool with P_STREAM_RESUME on: how to continue it elsewhere."""
        if not (route.config.stream_resume and req.target.endswith(_CHAT_PATH)
                and payload is not None and req.json is not None
                and resumable_request(payload)):
            return None
        caller = forward_headers(req, TO_PEER)  # kept: req's own block is dropped
        local = route.config

        def target(origin: str) -> ContinuationTarget:
            if origin == role.local_origin and local.base_url is not None:
                return ContinuationTarget(local.base_url, caller, local.served_name)
            spec = role.spec(origin)
            key = f"Authorization: Bearer {spec.api_key}\r\n" if spec.api_key else ""
            marker = header_block([("X-Lobes-Proxied", role.role)])
            return ContinuationTarget(self._peers.origin(origin), caller + key + marker,
                                      role.replicas.served_id)

        return StreamResume(role, req.json, with_priority(payload, req.priority, False),
                            req.target, target, self._timeout, self._stall,
                            self._metrics.resumes, req.strip_usage)

    def _pooled_arrival(self, req: Request, route: PoolRoute, role: PooledRole, arrived: str,
                        requested_tier: str | None, payload: dict | None) -> Plan:
        """Single hop: a request another box placed here is served locally, and counted on
        the local replica so it is not mistaken for idle capacity; never forwarded again."""
        if role.local_origin is None:
            yield Answer(errors.proxy_loop(route.role, arrived,
                                           f"the {route.role} replica pool"))
            return
        placement = role.placer.occupy(role.local_origin, role.default_slots)
        yield from self.plan(req, route.fall_through, requested_tier, payload, [], placement)

    def _owners(self, req: Request, route: OwnerRoute, payload: dict | None) -> Plan:
        """The owners in routing order under the fleet key; a marked arrival is
        answered where it lands (the route's refusal here), never forwarded again."""
        if any(marker in req.headers for marker in _MARKERS):
            yield Answer(route.refusal.error)
            return
        headers = peer_headers(req, self._fleet_key, [(FORWARDED_BY, self._me)])
        # The body names the role this box resolved, so a request without a model is
        # answered for the same role on the owner.
        body = encode_for(req, with_priority(payload, req.priority, False), route.role)
        failures: list[Failure] = []
        for owner in self._peers.owners_in_order(route.role, distinct_boxes(route.owners)):
            extra = [b"X-Lobes-Proxied-By: " + owner.encode()]
            failure = yield Attempt(self._peers.origin(owner), owner, headers, body, extra,
                                    OWNER, model=self._peers.served_id(route.role))
            if failure is None:
                return
            failures.append(failure)
        yield Answer(exhausted(f"every owner of {route.role}", failures, self._retry_after))
