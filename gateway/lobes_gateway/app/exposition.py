"""GET /metrics: the Prometheus text exposition format (0.0.4), built only when scraped.

Reads the request counters (app/metrics.py), the pools' replica state and placement, the
pressure sampler and the process itself; the request path never formats any of it.
Every metric, its labels and its meaning: docs/gateway.md, "Metrics".
"""

from __future__ import annotations

import os
import resource
import time
from collections import Counter
from collections.abc import Iterable, Mapping

from .. import __version__
from ..mesh.peers import PeerWatch, PooledRole
from ..policy.admission import CLASSES
from ..policy.pressure import PressureMonitor
from .admission_gate import OUTCOMES, AdmissionGate
from .metrics import BUCKETS, Histogram, Metrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Labels = tuple[tuple[str, str], ...]
Sample = tuple[Labels, float]
_LE = (*(repr(bound) for bound in BUCKETS), "+Inf")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Exposition:
    """The lines of one scrape, family by family."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str, samples: Iterable[Sample]) -> None:
        self.lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        self.lines += [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]

    def histograms(self, name: str, text: str, series: Iterable[tuple[Labels, Histogram]]) -> None:
        self.lines += [f"# HELP {name} {text}", f"# TYPE {name} histogram"]
        for labels, histogram in series:
            total = 0
            for le, count in zip(_LE, histogram.counts, strict=True):
                total += count
                self.lines.append(f"{name}_bucket{_labels((*labels, ('le', le)))} {total}")
            self.lines.append(f"{name}_sum{_labels(labels)} {_number(histogram.sum)}")
            self.lines.append(f"{name}_count{_labels(labels)} {total}")

    def text(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()


def _keyed(counts: Mapping[tuple[str, ...], int], names: tuple[str, ...]) -> list[Sample]:
    """Counter samples from a dict keyed by label-value tuples, in a stable order."""
    return [(tuple(zip(names, map(str, key), strict=True)), value)
            for key, value in sorted(counts.items(), key=lambda item: tuple(map(str, item[0])))]


def _traffic(out: Exposition, metrics: Metrics) -> None:
    out.family("lobes_gateway_requests_total", "counter",
               "Requests answered (or ended by the client: code 499), by role, lane, pool route "
               "reason and status code.",
               _keyed(metrics.requests, ("role", "lane", "route_reason", "code")))
    latency = sorted(metrics.latency.items())
    out.histograms("lobes_gateway_request_duration_seconds",
                   "Seconds from a request's head to the end of its answer.",
                   [((("role", role), ("lane", lane)), pair.duration)
                    for (role, lane), pair in latency])
    out.histograms("lobes_gateway_time_to_first_byte_seconds",
                   "Seconds from a request's head to the first byte of its answer's head.",
                   [((("role", role), ("lane", lane)), pair.first_byte)
                    for (role, lane), pair in latency])
    out.family("lobes_gateway_upstream_attempts_total", "counter",
               "Upstream attempts (gears, fallback, peers, replicas, owners) by target and "
               "outcome.",
               _keyed(metrics.attempts, ("target", "outcome")))
    out.family("lobes_gateway_upstream_failovers_total", "counter",
               "Attempts after which the request moved on to another attempt, by the target "
               "left and why.",
               _keyed(metrics.failovers, ("target", "outcome")))
    out.family("lobes_gateway_stream_resumes_total", "counter",
               "Pooled streams that broke off mid-answer, by role and outcome: continued on "
               "another replica, or ended (not resumable, or no replica left).",
               _keyed(metrics.resumes, ("role", "outcome")))
    out.family("lobes_gateway_streams_cut_total", "counter",
               "Streams cut off mid-answer and ended with an error event, by role and reason: "
               "the backend broke the stream (closed it, or broke its framing) or stalled "
               "(sent nothing for GATEWAY_STREAM_STALL_S).",
               _keyed(metrics.streams_cut, ("role", "reason")))
    out.family("lobes_gateway_upstream_unpooled_total", "counter",
               "Times an upstream sent bytes nobody asked for (an answer longer than its "
               "framing, a response on an idle connection, an answer naming another request) "
               "and its connections stopped being pooled for a while, by origin.",
               [((("origin", origin),), count) for origin, count in metrics.unpooled.items()])
    out.family("lobes_gateway_shed_requests_total", "counter",
               "Requests refused to shed load, by reason.",
               _keyed({(reason,): n for reason, n in metrics.shed.items()}, ("reason",)))
    out.family("lobes_gateway_completion_tokens_total", "counter",
               "Completion tokens of generate-lane answers, by role and the replica that "
               "served them.",
               _keyed(metrics.tokens, ("role", "replica")))
    out.family("lobes_gateway_client_requests_total", "counter",
               "Requests by the caller's key name (anonymous, client, fleet or a named key) "
               "and status code.",
               _keyed(metrics.clients, ("client", "code")))
    in_flight = Counter(trace.role for trace in metrics.live)
    out.family("lobes_gateway_in_flight_requests", "gauge",
               "Requests being answered now, by role (none: not routed to a role).",
               _keyed({(role,): n for role, n in in_flight.items()}, ("role",)))


def _pools(out: Exposition, pooled: Mapping[str, PooledRole]) -> None:
    rows = [(role, state, pool.placer) for role, pool in sorted(pooled.items())
            for state in pool.replicas.states]
    names = ("role", "replica")
    out.family("lobes_gateway_pool_replica_in_flight", "gauge",
               "Requests this box has placed on a pool replica and not yet finished.",
               [(tuple(zip(names, (role, s.origin), strict=True)), placer.in_flight(s.origin))
                for role, s, placer in rows])
    out.family("lobes_gateway_pool_replica_ready", "gauge",
               "1 when the replica's latest probe saw it ready, else 0.",
               [(tuple(zip(names, (role, s.origin), strict=True)), int(s.ready))
                for role, s, _placer in rows])
    out.family("lobes_gateway_pool_replica_compatible", "gauge",
               "1 when the replica's fingerprint matches the pool's reference, else 0.",
               [(tuple(zip(names, (role, s.origin), strict=True)), int(s.compatible))
                for role, s, _placer in rows])
    rates = [(role, s.origin, placer.rate(s.origin)) for role, s, placer in rows]
    out.family("lobes_gateway_pool_replica_service_rate_tokens_per_second", "gauge",
               "The per-stream service rate placement uses for the replica (learned, or the "
               "declared prior); absent while neither is known.",
               [(tuple(zip(names, (role, origin), strict=True)), rate)
                for role, origin, rate in rates if rate is not None])
    forecasting = [(role, s.origin, placer) for role, s, placer in rows
                   if placer.policy.forecasts]
    prefill_rates = [(role, origin, placer.prefill_rate(origin))
                     for role, origin, placer in forecasting]
    out.family("lobes_gateway_pool_replica_prefill_rate_tokens_per_second", "gauge",
               "The prompt tokens per second placement prices the replica's prefill at "
               "(learned; prefix policy); absent until learned.",
               [(tuple(zip(names, (role, origin), strict=True)), rate)
                for role, origin, rate in prefill_rates if rate is not None])
    out.family("lobes_gateway_pool_replica_sessions", "gauge",
               "Sessions (conversations continued at least once) placement counts as bound "
               "to the replica (prefix policy).",
               [(tuple(zip(names, (role, origin), strict=True)),
                 placer.conversations.bound(origin)) for role, origin, placer in forecasting])


def _admission(out: Exposition, gate: AdmissionGate) -> None:
    """Queue depths by class and by client key name, and how requests left admission."""
    queues = sorted(gate.queues.items())
    out.family("lobes_gateway_admission_queue_depth", "gauge",
               "Requests waiting at the gateway for a slot of the role's gear or pool, by class.",
               [((("role", role), ("class", name)), depth)
                for role, queue in queues for name, depth in queue.depth_by_class().items()])
    out.family("lobes_gateway_admission_queue_depth_by_client", "gauge",
               "Requests waiting at the gateway for a slot of the role's gear or pool, by client "
               "key name (keys with none waiting are left out).",
               [((("role", role), ("client", client)), depth) for role, queue in queues
                for client, depth in sorted(queue.depth_by_client().items())])
    out.family("lobes_gateway_admission_running", "gauge",
               "Requests admitted to the role's gear (or released to its pool) and not yet "
               "finished.",
               [((("role", role),), len(queue.running)) for role, queue in queues])
    counts = {(role, name, outcome): gate.outcomes.get((role, name, outcome), 0)
              for role, _queue in queues for name in CLASSES for outcome in OUTCOMES}
    out.family("lobes_gateway_admission_total", "counter",
               "Generate requests that met the admission queue, by role, class and how they "
               "left it (started, released, deadline_unmeetable, deadline_passed, client_gone).",
               _keyed(counts, ("role", "class", "outcome")))


def _pressure(out: Exposition, pressure: PressureMonitor) -> None:
    sample, config = pressure.sample, pressure.config
    readings = (("swap_used_ratio", "Swap used, 0-1, at the latest sample.",
                 sample.swap_used_percent / 100),
                ("iowait_ratio", "CPU iowait share, 0-1, between the last two samples.",
                 sample.iowait_percent / 100),
                ("swap_degraded_threshold_ratio", "Swap used above which full tiers are shed.",
                 config.swap_degraded / 100),
                ("iowait_degraded_threshold_ratio", "Iowait above which full tiers are shed.",
                 config.iowait_degraded / 100),
                ("memavailable_degraded_threshold_ratio", "MemAvailable share of MemTotal "
                 "under which full tiers are shed.", config.memavailable_degraded / 100),
                ("psi_memory_full_threshold", "PSI memory full avg10 over which full tiers "
                 "are shed.", config.psi_memory_full),
                ("shedding", "1 while pressure sheds the full tiers, else 0.",
                 int(pressure.busy)))
    # Readings the box may not have: MemAvailable (an old kernel) and PSI (not enabled).
    optional = (("mem_available_ratio", "MemAvailable as a share of MemTotal, 0-1, at the "
                 "latest sample.", None if sample.mem_available_percent is None
                 else sample.mem_available_percent / 100),
                ("psi_memory_full_avg10", "PSI memory full avg10 (percent of time all tasks "
                 "stalled on memory) at the latest sample.", sample.psi_memory_full))
    for name, text, value in (*readings, *optional):
        if value is not None:
            out.family(f"lobes_gateway_pressure_{name}", "gauge", text, [((), value)])


def process_start_time(proc: str = "/proc") -> float:
    """When this process started (unix seconds), as /proc tells it: boot time plus the
    process's start in clock ticks since boot; now, where /proc has neither."""
    try:
        with open(f"{proc}/self/stat", encoding="ascii") as fh:
            # Fields after the command name (which may hold spaces); starttime is field 22.
            ticks = int(fh.read().rpartition(")")[2].split()[19])
        with open(f"{proc}/stat", encoding="ascii") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _process(out: Exposition, started_at: float) -> None:
    """The standard process_* metrics (resident memory and descriptors where /proc has them)."""
    times = os.times()
    out.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent "
               "in seconds.", [((), times.user + times.system)])
    out.family("process_start_time_seconds", "gauge", "Start time of the process since unix "
               "epoch in seconds.", [((), started_at)])
    out.family("process_max_fds", "gauge", "Maximum number of open file descriptors.",
               [((), resource.getrlimit(resource.RLIMIT_NOFILE)[0])])
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            virtual, resident = (int(pages) * _PAGE_BYTES for pages in fh.read().split()[:2])
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        return
    out.family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
               [((), virtual)])
    out.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
               [((), resident)])
    out.family("process_open_fds", "gauge", "Number of open file descriptors.", [((), open_fds)])


def render(metrics: Metrics, peers: PeerWatch, pressure: PressureMonitor,
           started_at: float, admission: AdmissionGate) -> bytes:
    """The whole /metrics body."""
    out = Exposition()
    out.family("lobes_gateway_build_info", "gauge", "The gateway's version (always 1).",
               [((("version", __version__),), 1)])
    _traffic(out, metrics)
    _pools(out, peers.pooled)
    out.family("lobes_gateway_peer_selectable", "gauge",
               "1 when the proxied peer or owner's latest probe saw it ready and compatible "
               "(the plan's model, adverts within bounds), else 0; /capabilities says why.",
               [((("role", role), ("peer", state.origin)), int(state.selectable))
                for role, state in peers.peer_states()])
    _admission(out, admission)
    _pressure(out, pressure)
    log = metrics.access_log
    out.family("lobes_gateway_access_log_dropped_lines_total", "counter",
               "Access log lines lost: queue_full (the writer fell behind) or write_error.",
               [((("reason", "queue_full"),), log.dropped if log else 0),
                ((("reason", "write_error"),), log.failed if log else 0)])
    _process(out, started_at)
    return out.text()
