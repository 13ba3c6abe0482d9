"""The gateway's own work per request, without sockets: the real Gateway, in-memory transports.

The socket benchmark's CPU per request moves 15-30% with the host (docs/benchmarks.md), more
than most single cuts to the hot path save. This harness takes the kernel, the event loop and
the host out: a client Channel is handed each request's bytes by a call, and the upstream's
answer (fast_backend's) is handed back inside the gateway's own write to it, so one request is
one synchronous pass through the gateway's Python, from head to answer. It prints the process
CPU per request over --requests (after --warmup), the median of --rounds, and with --valgrind
also the instructions per request under cachegrind: the difference between two runs of
different lengths over the difference in requests, so start-up drops out. Instructions are
the stable measure of a change; the microseconds are this host's.

    python3 bench/inprocess_cost.py                  # CPU per request, access log off
    python3 bench/inprocess_cost.py --access-log     # with the JSON access log on (a file)
    python3 bench/inprocess_cost.py --valgrind       # and instructions per request
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fast_backend
import gateway_bench

sys.path.insert(0, str(gateway_bench.REPO / "gateway"))

from lobes_gateway.app.gateway import Gateway
from lobes_gateway.policy.config import load_config
from lobes_gateway.transport.channel import Channel
from lobes_gateway.transport.upstream import Connection, Origin

BACKEND = Origin("127.0.0.1", 9)  # never dialled: its one connection is in the pool already


class MemoryTransport(asyncio.Transport):
    """A transport whose writes go to `on_write`; never paused, closed only when asked."""

    def __init__(self, on_write) -> None:
        super().__init__()
        self._on_write = on_write
        self._closing = False

    def write(self, data) -> None:
        self._on_write(data)

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self._closing = True

    def abort(self) -> None:
        self._closing = True

    def get_extra_info(self, name, default=None):
        return default


class Harness:
    """One gateway, one keep-alive client connection and one pooled upstream connection."""

    def __init__(self, gateway: Gateway) -> None:
        self.answered = bytearray()
        self.upstream = Channel()
        self.upstream.connection_made(MemoryTransport(self._answer_upstream))
        gateway.connections.release(Connection(BACKEND, self.upstream))
        self.client = gateway.accept()
        self.client.connection_made(MemoryTransport(self.answered.extend))

    def _answer_upstream(self, _request: bytes) -> None:
        # The request is one write (head and small body); the backend answers it whole.
        self.upstream.data_received(fast_backend.JSON_RESPONSE)

    def serve(self, request: bytes, count: int) -> None:
        data_received = self.client.data_received
        for _request in range(count):
            data_received(request)

    def check(self, count: int) -> None:
        """The last `count` requests were each answered 200 with the backend's body: a
        harness that measured errors, or answers the gateway made up, would mislead."""
        answered = bytes(self.answered)
        ok = answered.count(b"HTTP/1.1 200 ")
        relayed = answered.count(fast_backend.COMPLETION_BODY)
        if not ok == relayed == answered.count(b"HTTP/1.1 ") == count:
            raise SystemExit(f"{count} requests: {ok} answered 200, {relayed} with the "
                             f"backend's body: {answered[:400]!r}")
        self.answered.clear()


def environment(access_log: str | None) -> dict[str, str]:
    """The socket benchmark's gateway settings (gateway_bench.start_gateway)."""
    env = {
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": "8000",
        "PRIMARY_BASE_URL": BACKEND.url,
        "PRIMARY_SERVED_NAME": gateway_bench.SERVED_NAME,
        "GATEWAY_DEFAULT_MODEL": gateway_bench.SERVED_NAME,
        "GATEWAY_API_KEY": gateway_bench.API_KEY,
        "GATEWAY_MAX_INFLIGHT_PER_KEY": "100000",
    }
    if access_log:
        env["GATEWAY_ACCESS_LOG"] = access_log
    return env


async def measure(args: argparse.Namespace, access_log: str | None) -> list[float]:
    """Microseconds of process CPU per request, one figure per round."""
    gateway = Gateway(load_config(environment(access_log)))
    gateway.pressure.take_sample()
    if gateway.access_log is not None:
        gateway.access_log.start()
    harness = Harness(gateway)
    request = gateway_bench.post(gateway_bench.chat_body())
    harness.serve(request, args.warmup)
    harness.check(args.warmup)
    # As the served gateway does (__main__.serve): start-up objects kept out of collections.
    gc.collect()
    gc.freeze()
    figures = []
    for _round in range(args.rounds):
        started = time.process_time()
        harness.serve(request, args.requests)
        figures.append((time.process_time() - started) / args.requests * 1e6)
        harness.check(args.requests)
        await asyncio.sleep(0)  # the access log's writer drains between rounds
    await gateway.close()
    return figures


def instructions(args: argparse.Namespace, requests: int) -> int:
    """Instructions cachegrind counts for this script serving `requests` requests once."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cachegrind.out"
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                   f"--cachegrind-out-file={out}", sys.executable, __file__, "--rounds", "1",
                   "--warmup", str(args.warmup), "--requests", str(requests)]
        if args.access_log:
            command.append("--access-log")
        subprocess.run(command, check=True, capture_output=True)
        for line in out.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise SystemExit("cachegrind wrote no summary")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument("--valgrind", action="store_true",
                        help="also count instructions per request under cachegrind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "access.log") if args.access_log else None
        figures = asyncio.run(measure(args, log))
    label = "access log on" if args.access_log else "access log off"
    print(f"{label}: {statistics.median(figures):.1f} us a request of process CPU "
          f"(median of {len(figures)} rounds of {args.requests}: "
          f"{', '.join(f'{f:.1f}' for f in figures)})")
    if args.valgrind:
        short, long = 1_000, 6_000
        per_request = (instructions(args, long) - instructions(args, short)) / (long - short)
        print(f"{label}: {per_request / 1000:.1f}k instructions a request (cachegrind)")


if __name__ == "__main__":
    main()
