"""The gateway's own counters, kept as plain ints, dicts and bucket arrays on the request path.

A request is traced from its head to its end (transport/trace.py); `end` adds it to the
counters in one step. The dispatcher counts attempts, failovers and sheds where they happen.
Nothing here formats text: app/exposition.py builds /metrics from these only when scraped.
Label values are bounded by construction: roles, lanes, route reasons, status codes, the
configured targets and replicas, the configured client key names; never a caller's model name,
path or key.
"""

from __future__ import annotations

import itertools
import os
import time
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from ..transport.channel import Channel
from ..transport.trace import CLIENT_CLOSED, Trace
from .access_log import AccessLog

# Seconds: 1 ms to 5 min, for both request duration and time to first byte.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
           60.0, 120.0, 300.0)
# Outcomes of one upstream attempt (lobes_gateway_upstream_attempts_total{outcome}).
ANSWERED = "answered"  # its answer was relayed, whatever its status
UNREACHABLE = "unreachable"  # refused, timed out or broke off before an answer
SERVER_ERROR = "server_error"  # a 5xx that moved the request on
DECLINED = "declined"  # a 401/403/404 (a peer's role_infeasible) that moved it on
BUSY = "busy"  # a pool replica's 429 (its box sheds the tier, or its key is at its limit)
SCHEMA_REJECTED = "schema_rejected"  # a strict-lane 400: retried without strict
WRONG_MODEL = "wrong_model"  # a peer's 200 that names a model other than the role's
# Why a request was shed (lobes_gateway_shed_requests_total{reason}).
SHED_PRESSURE = "pressure"  # swap or iowait
SHED_MEMORY = "memory"  # MemAvailable or PSI memory
SHED_KEY_LIMIT = "key_in_flight_limit"
SHED_REASONS = (SHED_PRESSURE, SHED_MEMORY, SHED_KEY_LIMIT)


class Histogram:
    """Observations per bucket (the last is +Inf), not cumulative, and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(BUCKETS, value)] += 1
        self.sum += value


class Latency:
    """The duration and time-to-first-byte histograms of one (role, lane)."""

    __slots__ = ("duration", "first_byte")

    def __init__(self) -> None:
        self.duration = Histogram()
        self.first_byte = Histogram()


class Series:
    """The requests of one combination of labels, their completion tokens, and the latency of
    their role and lane (shared by that role and lane's series)."""

    __slots__ = ("latency", "requests", "tokens")

    def __init__(self, latency: Latency) -> None:
        self.latency = latency
        self.requests = 0
        self.tokens = 0


# A request's labels: role, lane, route reason, status code, replica (served), client key name.
SeriesKey = tuple[str, str, str, int, str, str]


class Metrics:
    """Every counter of the gateway's own traffic, and the requests in flight now."""

    def __init__(self, access_log: AccessLog | None) -> None:
        # One entry per combination of a request's labels, found with one lookup a request;
        # the request, token and client families are sums of these (bounded: every label is).
        self.series: dict[SeriesKey, Series] = {}
        self.latency: dict[tuple[str, str], Latency] = {}
        self.attempts: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.failovers: defaultdict[tuple[str, str], int] = defaultdict(int)
        # Pooled streams that broke off, by role and how (app/resume.py RESUMED and others).
        self.resumes: defaultdict[tuple[str, str], int] = defaultdict(int)
        # Streams relayed whole to no end of their own: by role and why (app/framing.py BROKEN,
        # STALLED).
        self.streams_cut: defaultdict[tuple[str, str], int] = defaultdict(int)
        # Origins whose connections stopped being pooled (bytes nobody asked for), by origin:
        # the connection pool's own count, shown here.
        self.unpooled: Mapping[str, int] = {}
        # Every reason from zero: an alert on rate() sees the first shed too.
        self.shed: dict[str, int] = dict.fromkeys(SHED_REASONS, 0)
        self.live: set[Trace] = set()
        # When each target last failed (monotonic): an attempt that moved on, or a /status
        # fan-out it did not answer. Written on failures only, read by /status.
        self.failed_at: dict[str, float] = {}
        self.access_log = access_log
        # Request ids: unique per process run without a random read per request.
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()

    def begin(self, client: Channel) -> Trace:
        """Trace the request whose head just arrived on `client` (its writes go through it)."""
        trace = Trace(client.write, time.monotonic(), f"{self._id_prefix}-{next(self._ids):x}")
        client.write = trace.write
        if self.access_log is None:  # nothing reads the bytes count
            trace.hands_back = client
        self.live.add(trace)
        return trace

    def end(self, trace: Trace, client: Channel) -> None:
        """The request ended (answered, or its connection broke): count it."""
        client.write = trace.sink
        self.live.discard(trace)
        trace.ended = ended = time.monotonic()
        key = (trace.role, trace.lane, trace.reason, trace.status or CLIENT_CLOSED, trace.served,
               trace.client)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Series(self._latency(trace.role, trace.lane))
        series.requests += 1
        if trace.tokens:
            series.tokens += trace.tokens
        # Histogram.observe inlined: this runs once per request.
        latency, started = series.latency, trace.started
        elapsed = ended - started
        histogram = latency.duration
        histogram.counts[bisect_left(BUCKETS, elapsed)] += 1
        histogram.sum += elapsed
        if trace.first_byte:
            elapsed = trace.first_byte - started
            histogram = latency.first_byte
            histogram.counts[bisect_left(BUCKETS, elapsed)] += 1
            histogram.sum += elapsed
        if self.access_log is not None:
            self.access_log.push(trace)

    def _latency(self, role: str, lane: str) -> Latency:
        latency = self.latency.get((role, lane))
        if latency is None:
            latency = self.latency[role, lane] = Latency()
        return latency

    @property
    def requests(self) -> Counter[tuple[str, str, str, int]]:
        """Requests by role, lane, route reason and status code."""
        return _summed((key[:4], series.requests) for key, series in self.series.items())

    @property
    def tokens(self) -> Counter[tuple[str, str]]:
        """Completion tokens by role and the replica that served them (those with any)."""
        return _summed(((key[0], key[4]), series.tokens) for key, series in self.series.items())

    @property
    def clients(self) -> Counter[tuple[str, int]]:
        """Requests by the caller's key name and status code (once the gate named it)."""
        return _summed(((key[5], key[3]), series.requests)
                       for key, series in self.series.items() if key[5])


def _summed(pairs: Iterable[tuple[tuple, int]]) -> Counter:
    """The values summed by key; keys summing to 0 are left out."""
    total: Counter = Counter()
    for key, value in pairs:
        total[key] += value
    return +total
