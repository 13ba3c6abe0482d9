"""What /status adds for the live page: rates, recent latency, gear readiness, peer links, the box.

Everything here is computed when /status is asked, from what the gateway already holds: counter
deltas between two /status calls give the token rates, the time-to-first-byte histograms kept
for /metrics give the recent TTFT percentiles, and the peer prober's last verdicts give the
links. Nothing runs in the background for it, so a gateway nobody looks at does no work here.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..mesh.peers import PeerWatch
from ..mesh.replicas import NOT_PROBED_REASON, ReplicaState
from ..policy.config import BoxPlan
from ..policy.pressure import read_memory_kb
from .metrics import BUCKETS, Metrics

# Link states the page colours: answered and agrees, cannot be reached, answered but will not
# serve the role (HTTP error, key rejected, not hosted or not ready), serves something else.
READY, UNREACHABLE, REFUSED, INCOMPATIBLE = "ready", "unreachable", "refused", "incompatible"
# TTFT percentiles are taken over the requests of at most this many recent seconds.
TTFT_WINDOW_S = 300.0
# Histogram snapshots kept for the TTFT window: one per /status call, no more than this.
_MAX_SNAPSHOTS = 256


def link_state(state: ReplicaState) -> str:
    """The page's colour for a replica as the prober last judged it."""
    if state.ready:
        return READY if state.compatible else INCOMPATIBLE
    if "unreachable" in state.reason or state.reason == NOT_PROBED_REASON:
        return UNREACHABLE
    return REFUSED


def quantile(counts: list[int], q: float) -> float | None:
    """The q-quantile of per-bucket counts (the last bucket is +Inf), interpolated inside its
    bucket as Prometheus' histogram_quantile does; None without observations."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index == len(BUCKETS):  # past the largest bound: say the bound, not infinity
                return BUCKETS[-1]
            lower = BUCKETS[index - 1] if index else 0.0
            return lower + (BUCKETS[index] - lower) * (rank - seen) / count
        seen += count
    return BUCKETS[-1]


@dataclass
class _Counters:
    """A gear's token and prefix-cache counters as one /status call read them."""

    at: float
    prompt: float
    generation: float
    queries: float
    hits: float


def _rate(now: float, before: float, then: float, at: float) -> float | None:
    """Per second between two readings; None across a counter reset or no time."""
    if now < before or at <= then:
        return None
    return round((now - before) / (at - then), 2)


@dataclass
class Live:
    """The state /status keeps between its calls to turn counters into rates and windows."""

    metrics: Metrics
    peers: PeerWatch
    roles: frozenset[str] = frozenset()  # the catalog's: the only roles TTFT is reported for
    _counters: dict[str, _Counters] = field(default_factory=dict)
    _snapshots: deque[tuple[float, dict[str, list[int]]]] = field(
        default_factory=lambda: deque(maxlen=_MAX_SNAPSHOTS))

    def gear(self, name: str, totals: dict[str, float], now: float) -> dict[str, object]:
        """The rates and ratios of one gear since the previous /status call."""
        current = _Counters(now, totals.get("prompt_tokens_total", 0.0),
                            totals.get("generation_tokens_total", 0.0),
                            totals.get("prefix_cache_queries_total", 0.0),
                            totals.get("prefix_cache_hits_total", 0.0))
        previous = self._counters.get(name)
        self._counters[name] = current
        row: dict[str, object] = {"prompt_tokens_per_s": None, "generation_tokens_per_s": None,
                                  "prefix_cache_hit_rate": _hit_rate(current, previous)}
        if previous is not None:
            row["prompt_tokens_per_s"] = _rate(current.prompt, previous.prompt, previous.at, now)
            row["generation_tokens_per_s"] = _rate(current.generation, previous.generation,
                                                   previous.at, now)
        failed_at = self.metrics.failed_at.get(name)
        row["last_error_s_ago"] = None if failed_at is None else round(now - failed_at, 1)
        return row

    def gear_down(self, name: str) -> None:
        """A gear that did not answer: its next rate starts from its next reading."""
        self._counters.pop(name, None)
        self.metrics.failed_at[name] = time.monotonic()

    def ttft(self, now: float) -> dict[str, dict[str, object]]:
        """Per role, the p50/p95 time to first byte of the requests of the recent window."""
        current: dict[str, list[int]] = {}
        for (role, _lane), latency in self.metrics.latency.items():
            if role in self.roles:
                summed = current.setdefault(role, [0] * (len(BUCKETS) + 1))
                for index, count in enumerate(latency.first_byte.counts):
                    summed[index] += count
        while self._snapshots and now - self._snapshots[0][0] > TTFT_WINDOW_S:
            self._snapshots.popleft()
        since, base = self._snapshots[0] if self._snapshots else (None, {})
        self._snapshots.append((now, current))
        window = round(now - since, 1) if since is not None else None
        block: dict[str, dict[str, object]] = {}
        for role, counts in sorted(current.items()):
            old = base.get(role, [0] * len(counts))
            recent = [a - b for a, b in zip(counts, old, strict=True)]
            p50, p95 = quantile(recent, 0.5), quantile(recent, 0.95)
            block[role] = {"requests": sum(recent), "window_s": window,
                           "p50_s": _rounded_s(p50), "p95_s": _rounded_s(p95)}
        return block

    def links(self) -> list[dict[str, object]]:
        """Every peer link: the role it answers, how (pool, proxy, owner), the peer's origin
        and its state as the last probe pass judged it (this box's own replica left out)."""
        return [{"role": role, "kind": kind, "origin": state.origin,
                 "state": link_state(state), "reason": state.reason, "load": state.load,
                 "hardware": state.hardware}
                for role, kind, state in self._peer_states()]

    def _peer_states(self) -> Iterable[tuple[str, str, ReplicaState]]:
        proxied = set(self.peers.proxied_roles())
        for role, state in self.peers.peer_states():
            yield role, "proxy" if role in proxied else "owner", state
        for role, pooled in sorted(self.peers.pooled.items()):
            for state in pooled.replicas.states:
                if not state.spec.is_local:
                    yield role, "pool", state


def _hit_rate(current: _Counters, previous: _Counters | None) -> float | None:
    """Prefix-cache hits per queried token since the last call (over the gear's life on the
    first call, or when nothing was queried since); None before any query."""
    if previous is not None and current.queries > previous.queries >= 0 \
            and current.hits >= previous.hits:
        return round((current.hits - previous.hits) / (current.queries - previous.queries), 3)
    if current.queries > 0:
        return round(current.hits / current.queries, 3)
    return None


def _rounded_s(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


def box_block(self_origin: str | None, proc_root: str, plan: BoxPlan) -> dict[str, object]:
    """This box as the gateway knows it: its host name, origin, CPUs and memory (kB, read
    now; None where the kernel's meminfo cannot be read), and what the plan says of it: its
    hardware, the gears' memory shares and the headroom it keeps free (GiB; None unrendered)."""
    try:
        total, available = read_memory_kb(proc_root)
    except (OSError, ValueError, IndexError):
        total = available = None
    return {"name": socket.gethostname(), "origin": self_origin, "cpus": os.cpu_count(),
            "mem_total_kb": total, "mem_available_kb": available, "hardware": plan.hardware,
            "gear_shares_gib": plan.gear_shares_gib,
            "memory_headroom_gib": plan.memory_headroom_gib}
