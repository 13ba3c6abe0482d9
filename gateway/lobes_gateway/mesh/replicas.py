"""Replica sets: the peers of a pool, a proxy or owner forwarding, and what each last probe saw.

A replica set is judged one whole probe pass at a time. The fingerprint reference is what this
box's own plan says the role serves (P_SERVED_NAME, P_QUANTIZATION): every ready replica is
compatible only if its fingerprint agrees with it, so a peer declared first cannot make the
honest ones look wrong. Without a declared served name (an .env written by hand) the reference
is the first replica READY in this pass, in declaration order. A replica whose probe failed in
this pass is neither ready nor compatible: it is never judged on a fingerprint it published
before it went dark.

What a peer advertises is held to the bounds the plan holds this box's own gears to
(lobes_contract): a window, slot count, load or name outside them makes the peer incompatible,
with the reason, and never reaches placement or this box's own adverts. A probe that cannot be
read at all (nested past the parser, a number past any float) fails that peer alone.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from lobes_contract import CONTEXT_TOKENS, MAX_ACTIVE_SLOTS, SERVED_NAME

from ..policy.config import MAX_HARDWARE_CHARS, is_shown_line

# fetch(origin, path, api_key) -> (status, body). Raises OSError or TimeoutError when the
# peer cannot be reached; the gateway wires its upstream client here, tests a dict.
Fetch = Callable[[str, str, "str | None"], Awaitable[tuple[int, bytes]]]

LOCAL_ORIGIN = "local"
REFERENCE_REASON = "fingerprint reference"
NOT_PROBED_REASON = "not probed yet"
# A peer's running + waiting requests beyond this is no load a box can have.
MAX_LOAD = 1_000_000
# A probe's answer larger than this is not read (a /capabilities or /status is a few KiB).
MAX_PROBE_BYTES = 4 * 1024 * 1024


def normalize_origin(origin: str) -> str:
    """An origin as compared and displayed: stripped, without a trailing slash."""
    return origin.strip().rstrip("/")


@dataclass(frozen=True)
class ReplicaSpec:
    """One declared replica of a pool.

    api_key is the key after the empty-slot inheritance rule; prior_rate is the declared
    single-stream service rate in tokens per second (P_PEER_RATES), None when undeclared.
    local_url is set for this box's own backend in a hosted pool (dialled directly).
    """

    origin: str
    api_key: str | None = None
    prior_rate: float | None = None
    local_url: str | None = None

    @property
    def is_local(self) -> bool:
        return self.local_url is not None


def with_local_replica(
    specs: Sequence[ReplicaSpec], *, local_url: str, self_origin: str | None
) -> tuple[ReplicaSpec, ...]:
    """A hosted pool: this box's own backend joins its peers.

    When GATEWAY_SELF_ORIGIN is among the declared origins, that slot (its position and rate
    prior) is the local replica; otherwise the local replica is declared first.
    """
    me = normalize_origin(self_origin) if self_origin else LOCAL_ORIGIN
    if any(spec.origin == me for spec in specs):
        return tuple(
            replace(spec, local_url=local_url, api_key=None) if spec.origin == me else spec
            for spec in specs
        )
    return (ReplicaSpec(origin=me, local_url=local_url), *specs)


@dataclass(frozen=True)
class Fingerprint:
    """What must agree for two replicas to be interchangeable, and the replica's window.

    runtime (quantization or runtime tag) is compared only when both replicas publish one.
    context (the served window) is carried but not compared: it is a per-replica fact, and
    placement sends a request only where it fits.
    """

    served_id: str
    context: int | None
    runtime: str | None = None

    def difference(self, reference: Fingerprint, by: str = "reference") -> str:
        """Why this fingerprint disagrees with the reference (named `by`, the first ready
        replica or the plan); empty when it agrees."""
        if self.served_id != reference.served_id:
            return f"serves {self.served_id}, {by} serves {reference.served_id}"
        if self.runtime and reference.runtime and self.runtime != reference.runtime:
            return f"runtime {self.runtime}, {by} runtime {reference.runtime}"
        return ""


@dataclass(frozen=True)
class ProbeResult:
    """What one probe of one replica saw in one pass."""

    ready: bool
    reason: str = ""
    listed_ids: frozenset[str] = frozenset()
    fingerprint: Fingerprint | None = None
    load: int | None = None
    slots: int | None = None
    # The hardware the peer's /capabilities names for its box (shown, never acted on).
    hardware: str | None = None

    @classmethod
    def failed(cls, reason: str, listed_ids: frozenset[str] = frozenset()) -> ProbeResult:
        return cls(ready=False, reason=reason, listed_ids=listed_ids)

    @classmethod
    def refused(cls, reason: str) -> ProbeResult:
        """The peer answered, but what it advertised is out of bounds: ready, incompatible."""
        return cls(ready=True, reason=reason)


@dataclass(frozen=True)
class ReplicaState:
    """A replica as judged by the latest pass."""

    spec: ReplicaSpec
    ready: bool = False
    compatible: bool = False
    reason: str = NOT_PROBED_REASON
    fingerprint: Fingerprint | None = None
    listed_ids: frozenset[str] = frozenset()
    load: int | None = None
    slots: int | None = None
    judged_at: float | None = None
    hardware: str | None = None

    @property
    def origin(self) -> str:
        return self.spec.origin

    @property
    def selectable(self) -> bool:
        return self.ready and self.compatible

    @property
    def window(self) -> int | None:
        """The window this replica serves, as its last probe published it."""
        return self.fingerprint.context if self.fingerprint else None

    def snapshot(self) -> dict[str, object]:
        row: dict[str, object] = {
            "origin": self.origin,
            "ready": self.ready,
            "compatible": self.compatible,
            "reason": self.reason,
        }
        if self.load is not None:
            row["load"] = self.load
        return row


def _judge(
    spec: ReplicaSpec,
    result: ProbeResult,
    reference: Fingerprint | None,
    is_reference: bool,
    now: float,
    by: str = "reference",
) -> ReplicaState:
    base = ReplicaState(
        spec=spec,
        ready=result.ready,
        fingerprint=result.fingerprint,
        listed_ids=result.listed_ids,
        load=result.load,
        slots=result.slots,
        judged_at=now,
        hardware=result.hardware,
    )
    if not result.ready or reference is None or result.fingerprint is None:
        return replace(base, compatible=False, reason=result.reason or "not ready")
    if is_reference:
        return replace(base, compatible=True, reason=REFERENCE_REASON)
    difference = result.fingerprint.difference(reference, by)
    return replace(base, compatible=difference == "", reason=difference)


@dataclass
class ReplicaSet:
    """The replicas of one role and their state after the latest probe pass; `expected`, the
    plan's fingerprint for the role, is the reference when it is known."""

    role: str
    specs: tuple[ReplicaSpec, ...]
    expected: Fingerprint | None = None
    states: tuple[ReplicaState, ...] = field(init=False)

    def __post_init__(self) -> None:
        origins = [spec.origin for spec in self.specs]
        if len(set(origins)) != len(origins):
            raise ValueError(f"pool {self.role} declares an origin twice: {origins}")
        self.states = tuple(ReplicaState(spec=spec) for spec in self.specs)

    def apply_pass(self, results: Mapping[str, ProbeResult], now: float) -> None:
        """Judge every replica from this pass alone; a replica missing from it failed."""
        judged = [
            results.get(spec.origin) or ProbeResult.failed("no probe answer in this pass")
            for spec in self.specs
        ]
        if self.expected is not None:
            self.states = tuple(
                _judge(spec, result, self.expected, False, now, "the plan")
                for spec, result in zip(self.specs, judged, strict=True))
            return
        index = next(
            (i for i, r in enumerate(judged) if r.ready and r.fingerprint is not None), None
        )
        reference = judged[index].fingerprint if index is not None else None
        self.states = tuple(
            _judge(spec, result, reference, i == index, now)
            for i, (spec, result) in enumerate(zip(self.specs, judged, strict=True))
        )

    def note_failed(self, origin: str, reason: str) -> bool:
        """A request found the replica at `origin` down (it restarted, or lost its gear since
        the last probe): not ready until the next pass judges it again. Whether it changed."""
        states = list(self.states)
        for index, state in enumerate(states):
            if state.origin == origin and state.ready:
                states[index] = replace(state, ready=False, reason=reason)
                self.states = tuple(states)
                return True
        return False

    @property
    def reference(self) -> ReplicaState | None:
        return next((s for s in self.states if s.reason == REFERENCE_REASON), None)

    def selectable(self) -> tuple[ReplicaState, ...]:
        """Replicas a request may be placed on now: ready and fingerprint-compatible."""
        return tuple(s for s in self.states if s.selectable)

    @property
    def ready(self) -> bool:
        return any(s.selectable for s in self.states)

    @property
    def context(self) -> int | None:
        """The largest window a selectable replica serves (None when none is ready or none
        publishes one): the longest request the pool can take."""
        windows = [s.window for s in self.selectable() if s.window is not None]
        return max(windows) if windows else None

    @property
    def served_id(self) -> str | None:
        """The model the role's replicas serve: the plan's, else the first ready one's."""
        if self.expected is not None:
            return self.expected.served_id
        reference = self.reference
        return reference.fingerprint.served_id if reference and reference.fingerprint else None

    def peer_lists(self, model_id: str) -> bool:
        """True while a selectable replica's own /v1/models lists model_id."""
        return any(model_id in s.listed_ids for s in self.states if s.selectable)

    def capabilities(self) -> dict[str, object]:
        """The pool's part of a /capabilities role entry."""
        return {
            "ready": self.ready,
            "context": self.context,
            "replicas": [s.snapshot() for s in self.states],
        }


@dataclass(frozen=True)
class ProbeTarget:
    """What a probe looks for on a replica.

    served_id is this box's expectation when it has one (a single proxied peer); a pool
    learns it from each replica's /capabilities. audio roles have no /v1/models entry, so
    their readiness comes from /capabilities alone.
    """

    role: str
    served_id: str | None = None
    audio: bool = False


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


_STRICT = json.JSONDecoder(parse_constant=_refuse_constant)


class _Unreadable(Exception):
    """A probe answer that is not JSON the gateway reads: NaN, nesting past the parser."""


def _json(body: bytes) -> object:
    try:
        return _STRICT.decode(body.decode())
    except (ValueError, UnicodeDecodeError):
        return None
    except RecursionError:
        raise _Unreadable("nested deeper than the gateway reads") from None


def _role_entry(capabilities: object, role: str) -> dict | None:
    if not isinstance(capabilities, dict):
        return None
    roles = capabilities.get("roles", capabilities)
    entry = roles.get(role) if isinstance(roles, dict) else None
    return entry if isinstance(entry, dict) else None


def _models(body: object) -> dict[str, dict]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return {}
    return {m["id"]: m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)}


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _advert_problem(entry: dict) -> str | None:
    """Why a peer's /capabilities entry for a role is refused (a window, slot count or served
    name outside what the plan allows a gear), or None."""
    for field_name, bound in (("context", CONTEXT_TOKENS), ("max_active", MAX_ACTIVE_SLOTS),
                              ("served_name", SERVED_NAME)):
        value = entry.get(field_name)
        if value is None:
            continue
        refusal = bound.refusal(value)
        if refusal is not None:
            return f"peer advertises {field_name} that {refusal.removeprefix('is ')}"
    return None


class _Refused(Exception):
    """A peer's answer that is readable, but advertises what no box can have."""


def _backend_load(status: object, served_id: str) -> int | None:
    """running + waiting of the peer's backend serving served_id, from its GET /status (None
    when it publishes none); counts no box can have are refused."""
    if not isinstance(status, dict):
        raise _Refused("peer /status is not a JSON object the gateway reads")
    backends = status.get("backends")
    for backend in backends if isinstance(backends, list) else []:
        if not isinstance(backend, dict) or backend.get("served_name") != served_id:
            continue
        metrics = backend.get("metrics")
        if not isinstance(metrics, dict):
            return None
        counts = [c for c in (metrics.get("running"), metrics.get("waiting"))
                  if isinstance(c, (int, float)) and not isinstance(c, bool)]
        if not all(_finite_count(c) for c in counts):
            raise _Refused(f"peer advertises a load no box can have (at most {MAX_LOAD} "
                           "requests running and waiting)")
        return int(sum(counts))
    return None


def _finite_count(value: float) -> bool:
    try:
        return math.isfinite(value) and 0 <= value <= MAX_LOAD
    except OverflowError:  # an integer past any float
        return False


class _Unreachable(Exception):
    """The replica did not answer (transport error or timeout)."""


async def _get(fetch: Fetch, spec: ReplicaSpec, path: str) -> tuple[int, object]:
    origin = spec.local_url or spec.origin
    try:
        status, body = await fetch(origin, path, spec.api_key)
    except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
        raise _Unreachable(str(exc)) from exc
    return status, _json(body)


async def _probe_local(fetch: Fetch, spec: ReplicaSpec, target: ProbeTarget) -> ProbeResult:
    """This box's own backend: a vLLM /v1/models listing the configured served name."""
    status, body = await _get(fetch, spec, "/v1/models")
    if status != 200:
        return ProbeResult.failed(f"local backend /v1/models answered HTTP {status}")
    models = _models(body)
    served = target.served_id or target.role
    if served not in models:
        return ProbeResult.failed(f"local backend does not list {served}", frozenset(models))
    context = _int_or_none(models[served].get("max_model_len"))
    return ProbeResult(
        ready=True, listed_ids=frozenset(models), fingerprint=Fingerprint(served, context)
    )


async def _probe_peer(fetch: Fetch, spec: ReplicaSpec, target: ProbeTarget) -> ProbeResult:
    """A peer gateway: its /capabilities entry for the role, then its /v1/models listing; the
    hardware its box names, whatever the verdict."""
    status, capabilities = await _get(fetch, spec, "/capabilities")
    if status != 200:
        return ProbeResult.failed(f"peer /capabilities answered HTTP {status}")
    result = await _judge_peer_role(fetch, spec, target, capabilities)
    return replace(result, hardware=peer_hardware(capabilities))


def peer_hardware(capabilities: object) -> str | None:
    """The hardware a peer's /capabilities names, where it is a short line of printable ASCII
    (what this box shows of it); anything else is not repeated."""
    box = capabilities.get("box") if isinstance(capabilities, dict) else None
    hardware = box.get("hardware") if isinstance(box, dict) else None
    return hardware if isinstance(hardware, str) and is_shown_line(hardware, MAX_HARDWARE_CHARS) \
        else None


async def _judge_peer_role(fetch: Fetch, spec: ReplicaSpec, target: ProbeTarget,
                           capabilities: object) -> ProbeResult:
    """The peer's verdict on the role from its /capabilities entry, then its listing."""
    entry = _role_entry(capabilities, target.role)
    if entry is None:
        return ProbeResult.failed(f"peer does not declare {target.role}")
    if entry.get("feasible") is False:
        return ProbeResult.failed(f"peer does not host {target.role} (feasible=false)")
    if entry.get("ready") is not True:
        return ProbeResult.failed(f"peer reports {target.role} not ready")
    refused = _advert_problem(entry)
    if refused is not None:
        return ProbeResult.refused(refused)
    try:
        return await _peer_fingerprint(fetch, spec, target, entry)
    except _Refused as exc:
        return ProbeResult.refused(str(exc))


async def _peer_fingerprint(fetch: Fetch, spec: ReplicaSpec, target: ProbeTarget,
                            entry: dict) -> ProbeResult:
    """A peer that declares the role ready: its fingerprint, listing and load."""
    context = _int_or_none(entry.get("context"))
    runtime = entry.get("quantization") or entry.get("runtime")
    runtime = runtime if isinstance(runtime, str) else None
    slots = _int_or_none(entry.get("max_active"))
    if target.audio:
        return ProbeResult(ready=True, fingerprint=Fingerprint(target.role, context), slots=slots)
    served = entry.get("served_name") or target.served_id or target.role
    status, body = await _get(fetch, spec, "/v1/models")
    if status in (401, 403):
        return ProbeResult.failed(f"peer rejected the pairwise key (HTTP {status})")
    if status != 200:
        return ProbeResult.failed(f"peer /v1/models answered HTTP {status}")
    models = _models(body)
    if served not in models:
        return ProbeResult.failed(f"peer does not list {served}", frozenset(models))
    if context is None:
        listed_window = models[served].get("max_model_len")
        if listed_window is not None and CONTEXT_TOKENS.refusal(listed_window) is not None:
            raise _Refused(f"peer lists max_model_len that "
                           f"{CONTEXT_TOKENS.refusal(listed_window)}")
        context = _int_or_none(listed_window)
    return ProbeResult(
        ready=True,
        listed_ids=frozenset(models),
        fingerprint=Fingerprint(served, context, runtime),
        load=await _peer_load(fetch, spec, served),
        slots=slots,
    )


async def _peer_load(fetch: Fetch, spec: ReplicaSpec, served_id: str) -> int | None:
    """The peer's own load for served_id; informative only, so a failure is not fatal."""
    try:
        status, body = await _get(fetch, spec, "/status")
    except _Unreachable:
        return None
    return _backend_load(body, served_id) if status == 200 else None


async def probe_replica(
    fetch: Fetch, spec: ReplicaSpec, target: ProbeTarget, timeout_s: float
) -> ProbeResult:
    """Probe one replica; any transport failure or timeout makes it not ready, and so does an
    answer that cannot be read, whatever it raises: one peer's answer fails that peer alone."""
    probe = _probe_local if spec.is_local else _probe_peer
    where = "local backend" if spec.is_local else "peer gateway"
    try:
        return await asyncio.wait_for(probe(fetch, spec, target), timeout_s)
    except (_Unreachable, TimeoutError, asyncio.TimeoutError):
        return ProbeResult.failed(f"{where} unreachable")
    except _Unreadable as exc:
        return ProbeResult.failed(f"{where} answered what the gateway does not read: {exc}")
    except Exception as exc:  # any answer, any failure: this peer's alone
        return ProbeResult.failed(f"{where} answered what the gateway does not read "
                                  f"({type(exc).__name__})")


@dataclass
class Prober:
    """Background loop probing every pool's replicas concurrently, one whole pass at a time."""

    replica_sets: Sequence[tuple[ReplicaSet, ProbeTarget]]
    fetch: Fetch
    interval_s: float = 5.0
    timeout_s: float = 3.0
    clock: Callable[[], float] = time.monotonic
    on_pass: Callable[[], None] | None = None

    async def probe_once(self) -> None:
        """One whole pass over every replica set; on_pass then publishes the new verdicts."""
        await asyncio.gather(*(self._probe_set(replicas, target)
                               for replicas, target in self.replica_sets))
        if self.on_pass is not None:
            self.on_pass()

    async def _probe_set(self, replicas: ReplicaSet, target: ProbeTarget) -> None:
        started = self.clock()
        results = await asyncio.gather(
            *(probe_replica(self.fetch, spec, target, self.timeout_s) for spec in replicas.specs)
        )
        before = {state.origin: state.reason for state in replicas.states}
        replicas.apply_pass(
            {spec.origin: r for spec, r in zip(replicas.specs, results, strict=True)}, started
        )
        for state in replicas.states:
            if state.reason != before.get(state.origin) and not state.selectable:
                log(f"{replicas.role} replica {state.origin} is not selectable: {state.reason}")

    async def run(self) -> None:
        """Probe forever; cancel the task to stop. A pass that fails anyway is logged and the
        loop goes on: no answer stops the probing of every peer."""
        while True:
            try:
                await self.probe_once()
            except Exception as exc:  # logged; the next pass starts afresh
                log(f"a probe pass failed ({type(exc).__name__}: {exc}); probing goes on")
            await asyncio.sleep(self.interval_s)


def log(line: str) -> None:
    print(f"lobes_gateway: {line}", file=sys.stderr, flush=True)
