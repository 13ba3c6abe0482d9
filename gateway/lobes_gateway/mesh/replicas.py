"""Replica sets: the peers of a pool, a proxy or owner forwarding, and what each last probe saw.

A replica set is judged one whole probe pass at a time. The fingerprint reference is the first
replica that is READY in this pass, in declaration order; every other ready replica is
compatible only if its fingerprint agrees with the reference. A replica whose probe failed
in this pass is neither ready nor compatible: it is never judged on a fingerprint it
published before it went dark (seed 000, defect 2).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

# fetch(origin, path, api_key) -> (status, body). Raises OSError or TimeoutError when the
# peer cannot be reached; the gateway wires its upstream client here, tests a dict.
Fetch = Callable[[str, str, "str | None"], Awaitable[tuple[int, bytes]]]

LOCAL_ORIGIN = "local"
REFERENCE_REASON = "fingerprint reference"
NOT_PROBED_REASON = "not probed yet"


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

    def difference(self, reference: Fingerprint) -> str:
        """Why this fingerprint disagrees with the reference; empty when it agrees."""
        if self.served_id != reference.served_id:
            return f"serves {self.served_id}, reference serves {reference.served_id}"
        if self.runtime and reference.runtime and self.runtime != reference.runtime:
            return f"runtime {self.runtime}, reference runtime {reference.runtime}"
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

    @classmethod
    def failed(cls, reason: str, listed_ids: frozenset[str] = frozenset()) -> ProbeResult:
        return cls(ready=False, reason=reason, listed_ids=listed_ids)


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
) -> ReplicaState:
    base = ReplicaState(
        spec=spec,
        ready=result.ready,
        fingerprint=result.fingerprint,
        listed_ids=result.listed_ids,
        load=result.load,
        slots=result.slots,
        judged_at=now,
    )
    if not result.ready or reference is None or result.fingerprint is None:
        return replace(base, compatible=False, reason=result.reason or "not ready")
    if is_reference:
        return replace(base, compatible=True, reason=REFERENCE_REASON)
    difference = result.fingerprint.difference(reference)
    return replace(base, compatible=difference == "", reason=difference)


@dataclass
class ReplicaSet:
    """The replicas of one role and their state after the latest probe pass."""

    role: str
    specs: tuple[ReplicaSpec, ...]
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
        index = next(
            (i for i, r in enumerate(judged) if r.ready and r.fingerprint is not None), None
        )
        reference = judged[index].fingerprint if index is not None else None
        self.states = tuple(
            _judge(spec, result, reference, i == index, now)
            for i, (spec, result) in enumerate(zip(self.specs, judged, strict=True))
        )

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


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


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


def _backend_load(status: object, served_id: str) -> int | None:
    """running + waiting of the peer's backend serving served_id, from its GET /status."""
    backends = status.get("backends") if isinstance(status, dict) else None
    for backend in backends if isinstance(backends, list) else []:
        if not isinstance(backend, dict) or backend.get("served_name") != served_id:
            continue
        metrics = backend.get("metrics")
        if not isinstance(metrics, dict):
            return None
        counts = [metrics.get("running"), metrics.get("waiting")]
        return int(sum(c for c in counts if isinstance(c, (int, float))))
    return None


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
    """A peer gateway: its /capabilities entry for the role, then its /v1/models listing."""
    status, capabilities = await _get(fetch, spec, "/capabilities")
    if status != 200:
        return ProbeResult.failed(f"peer /capabilities answered HTTP {status}")
    entry = _role_entry(capabilities, target.role)
    if entry is None:
        return ProbeResult.failed(f"peer does not declare {target.role}")
    if entry.get("feasible") is False:
        return ProbeResult.failed(f"peer does not host {target.role} (feasible=false)")
    if entry.get("ready") is not True:
        return ProbeResult.failed(f"peer reports {target.role} not ready")
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
    context = context or _int_or_none(models[served].get("max_model_len"))
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
    """Probe one replica; any transport failure or timeout makes it not ready."""
    probe = _probe_local if spec.is_local else _probe_peer
    try:
        return await asyncio.wait_for(probe(fetch, spec, target), timeout_s)
    except (_Unreachable, TimeoutError, asyncio.TimeoutError):
        where = "local backend" if spec.is_local else "peer gateway"
        return ProbeResult.failed(f"{where} unreachable")


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
        replicas.apply_pass(
            {spec.origin: r for spec, r in zip(replicas.specs, results, strict=True)}, started
        )

    async def run(self) -> None:
        """Probe forever; cancel the task to stop."""
        while True:
            await self.probe_once()
            await asyncio.sleep(self.interval_s)
