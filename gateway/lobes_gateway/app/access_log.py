"""The JSON access log (GATEWAY_ACCESS_LOG): one line per request, written off the request path.

A request's end only appends its finished trace to a bounded queue (one deque append); a
writer thread formats the queued traces and writes them every FLUSH_INTERVAL_S, so a request
never waits on the disk. When the queue is full, lines are dropped and counted (exported on
/metrics). A line holds no key and no body: see LINE_FIELDS.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import deque
from json.encoder import encode_basestring_ascii as quoted
from typing import BinaryIO

from ..policy.config import ConfigError
from ..transport.trace import Trace

STDOUT = "-"
MAX_PENDING = 10_000
FLUSH_INTERVAL_S = 0.25
LINE_FIELDS = ("time", "request_id", "method", "path", "lane", "role", "route_reason",
               "served_by", "status", "bytes", "duration_s", "ttfb_s", "tokens", "client")


def _open(destination: str) -> BinaryIO:
    """stdout for `-`, else the file appended to (its directory made when missing)."""
    if destination == STDOUT:
        return sys.stdout.buffer
    try:
        os.makedirs(os.path.dirname(os.path.abspath(destination)), exist_ok=True)
        return open(destination, "ab")
    except OSError as exc:
        raise ConfigError("GATEWAY_ACCESS_LOG", f"cannot open {destination!r}: {exc.strerror}",
                          "give a writable file path, - for stdout, or off") from None


@functools.lru_cache(maxsize=4)
def _second(whole: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))


# The middle of a line, "method" to "served_by", by the trace fields it is made of: the same
# few for nearly every request, so escaped and joined once (the writer thread alone fills it;
# bounded, as callers' paths are not).
_MIDDLES: dict[tuple[str, str, str, str, str, str], str] = {}
MAX_MIDDLES = 256


def _middle(trace: Trace) -> str:
    key = (trace.method, trace.path, trace.lane, trace.role, trace.reason, trace.served)
    middle = _MIDDLES.get(key)
    if middle is None:
        method, path, lane, role, reason, served = key
        middle = (f'"method":{quoted(method)},"path":{quoted(path)},"lane":"{lane}",'
                  f'"role":"{role}","route_reason":"{reason}",'
                  f'"served_by":{quoted(served) if served else "null"},')
        if len(_MIDDLES) < MAX_MIDDLES:
            _MIDDLES[key] = middle
    return middle


def line(trace: Trace, wall_offset: float) -> bytes:
    """One request's JSON line (keys in LINE_FIELDS order); `wall_offset` turns its monotonic
    times into wall-clock time (ISO 8601 UTC, milliseconds). Built as text: lane, role and route
    reason come from closed vocabularies, the request id is safe by construction
    (transport/trace.py) and the client is a key's configured name, so only the method, the
    path and the replica need escaping."""
    started = trace.started
    wall = started + wall_offset
    whole = int(wall)
    first_byte, tokens = trace.first_byte, trace.tokens
    client = f'"{trace.client}"' if trace.client else "null"
    ttfb = f"{first_byte - started:.6f}" if first_byte else "null"
    return (f'{{"time":"{_second(whole)}.{int((wall - whole) * 1000):03d}Z",'
            f'"request_id":"{trace.request_id}",{_middle(trace)}"status":{trace.code},'
            f'"bytes":{trace.bytes},"duration_s":{trace.ended - started:.6f},"ttfb_s":{ttfb},'
            f'"tokens":{"null" if tokens is None else tokens},"client":{client}}}\n').encode()


class AccessLog:
    """The queue the request path appends to and the thread that writes it out."""

    def __init__(self, destination: str) -> None:
        self._stream = _open(destination)
        self._owns_stream = destination != STDOUT
        self._pending: deque[Trace] = deque()
        self.dropped = 0  # queue full (counted on the event loop's thread)
        self.failed = 0  # lines a write error lost (counted on the writer's thread)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lobes-access-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def push(self, trace: Trace) -> None:
        """Queue a finished request's line, or count it dropped when the queue is full."""
        if len(self._pending) < MAX_PENDING:
            self._pending.append(trace)
        else:
            self.dropped += 1

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL_S):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        offset = time.time() - time.monotonic()
        lines = [line(pending.popleft(), offset) for queued in range(len(pending))]
        try:
            self._stream.write(b"".join(lines))
            self._stream.flush()
        except OSError as exc:
            self.failed += len(lines)
            print(f"lobes_gateway: access log write failed: {exc}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)  # its last pass writes what is queued
        else:
            self._flush()
        if self._owns_stream:
            self._stream.close()
